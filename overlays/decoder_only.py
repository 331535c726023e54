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
  zeros in principle; synthetic ones never do (see harness.models.checkpoints).
- Fused projections.  ``qkv_proj`` returns ``[q | k | v]`` concatenated
  (grouped-query: k and v are ``n_kv_heads * head_dim`` wide); ``gate_up_proj``
  returns ``[gate | up]``.  Both are sliced by column and split into heads.
  ``hook_q``/``hook_k`` are the projections before any q/k norm and rotary,
  as in TransformerLens; ``hook_rot_q``/``hook_rot_k`` are the rotary
  embedding's outputs (after q/k norm where the architecture has one).
- ``hook_z`` is ``o_proj``'s input, split into heads.
- ``unembed.hook_out`` is vLLM's own logits processor (``logits_processor``
  at the model root), read on *every* call: with prompt log-probs requested
  vLLM calls it once for the sampled last position ([1, V]) and once for the
  prompt positions ([T-1, V]); the calls are stitched by row count.  Its
  output is after vLLM's logit ``scale`` (Granite's ``1 / logits_scaling``),
  which is divided out; a final logit soft-cap (Gemma-2) cannot be undone
  (tanh saturates), so soft-capped configs declare it non-firing.
- ``attn.hook_attn_scores`` / ``attn.hook_pattern`` never exist in vLLM (its
  attention kernel fuses them); they are *derived* host-side from the
  captured rotated q and k (:attr:`score_inputs`) with the config's attention
  scale, grouped-query repeat, causal / sliding-window mask and logit
  soft-cap, and reported as derived (:mod:`harness.comparison.derived`).
"""
from __future__ import annotations

from typing import Any

from .base import (Cols, Derived, DropBatch, Heads, HookSpec, Mul, NonFiring, Overlay, SwapAxes, UnfoldNorm,
                   config_get, expand_layers)


class DecoderOnlyOverlay(Overlay):
    """Llama-shaped vLLM decoder (model.layers.{i}.self_attn / mlp, fused residual)."""

    name = "decoder_only"
    norm_offset = 0.0  # 1.0 where norms multiply by (1 + w)
    layer_norm_bias = False  # LayerNorm with a bias (GPT-2, OPT, NeoX, StableLM, StarCoder2): un-fold is (y - b) / w
    # Layer-free hooks the attention scores are derived from: rotated q/k here;
    # ("attn.hook_q", "attn.hook_k") for an architecture without rotary
    # embeddings; None where scores cannot be derived (then they are non-firing).
    score_inputs: tuple[str, str] | None = ("attn.hook_rot_q", "attn.hook_rot_k")
    # Per-head q/k RMSNorm before rotary (Qwen3, Qwen3-MoE, Gemma-3): offer
    # attn.q_norm/k_norm.hook_normalized, un-folded and moved to TL's heads-first layout.
    qk_norm = False
    # Overlays whose reads may sit on HF modules (see TransformersBackend): conversions first
    # applied to every such read, and the read of the attention module's return.
    batch: tuple = ()
    attn_out = "out"

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
        """Un-fold a norm's affine part: ``÷ (w + offset)``, after ``- b`` for a LayerNorm with bias."""
        return UnfoldNorm(f"{module}.weight", self.norm_offset,
                          bias=f"{module}.bias" if self.layer_norm_bias else None)

    def qk_norm_specs(self, i: int, d: dict[str, int]) -> dict[str, HookSpec]:
        """vLLM normalizes q/k as ``[T, heads, d_head]``; TL's norm hooks are ``[heads, T, d_head]``."""
        if not self.qk_norm:
            return {}
        A, b = f"model.layers.{i}.self_attn", f"blocks.{i}"
        q, kv = d["n_heads"] * d["head_dim"], d["n_kv"] * d["head_dim"]
        return {
            f"{b}.attn.q_norm.hook_normalized": HookSpec(
                f"{A}.q_norm", "out", (self.unfold(f"{A}.q_norm"), SwapAxes(0, 1)), q),
            f"{b}.attn.k_norm.hook_normalized": HookSpec(
                f"{A}.k_norm", "out", (self.unfold(f"{A}.k_norm"), SwapAxes(0, 1)), kv),
        }

    def rotary_specs(self, A: str, b: str, d: dict[str, int]) -> dict[str, HookSpec]:
        """``hook_rot_q`` / ``hook_rot_k``: the outputs of the attention's rotary-embedding module
        ``{A}.rotary_emb`` (``(q, k)``, flat), split into heads."""
        q, kv = d["n_heads"] * d["head_dim"], d["n_kv"] * d["head_dim"]
        return {f"{b}.attn.hook_rot_q": HookSpec(f"{A}.rotary_emb", "out[0]", (Heads(d["n_heads"], d["head_dim"]),), q),
                f"{b}.attn.hook_rot_k": HookSpec(f"{A}.rotary_emb", "out[1]", (Heads(d["n_kv"], d["head_dim"]),), kv)}

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
            **self.qk_norm_specs(i, d),
            **self.rotary_specs(A, b, d),
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
        unembed = self.unembed_spec(cfg)
        if unembed is not None:
            specs["unembed.hook_out"] = unembed
        return specs

    def unembed_spec(self, cfg: Any) -> HookSpec | None:
        """vLLM's logits processor, every call; ``None`` where its output cannot be
        turned back into the pre-cap logits TransformerBridge's hook holds."""
        if config_get(cfg, "final_logit_softcapping"):
            return None
        # vLLM: LogitsProcessor(scale=logit_scale / logits_scaling); the bridge's
        # unembed.hook_out is the plain lm_head output (measured on Granite).
        scale = float(config_get(cfg, "logit_scale", default=1.0)) / float(
            config_get(cfg, "logits_scaling", default=1.0))
        return HookSpec("logits_processor", "out", (Mul(1.0 / scale),) if scale != 1.0 else (),
                        int(config_get(cfg, "vocab_size")), calls="all")

    # -- derived hooks: read from the HF config, generically -------------------
    def attn_scale(self, cfg: Any) -> float:
        multiplier = config_get(cfg, "attention_multiplier")  # Granite
        if multiplier is not None:
            return float(multiplier)
        scalar = config_get(cfg, "query_pre_attn_scalar")  # Gemma 2/3
        if scalar is not None:
            return float(scalar) ** -0.5
        return float(self.dims(cfg)["head_dim"]) ** -0.5

    def sliding_window(self, cfg: Any, layer: int) -> int | None:
        """HF's rule: ``layer_types`` names the sliding layers where present;
        otherwise a set ``sliding_window`` (not switched off by
        ``use_sliding_window=False``) applies to every layer."""
        window = config_get(cfg, "sliding_window")
        if not window:
            return None
        types = config_get(cfg, "layer_types")
        if types is not None:
            return int(window) if types[layer] == "sliding_attention" else None
        if config_get(cfg, "use_sliding_window") is False:
            return None
        return int(window)

    def derived_specs(self, cfg: Any) -> dict[str, Derived]:
        if self.score_inputs is None:
            return {}
        captured = self.hook_specs(cfg)
        scale, softcap = self.attn_scale(cfg), config_get(cfg, "attn_logit_softcapping")
        out: dict[str, Derived] = {}
        for i in range(self.dims(cfg)["n_layers"]):
            inputs = tuple(f"blocks.{i}.{h}" for h in self.score_inputs)
            if not all(h in captured for h in inputs):
                continue
            common = dict(inputs=inputs, scale=scale, window=self.sliding_window(cfg, i),
                          softcap=float(softcap) if softcap else None)
            out[f"blocks.{i}.attn.hook_attn_scores"] = Derived("attn_scores", **common)
            out[f"blocks.{i}.attn.hook_pattern"] = Derived("pattern", **common)
        return out

    # Hooks a config may leave unoffered, with the reason; a subclass that drops
    # one for another reason lists it in nonfiring() with its own reason instead.
    _UNOFFERED = {
        "blocks.{i}.attn.hook_attn_scores":
            "vLLM's attention kernel fuses QK^T, mask and softmax; scores never exist as a tensor, "
            "and this overlay captures no q/k to derive them from",
        "blocks.{i}.attn.hook_pattern":
            "vLLM's attention kernel fuses softmax with the value product; the pattern never exists "
            "as a tensor, and this overlay captures no q/k to derive it from",
        "unembed.hook_out":
            "vLLM's logits processor applies the final logit soft-cap (tanh) in the same call; the "
            "bridge's unembed.hook_out is before the cap and tanh saturates, so it cannot be recovered "
            "(the capped logits are compared as log-probs)",
    }

    def nonfiring_for(self, cfg: Any) -> list[NonFiring]:
        """:meth:`nonfiring` plus each of :attr:`_UNOFFERED` this config offers no layer of."""
        listed = self.nonfiring()
        offered = set(self.hook_specs(cfg)) | set(self.derived_specs(cfg))
        n_layers = self.dims(cfg)["n_layers"]
        return listed + [NonFiring(t, why) for t, why in self._UNOFFERED.items()
                         if t not in {nf.template for nf in listed}
                         and not offered & set(expand_layers(t, n_layers))]

    def nonfiring(self) -> list[NonFiring]:
        return []


class TransformersBackend:
    """Mixin for an overlay of an architecture vLLM runs through its Transformers modeling
    backend (HF's modules, vLLM layers swapped in): HF modules see ``[1, T, ...]`` (every read
    starts with ``DropBatch``), HF attention modules return ``(output, weights)`` (``out[0]``),
    and HF rotates q/k in a function (``apply_rotary_pos_emb``) before calling vLLM's attention
    as ``attn.forward(q, k, v)``, bypassing module hooks: no rotated q/k to capture, so no
    derived scores / pattern (the overlay's ``nonfiring`` says why).  Put it first in the bases."""

    batch = (DropBatch(),)
    attn_out = "out[0]"
    score_inputs = None

    def rotary_specs(self, A: str, b: str, d: dict[str, int]) -> dict[str, HookSpec]:
        return {}


__all__ = ["DecoderOnlyOverlay", "Mul", "TransformersBackend"]
