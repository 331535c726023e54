"""Mamba-2 (``Mamba2ForCausalLM``): an attention-free, mixer-only tree, implementing the
:class:`~overlays.base.Overlay` contract directly (no :class:`~overlays.tree.Tree` field says
"no attention, no MLP, one SSM mixer").

vLLM's tree (vllm/model_executor/models/mamba2.py, layers/mamba/mamba_mixer2.py)::

    backbone.embeddings                      VocabParallelEmbedding
    backbone.layers.{i}                      Mamba2DecoderLayer(hidden_states, residual) -> (mixer_out, residual)
    backbone.layers.{i}.norm                 RMSNorm, fused add-norm from layer 1 on: (normed, residual)
    backbone.layers.{i}.mixer                MambaMixer2(hidden_states) -> out
    backbone.layers.{i}.mixer.in_proj        [z | xBC | dt] = [I | I + 2*G*N | H] columns, returns (out, bias)
    backbone.layers.{i}.mixer.norm           Mixer2RMSNormGated(ssm_out, gate): w * rms(ssm_out * silu(gate))
    backbone.layers.{i}.mixer.out_proj       RowParallelLinear, returns (out, bias)
    backbone.norm_f                          RMSNorm(hidden_states, residual) -> (normed, _)
    logits_processor                         as every decoder

TransformerBridge (TL 4.3.0, supported_architectures/mamba2.py) names the HF tree
``blocks.{i}.{norm, mixer.{in_proj, conv1d, inner_norm, out_proj}}``; ``inner_norm`` is HF's
``mixer.norm`` (renamed against the block's ``norm``).

Hooks, and why each read is the TransformerLens value (the backbone's -- block input and output, norm,
mixer input, embeddings, final norm, logits -- declared once for both Mamba lines in
:mod:`overlays.mamba_backbone`):

- ``blocks.{i}.hook_in`` / ``hook_out``: the fused pair, as in decoder layers: a layer's output
  ``(mixer_out, residual)`` holds the residual *entering* the layer, so the block output is
  ``out[0]+out[1]`` and the block input ``in.hidden_states+in.residual`` (layer 0's residual is
  None and adds nothing).  HF's ``Mamba2Block`` returns the stream itself (HF hooks as usual).
- ``blocks.{i}.norm.hook_normalized``: the block norm's ``out[0]`` (a tensor at layer 0, a pair
  after) divided by its weight.
- ``blocks.{i}.mixer.hook_in``: the mixer's input, the weighted norm output.
- ``blocks.{i}.mixer.in_proj.hook_out``: ``in_proj``'s ``out[0]``, all 2I + 2GN + H columns;
  vLLM's column order is HF's ``[gate, hidden_states_B_C, dt]`` (HF's two ``d_mlp`` slots are
  empty: TL's adapter checks it).  The split: ``in_proj.hook_xBC`` and ``in_proj.hook_dt`` are
  its columns (our names, HF's variables; TL has no hook for them, so ``("bridge", None)``: they
  are compared with HF's forward hooks on ``mixer.in_proj``, sliced by HF's own mixer sizes,
  harness/references/reference.py); z is ``mixer.inner_norm.hook_gate`` (TL's name), read where
  the gated norm takes it (``mixer.norm``'s ``in[1]``).  A dt bug hides in the whole row (H of
  2I + 2GN + H columns): that is why the split is compared on its own.
- ``blocks.{i}.mixer.inner_norm.hook_in`` / ``hook_out``: the gated norm's first input (the SSM
  output that ``vllm::mamba_mixer2`` wrote: conv, scan, D skip) and its output, weight included,
  as TL's ``GatedRMSNormBridge`` hooks HF's ``MambaRMSNormGated``.  The norm is a ``CustomOp``
  whose ``forward(*args)`` binds no names: reads are positional (``in[0]``, ``in[1]``).
- ``blocks.{i}.mixer.hook_out``: the mixer's output (``out_proj``'s, bias included).
- ``embed.hook_out``, ``ln_final.hook_normalized`` (``norm_f``'s ``out[0]`` / weight),
  ``unembed.hook_out`` (the logits processor, every call, stitched), as in decoders.

Traps:

- The SSM itself (conv1d, the SSD chunk scan with its state passing, ``dt_bias`` / ``A`` /
  ``D``) runs inside the custom op ``vllm::mamba_mixer2``: no module is called there, so its
  intermediates are non-firing and its parameters are gated through ``inner_norm.hook_in``
  (the op's output) and everything after it.  ``conv1d`` only holds weights for that op.
- HF's gated norm (``MambaRMSNormGated``, transformers 5.19) normalizes the whole inner width; vLLM's
  ``Mixer2RMSNormGated`` (like mamba_ssm's ``RMSNormGated(group_size=d_ssm // ngroups)``) normalizes
  each of ``n_groups`` groups: a reference bug (open upstream, huggingface/transformers PR 40861,
  Mamba-Codestral has ``n_groups`` 8), and TransformerBridge wraps HF's module.  With ``n_groups`` 2
  ``inner_norm.hook_in`` and ``hook_gate`` pass, ``inner_norm.hook_out`` fails against both references,
  and without a correction everything after it would too.  Declared as data
  (harness.comparison.known_issues.GATED_NORM_BUGS): for ``n_groups`` > 1 every reference runs with the
  group-wise norm downstream of HF's (harness.references.reference.group_wise_gated_norm: ``out_proj``'s
  input replaced, the norm's own output left HF's), so ``mixer.hook_out`` and everything after are gated
  against the model as defined, and the ``inner_norm.hook_out`` rows are explained only where the bug's
  signature holds on the run's captures (HF's output is a whole-width gated norm of its own input,
  vLLM's the per-group one of its); a transformers that groups makes them an error saying to retire the
  entry.  With ``n_groups`` 1 the two norms agree and every row compares as is (family ``mamba2``;
  ``mamba2_groups`` has two groups).
- No attention: no q/k/v, scores or pattern, so nothing is derived; no MLP and no
  ``hook_resid_mid`` (one sublayer per block).
- HF's ``residual_in_fp32`` keeps the residual in fp32 in a bf16 run; vLLM's fused add-norm keeps it
  in the run dtype.  In fp32 they are the same arithmetic; in bf16 the difference is one rounding
  of the stream per layer, below the bf16 tolerance.
"""
from __future__ import annotations

from typing import Any

from .base import Cols, HookSpec, NonFiring, Overlay, config_get
from .mamba_backbone import backbone_specs

_BRIDGE_ONLY_HF = (("bridge", None),)

_SSM_STATE = ("inside vLLM's custom op vllm::mamba_mixer2 (causal conv, SSD chunk scan, state passing, D "
              "skip): no module is called there, so no hook can read it; its result is "
              "mixer.inner_norm.hook_in")
NONFIRING: tuple[NonFiring, ...] = (
    NonFiring("blocks.{i}.mixer.conv1d.hook_out",
              "vLLM never calls conv1d as a module: it only holds the weights vllm::mamba_mixer2 hands to "
              "causal_conv1d_fn / causal_conv1d_update (and TransformerBridge's conv1d hook does not fire "
              "on HF's CPU path either)"),
    NonFiring("blocks.{i}.mixer.hook_ssm_state", _SSM_STATE + " (TL fires it only on its opt-in eager scan)"),
    NonFiring("blocks.{i}.mixer.hook_ssm_write", _SSM_STATE + " (TL fires it only on its opt-in eager scan)"),
    *(NonFiring(f"blocks.{{i}}.attn.{h}", "Mamba-2 is attention-free: no attention module, no per-position "
                                          "attention tensors (TL's effective attention is a post-hoc computation)")
      for h in ("hook_q", "hook_k", "hook_v", "hook_z", "hook_attn_scores", "hook_pattern")),
    NonFiring("blocks.{i}.hook_resid_mid", "one sublayer (the mixer) per block: no mid-block residual"),
    NonFiring("blocks.{i}.mlp.hook_out", "Mamba-2 has no MLP: the gated norm and out_proj are the mixer's"),
)


def ssm_sizes(cfg: Any) -> tuple[int, int, int]:
    """``(I, conv_dim, H)``: inner width, the conv's width (x, B, C) and the number of heads."""
    d_model = int(config_get(cfg, "hidden_size"))
    inner = int(config_get(cfg, "intermediate_size", default=int(config_get(cfg, "expand", default=2)) * d_model))
    conv_dim = inner + 2 * int(config_get(cfg, "n_groups", default=1)) * int(config_get(cfg, "state_size"))
    return inner, conv_dim, int(config_get(cfg, "num_heads"))


def mixer_specs(b: str, mixer: str, inner: int, conv_dim: int, heads: int) -> dict[str, HookSpec]:
    """A Mamba-2 mixer's inner hooks at vLLM module path ``mixer`` for block ``b`` (``blocks.{i}``), in
    forward order: ``in_proj``'s output and its xBC / dt columns, the gated norm's input, gate and
    output, each with its HF row (module doc).  Shared by every tree with Mamba-2 layers
    (:mod:`overlays.nemotron_h`)."""
    return {
        f"{b}.mixer.in_proj.hook_out": HookSpec(f"{mixer}.in_proj", "out[0]", (), inner + conv_dim + heads,
                                                references=(("hf", f"{b}.mixer.in_proj.hook_out"),)),
        f"{b}.mixer.in_proj.hook_xBC": HookSpec(
            f"{mixer}.in_proj", "out[0]", (Cols(inner, inner + conv_dim),), conv_dim,
            references=_BRIDGE_ONLY_HF + (("hf", f"{b}.mixer.in_proj.hook_xBC"),)),
        f"{b}.mixer.in_proj.hook_dt": HookSpec(
            f"{mixer}.in_proj", "out[0]", (Cols(inner + conv_dim, inner + conv_dim + heads),), heads,
            references=_BRIDGE_ONLY_HF + (("hf", f"{b}.mixer.in_proj.hook_dt"),)),
        **{f"{b}.mixer.inner_norm.{name}": HookSpec(f"{mixer}.norm", read, (), inner,
                                                    references=(("hf", f"{b}.mixer.inner_norm.{name}"),))
           for name, read in (("hook_in", "in[0]"), ("hook_gate", "in[1]"), ("hook_out", "out"))},
    }


class Mamba2Overlay(Overlay):
    """Mamba-2: embeddings, mixer-only blocks with fused residual pairs, final norm, logits."""

    name = "mamba2"
    norm_weight_offset = 0.0  # RMS norms store the weight itself (overlays.norm_weight_offset)

    def hook_specs(self, hf_config: Any) -> dict[str, HookSpec]:
        d_model = int(config_get(hf_config, "hidden_size"))
        inner, conv_dim, heads = ssm_sizes(hf_config)

        def mixer(b: str, path: str) -> dict[str, HookSpec]:
            return {**mixer_specs(b, path, inner, conv_dim, heads),
                    f"{b}.mixer.hook_out": HookSpec(path, "out", (), d_model,
                                                    references=(("hf", f"{b}.mixer.hook_out"),))}
        return backbone_specs(hf_config, mixer)

    def nonfiring(self) -> list[NonFiring]:
        return list(NONFIRING)


__all__ = ["NONFIRING", "Mamba2Overlay", "mixer_specs", "ssm_sizes"]
