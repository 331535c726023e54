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
  scores / pattern (DecoderOnlyOverlay reads them from the config).  The final
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

from .base import HookSpec
from .gemma import GemmaOverlay


class Gemma2Overlay(GemmaOverlay):
    """Gemma-2: Gemma tree plus sandwich norms (pre/post attention and feed-forward)."""

    name = "gemma2"

    def layer_specs(self, i: int, d: dict[str, int]) -> dict[str, HookSpec]:
        base = super().layer_specs(i, d)
        L, b, D = f"model.layers.{i}", f"blocks.{i}", d["d_model"]
        post_attn, pre_ff = f"{L}.post_attention_layernorm", f"{L}.pre_feedforward_layernorm"
        post_ff = f"{L}.post_feedforward_layernorm"
        sandwich = {
            f"{b}.ln1_post.hook_normalized": HookSpec(post_attn, "out", (self.unfold(post_attn),), D),
            f"{b}.ln1_post.hook_out": HookSpec(post_attn, "out", width=D,
                                               references=(("compat", f"{b}.hook_attn_out"),)),
            f"{b}.hook_resid_mid": HookSpec(pre_ff, "in[0]+in[1]", width=D),
            f"{b}.ln2.hook_normalized": HookSpec(pre_ff, "out[0]", (self.unfold(pre_ff),), D),
        }
        post = {
            f"{b}.ln2_post.hook_normalized": HookSpec(post_ff, "out", (self.unfold(post_ff),), D),
            f"{b}.ln2_post.hook_out": HookSpec(post_ff, "out", width=D,
                                               references=(("compat", f"{b}.hook_mlp_out"),)),
        }
        out: dict[str, HookSpec] = {}
        for hook, spec in base.items():
            if hook == f"{b}.hook_resid_mid":  # re-inserted after ln1_post, in forward order
                out.update(sandwich)
            elif hook == f"{b}.ln2.hook_normalized":
                continue
            elif hook in (f"{b}.attn.hook_out", f"{b}.mlp.hook_out"):  # legacy alias is the post-normed one
                out[hook] = replace(spec, references=(("compat", None),))
            elif hook == f"{b}.hook_out":
                out.update(post)
                out[hook] = spec
            else:
                out[hook] = spec
        return out


class Gemma3Overlay(Gemma2Overlay):
    """Gemma-3 text: Gemma-2's sandwich-norm tree plus per-head q/k norms."""

    name = "gemma3"
    qk_norm = True
