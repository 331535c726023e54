"""OPT overlay: vLLM's ``OPTForCausalLM`` tree, learned positions, LayerNorm.

Module tree: ``model.decoder.embed_tokens`` and ``model.decoder.embed_positions``
(``OPTLearnedPositionalEmbedding``: it adds OPT's offset of 2 to the position
ids itself), ``model.decoder.layers.{i}`` (``self_attn_layer_norm``,
``self_attn`` with fused ``qkv_proj`` -> ``attn`` -> ``out_proj``,
``final_layer_norm``, ``fc1`` -> ``activation_fn`` -> ``fc2``),
``model.decoder.final_layer_norm``.  Written for ``do_layer_norm_before=True``
(every OPT but the 350m one); with it False the norms sit after the residual
adds and ``ln*.hook_normalized`` would read different tensors.

Conversions, hook by hook (they differ from :mod:`overlays.decoder_only`):

- Residual stream.  ``OPTDecoderLayer`` takes and returns the full stream as
  one tensor: ``blocks.{i}.hook_in`` / ``hook_out`` are the layer's input /
  output; ``hook_resid_mid`` is the layer's ``final_layer_norm`` input (OPT
  names its *per-layer* pre-MLP norm ``final_layer_norm``; the model's last
  norm is ``model.decoder.final_layer_norm``).
- Positions.  ``embed.hook_out`` is ``embed_tokens``'s output alone,
  ``pos_embed.hook_out`` is ``embed_positions``'s (offset applied inside it,
  as in HF); ``blocks.0.hook_in`` is their sum.
- LayerNorm un-fold ``(y - b) / w`` (TL's ``hook_normalized`` is before weight
  and bias).
- No MLP module: ``fc1`` / ``fc2`` hang off the layer, so ``mlp.hook_in`` is
  ``fc1``'s input, ``mlp.hook_pre`` its output (before ReLU),
  ``mlp.hook_post`` ``fc2``'s input and ``mlp.hook_out`` ``fc2``'s output.
- ``qkv_proj`` returns ``[q | k | v]`` (multi-head); no rotary, so the derived
  attention scores use ``hook_q`` / ``hook_k``.  ``hook_z`` is ``out_proj``'s
  input.
"""
from __future__ import annotations

from typing import Any

from .base import Cols, Heads, HookSpec, config_get
from .decoder_only import DecoderOnlyOverlay


class OPTOverlay(DecoderOnlyOverlay):
    """OPT: model.decoder.layers.{i}, learned positions (offset 2), LayerNorm, fc1/fc2."""

    name = "opt"
    score_inputs = ("attn.hook_q", "attn.hook_k")

    def dims(self, cfg: Any) -> dict[str, int]:
        return {**super().dims(cfg), "d_mlp": int(config_get(cfg, "ffn_dim"))}

    layer_norm_bias = True

    def layer_specs(self, i: int, d: dict[str, int]) -> dict[str, HookSpec]:
        L, b = f"model.decoder.layers.{i}", f"blocks.{i}"
        A = f"{L}.self_attn"
        D, q, dm = d["d_model"], d["n_heads"] * d["head_dim"], d["d_mlp"]
        qh = Heads(d["n_heads"], d["head_dim"])
        ln1, ln2 = f"{L}.self_attn_layer_norm", f"{L}.final_layer_norm"
        return {
            f"{b}.hook_in": HookSpec(L, "in.hidden_states", width=D),
            f"{b}.ln1.hook_normalized": HookSpec(ln1, "out", (self.unfold(ln1),), D),
            f"{b}.attn.hook_in": HookSpec(A, "in.hidden_states", width=D),
            f"{b}.attn.hook_q": HookSpec(f"{A}.qkv_proj", "out[0]", (Cols(0, q), qh), q),
            f"{b}.attn.hook_k": HookSpec(f"{A}.qkv_proj", "out[0]", (Cols(q, 2 * q), qh), q),
            f"{b}.attn.hook_v": HookSpec(f"{A}.qkv_proj", "out[0]", (Cols(2 * q, 3 * q), qh), q),
            f"{b}.attn.hook_z": HookSpec(f"{A}.out_proj", "in[0]", (qh,), q),
            f"{b}.attn.hook_out": HookSpec(A, "out", width=D),
            f"{b}.hook_resid_mid": HookSpec(ln2, "in[0]", width=D),
            f"{b}.ln2.hook_normalized": HookSpec(ln2, "out", (self.unfold(ln2),), D),
            f"{b}.mlp.hook_in": HookSpec(f"{L}.fc1", "in[0]", width=D),
            f"{b}.mlp.hook_pre": HookSpec(f"{L}.fc1", "out[0]", width=dm),
            f"{b}.mlp.hook_post": HookSpec(f"{L}.fc2", "in[0]", width=dm),
            f"{b}.mlp.hook_out": HookSpec(f"{L}.fc2", "out[0]", width=D),
            f"{b}.hook_out": HookSpec(L, "out", width=D),
        }

    def hook_specs(self, cfg: Any) -> dict[str, HookSpec]:
        d = self.dims(cfg)
        P = "model.decoder"
        specs = {
            "embed.hook_out": HookSpec(f"{P}.embed_tokens", "out", width=d["d_model"]),
            "pos_embed.hook_out": HookSpec(f"{P}.embed_positions", "out", width=d["d_model"]),
        }
        for i in range(d["n_layers"]):
            specs.update(self.layer_specs(i, d))
        specs["ln_final.hook_normalized"] = HookSpec(f"{P}.final_layer_norm", "out",
                                                     (self.unfold(f"{P}.final_layer_norm"),), d["d_model"])
        unembed = self.unembed_spec(cfg)
        if unembed is not None:
            specs["unembed.hook_out"] = unembed
        return specs
