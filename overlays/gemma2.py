"""Gemma-2 and Gemma-3 (text) overlays: Gemma's tree with sandwich norms.

vLLM's ``Gemma2DecoderLayer`` / ``Gemma3DecoderLayer`` (``model.layers.{i}``)
run ``input_layernorm -> self_attn -> post_attention_layernorm`` then
``pre_feedforward_layernorm -> mlp -> post_feedforward_layernorm``, and return
``(post_ff_normed_mlp, residual)`` like the Llama tree, so the residual-stream
hooks keep :mod:`overlays.decoder_only`'s fused reads.  Conversions, hook by
hook, on top of :mod:`overlays.gemma` (embedding x ``sqrt(d_model)``,
``(1 + w)`` norms un-folded with ``÷ (1 + w)``):

- ``attn.hook_out`` is ``self_attn``'s output, *before* the post-attention
  norm: TransformerBridge takes it at ``o_proj``'s output (it equals
  ``ln1_post.hook_in``).  ``ln1_post.hook_out`` (what joins the residual) is
  ``post_attention_layernorm``'s output, called without a residual so it
  returns a bare tensor; ``ln1_post.hook_normalized`` un-folds it.  Likewise
  ``mlp.hook_out`` is ``mlp``'s output before ``post_feedforward_layernorm``,
  and ``ln2_post.hook_out`` / ``hook_normalized`` are that norm's output.
- ``ln2`` is ``pre_feedforward_layernorm`` (not ``post_attention_layernorm`` as
  in Llama): vLLM calls it as the fused add-norm ``(x, residual)``, so
  ``hook_resid_mid`` is the sum of its two inputs and ``ln2.hook_normalized``
  un-folds its ``out[0]``.
- Trap: TransformerLens's legacy (compatibility-mode) ``hook_attn_out`` /
  ``hook_mlp_out`` are the *post-normed* sublayer outputs here
  (``ln1_post.hook_out`` / ``ln2_post.hook_out``, measured equal), as in
  HookedTransformer's Gemma-2 block, not ``attn.hook_out`` / ``mlp.hook_out``
  (which differ from them by the post-norm, ~3x in RMS): ``HookSpec.references``
  moves the compat rows to the post-norm hooks.
- Attention-logit soft-capping, ``query_pre_attn_scalar`` scaling and the
  sliding window (``layer_types``) happen inside vLLM's fused attention
  kernel: they show in ``hook_z`` and downstream, and in the derived
  scores / pattern (the builder, overlays.tree, reads them from the config).  The final
  logit soft-cap is applied inside vLLM's logits processor, so
  ``unembed.hook_out`` (pre-cap in TL) is non-firing where it is set.

Gemma-3 adds per-head q/k RMS norms (``self_attn.q_norm`` / ``k_norm``, ``(1 +
w)``), run by vLLM on ``[T, heads, head_dim]`` before rotary: their
``hook_normalized`` un-folds the output and swaps to TL's heads-first
``[heads, T, head_dim]`` layout.  ``hook_rot_q`` / ``hook_rot_k`` are after
q/k norm and rotary, as in TL.  Gemma-3's sliding layers use a local rope base
distinct from the global layers': vLLM builds one rotary module per base and
shares it across the layers using it (the worker maps the n-th call of a
shared module to the n-th layer path).
"""
from __future__ import annotations

from dataclasses import replace

from .gemma import GEMMA
from .tree import QK_PER_HEAD, TreeOverlay

# sandwich norms: ln2 is the pre-feed-forward norm (the fused add-norm: FUSED_PAIR's reads stay);
# the post-norms make ln1_post / ln2_post and carry the legacy hook_attn_out / hook_mlp_out
GEMMA2 = replace(GEMMA, name="gemma2",
                 norms=replace(GEMMA.norms, ln2="pre_feedforward_layernorm",
                               ln1_post="post_attention_layernorm", ln2_post="post_feedforward_layernorm"))
GEMMA3 = replace(GEMMA2, name="gemma3", attention=replace(GEMMA2.attention, qk_norm=QK_PER_HEAD))


class Gemma2Overlay(TreeOverlay):
    """Gemma-2: Gemma tree plus sandwich norms (pre/post attention and feed-forward)."""

    tree = GEMMA2


class Gemma3Overlay(TreeOverlay):
    """Gemma-3 text: Gemma-2's sandwich-norm tree plus per-head q/k norms."""

    tree = GEMMA3


__all__ = ["GEMMA2", "GEMMA3", "Gemma2Overlay", "Gemma3Overlay"]
