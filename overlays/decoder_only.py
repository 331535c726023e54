"""Generic overlay for vLLM's Llama-shaped decoder-only models.

Module tree: ``model.embed_tokens`` / ``model.layers.{i}`` (``input_layernorm``,
``self_attn`` with fused ``qkv_proj`` -> ``rotary_emb`` -> ``attn`` ->
``o_proj``, ``post_attention_layernorm``, ``mlp`` with fused ``gate_up_proj``
-> ``act_fn`` -> ``down_proj``) / ``model.norm``.  Right for Llama, Qwen2/3,
Mistral and Gemma (with :mod:`overlays.gemma`'s two conversions); families
whose tree differs get their own file.

Traps this overlay handles, hook by hook:

- Fused residual.  A vLLM decoder layer returns ``(delta, residual)`` and the
  *next* norm adds them, so the residual stream is never a tensor of its own.
  ``blocks.{i}.hook_out`` reads ``out[0]+out[1]`` of the layer;
  ``blocks.{i}.hook_in`` reads ``in.hidden_states+in.residual`` of the layer
  (layer 0 gets ``residual=None``: the embedding alone);
  ``blocks.{i}.hook_resid_mid`` reads the two inputs of
  ``post_attention_layernorm``.
- Folded norm weights.  vLLM's norms return ``x * rsqrt(var + eps) * w``;
  TransformerLens's ``hook_normalized`` is taken before ``* w``.  ``ln1``,
  ``ln2`` and ``ln_final`` un-fold with ``÷ w`` (``÷ (1 + w)`` where
  ``norm_offset`` is 1).  Norm weights of a real checkpoint can hold exact
  zeros in principle; synthetic ones never do (see harness.checkpoints).
- Fused projections.  ``qkv_proj`` returns ``[q | k | v]`` concatenated
  (grouped-query: k and v are ``n_kv_heads * head_dim`` wide); ``gate_up_proj``
  returns ``[gate | up]``.  Both are sliced by column and split into heads.
  ``hook_q``/``hook_k`` are the projections before any q/k norm and rotary,
  as in TransformerLens; ``hook_rot_q``/``hook_rot_k`` are the rotary
  embedding's outputs (after q/k norm where the architecture has one).
- ``hook_z`` is ``o_proj``'s input, split into heads.
"""
from __future__ import annotations

from typing import Any

from .base import Cols, Heads, HookSpec, Mul, NonFiring, Overlay, UnfoldNorm, config_get


class DecoderOnlyOverlay(Overlay):
    """Llama-shaped vLLM decoder (model.layers.{i}.self_attn / mlp, fused residual)."""

    name = "decoder_only"
    norm_offset = 0.0  # 1.0 where norms multiply by (1 + w)

    # -- hooks an architecture may change ------------------------------------
    def embed_conversions(self, cfg: Any) -> tuple:
        return ()

    def dims(self, cfg: Any) -> dict[str, int]:
        d_model = config_get(cfg, "hidden_size", "n_embd")
        n_heads = config_get(cfg, "num_attention_heads", "n_head")
        head_dim = config_get(cfg, "head_dim", default=None) or d_model // n_heads
        n_kv = config_get(cfg, "num_key_value_heads", default=None) or n_heads
        d_mlp = config_get(cfg, "intermediate_size", "n_inner", default=None) or 4 * d_model
        return dict(d_model=d_model, n_heads=n_heads, head_dim=head_dim, n_kv=n_kv,
                    d_mlp=d_mlp, n_layers=config_get(cfg, "num_hidden_layers", "n_layer"))

    def unfold(self, module: str) -> UnfoldNorm:
        return UnfoldNorm(f"{module}.weight", self.norm_offset)

    def layer_specs(self, i: int, d: dict[str, int]) -> dict[str, HookSpec]:
        L = f"model.layers.{i}"
        A = f"{L}.self_attn"
        M = f"{L}.mlp"
        q, kv, dm = d["n_heads"] * d["head_dim"], d["n_kv"] * d["head_dim"], d["d_mlp"]
        qh = Heads(d["n_heads"], d["head_dim"])
        kh = Heads(d["n_kv"], d["head_dim"])
        b = f"blocks.{i}"
        return {
            f"{b}.hook_in": HookSpec(L, "in.hidden_states+in.residual", width=d["d_model"]),
            f"{b}.ln1.hook_normalized": HookSpec(f"{L}.input_layernorm", "out[0]",
                                                 (self.unfold(f"{L}.input_layernorm"),), d["d_model"]),
            f"{b}.attn.hook_in": HookSpec(A, "in.hidden_states", width=d["d_model"]),
            f"{b}.attn.hook_q": HookSpec(f"{A}.qkv_proj", "out[0]", (Cols(0, q), qh), q),
            f"{b}.attn.hook_k": HookSpec(f"{A}.qkv_proj", "out[0]", (Cols(q, q + kv), kh), kv),
            f"{b}.attn.hook_v": HookSpec(f"{A}.qkv_proj", "out[0]", (Cols(q + kv, q + 2 * kv), kh), kv),
            f"{b}.attn.hook_rot_q": HookSpec(f"{A}.rotary_emb", "out[0]", (qh,), q),
            f"{b}.attn.hook_rot_k": HookSpec(f"{A}.rotary_emb", "out[1]", (kh,), kv),
            f"{b}.attn.hook_z": HookSpec(f"{A}.o_proj", "in[0]", (qh,), q),
            f"{b}.attn.hook_out": HookSpec(A, "out", width=d["d_model"]),
            f"{b}.hook_resid_mid": HookSpec(f"{L}.post_attention_layernorm", "in[0]+in[1]",
                                            width=d["d_model"]),
            f"{b}.ln2.hook_normalized": HookSpec(f"{L}.post_attention_layernorm", "out[0]",
                                                 (self.unfold(f"{L}.post_attention_layernorm"),),
                                                 d["d_model"]),
            f"{b}.mlp.hook_in": HookSpec(M, "in[0]", width=d["d_model"]),
            f"{b}.mlp.hook_pre": HookSpec(f"{M}.gate_up_proj", "out[0]", (Cols(0, dm),), dm),
            f"{b}.mlp.hook_pre_linear": HookSpec(f"{M}.gate_up_proj", "out[0]", (Cols(dm, 2 * dm),), dm),
            f"{b}.mlp.hook_post": HookSpec(f"{M}.down_proj", "in[0]", width=dm),
            f"{b}.mlp.hook_out": HookSpec(M, "out", width=d["d_model"]),
            f"{b}.hook_out": HookSpec(L, "out[0]+out[1]", width=d["d_model"]),
        }

    # -- the contract ----------------------------------------------------------
    def hook_specs(self, cfg: Any) -> dict[str, HookSpec]:
        d = self.dims(cfg)
        specs = {"embed.hook_out": HookSpec("model.embed_tokens", "out", self.embed_conversions(cfg),
                                            d["d_model"])}
        for i in range(d["n_layers"]):
            specs.update(self.layer_specs(i, d))
        specs["ln_final.hook_normalized"] = HookSpec("model.norm", "out[0]",
                                                     (self.unfold("model.norm"),), d["d_model"])
        return specs

    def nonfiring(self) -> list[NonFiring]:
        return [
            NonFiring("blocks.{i}.attn.hook_attn_scores",
                      "vLLM's attention kernel fuses QK^T, mask and softmax; scores never exist as a tensor"),
            NonFiring("blocks.{i}.attn.hook_pattern",
                      "vLLM's attention kernel fuses softmax with the value product; the pattern never exists as a tensor"),
            NonFiring("unembed.hook_out",
                      "compared as full prompt log-probs from vLLM's own logits processor (see logits rows), not as a hook"),
        ]


__all__ = ["DecoderOnlyOverlay", "Mul"]
