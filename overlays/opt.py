"""OPT overlay: vLLM's ``OPTForCausalLM`` tree, learned positions, LayerNorm (the :data:`OPT` row).

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

from .tree import LAYER_NORM, PLAIN, PLAIN_STREAM, SCORES_FROM_QK, Attention, Mlp, Norms, Tree, TreeOverlay

OPT = Tree(
    "opt", root="model.decoder", pos_embed="embed_positions",
    attention=Attention(out_proj="out_proj", rotary=None, grouped_query=False),
    mlp=Mlp(kind=PLAIN, module=None, up="fc1", down="fc2"),
    norms=Norms(kind=LAYER_NORM, ln1="self_attn_layer_norm", ln2="final_layer_norm", final="final_layer_norm",
                read="out", final_read="out"),
    residual=PLAIN_STREAM, score_inputs=SCORES_FROM_QK, d_mlp_keys=("ffn_dim",), d_mlp_ratio=None,
)


class OPTOverlay(TreeOverlay):
    """OPT: model.decoder.layers.{i}, learned positions (offset 2), LayerNorm, fc1/fc2."""

    tree = OPT


__all__ = ["OPT", "OPTOverlay"]
