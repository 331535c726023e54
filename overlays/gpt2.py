"""GPT-2 overlay: vLLM's ``GPT2LMHeadModel`` tree, plain residual, LayerNorm.

Module tree: ``transformer.wte`` (tokens) and ``transformer.wpe`` (learned
positions), ``transformer.h.{i}`` (``ln_1``, ``attn`` with fused ``c_attn`` ->
``attn`` -> ``c_proj``, ``ln_2``, ``mlp`` with ``c_fc`` -> ``act`` ->
``c_proj``), ``transformer.ln_f``.  HF stores ``c_attn`` / ``c_proj`` / ``c_fc``
as ``Conv1D`` (weight ``[in, out]``); vLLM transposes them at load into its
linear layers, so the outputs are the same tensors and need no conversion.

Conversions, hook by hook (they differ from :mod:`overlays.decoder_only`):

- Residual stream.  ``GPT2Block`` takes and returns the full stream as one
  tensor (no fused ``(delta, residual)`` pair): ``blocks.{i}.hook_in`` is the
  block's input, ``hook_out`` its output, ``hook_resid_mid`` is ``ln_2``'s
  input.
- Positions.  ``embed.hook_out`` is ``wte``'s output alone and
  ``pos_embed.hook_out`` is ``wpe``'s (vLLM adds them in
  ``GPT2Model.forward``); ``blocks.0.hook_in`` is their sum.
- LayerNorm un-fold.  vLLM's ``LayerNorm`` returns ``n * w + b`` with
  ``n = (x - mean) / sqrt(var + eps)``; TL's ``hook_normalized`` is ``n``,
  before the weight *and* the bias, so the un-fold is ``(y - b) / w``
  (``UnfoldNorm(..., bias=...)``).
- ``c_attn`` returns ``[q | k | v]`` (multi-head: each ``d_model`` wide),
  sliced by column and split into heads.  No rotary: the derived attention
  scores use ``hook_q`` / ``hook_k``.  ``hook_z`` is ``attn.c_proj``'s input.
- ``mlp.hook_pre`` is ``c_fc``'s output (before ``gelu_new``),
  ``mlp.hook_post`` is ``mlp.c_proj``'s input.  There is no gate, so no
  ``hook_pre_linear``.
"""
from __future__ import annotations

from typing import Any

from .base import Cols, Heads, HookSpec
from .decoder_only import DecoderOnlyOverlay


class GPT2Overlay(DecoderOnlyOverlay):
    """GPT-2: transformer.h.{i}, learned positions, LayerNorm with bias, plain residual."""

    name = "gpt2"
    score_inputs = ("attn.hook_q", "attn.hook_k")

    layer_norm_bias = True

    def layer_specs(self, i: int, d: dict[str, int]) -> dict[str, HookSpec]:
        L, b = f"transformer.h.{i}", f"blocks.{i}"
        A, M = f"{L}.attn", f"{L}.mlp"
        D, q, dm = d["d_model"], d["n_heads"] * d["head_dim"], d["d_mlp"]
        qh = Heads(d["n_heads"], d["head_dim"])
        return {
            f"{b}.hook_in": HookSpec(L, "in.hidden_states", width=D),
            f"{b}.ln1.hook_normalized": HookSpec(f"{L}.ln_1", "out", (self.unfold(f"{L}.ln_1"),), D),
            f"{b}.attn.hook_in": HookSpec(A, "in.hidden_states", width=D),
            f"{b}.attn.hook_q": HookSpec(f"{A}.c_attn", "out[0]", (Cols(0, q), qh), q),
            f"{b}.attn.hook_k": HookSpec(f"{A}.c_attn", "out[0]", (Cols(q, 2 * q), qh), q),
            f"{b}.attn.hook_v": HookSpec(f"{A}.c_attn", "out[0]", (Cols(2 * q, 3 * q), qh), q),
            f"{b}.attn.hook_z": HookSpec(f"{A}.c_proj", "in[0]", (qh,), q),
            f"{b}.attn.hook_out": HookSpec(A, "out", width=D),
            f"{b}.hook_resid_mid": HookSpec(f"{L}.ln_2", "in[0]", width=D),
            f"{b}.ln2.hook_normalized": HookSpec(f"{L}.ln_2", "out", (self.unfold(f"{L}.ln_2"),), D),
            f"{b}.mlp.hook_in": HookSpec(M, "in[0]", width=D),
            f"{b}.mlp.hook_pre": HookSpec(f"{M}.c_fc", "out[0]", width=dm),
            f"{b}.mlp.hook_post": HookSpec(f"{M}.c_proj", "in[0]", width=dm),
            f"{b}.mlp.hook_out": HookSpec(M, "out", width=D),
            f"{b}.hook_out": HookSpec(L, "out", width=D),
        }

    def hook_specs(self, cfg: Any) -> dict[str, HookSpec]:
        d = self.dims(cfg)
        specs = {
            "embed.hook_out": HookSpec("transformer.wte", "out", width=d["d_model"]),
            "pos_embed.hook_out": HookSpec("transformer.wpe", "out", width=d["d_model"]),
        }
        for i in range(d["n_layers"]):
            specs.update(self.layer_specs(i, d))
        specs["ln_final.hook_normalized"] = HookSpec("transformer.ln_f", "out",
                                                     (self.unfold("transformer.ln_f"),), d["d_model"])
        unembed = self.unembed_spec(cfg)
        if unembed is not None:
            specs["unembed.hook_out"] = unembed
        return specs
