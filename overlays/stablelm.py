"""StableLM overlay: the Llama-shaped tree with LayerNorm and an unfused residual.

Module tree as in :mod:`overlays.decoder_only` (``model.layers.{i}`` with
``input_layernorm``, ``self_attn`` (``qkv_proj`` -> ``rotary_emb`` -> ``attn`` ->
``o_proj``), ``post_attention_layernorm``, ``mlp`` (``gate_up_proj`` ->
``down_proj``), ``model.norm``), but three things differ:

- Residual stream.  vLLM's ``StablelmDecoderLayer`` adds its residuals itself
  and returns ``(hidden_states, residual)`` where ``hidden_states`` is the
  *whole* stream after the block and ``residual`` the stream after attention
  (no fused add-norm): ``blocks.{i}.hook_out`` reads ``out[0]`` alone (summing
  ``out[0]+out[1]`` as the Llama tree does would double-count), ``hook_in``
  reads ``in.hidden_states``, ``hook_resid_mid`` ``post_attention_layernorm``'s
  input.
- Norms are ``torch.nn.LayerNorm`` with bias: TL's ``hook_normalized`` is
  ``(x - mean) / std`` before weight and bias, so ``ln1``, ``ln2`` and
  ``ln_final`` un-fold with ``(y - b) / w``.
- Partial rotary (``partial_rotary_factor``): vLLM's ``rotary_emb`` rotates the
  first ``rotary_dim`` dims of each head and passes the rest through, and
  returns the full ``[q | pass]`` heads, as TL's ``hook_rot_q`` / ``hook_rot_k``
  hold them; no conversion beyond the head split.  q/k/v carry biases
  (``use_qkv_bias``) inside ``qkv_proj``'s output.
"""
from __future__ import annotations


from .base import HookSpec
from .decoder_only import DecoderOnlyOverlay


class StableLMOverlay(DecoderOnlyOverlay):
    """StableLM: Llama tree, LayerNorm with bias, residual added inside the layer."""

    name = "stablelm"

    layer_norm_bias = True

    def layer_specs(self, i: int, d: dict[str, int]) -> dict[str, HookSpec]:
        specs = super().layer_specs(i, d)
        L, b, D = f"model.layers.{i}", f"blocks.{i}", d["d_model"]
        ln1, ln2 = f"{L}.input_layernorm", f"{L}.post_attention_layernorm"
        specs.update({
            f"{b}.hook_in": HookSpec(L, "in.hidden_states", width=D),
            f"{b}.ln1.hook_normalized": HookSpec(ln1, "out", (self.unfold(ln1),), D),
            f"{b}.hook_resid_mid": HookSpec(ln2, "in[0]", width=D),
            f"{b}.ln2.hook_normalized": HookSpec(ln2, "out", (self.unfold(ln2),), D),
            f"{b}.hook_out": HookSpec(L, "out[0]", width=D),
        })
        return specs
