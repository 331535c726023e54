"""OLMoE overlay: Mixtral's MoE hooks at ``mlp`` with OLMo-2's whole-projection q/k norms.

vLLM's ``OlmoeDecoderLayer`` (``model.layers.{i}``) is Llama-shaped: ``input_layernorm`` /
``post_attention_layernorm`` as fused add-norms and a ``(delta, residual)`` return, ``self_attn``
with fused ``qkv_proj`` -> ``q_norm`` / ``k_norm`` -> ``rotary_emb`` -> ``attn`` -> ``o_proj``, and
the MoE block ``mlp`` (``OlmoeMoE``: router ``gate``, fused-MoE runner ``experts``).  Hook by hook:

- q/k norms normalize the whole q (``n_heads * head_dim``) and k (``n_kv_heads * head_dim``)
  projections, not each head (HF's ``OlmoeAttention`` and vLLM's alike): ``QK_WHOLE``, as
  :data:`overlays.olmo2.OLMO2` -- ``attn.q_norm.hook_normalized`` un-folds ``q_norm``'s output,
  ``attn.hook_q_normed`` is that output; ``hook_rot_q`` / ``hook_rot_k`` follow the norms.
- MoE: :data:`overlays.mixtral.MIXTRAL`'s router logits, router's choice and per-expert
  non-firing hooks.
- Trap: vLLM hard-codes every norm's eps to 1e-5 (``RMSNorm(..., eps=1e-5)``) whatever
  ``rms_norm_eps`` says; the family row sets 1e-5 so both engines compute the same model.
"""
from __future__ import annotations

from dataclasses import replace

from .mixtral import MIXTRAL
from .tree import QK_WHOLE, TreeOverlay

OLMOE = replace(MIXTRAL, name="olmoe", mlp=replace(MIXTRAL.mlp, module="mlp"),
                attention=replace(MIXTRAL.attention, qk_norm=QK_WHOLE))


class OlmoeOverlay(TreeOverlay):
    """OLMoE: MoE block at ``mlp``; q/k norms over the whole projections."""

    tree = OLMOE


__all__ = ["OLMOE", "OlmoeOverlay"]
