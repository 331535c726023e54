"""Module trees as declared rows, and the one builder that expands a row into hook specs.

Contract: a :class:`Tree` is a frozen row saying where each part of a decoder
lives in vLLM's model tree and how it behaves (module names, qkv layout, MLP
kind, norm kind and places, residual style, batch dim, rotary module, q/k
norms, references and non-firing hooks).  :class:`TreeOverlay` turns a row and
an HF config into the :class:`overlays.base.Overlay` contract, in forward
order (reports depend on that order):

    embed.hook_out, [pos_embed.hook_out], then per layer i
      hook_in, [ln1.hook_normalized], attn.hook_in, attn.hook_q/k/v,
      [q/k norm hooks], [attn.hook_rot_q/k], attn.hook_z, attn.hook_out,
      [ln1_post.hook_normalized/hook_out | hook_attn_out], [hook_resid_mid],
      [ln2.hook_normalized], mlp.hook_in, [mlp.gate.hook_out, [mlp.shared_experts.hook_*]],
      [mlp.hook_pre, [mlp.hook_pre_linear], mlp.hook_post], mlp.hook_out,
      [ln2_post.hook_normalized/hook_out | hook_mlp_out], hook_out,
    ln_final.hook_normalized, [unembed.hook_out].

The defaults of every row are the Llama tree (:data:`overlays.decoder_only.DECODER`),
so a family's row is ``replace(<a base row>, <what differs>)``.  Hook
semantics (why each read and conversion is right) live in the family modules'
docstrings; the rules this builder applies to every row:

- ``batch`` conversions (``DropBatch`` under vLLM's Transformers backend) lead
  every read except ``unembed.hook_out`` (vLLM's own logits processor, ``[T, V]``).
- Legacy ``hook_attn_out`` / ``hook_mlp_out`` (compatibility mode) name what is
  *added to the stream*: with post-norms (``ln1_post`` / ``ln2_post``) that is
  the post-norm's output, with a ``residual_scale`` (Granite) an extra hook of
  the sublayer output times the multiplier; either way ``attn.hook_out`` /
  ``mlp.hook_out`` lose their compatibility alias.
- Multi-head latent attention (``qkv_layout=MLA``, DeepSeek) replaces q/k/v by
  ``attn.hook_q_latent`` / ``hook_kv_latent`` (and their norms' ``hook_normalized``),
  ``hook_rot_q/k``, the final ``hook_q`` and prefill's ``hook_v``, its head dims read from the
  config (:meth:`TreeOverlay._mla`); its rope dims are de-interleaved where the row's
  ``rope_deinterleave_key`` is set in the config.
- Dense-then-sparse stacks (``dense_layers``): ``dense_mlp`` below ``cfg.<dense_layers>``, ``mlp``
  above, and the non-firing hooks under ``blocks.{i}.mlp.`` listed for the sparse layers only.
- Short-convolution layers (``short_conv``, LFM2): on the layers the config's layer types name, the mixer's
  ``<hook>.hook_in`` / ``in.hook_out`` / ``out.hook_in`` / ``hook_out`` take the attention hooks' place; each
  layer's hooks of the mixer it does not run are non-firing, per layer, with the reason.
- ``unembed.hook_out`` divides out vLLM's logit scale (``logit_scale /
  logits_scaling``) and is not offered under a final logit soft-cap (tanh
  cannot be undone); attention scores / pattern are derived from
  ``score_inputs`` with the config's scale, grouped-query repeat, window and
  soft-cap.  Either missing is declared non-firing with a reason
  (:meth:`TreeOverlay.nonfiring_for`), never dropped silently.

Trap: a row is data, so a difference that is a fact about the tree belongs in a
field here (used by every row that has it), not in a family's method; a
family that would need a method is a new field.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from .base import (Conversion, Cols, DeInterleave, Derived, DropBatch, Flatten, Heads, HookSpec, Mul, NonFiring, Overlay, Routing,
                   SwapAxes, UnfoldNorm, config_get, expand_layers, hook_kind, layer_of)

# qkv layouts
FUSED = "fused"  # one projection returning [q | k | v] (k and v n_kv_heads * head_dim wide)
PER_HEAD = "per_head"  # one projection returning, per head, [q_h | k_h | v_h] (HF GPT-NeoX)
SEPARATE = "separate"  # q_proj / k_proj / v_proj, one output each
MLA = "mla"  # multi-head latent attention (DeepSeek-V2/V3): compressed q / kv latents, kv_b_proj, a shared rope key
# q/k norm kinds
QK_PER_HEAD = "per_head"  # RMSNorm over head_dim on [T, heads, head_dim] (Qwen3, Gemma-3)
QK_WHOLE = "whole"  # norm over the whole q / k projection, flat (OLMo-2)
# norm over head_dim with a weight per (head, dim) (Cohere's (heads, head_dim) LayerNorm): TL's bridge runs it on the
# pre-transpose [T, heads, d_head] layout (PositionEmbeddingsAttentionBridge._qk_norm_per_head), so no swap
QK_PER_HEAD_WEIGHTS = "per_head_weights"
# RMSNorm over head_dim on HF's heads-first [1, heads, T, d_head] (HunYuan, whose HF attention transposes before its
# norms, run by vLLM's Transformers backend): after DropBatch already TL's [heads, T, d_head], so no swap
QK_PER_HEAD_HEADS_FIRST = "per_head_heads_first"
# MLP kinds
TOP_K, SIGMOID_BIAS, FROM_CONFIG = "top-k", "sigmoid-bias", "from-config"  # Mlp.routing
SOFTMAX_BIAS = "softmax-bias"  # Mlp.routing: softmax scores plus the correction bias choose; ERNIE-4.5-MoE
SPARSEMIXER = "sparsemixer"  # Mlp.routing: Phi-3.5-MoE's top-2 (overlays.base.Routing), jitter from router_jitter_noise
ROUTE_TAP = "vp_route"  # harness.engines.route_tap.TAP: the child module the worker gives a MoE runner
GATED = "gated"  # fused [gate | up] projection, then down
PLAIN = "plain"  # up projection -> activation -> down projection, no gate
MOE = "moe"  # sparse mixture of experts: router + fused experts
# where scores / pattern are derived from (layer-free hooks)
SCORES_FROM_ROTATED = ("attn.hook_rot_q", "attn.hook_rot_k")
SCORES_FROM_QK = ("attn.hook_q", "attn.hook_k")  # no rotary embedding (GPT-2, OPT)
# Attention.position_bias kinds: ALiBi, a per-head linear bias on the scores (BLOOM), in the derived scores
ALIBI = "alibi"

References = tuple[tuple[str, "str | None"], ...]


def _check(what: str, value: Any, valid: tuple) -> None:
    if value not in valid:
        raise ValueError(f"{what} {value!r} is none of {valid}")


@dataclass(frozen=True)
class Scale:
    """A multiplier read from the HF config: ``float(cfg.key) ** power`` (``default`` where unset)."""

    key: str
    default: float | None = None
    power: float = 1.0

    def mul(self, cfg: Any) -> Mul:
        value = float(config_get(cfg, self.key, default=self.default))
        return Mul(value ** self.power if self.power != 1.0 else value)


@dataclass(frozen=True)
class NormKind:
    """How a norm applies its affine part, which the un-fold divides out."""

    offset: float = 0.0  # 1.0 where the norm multiplies by (1 + w) (Gemma)
    bias: bool = False  # LayerNorm with a bias: un-fold is (y - b) / (w + offset)
    affine: bool = True  # False: no learned weight or bias (OLMo-1's LayerNorm): nothing to un-fold


RMS = NormKind()
LAYER_NORM = NormKind(bias=True)
GEMMA_RMS = NormKind(offset=1.0)
NO_AFFINE = NormKind(affine=False)


@dataclass(frozen=True)
class Norms:
    """Norm modules (attribute names on a layer; ``final`` under the root) and how they are read.
    ``None``: the tree has no such norm, and its hooks are not offered."""

    kind: NormKind = RMS
    ln1: str | None = "input_layernorm"  # before attention
    ln2: str | None = "post_attention_layernorm"  # before the MLP
    ln1_post: str | None = None  # after attention, before the add (sandwich / post-norm)
    ln2_post: str | None = None  # after the MLP, before the add
    final: str = "norm"
    # read of ln1 / ln2: "out[0]" where vLLM's fused add-norm returns (normed, residual);
    # post-norms are called without a residual and read "out"
    read: str = "out[0]"
    final_read: str = "out[0]"


@dataclass(frozen=True)
class Residual:
    """How a layer hands the residual stream on: the reads of ``hook_in`` and ``hook_out`` on the
    layer and of ``hook_resid_mid`` on the input of ``mid_at`` (``"ln2"`` or ``"mlp"``)."""

    block_in: str
    block_out: str
    mid: str | None  # None: no stream between attention and MLP (parallel residual)
    mid_at: str = "ln2"

    def __post_init__(self) -> None:
        _check("Residual.mid_at", self.mid_at, ("ln2", "mlp"))


# vLLM's Llama-style layer returns (delta, residual); the next norm adds them
FUSED_PAIR = Residual("in.hidden_states+in.residual", "out[0]+out[1]", "in[0]+in[1]")
# the layer takes and returns the whole stream as one tensor
PLAIN_STREAM = Residual("in.hidden_states", "out", "in[0]")
# the layer returns (stream after the block, stream after attention) (StableLM)
STREAM_PAIR = Residual("in.hidden_states", "out[0]", "in[0]")
# x + attn(ln1(x)) + mlp(ln2(x)): no mid stream (GPT-NeoX)
PARALLEL = Residual("in.hidden_states", "out", None)
# x + ln1_post(attn(x)), then + ln2_post(mlp(.)): the mid stream is the MLP's input (OLMo-2)
POST_NORM = Residual("in.hidden_states", "out[0]", "in[0]", mid_at="mlp")
# sandwich norms (Gemma-2/3) are FUSED_PAIR with ln1_post / ln2_post set and ln2 the pre-feed-forward norm


@dataclass(frozen=True)
class Attention:
    """The attention module (attribute on a layer) and its parts."""

    module: str = "self_attn"
    qkv_layout: str = FUSED
    # config keys of the KV head count (the first one set wins; none set: as many as query heads), and the
    # config flag that, when true, means one KV head whatever those say (Falcon-7B's multi_query)
    kv_heads_keys: tuple[str, ...] = ("num_key_value_heads",)
    multi_query_key: str | None = None
    qkv: str = "qkv_proj"  # the fused projection (FUSED, PER_HEAD)
    q_k_v: tuple[str, str, str] = ("q_proj", "k_proj", "v_proj")  # SEPARATE
    # width declared on hook_q/k/v: their own ("slice") or the whole fused projection's
    # ("projection", as GPT-NeoX's overlay declares it)
    qkv_width: str = "slice"
    out_proj: str = "o_proj"  # its input is hook_z
    # module returning the rotated (q, k): hook_rot_q / hook_rot_k; None: not captured
    rotary: str | None = "rotary_emb"
    qk_norm: str | None = None  # QK_PER_HEAD | QK_WHOLE | QK_PER_HEAD_WEIGHTS, modules q_norm / k_norm
    qk_norm_read: str = "out"  # read of q_norm / k_norm: "out[0]" where the norm returns (normed, residual) (Cohere)
    qk_norm_key: str | None = None  # config flag switching the q/k norms on (Cohere's use_qk_norm); None: always on
    qk_norm_modules: tuple[str, str] = ("q_norm", "k_norm")  # the q / k norm modules (HunYuan: query_layernorm, ...)
    # False: multi-head only (GPT-2, OPT, GPT-NeoX): k / v have every query head, whatever the config says
    grouped_query: bool = True
    returns: str = "out"  # read of the module's return: "out[0]" for HF's (output, weights)
    # a child whose ``returns`` read is attn.hook_out, where the attention module itself returns None and fills an
    # ``output`` argument in place (vLLM 0.20's Qwen3-Next: ``output[:], _ = self.o_proj(...)``); "": the module's own
    returns_at: str = ""
    # a bias the kernel adds to the scores: ALIBI (slope_h x key position, HF's build_alibi_tensor), which the
    # derived scores / pattern add (Derived.alibi_slopes); None: none
    position_bias: str | None = None
    # MLA only (qkv_layout MLA; dims from the config's q_lora_rank, kv_lora_rank, qk_nope_head_dim,
    # qk_rope_head_dim, v_head_dim): the latents' norms (their outputs are hook_q_latent / hook_kv_latent),
    # the kv up-projection (prefill: per-head [k_nope | v]), the attention layer whose input is the final q
    mla_q_norm: str = "q_a_layernorm"
    mla_kv_norm: str = "kv_a_layernorm"
    mla_kv_up: str = "kv_b_proj"
    mla_core: str = "mla_attn.mla_attn"
    # config key that, when true, says the reference rotates de-interleaved (HF DeepSeek-V3's
    # rope_interleave) while vLLM rotates adjacent pairs in place: the rope dims get DeInterleave
    rope_deinterleave_key: str | None = None
    # MLA only: hook_rot_q / hook_rot_k read at ``mla_core``'s inputs (q's rope columns of in[0], the rope key in[2])
    # instead of ``rotary``'s outputs: GLM-5, whose rotary module vLLM's get_rope cache hands to the indexer too (one
    # object, called twice per layer), so its calls cannot be told apart by order; ``mla_core`` is per layer and
    # takes the rotated parts
    mla_rot_at_core: bool = False
    # the per-layer module whose inputs [0] / [1] are the q / k attention takes (vLLM's ``attn``), read as
    # hook_rot_q / hook_rot_k instead of ``rotary``'s output: Cohere2, whose rotary module vLLM shares across
    # layers and skips on the NoPE layers, so its calls cannot be told apart by order; on a NoPE layer the
    # read is q / k unrotated, as TransformerBridge's hook_rot_q / hook_rot_k are there.  None: ``rotary``
    rotated_from: str | None = None
    # QK_WHOLE norms vLLM applies without calling them as modules (MiniMax-M2's MiniMaxText01RMSNormTP.forward_qk, a
    # static method): their outputs are read as the rotary module's q / k inputs (in[1] / in[2]), un-folded by the
    # norm's weight.  QK_PER_HEAD norms whose module output's layout differs by vLLM line (Apertus: 0.32 normalizes
    # [T, heads, d_head], 0.20 the heads flattened across tokens, [T * heads, d_head], which a token-indexed capture
    # cannot hold): the same read, split into heads first, on every line
    qk_norm_at_rotary: bool = False
    # QK_PER_HEAD: TL's hook is heads-first ([heads, T, d_head]: the norm's output is swapped); False where TL's
    # bridge wraps HF's norm on [T, heads, d_head] and keeps that layout (AFMoE)
    qk_norm_heads_first: bool = True
    # True where vLLM's loader permutes each q / k head's projection rows from HF's adjacent pairs to halves
    # (Llama-4's permute_qk_weight_for_rotary, every layer, so its NeoX rotary equals HF's complex one): hook_q /
    # hook_k are turned back into HF's order (DeInterleave inverse); scores are the same in either order
    qk_rows_halved: bool = False
    # config key listing each layer's query-head count (Laguna's num_attention_heads_per_layer; TreeOverlay.layer_dims);
    # None: num_attention_heads on every layer
    heads_per_layer: str | None = None
    # a fixed softmax scale where the config names none (Gemma-4: 1.0, its q / k norms carry the scaling); None:
    # attention_multiplier, query_pre_attn_scalar ** -0.5 or head_dim ** -0.5 (TreeOverlay.attn_scale)
    scale: float | None = None
    # a weightless per-head norm on v (Gemma-4's v_norm, [T, kv_heads, d_head] in vLLM and TL): attn.<v_norm>.hook_out,
    # read as is (nothing to un-fold); None: none
    v_norm: str | None = None
    # FUSED only: the query projection is twice as wide, per head [q_h | gate_h] (Qwen3-Next / Qwen3.5's gated
    # attention, vLLM's attn_output_gate): hook_q is TL's, the whole 2 x q columns split in head_dim slices
    # ([T, 2 x heads, d_head]: TransformerBridge hooks q_proj before splitting off the gate), attn.hook_q_gate each
    # head's second half (flat, TL's q_gate); the attention output is multiplied by sigmoid(gate) before o_proj (hook_z
    # is o_proj's input, after the gate, as TL's o.hook_in); k / v follow the 2 x q columns
    output_gate: bool = False

    def __post_init__(self) -> None:
        _check("qkv_layout", self.qkv_layout, (FUSED, PER_HEAD, SEPARATE, MLA))
        _check("qkv_width", self.qkv_width, ("slice", "projection"))
        _check("position_bias", self.position_bias, (None, ALIBI))
        _check("qk_norm", self.qk_norm, (None, QK_PER_HEAD, QK_WHOLE, QK_PER_HEAD_WEIGHTS, QK_PER_HEAD_HEADS_FIRST))


@dataclass(frozen=True)
class Mlp:
    """The feed-forward block (attribute on a layer; ``module=None``: its projections hang off the layer)."""

    kind: str = GATED
    module: str | None = "mlp"
    up: str = "gate_up_proj"  # GATED: fused [gate | up]; PLAIN: the input projection (hook_pre is its output)
    down: str = "down_proj"  # its input is hook_post
    router: str = "gate"  # MOE: the router, whose logits are mlp.gate.hook_out
    # MOE: the experts' runner, whose router's choice harness.engines.route_tap exposes at <experts>.vp_route
    experts: str = "experts"
    # MOE: shared experts, a gated MLP (``gate_up_proj`` / ``down_proj``) every token runs, offered as
    # mlp.shared_experts.hook_* where the reference names them; width moe_intermediate_size x n_shared_experts
    shared: str | None = None
    # TL's name of the shared block (mlp.<shared_hook>.hook_*): DeepSeek "shared_experts", Qwen2-MoE "shared_expert"
    shared_hook: str = "shared_experts"
    # config key of the shared block's width; None: moe_intermediate_size x n_shared_experts (DeepSeek)
    shared_width: str | None = None
    # config key of the shared experts' count where shared_width is None (ERNIE-4.5-MoE: moe_num_shared_experts)
    shared_count: str = "n_shared_experts"
    # a sigmoid gate on the shared block (Qwen2-MoE's shared_expert_gate, Linear d_model -> 1, on the MoE
    # block): mlp.<shared_gate>.hook_in / hook_out are its input and logit; vLLM applies sigmoid(logit) inside
    # the shared module's forward, after down_proj, so the shared block's hook_out (HF's module output, before
    # the gate) is read at its down_proj
    shared_gate: str | None = None
    # MOE: how the router chooses experts (overlays.base.Routing): TOP_K (the top-k logits: Mixtral, Qwen3-MoE),
    # SIGMOID_BIAS (always sigmoid scores plus e_score_correction_bias over n_group / topk_group groups:
    # GLM-4-MoE, whose config does not say so), FROM_CONFIG (DeepSeek: scoring_func, and the bias where
    # topk_method is "noaux_tc")
    routing: str = "top-k"
    # MOE: the router's and the route tap's reads hold no batch dim where every other read of the tree has one
    # (``Tree.batch``): vLLM's Transformers backend runs HF's MoE block, which flattens to ``[T, d]`` before its
    # router and experts (FlexOlmo); those reads skip the batch conversions
    flat_reads: bool = False
    # MOE: False where no reference names the router's choice (TransformerLens 4.3.0's FlexOlmo adapter wraps the
    # router as a plain component, without hook_expert_weights / hook_expert_indices): the route tap is not read,
    # and the row lists mlp.gate.hook_expert_* non-firing with its reason; the router logits are still compared
    route_choice: bool = True
    # SIGMOID_BIAS: the correction bias's attribute on the MoE block where it is not the router's
    # (<router>.e_score_correction_bias): MiniMax-M2's block-level e_score_correction_bias
    routing_bias: str | None = None
    # SIGMOID_BIAS: the correction bias's attribute on the MoE block in the checkpoint where the engine's loader
    # renames it (LFM2-MoE's feed_forward.expert_bias -> gate.e_score_correction_bias): the flip rule reads the
    # reference side's bias there (Routing.checkpoint_bias); None: the engine's name
    routing_bias_checkpoint: str | None = None
    # GATED (and a MoE's shared block): the gate as a projection of its own beside the up projection (vLLM's
    # LagunaMLP: gate_proj / up_proj): hook_pre is its output, hook_pre_linear the up projection's (``up`` on a
    # dense block, ``up_proj`` on a shared one); None: the fused [gate | up] (``up`` / ``gate_up_proj``)
    gate_proj: str | None = None

    def __post_init__(self) -> None:
        _check("Mlp.kind", self.kind, (GATED, PLAIN, MOE))
        _check("Mlp.routing", self.routing, (TOP_K, SIGMOID_BIAS, FROM_CONFIG, SPARSEMIXER, SOFTMAX_BIAS))
        if self.module is None and self.kind == MOE:
            raise ValueError("Mlp: a MoE block is a module (module=None is for projections on the layer)")


@dataclass(frozen=True)
class ShortConv:
    """A gated short-convolution mixer run in attention's place on the layers the config names (LFM2's
    ``Lfm2ShortConv``, vLLM's ``ShortConv``): ``in_proj`` -> ``[B | C | x]``, a depthwise causal conv of
    ``B * x`` (kernel ``conv_L_cache``), ``C *`` its output, ``out_proj``.  Offered as TransformerLens's
    ``blocks.{i}.<hook>.*``: ``hook_in`` (the mixer's input), ``in.hook_out`` (``in_proj``'s ``[B | C | x]``),
    ``out.hook_in`` (``C * conv(B * x)``, ``out_proj``'s input), ``hook_out`` (``out_proj``'s output); what
    runs inside a fused op is ``nonfiring`` (per short-conv layer, with its reason)."""

    module: str = "short_conv"  # vLLM's mixer module on the layer
    in_proj: str = "in_proj"
    out_proj: str = "out_proj"
    hook: str = "conv"  # TransformerLens's name of the mixer: blocks.{i}.<hook>.*
    layer_types_key: str = "layer_types"  # config key: one type per layer
    layer_type: str = "conv"  # the type of the layers that run this mixer
    nonfiring: tuple[NonFiring, ...] = ()  # hooks of the mixer no module boundary exposes ("blocks.{i}.conv...")

    def runs(self, cfg: Any, layer: int) -> bool:
        types = config_get(cfg, self.layer_types_key, default=None)
        return types is not None and types[layer] == self.layer_type


NORM_OFF = ("the config's {key} is false: the mixer has no gated norm (HF holds an nn.Identity it never calls and "
            "gates the scan output inline, y * silu(z); TransformerLens offers no inner_norm hook), so there is nothing "
            "to compare with; the gated output is out_proj's input, gated through the mixer's hook_out")


@dataclass(frozen=True)
class SsmMixer:
    """A Mamba-2 mixer run in attention's place on the layers the config names (GraniteMoeHybrid's
    ``layer_types`` "linear_attention", vLLM's ``MambaMixer2`` at ``module`` on the layer).  Offered as
    TransformerLens's ``blocks.{i}.mixer.*``: ``hook_in`` / ``hook_out`` (the mixer's input and output) and
    Mamba-2's inner hooks (:func:`overlays.mamba2.mixer_specs`: ``in_proj`` and its xBC / dt columns, the gated
    norm's input, gate and output), each with its HF forward-hook row; sizes from the config keys below.  The
    sublayer's scaled contribution (``hook_attn_out``) is not offered on these layers: TransformerLens's
    ``ScaledResidualBlockBridge`` hooks it at attention only.  On an attention layer the mixer's hooks, and on a
    Mamba layer the attention's, are listed non-firing per layer (:meth:`TreeOverlay.nonfiring_for`), with
    Mamba-2's fused internals (:data:`overlays.mamba2.NONFIRING`'s mixer hooks)."""

    module: str = "mamba"  # vLLM's mixer module on the layer
    layer_types_key: str = "layer_types"  # config key: one type per layer
    layer_type: str = "linear_attention"  # the type of the layers that run this mixer
    heads_key: str = "mamba_n_heads"
    head_dim_key: str = "mamba_d_head"
    groups_key: str = "mamba_n_groups"
    state_key: str = "mamba_d_state"
    # TransformerLens's name of the mixer: blocks.{i}.<hook>.* (Falcon-H1's adapter: "mamba"); HF's forward-hook rows
    # keep the harness's "mixer" names (harness.references.reference._ssm_mixer_hooks)
    hook: str = "mixer"
    # True: the mixer runs beside attention on every layer, on the same normed input, and the two outputs are summed
    # (Falcon-H1's parallel hybrid): attention's hooks, then the mixer's, on every layer; layer_types is not read
    parallel: bool = False
    # a multiplier vLLM applies to the mixer's input before calling it where HF applies it inside the mixer (Falcon-H1's
    # ssm_in_multiplier): <hook>.hook_in, vLLM's mixer input, is divided by it; None: none
    input_scale: Scale | None = None
    # a config key that turns the mixer's gated norm off where false (Falcon-H1's mamba_rms_norm, false in the released
    # configs): HF then holds an nn.Identity it never calls and gates inline (y * silu(z)), and TransformerLens offers no
    # inner_norm hook, so the <hook>.inner_norm.* hooks are not offered (listed non-firing, NORM_OFF); vLLM still calls
    # its norm module, ungated by a weight.  None: the norm is always on
    norm_key: str | None = None

    def has_norm(self, cfg: Any) -> bool:
        """False where :attr:`norm_key` is set and the config turns the gated norm off."""
        return self.norm_key is None or bool(config_get(cfg, self.norm_key, default=True))

    def runs(self, cfg: Any, layer: int) -> bool:
        """True where the mixer runs in attention's place (never for a ``parallel`` mixer)."""
        if self.parallel:
            return False
        types = config_get(cfg, self.layer_types_key, default=None)
        return types is not None and types[layer] == self.layer_type

    def sizes(self, cfg: Any) -> tuple[int, int, int]:
        """``(I, conv_dim, H)``: inner width, the conv's width (x, B, C), heads."""
        heads = int(config_get(cfg, self.heads_key))
        inner = heads * int(config_get(cfg, self.head_dim_key))
        groups = int(config_get(cfg, self.groups_key, default=1))
        return inner, inner + 2 * groups * int(config_get(cfg, self.state_key)), heads


@dataclass(frozen=True)
class GdnMixer:
    """A Gated DeltaNet linear-attention mixer run in attention's place on the layers the config names (Qwen3-Next /
    Qwen3.5's ``layer_types`` "linear_attention", vLLM's ``QwenGatedDeltaNetAttention`` at ``module`` on the layer).
    Offered as TransformerLens's ``GatedDeltaNetBridge`` hooks ``blocks.{i}.<hook>.*`` where vLLM has a module boundary:
    ``hook_in`` / ``hook_out`` (the mixer's input and output), ``hook_{q,k,v}_pre_conv`` (``in_proj_qkvz``'s columns,
    per head), ``hook_beta_logit`` (``in_proj_ba``'s b columns), ``hook_recurrence_out`` / ``hook_gate_input`` (the
    gated norm's two inputs: the delta rule's output and z).  ``layout``: "interleaved" (Qwen3-Next's checkpoint: per
    key-head group ``[q | k | v (ratio heads) | z (ratio heads)]`` and ``[b (ratio) | a (ratio)]``) or "flat" (Qwen3.5:
    ``[q | k | v | z]`` and ``[b | a]``).  What runs inside vLLM's fused op (the conv, the gating, the recurrence) is
    ``nonfiring`` (templates ``blocks.{i}.<hook>.*``, per mixer layer, with its reason)."""

    module: str = "linear_attn"  # vLLM's mixer module on the layer
    hook: str = "linear_attn"  # TransformerLens's name of the mixer: blocks.{i}.<hook>.*
    qkvz: str = "in_proj_qkvz"
    ba: str = "in_proj_ba"
    norm: str = "norm"  # the gated RMSNorm, called (core_out, z)
    # hook_out's read: the mixer's return, or where the mixer returns None and fills an ``output`` argument in place
    # (vLLM 0.20's QwenGatedDeltaNetAttention: ``output[:num_tokens], _ = self.out_proj(...)``) its out_proj's out[0]
    out_at: str = ""
    out_read: str = "out"
    layout: str = "interleaved"
    layer_types_key: str = "layer_types"
    layer_type: str = "linear_attention"
    nonfiring: tuple[NonFiring, ...] = ()
    # the norms and residual of the mixer's layers where they differ from the tree's, which then hold for the attention
    # layers (OLMo-Hybrid: pre-norm Gated DeltaNet layers, OLMo-2 post-norm attention layers); None: the tree's
    norms: Norms | None = None
    residual: Residual | None = None

    def __post_init__(self) -> None:
        _check("GdnMixer.layout", self.layout, ("interleaved", "flat"))

    def runs(self, cfg: Any, layer: int) -> bool:
        types = config_get(cfg, self.layer_types_key, default=None)
        return types is not None and types[layer] == self.layer_type

    def sizes(self, cfg: Any) -> tuple[int, int, int, int]:
        """``(k_heads, v_heads, head_k_dim, head_v_dim)``."""
        return tuple(int(config_get(cfg, k)) for k in ("linear_num_key_heads", "linear_num_value_heads",
                                                       "linear_key_head_dim", "linear_value_head_dim"))


@dataclass(frozen=True)
class Tree:
    """One architecture's vLLM module tree, as data (defaults: vLLM's Llama tree)."""

    name: str  # the overlay's name (reports)
    root: str = "model"  # dot path holding the embeddings, layers and final norm
    embed: str = "embed_tokens"
    pos_embed: str | None = None  # learned positional embedding module (pos_embed.hook_out)
    # a LayerNorm on the embedding, under root, before layer 0 (BLOOM's word_embeddings_layernorm):
    # embed_ln.hook_normalized, its output un-folded with the row's norm kind; None: none
    embed_norm: str | None = None
    # vLLM multiplies the embedding module's output by this before the stream (Gemma's sqrt(d_model)
    # normalizer, Granite's embedding_multiplier): embed.hook_out is then read as layer 0's hidden_states
    # input, the engine's own scaled value -- an embed_tokens read times the config's factor would hide a
    # wrong normalizer in the engine (planted in tests/engine/test_planted_faults.py on Gemma-3-270M)
    embed_scale: Scale | None = None
    layers: str = "layers"  # layer i is {root}.{layers}.{i}
    attention: Attention = Attention()
    mlp: Mlp = Mlp()
    norms: Norms = Norms()
    residual: Residual = FUSED_PAIR
    residual_scale: Scale | None = None  # sublayer outputs are multiplied by it before the add (Granite)
    batch: tuple[Conversion, ...] = ()  # leading conversions of every read but unembed (DropBatch)
    score_inputs: tuple[str, str] | None = SCORES_FROM_ROTATED  # None: scores / pattern not derived
    # why HF's eager attention holds no pre-softmax score tensor of its own (GPT-OSS: the sinks join its softmax
    # after a row-max shift); non-empty: the derived hooks are compared with TransformerLens's references only
    scores_not_in_hf: str = ""
    d_mlp_keys: tuple[str, ...] = ("intermediate_size", "n_inner")  # config keys of the MLP width
    d_mlp_ratio: int | None = 4  # MLP width d_model x this where the config leaves it unset; None: required
    # Dense-then-sparse stacks (DeepSeek, GLM-4-MoE): layers below ``cfg.<dense_layers>``
    # (first_k_dense_replace) run ``dense_mlp``, the rest ``mlp``; None: every layer runs ``mlp``.
    # Non-firing hooks of the MoE kind (per-expert, routing) then list the sparse layers only.
    dense_layers: str | None = None
    dense_mlp: Mlp = Mlp()
    # Interleaved stacks (Llama-4's interleave_moe_layer_step): the config key listing the layers that run ``mlp``
    # (HF's moe_layers), the others running ``dense_mlp``; None: as ``dense_layers`` says
    sparse_layers: str | None = None
    # the config key naming each layer's MLP type, "sparse" where it runs ``mlp`` (Laguna's mlp_layer_types), the
    # others running ``dense_mlp``; None: as ``dense_layers`` / ``sparse_layers`` say
    mlp_layer_types: str | None = None
    # Qwen2-MoE's rule (Qwen2-MoE, Qwen3-MoE, Qwen3-Next in HF and vLLM): a layer runs ``mlp`` unless the config key
    # ``dense_listed`` lists it (mlp_only_layers) or ``(layer + 1)`` is not a multiple of ``cfg.<sparse_step>``
    # (decoder_sparse_step); the others run ``dense_mlp``; None: as the fields above say
    dense_listed: str | None = None
    sparse_step: str | None = None
    # (hook kind, references) overrides, for hooks whose reference names differ (HookSpec.references);
    # "{i}" in a name is the hook's layer
    references: tuple[tuple[str, References], ...] = ()
    nonfiring: tuple[NonFiring, ...] = ()
    cuda_graph_nonfiring: tuple[NonFiring, ...] = ()
    # False: no module produces the MLP's contribution to the stream (Granite-4.0-H's MoE configs sum two blocks
    # inline), so the legacy ``hook_mlp_out`` is not offered; the row's ``nonfiring`` says why
    mlp_contribution: bool = True
    # which vLLM implementation's module tree the row reads: "native" (vLLM's own model class) or "transformers"
    # (its Transformers modeling backend: set by transformers_backend()); overlays/__init__.py registers a
    # "transformers" row as that implementation only, so a vLLM line running the architecture natively is refused
    implementation: str = "native"
    # references the reference library refuses for this architecture (TransformerLens 4.3.0's VaultGemma adapter:
    # supports_compatibility_mode = False): every hook the builder adds names no tensor there ((ref, None))
    refused_references: tuple[str, ...] = ()
    # a short-convolution mixer in attention's place on the layers the config names (LFM2): its hooks replace the
    # attention hooks there; the attention hooks of those layers (and the mixer's of the attention layers) are
    # listed non-firing per layer (TreeOverlay.nonfiring_for); None: every layer runs attention
    short_conv: ShortConv | None = None
    # the MLP width as a config flag adjusts it, (flag key, multiplier key, multiple-of key): where cfg.<flag> is
    # true, int(2 w / 3), times the multiplier where set, rounded up to the multiple (LFM2's
    # block_auto_adjust_ff_dim, as vLLM's Lfm2MLP computes it); None: the width as read
    d_mlp_adjust: tuple[str, str, str] | None = None
    # the hook every norm is offered at: "hook_normalized" (its output un-folded) or "hook_out" (its output as is, where
    # the reference wraps the norms as bare components with hook_in / hook_out only: TransformerLens 4.3.0's Gemma-4
    # adapter); with "hook_out" the q / k norms are read in vLLM's [T, heads, d_head], TL's layout for them there
    norm_hook: str = "hook_normalized"
    # head_dim / num_key_value_heads per layer from HF's heterogeneous ``cfg.per_layer_config`` (Gemma-4's wider global
    # layers); False: the config's global values on every layer
    per_layer_dims: bool = False
    # a Mamba-2 mixer in attention's place on the layers the config names (GraniteMoeHybrid, SsmMixer); None: none
    ssm_mixer: SsmMixer | None = None
    # (builder's hook kind, TransformerLens's) for per-layer hooks TL names otherwise, the hook offered under TL's name
    # (GraniteMoeHybrid's dense MLP: mlp.hook_in -> shared_mlp.hook_in); references overrides are keyed by the builder's
    hook_names: tuple[tuple[str, str], ...] = ()
    # a Gated DeltaNet mixer in attention's place on the layers the config names (Qwen3-Next, Qwen3.5: GdnMixer); None:
    # none
    gdn_mixer: GdnMixer | None = None
    # serving shapes (--serving, harness.engines.serving) that cannot exist for this tree, ((name, why), ...), reported
    # skipped with the reason (harness.pipeline.runner.not_applicable), as overlays.base.Encoder.not_applicable; ():
    # every shape runs
    serving_not_applicable: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        _check("Tree.norm_hook", self.norm_hook, ("hook_normalized", "hook_out"))
        mid_module = self.norms.ln2 if self.residual.mid_at == "ln2" else self.mlp.module
        if self.residual.mid and mid_module is None:
            raise ValueError(f"Tree {self.name!r}: hook_resid_mid is read at {self.residual.mid_at}, "
                             "which this tree does not have")
        if (self.picks_mlp and (self.dense_mlp.kind == MOE or self.mlp.kind != MOE)):
            raise ValueError(f"Tree {self.name!r}: dense_layers is for a MoE mlp with a dense dense_mlp")

    @property
    def picks_mlp(self) -> bool:
        """Whether some layers run ``dense_mlp`` (a field that picks each layer's feed-forward block is set)."""
        return bool(self.dense_layers or self.sparse_layers or self.mlp_layer_types or self.dense_listed
                    or self.sparse_step)

    def mlp_at(self, cfg: Any, layer: int) -> Mlp:
        """The feed-forward block of ``layer``: ``dense_mlp`` below ``cfg.<dense_layers>``, else ``mlp``."""
        if self.dense_layers and layer < int(config_get(cfg, self.dense_layers, default=0)):
            return self.dense_mlp
        if self.sparse_layers and layer not in config_get(cfg, self.sparse_layers, default=()):  # Tree.sparse_layers
            return self.dense_mlp
        if self.mlp_layer_types and config_get(cfg, self.mlp_layer_types)[layer] != "sparse":  # Tree.mlp_layer_types
            return self.dense_mlp
        if self.dense_listed and layer in (config_get(cfg, self.dense_listed, default=None) or ()):  # Tree.dense_listed
            return self.dense_mlp
        if self.sparse_step and (layer + 1) % int(config_get(cfg, self.sparse_step, default=1) or 1):  # Tree.sparse_step
            return self.dense_mlp
        return self.mlp


def alibi_slopes(n_heads: int) -> tuple[float, ...]:
    """ALiBi's per-head slopes as HF's ``build_alibi_tensor`` (BLOOM) and vLLM's ``_get_alibi_slopes`` compute
    them: ``2^(-8/n) ** (1..n)`` for the largest power of two ``n <= n_heads``, then every other slope of
    ``2n`` for the remaining heads."""
    closest = 2 ** math.floor(math.log2(n_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base ** p for p in range(1, closest + 1)]
    if closest != n_heads:
        extra = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra ** p for p in range(1, 1 + 2 * min(closest, n_heads - closest), 2)]
    return tuple(slopes)


# What vLLM's Transformers backend fuses (vllm/model_executor/models/transformers/fusers: QKVFuser, GLUFuser) from HF's
# own projections, which a line whose fusers do not match the HF class keeps apart (HookSpec.unfused): fused module ->
# the HF projections whose outputs it concatenates, in column order.
BACKEND_FUSED: dict[str, tuple[str, ...]] = {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
                                              "gate_up_proj": ("gate_proj", "up_proj")}


def transformers_backend(tree: Tree, nonfiring: tuple[NonFiring, ...]) -> Tree:
    """``tree`` as vLLM's Transformers modeling backend runs it: HF's modules (vLLM layers swapped
    in) see ``[1, T, ...]`` (every read starts with ``DropBatch``), HF attention modules return
    ``(output, weights)`` (``out[0]``), and HF rotates q/k in a function (``apply_rotary_pos_emb``)
    before calling vLLM's attention as ``attn.forward(q, k, v)``, bypassing module hooks: no rotated
    q/k to capture, so no derived scores / pattern (``nonfiring`` says why, in the family's words)."""
    return replace(tree, implementation="transformers", batch=(DropBatch(),),
                   attention=replace(tree.attention, rotary=None, returns="out[0]"),
                   score_inputs=None, nonfiring=nonfiring)


# Hooks a config may leave unoffered, with the reason; a row that drops one for another reason
# lists it in its nonfiring with its own reason instead.
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


class TreeOverlay(Overlay):
    """The one builder: expands :attr:`tree` over the config's layers.  A family's class only
    binds its row (``tree = ...``), so reports keep naming it by class."""

    tree: ClassVar[Tree]

    def __init__(self, tree: Tree | None = None) -> None:
        if tree is not None:
            self.tree = tree

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.tree.name

    # -- sizes ---------------------------------------------------------------------------------------
    def dims(self, cfg: Any) -> dict[str, int]:
        d_model = config_get(cfg, "hidden_size", "n_embd")
        n_heads = config_get(cfg, "num_attention_heads", "n_head")
        # a heterogeneous config (Tree.per_layer_dims) refuses its global head_dim: layer 0's
        head_dim = (self._per_layer(cfg, 0, "head_dim") or config_get(cfg, "head_dim", default=None)
                    or d_model // n_heads)
        att = self.tree.attention
        n_kv = (1 if att.multi_query_key and config_get(cfg, att.multi_query_key, default=False)
                else self._per_layer(cfg, 0, "num_key_value_heads")
                or config_get(cfg, *att.kv_heads_keys, default=None) or n_heads)
        mlp_width, ratio = config_get(cfg, *self.tree.d_mlp_keys, default=None), self.tree.d_mlp_ratio
        d_mlp = int(mlp_width) if ratio is None else (mlp_width or ratio * d_model)
        adjust = self.tree.d_mlp_adjust  # Tree.d_mlp_adjust
        if adjust and config_get(cfg, adjust[0], default=False):
            d_mlp = int(2 * int(d_mlp) / 3)
            if config_get(cfg, adjust[1], default=None) is not None:
                d_mlp = int(float(config_get(cfg, adjust[1])) * d_mlp)
            multiple = int(config_get(cfg, adjust[2]))
            d_mlp = multiple * ((d_mlp + multiple - 1) // multiple)
        dims = dict(d_model=d_model, n_heads=n_heads, head_dim=head_dim, n_kv=n_kv, d_mlp=d_mlp,
                    n_layers=config_get(cfg, "num_hidden_layers", "n_layer"))
        if self.tree.mlp.kind == MOE:
            dims["n_experts"] = int(config_get(cfg, "num_local_experts", "num_experts", "n_routed_experts"))
        return dims

    # -- the contract ----------------------------------------------------------------------------------
    def hook_specs(self, cfg: Any) -> dict[str, HookSpec]:
        t, d = self.tree, self.dims(cfg)
        specs: dict[str, HookSpec] = {}
        if t.embed_scale:  # vLLM scales after the embedding module: read the stream where it begins (Tree.embed_scale)
            self._add(specs, "embed.hook_out", f"{t.root}.{t.layers}.0", "in.hidden_states", (), d["d_model"])
        else:
            self._add(specs, "embed.hook_out", f"{t.root}.{t.embed}", "out", (), d["d_model"])
        if t.pos_embed:
            self._add(specs, "pos_embed.hook_out", f"{t.root}.{t.pos_embed}", "out", (), d["d_model"])
        if t.embed_norm:  # Tree.embed_norm
            ln = f"{t.root}.{t.embed_norm}"
            self._add(specs, "embed_ln.hook_normalized", ln, "out", (self.unfold(ln),), d["d_model"])
        residual_scale = (t.residual_scale.mul(cfg),) if t.residual_scale else None
        for i in range(d["n_layers"]):
            self._layer(specs, i, d, residual_scale, t.mlp_at(cfg, i), cfg)
        final = f"{t.root}.{t.norms.final}"
        self._add(specs, f"ln_final.{t.norm_hook}", final, t.norms.final_read,
                  (self.unfold(final),) if t.norms.kind.affine and t.norm_hook == "hook_normalized" else (),
                  d["d_model"])
        unembed = self.unembed_spec(cfg)
        if unembed is not None:
            specs["unembed.hook_out"] = unembed
        return specs

    def nonfiring(self) -> list[NonFiring]:
        return list(self.tree.nonfiring)

    def cuda_graph_nonfiring(self, hf_config: Any) -> list[NonFiring]:
        return list(self.tree.cuda_graph_nonfiring)

    def derived_specs(self, cfg: Any) -> dict[str, Derived]:
        if self.tree.score_inputs is None:
            return {}
        captured = self.hook_specs(cfg)
        scale, softcap = self.attn_scale(cfg), config_get(cfg, "attn_logit_softcapping")
        slopes = alibi_slopes(self.dims(cfg)["n_heads"]) if self.tree.attention.position_bias == ALIBI else None
        out: dict[str, Derived] = {}
        for i in range(self.dims(cfg)["n_layers"]):
            inputs = tuple(f"blocks.{i}.{h}" for h in self.tree.score_inputs)
            if not all(h in captured for h in inputs):
                continue
            common = dict(inputs=inputs, scale=scale, window=self.sliding_window(cfg, i),
                          softcap=float(softcap) if softcap else None, alibi_slopes=slopes,
                          chunk=self.attention_chunk(cfg, i), hf_reference=not self.tree.scores_not_in_hf)
            out[f"blocks.{i}.attn.hook_attn_scores"] = Derived("attn_scores", **common)
            if "blocks.{i}.attn.hook_pattern" not in {nf.template for nf in self.tree.nonfiring}:
                # a row listing the pattern non-firing (GPT-OSS's attention sinks join its softmax) derives scores only
                out[f"blocks.{i}.attn.hook_pattern"] = Derived("pattern", **common)
        return out

    def nonfiring_for(self, cfg: Any) -> list[NonFiring]:
        """:meth:`nonfiring` plus each hook a config may leave unoffered (scores / pattern,
        soft-capped unembed) that this config offers no layer of, with the generic reason."""
        listed = self.nonfiring()
        offered = set(self.hook_specs(cfg)) | set(self.derived_specs(cfg))
        n_layers = self.dims(cfg)["n_layers"]
        if self.tree.picks_mlp:  # the sparse layers'
            sparse = [i for i in range(n_layers) if self.tree.mlp_at(cfg, i) is self.tree.mlp]
            listed = [nf for t in listed for nf in (
                [NonFiring(t.template.replace("{i}", str(i)), t.reason) for i in sparse]
                if t.template.startswith("blocks.{i}.mlp.") else [t])]
        if self.tree.short_conv:  # Tree.short_conv: each layer's hooks of the mixer it does not run
            listed = listed + self._short_conv_nonfiring(cfg, n_layers)
        if self.tree.ssm_mixer:  # Tree.ssm_mixer: each layer's hooks of the mixer it does not run
            listed = listed + self._ssm_nonfiring(cfg, n_layers)
        if self.tree.gdn_mixer:  # Tree.gdn_mixer: each layer's hooks of the mixer it does not run
            listed = listed + self._gdn_nonfiring(cfg, n_layers)
        return listed + [NonFiring(t, why) for t, why in _UNOFFERED.items()
                         if t not in {nf.template for nf in listed}
                         and not offered & set(expand_layers(t, n_layers))]

    # -- read from the HF config, generically -----------------------------------------------------------
    def unembed_spec(self, cfg: Any) -> HookSpec | None:
        """vLLM's logits processor (``logits_processor`` at the model root), every call: with
        prompt log-probs vLLM calls it for the sampled position and for the prompt positions,
        stitched by row count; ``None`` where its output cannot be turned back into the pre-cap
        logits TransformerBridge's hook holds."""
        if config_get(cfg, "final_logit_softcapping"):
            return None
        # vLLM: LogitsProcessor(scale=logit_scale / logits_scaling); the bridge's
        # unembed.hook_out is the plain lm_head output (measured on Granite).
        scale = float(config_get(cfg, "logit_scale", default=1.0)) / float(
            config_get(cfg, "logits_scaling", default=1.0))
        # Falcon-H1: LogitsProcessor(scale=lm_head_multiplier); the bridge's hook is lm_head's output before it
        scale *= float(config_get(cfg, "lm_head_multiplier", default=1.0))
        return HookSpec("logits_processor", "out", (Mul(1.0 / scale),) if scale != 1.0 else (),
                        int(config_get(cfg, "vocab_size")), calls="all")

    def attn_scale(self, cfg: Any) -> float:
        if self.tree.attention.scale is not None:  # Attention.scale
            return self.tree.attention.scale
        multiplier = config_get(cfg, "attention_multiplier")  # Granite
        if multiplier is not None:
            return float(multiplier)
        scalar = config_get(cfg, "query_pre_attn_scalar")  # Gemma 2/3
        if scalar is not None:
            return float(scalar) ** -0.5
        return float(self.dims(cfg)["head_dim"]) ** -0.5

    def sliding_window(self, cfg: Any, layer: int) -> int | None:
        """HF's rule: ``layer_types`` names the sliding layers where present; otherwise a set
        ``sliding_window`` (not switched off by ``use_sliding_window=False``) applies to every layer."""
        window = config_get(cfg, "sliding_window")
        if not window:
            return None
        types = config_get(cfg, "layer_types")
        if types is not None:
            return int(window) if types[layer] == "sliding_attention" else None
        if config_get(cfg, "use_sliding_window") is False:
            return None
        return int(window)

    def attention_chunk(self, cfg: Any, layer: int) -> int | None:
        """HF's rule (Llama-4): ``attention_chunk_size`` on the layers ``layer_types`` names ``chunked_attention``."""
        chunk, types = config_get(cfg, "attention_chunk_size"), config_get(cfg, "layer_types")
        return int(chunk) if chunk and types is not None and types[layer] == "chunked_attention" else None

    def unfold(self, module: str) -> UnfoldNorm:
        """Un-fold a norm's affine part: ``÷ (w + offset)``, after ``- b`` for a LayerNorm with bias."""
        kind = self.tree.norms.kind
        return UnfoldNorm(f"{module}.weight", kind.offset, bias=f"{module}.bias" if kind.bias else None)

    # -- the builder ------------------------------------------------------------------------------------
    def _add(self, specs: dict[str, HookSpec], hook: str, module: str, read: str, convert: tuple, width: int,
             references: References = (), routing: Routing | None = None, token_dim: int | None = None,
             flat: bool = False, flat_rows: int | None = None, part: int | None = None) -> None:
        layer = layer_of(hook)  # a row's override names a per-layer hook as a template ("blocks.{i}....")
        references = tuple((ref, name.replace("{i}", str(layer)) if name and layer is not None else name)
                           for ref, name in dict(self.tree.references).get(hook_kind(hook), references))
        references = (*references, *((ref, None) for ref in self.tree.refused_references))  # Tree.refused_references
        if hook_kind(hook) in dict(self.tree.hook_names):  # Tree.hook_names: TransformerLens's name of the hook
            hook = f"blocks.{layer}.{dict(self.tree.hook_names)[hook_kind(hook)]}"
        batch = () if flat else self.tree.batch
        specs[hook] = HookSpec(module, read, (*batch, *convert), width, references=references, routing=routing,
                               token_dim=token_dim, flat_rows=flat_rows,
                               unfused=self._unfused(module, read, (*batch, *convert[1:]), width, part, convert))

    def _unfused(self, module: str, read: str, convert: tuple, width: int, part: int | None,
                 fused_convert: tuple) -> HookSpec | None:
        """The read of part ``part`` of a fused projection from HF's own projection (:data:`BACKEND_FUSED`), where
        the row is the Transformers backend's and the fused read starts by cutting that part's columns; else None."""
        parent, _, name = module.rpartition(".")
        if (self.tree.implementation != "transformers" or part is None or name not in BACKEND_FUSED
                or not fused_convert or not isinstance(fused_convert[0], Cols)):
            return None
        return HookSpec(f"{parent}.{BACKEND_FUSED[name][part]}", read, convert, width)

    @staticmethod
    def _routing(mlp: Mlp, cfg: Any, router: str) -> Routing | None:
        """The router's choice rule (overlays.base.Routing), None for the plain top-k logits."""
        if mlp.routing == TOP_K:
            return None
        if mlp.routing == SPARSEMIXER:
            return Routing("sparsemixer", jitter_eps=float(config_get(cfg, "router_jitter_noise", default=0.01)))
        n_group = int(config_get(cfg, "n_group", default=1) or 1)
        topk_group = int(config_get(cfg, "topk_group", default=1) or 1)
        if mlp.routing in (SIGMOID_BIAS, SOFTMAX_BIAS):  # SOFTMAX_BIAS: the same with softmax scores
            bias = (f"{router.rsplit('.', 1)[0]}.{mlp.routing_bias}" if mlp.routing_bias
                    else f"{router}.e_score_correction_bias")
            return Routing("sigmoid" if mlp.routing == SIGMOID_BIAS else "softmax", n_group, topk_group, bias,
                           checkpoint_bias=(f"{router.rsplit('.', 1)[0]}.{mlp.routing_bias_checkpoint}"
                                            if mlp.routing_bias_checkpoint else None))
        scoring = str(config_get(cfg, "scoring_func", default="softmax"))
        biased = config_get(cfg, "topk_method") == "noaux_tc"
        if scoring == "softmax" and n_group == 1 and not biased:
            return None  # the top-k of the softmax is the top-k of the logits
        return Routing(scoring, n_group, topk_group, f"{router}.e_score_correction_bias" if biased else None)

    def layer_dims(self, cfg: Any, layer: int, d: dict[str, int]) -> dict[str, int]:
        """``d`` with ``layer``'s head_dim / n_kv from HF's ``per_layer_config`` where the row says so
        (:attr:`Tree.per_layer_dims`): the config object's per-layer view, or the sparse ``{"<layer>": {...}}``
        mapping its config.json holds."""
        head_dim, n_kv = self._per_layer(cfg, layer, "head_dim"), self._per_layer(cfg, layer, "num_key_value_heads")
        key = self.tree.attention.heads_per_layer  # Attention.heads_per_layer: this layer's query-head count
        heads = config_get(cfg, key, default=None) if key else None
        return {**d, "head_dim": int(head_dim or d["head_dim"]), "n_kv": int(n_kv or d["n_kv"]),
                "n_heads": int(heads[layer]) if heads is not None else d["n_heads"]}

    def _per_layer(self, cfg: Any, layer: int, key: str) -> Any:
        """``key`` of ``layer`` in HF's ``per_layer_config`` (:attr:`Tree.per_layer_dims`; None where unset): the
        config object's view (whose global ``head_dim`` raises as ambiguous), or config.json's sparse mapping."""
        plc = config_get(cfg, "per_layer_config") if self.tree.per_layer_dims else None
        if plc is None:
            return None
        if isinstance(plc, Mapping):
            return (plc.get(layer, plc.get(str(layer))) or {}).get(key)
        return getattr(plc[layer], key, None)

    def _layer(self, specs: dict[str, HookSpec], i: int, d: dict[str, int], residual_scale: tuple | None,
               mlp: Mlp, cfg: Any) -> None:
        t, norms = self.tree, self.tree.norms
        gdn = t.gdn_mixer if t.gdn_mixer and t.gdn_mixer.runs(cfg, i) else None
        norms = gdn.norms if gdn and gdn.norms else norms  # GdnMixer.norms: this layer's, where they differ
        residual = gdn.residual if gdn and gdn.residual else t.residual  # GdnMixer.residual
        d = self.layer_dims(cfg, i, d)  # Tree.per_layer_dims
        L, b, D = f"{t.root}.{t.layers}.{i}", f"blocks.{i}", d["d_model"]
        A = f"{L}.{t.attention.module}"
        M = f"{L}.{mlp.module}" if mlp.module else None
        n_kv = d["n_kv"] if t.attention.grouped_query else d["n_heads"]
        q, kv = d["n_heads"] * d["head_dim"], n_kv * d["head_dim"]
        qh, kh = Heads(d["n_heads"], d["head_dim"]), Heads(n_kv, d["head_dim"])

        def add(kind: str, module: str, read: str, convert: tuple = (), width: int = D,
                references: References = (), routing: Routing | None = None, token_dim: int | None = None,
                flat: bool = False, flat_rows: int | None = None, part: int | None = None) -> None:
            self._add(specs, f"{b}.{kind}", module, read, convert, width, references, routing, token_dim, flat,
                      flat_rows, part)

        def norm(kind: str, attr: str, read: str) -> None:
            if t.norm_hook == "hook_out":  # Tree.norm_hook: the norm's output as is, under its own hook_out
                add(kind.replace("hook_normalized", "hook_out"), f"{L}.{attr}", read)
                return
            add(kind, f"{L}.{attr}", read, (self.unfold(f"{L}.{attr}"),) if norms.kind.affine else ())

        def contribution(post_norm: str, legacy: str, sublayer_out: tuple[str, str]) -> None:
            """What a sublayer adds to the stream -- its post-norm's output, or its output times the
            residual multiplier -- which compatibility mode's legacy hook_attn_out / hook_mlp_out name."""
            attr = getattr(norms, post_norm)
            if attr:
                if t.norm_hook == "hook_normalized":  # with "hook_out" the line below is the norm's one hook
                    norm(f"{post_norm}.hook_normalized", attr, "out")
                add(f"{post_norm}.hook_out", f"{L}.{attr}", "out", references=(("compat", f"{b}.{legacy}"),))
            elif residual_scale:
                add(legacy, *sublayer_out, residual_scale, references=(("compat", f"{b}.{legacy}"),))

        # the sublayer outputs lose their legacy alias where the added contribution is another tensor
        attn_alias = (("compat", None),) if norms.ln1_post or residual_scale else ()
        mlp_alias = (("compat", None),) if norms.ln2_post or residual_scale else ()

        add("hook_in", L, residual.block_in)
        if norms.ln1:
            norm("ln1.hook_normalized", norms.ln1, norms.read)
        conv = t.short_conv if t.short_conv and t.short_conv.runs(cfg, i) else None
        if conv:  # Tree.short_conv: this layer's mixer is a short convolution, in attention's place
            C, h = f"{L}.{conv.module}", conv.hook
            add(f"{h}.hook_in", C, "in.hidden_states")
            add(f"{h}.in.hook_out", f"{C}.{conv.in_proj}", "out[0]", (), 3 * D)
            add(f"{h}.out.hook_in", f"{C}.{conv.out_proj}", "in[0]")
            add(f"{h}.hook_out", f"{C}.{conv.out_proj}", "out[0]")
        elif t.ssm_mixer and t.ssm_mixer.runs(cfg, i):  # Tree.ssm_mixer: a Mamba-2 mixer in attention's place
            self._ssm(specs, b, f"{L}.{t.ssm_mixer.module}", cfg, D)
        elif t.gdn_mixer and t.gdn_mixer.runs(cfg, i):  # Tree.gdn_mixer: a Gated DeltaNet mixer in attention's place
            self._gdn(add, f"{L}.{t.gdn_mixer.module}", cfg, b)
        else:
            self._attention(add, A, cfg, d, q, kv, qh, kh, attn_alias)
            if t.ssm_mixer and t.ssm_mixer.parallel:  # SsmMixer.parallel: beside attention, on the same normed input
                self._ssm(specs, b, f"{L}.{t.ssm_mixer.module}", cfg, D)
        if not (t.ssm_mixer and t.ssm_mixer.runs(cfg, i)):  # TL scales no Mamba-2 contribution (SsmMixer)
            contribution("ln1_post", "hook_attn_out", self._attn_out(A))
        if residual.mid:
            add("hook_resid_mid", f"{L}.{norms.ln2}" if residual.mid_at == "ln2" else M, residual.mid)
        if norms.ln2:
            norm("ln2.hook_normalized", norms.ln2, norms.read)
        dm = d["d_mlp"]
        up, down = f"{M or L}.{mlp.up}", f"{M or L}.{mlp.down}"
        add("mlp.hook_in", M or up, "in[0]")  # no MLP module (OPT): its projections' input / output
        if mlp.kind == MOE:
            add("mlp.gate.hook_out", f"{M}.{mlp.router}", "out[0]", (), d["n_experts"],
                routing=self._routing(mlp, cfg, f"{M}.{mlp.router}"), flat=mlp.flat_reads)
            tap = f"{M}.{mlp.experts}.{ROUTE_TAP}"  # the router's choice (harness.engines.route_tap)
            if mlp.route_choice:
                add("mlp.gate.hook_expert_weights", tap, "out[0]", (), d["n_experts"], flat=mlp.flat_reads)
                add("mlp.gate.hook_expert_indices", tap, "out[1]", (), int(config_get(cfg, "num_experts_per_tok")),
                    flat=mlp.flat_reads)
            if mlp.shared:  # a gated MLP of its own, run on every token
                S, h = f"{M}.{mlp.shared}", f"mlp.{mlp.shared_hook}"
                ds = (int(config_get(cfg, mlp.shared_width)) if mlp.shared_width else
                      int(config_get(cfg, "moe_intermediate_size")) * int(config_get(cfg, mlp.shared_count)))
                add(f"{h}.hook_in", S, "in[0]")
                if mlp.gate_proj:  # Mlp.gate_proj: the shared block's gate and up projections of their own
                    add(f"{h}.hook_pre", f"{S}.{mlp.gate_proj}", "out[0]", (), ds)
                    add(f"{h}.hook_pre_linear", f"{S}.up_proj", "out[0]", (), ds)
                else:
                    add(f"{h}.hook_pre", f"{S}.gate_up_proj", "out[0]", (Cols(0, ds),), ds)
                    add(f"{h}.hook_pre_linear", f"{S}.gate_up_proj", "out[0]", (Cols(ds, 2 * ds),), ds)
                add(f"{h}.hook_post", f"{S}.down_proj", "in[0]", (), ds)
                add(f"{h}.hook_out", *((f"{S}.down_proj", "out[0]") if mlp.shared_gate else (S, "out")))
                if mlp.shared_gate:  # Tree.Mlp.shared_gate: its logit, before vLLM's sigmoid
                    add(f"mlp.{mlp.shared_gate}.hook_in", f"{M}.{mlp.shared_gate}", "in[0]")
                    add(f"mlp.{mlp.shared_gate}.hook_out", f"{M}.{mlp.shared_gate}", "out[0]", (), 1)
        else:
            if mlp.gate_proj:  # Mlp.gate_proj: gate and up projections of their own
                add("mlp.hook_pre", f"{M or L}.{mlp.gate_proj}", "out[0]", (), dm)
                add("mlp.hook_pre_linear", up, "out[0]", (), dm)
            else:
                add("mlp.hook_pre", up, "out[0]", (Cols(0, dm),) if mlp.kind == GATED else (), dm, part=0)
            if mlp.kind == GATED and not mlp.gate_proj:
                add("mlp.hook_pre_linear", up, "out[0]", (Cols(dm, 2 * dm),), dm, part=1)
            add("mlp.hook_post", down, "in[0]", (), dm)
        mlp_out = (M, "out") if M else (down, "out[0]")
        add("mlp.hook_out", *mlp_out, references=mlp_alias)
        if t.mlp_contribution:  # Tree.mlp_contribution
            contribution("ln2_post", "hook_mlp_out", mlp_out)
        add("hook_out", L, residual.block_out)

    def _attention(self, add, A: str, cfg: Any, d: dict[str, int], q: int, kv: int, qh: Heads, kh: Heads,
                   attn_alias: References) -> None:
        """A layer's attention hooks, in forward order: input, q/k/v (or MLA's latents), q/k norms, rotated
        q/k, z, output."""
        t = self.tree
        add("attn.hook_in", A, "in.hidden_states")
        if t.attention.qkv_layout == MLA:
            self._mla(add, A, cfg, d)
        # part: q / k / v of a fused qkv_proj, read from HF's own projection where the backend keeps them apart
        unfusable = t.attention.qkv_layout == FUSED and not t.attention.qk_rows_halved
        for j, (x, module, convert, width) in enumerate(self._qkv(A, d, q, kv, qh, kh)):
            add(f"attn.hook_{x}", module, "out[0]", convert, width, part=j if unfusable else None)
        if t.attention.output_gate:  # Attention.output_gate: each head's second half, flat as TL's q_gate
            hd = d["head_dim"]
            add("attn.hook_q_gate", f"{A}.{t.attention.qkv}", "out[0]",
                (Cols(0, 2 * q), Heads(d["n_heads"], 2 * hd), Cols(hd, 2 * hd), Flatten(-2, -1)), q)
        if t.attention.qk_norm and (t.attention.qk_norm_key is None
                                    or config_get(cfg, t.attention.qk_norm_key, default=False)):
            for x, width in (("q", q), ("k", kv)):
                qk = f"{A}.{t.attention.qk_norm_modules['qk'.index(x)]}"
                if t.norm_hook == "hook_out":  # Tree.norm_hook: as is, vLLM's [T, heads, d_head] as TL's
                    add(f"attn.{x}_norm.hook_out", qk, t.attention.qk_norm_read, (), width)
                elif t.attention.qk_norm == QK_PER_HEAD:  # vLLM: [T, heads, d_head]; TL's hook: [heads, T, d_head]
                    at, read, split = ((f"{A}.{t.attention.rotary}", "in[1]" if x == "q" else "in[2]",
                                        (Heads(width // d["head_dim"], d["head_dim"]),))
                                       if t.attention.qk_norm_at_rotary else (qk, "out", ()))
                    add(f"attn.{x}_norm.hook_normalized", at, read,
                        (*split, self.unfold(qk), *((SwapAxes(0, 1),) if t.attention.qk_norm_heads_first else ())),
                        width)
                elif t.attention.qk_norm == QK_PER_HEAD_HEADS_FIRST:  # raw [1, heads, T, d_head]: tokens on dim 2
                    add(f"attn.{x}_norm.hook_normalized", qk, t.attention.qk_norm_read, (self.unfold(qk),), width,
                        token_dim=2)
                elif t.attention.qk_norm == QK_PER_HEAD_WEIGHTS:  # [T, heads, d_head] on both sides
                    add(f"attn.{x}_norm.hook_normalized", qk, t.attention.qk_norm_read, (self.unfold(qk),), width)
                else:  # QK_WHOLE: flat [T, heads * d_head], as in TL
                    at, read = ((f"{A}.{t.attention.rotary}", "in[1]" if x == "q" else "in[2]")
                                if t.attention.qk_norm_at_rotary else (qk, "out"))  # Attention.qk_norm_at_rotary
                    add(f"attn.{x}_norm.hook_normalized", at, read, (self.unfold(qk),), width)
                    add(f"attn.hook_{x}_normed", at, read, (), width)
        if t.attention.v_norm:  # Attention.v_norm: weightless, [T, kv_heads, d_head] on both sides
            add(f"attn.{t.attention.v_norm}.hook_out", f"{A}.{t.attention.v_norm}", "out", (), kv)
        if t.attention.rotary and t.attention.qkv_layout != MLA and t.attention.rotated_from:  # the kernel's inputs
            add("attn.hook_rot_q", f"{A}.{t.attention.rotated_from}", "in[0]", (qh,), q)
            add("attn.hook_rot_k", f"{A}.{t.attention.rotated_from}", "in[1]", (kh,), kv)
        elif t.attention.rotary and t.attention.qkv_layout != MLA:
            add("attn.hook_rot_q", f"{A}.{t.attention.rotary}", "out[0]", (qh,), q)
            add("attn.hook_rot_k", f"{A}.{t.attention.rotary}", "out[1]", (kh,), kv)
        if t.attention.qkv_layout == MLA:  # z is n_heads x v_head_dim
            v_dim = int(config_get(cfg, "v_head_dim"))
            add("attn.hook_z", f"{A}.{t.attention.out_proj}", "in[0]", (Heads(d["n_heads"], v_dim),),
                d["n_heads"] * v_dim)
        else:
            add("attn.hook_z", f"{A}.{t.attention.out_proj}", "in[0]", (qh,), q)
        add("attn.hook_out", *self._attn_out(A), references=attn_alias)

    def _attn_out(self, A: str) -> tuple[str, str]:
        """(module, read) of attn.hook_out: the attention module's return, or its ``returns_at`` child's."""
        at = self.tree.attention.returns_at
        return (f"{A}.{at}" if at else A), self.tree.attention.returns

    def _short_conv_nonfiring(self, cfg: Any, n_layers: int) -> list[NonFiring]:
        """Tree.short_conv: on a short-conv layer, the attention hooks (and the scores / pattern) the attention
        layers offer, and the mixer's fused internals; on an attention layer, the mixer's hooks."""
        sc, specs = self.tree.short_conv, self.hook_specs(cfg)
        kinds = lambda prefix: sorted({hook_kind(h) for h in specs if hook_kind(h).startswith(prefix)})  # noqa: E731
        attn = kinds("attn.") + (["attn.hook_attn_scores", "attn.hook_pattern"] if self.tree.score_inputs else [])
        mixer = kinds(f"{sc.hook}.")
        out: list[NonFiring] = []
        for i in range(n_layers):
            key = f"{sc.layer_types_key}[{i}]"
            if sc.runs(cfg, i):
                out += [NonFiring(f"blocks.{i}.{k}", f"layer {i} runs the short-convolution mixer in attention's "
                                                    f"place ({key} is {sc.layer_type!r}): no attention")
                        for k in sorted(set(attn))]
                out += [NonFiring(nf.template.replace("{i}", str(i)), nf.reason) for nf in sc.nonfiring]
            else:
                out += [NonFiring(f"blocks.{i}.{k}", f"layer {i} runs attention ({key} is not "
                                                    f"{sc.layer_type!r}): no short-convolution mixer")
                        for k in mixer + [nf.template.split(".", 2)[2] for nf in sc.nonfiring]]
        return out

    def _ssm(self, specs: dict[str, HookSpec], b: str, mixer: str, cfg: Any, d_model: int) -> None:
        """Tree.ssm_mixer on one layer: the Mamba-2 mixer's input, inner hooks (overlays.mamba2.mixer_specs) and
        output, each also against HF's forward hooks on the mixer (harness.references.reference._ssm_mixer_hooks)."""
        from .mamba2 import mixer_specs
        sm = self.tree.ssm_mixer
        h = f"{b}.{sm.hook}."  # SsmMixer.hook: TL's name of the mixer; the HF rows keep "mixer"
        scale = (Mul(1.0 / sm.input_scale.mul(cfg).factor),) if sm.input_scale else ()  # SsmMixer.input_scale
        refused = tuple((ref, None) for ref in self.tree.refused_references)  # Tree.refused_references
        specs[f"{h}hook_in"] = HookSpec(mixer, "in.hidden_states", (*self.tree.batch, *scale), d_model,
                                        references=(("hf", f"{b}.mixer.hook_in"), *refused))
        specs.update({k.replace(f"{b}.mixer.", h, 1): replace(v, references=(*v.references, *refused))
                      for k, v in mixer_specs(b, mixer, *sm.sizes(cfg)).items()
                      if sm.has_norm(cfg) or ".inner_norm." not in k})  # SsmMixer.norm_key
        specs[f"{h}hook_out"] = HookSpec(mixer, "out", self.tree.batch, d_model,
                                         references=(("hf", f"{b}.mixer.hook_out"), *refused))

    def _ssm_nonfiring(self, cfg: Any, n_layers: int) -> list[NonFiring]:
        """Tree.ssm_mixer: on a Mamba-2 layer, the attention hooks (and the scores / pattern and the scaled
        contribution) the attention layers offer, and the mixer's fused internals; on an attention layer, the
        mixer's hooks."""
        from .mamba2 import NONFIRING as MAMBA2
        sm, specs = self.tree.ssm_mixer, self.hook_specs(cfg)
        kinds = lambda prefix: sorted({hook_kind(h) for h in specs if hook_kind(h).startswith(prefix)})  # noqa: E731
        attn = set(kinds("attn.")) | ({"attn.hook_attn_scores", "attn.hook_pattern"} if self.tree.score_inputs else set())
        attn |= {k for k in ("hook_attn_out",) if k in {hook_kind(h) for h in specs}}
        inner = [nf for nf in MAMBA2 if nf.template.startswith("blocks.{i}.mixer.")]
        if not sm.has_norm(cfg):  # SsmMixer.norm_key: the gated norm off, its hooks not offered
            inner += [NonFiring(f"blocks.{{i}}.mixer.inner_norm.{x}", NORM_OFF.format(key=sm.norm_key))
                      for x in ("hook_in", "hook_gate", "hook_out")]
        if sm.parallel:  # SsmMixer.parallel: every layer runs both; only the mixer's fused internals, under TL's name
            return [NonFiring(nf.template.replace("{i}.mixer.", str(i) + f".{sm.hook}.", 1), nf.reason)
                    for i in range(n_layers) for nf in inner]
        out: list[NonFiring] = []
        for i in range(n_layers):
            key = f"{sm.layer_types_key}[{i}]"
            if sm.runs(cfg, i):
                out += [NonFiring(f"blocks.{i}.{k}", f"layer {i} runs a Mamba-2 mixer in attention's place ({key} "
                                                    f"is {sm.layer_type!r}): no attention")
                        for k in sorted(attn)]
                out += [NonFiring(nf.template.replace("{i}", str(i)), nf.reason) for nf in inner]
            else:
                out += [NonFiring(f"blocks.{i}.{k}", f"layer {i} runs attention ({key} is not {sm.layer_type!r}): "
                                                    "no Mamba-2 mixer")
                        for k in kinds("mixer.") + [nf.template.split(".", 2)[2] for nf in inner]]
        return out

    def _gdn(self, add, G: str, cfg: Any, b: str) -> None:
        """Tree.gdn_mixer on one layer, in TL's order: input, pre-conv q / k / v (``[T, heads, d]``), the write-gate
        logit (``[T, v_heads]``), the recurrence output and z (the gated norm's inputs, ``[T, v_heads, d_v]``),
        output (GdnMixer's docstring).  TransformerBridge fires the inner ones only on its own prefill path, not with the
        cache the references run with: they are compared with HF's forward hooks on the mixer
        (harness.references.reference._gdn_mixer_hooks, TL's names), input and output with both."""
        gm = self.tree.gdn_mixer
        nk, nv, hk, hv = gm.sizes(cfg)
        r, K, V = nv // nk, nk * hk, nv * hv
        h, qkvz, ba = gm.hook, f"{G}.{gm.qkvz}", f"{G}.{gm.ba}"
        if gm.layout == "interleaved":  # per key-head group [q | k | v (r heads) | z (r heads)], [b (r) | a (r)]
            group = Heads(nk, 2 * hk + 2 * r * hv)
            qkv = ((group, Cols(0, hk)), (group, Cols(hk, 2 * hk)),
                   (group, Cols(2 * hk, 2 * hk + r * hv), Heads(r, hv), Flatten(-3, -2)))
            beta = (Heads(nk, 2 * r), Cols(0, r), Flatten(-2, -1))
        else:  # [q | k | v | z], [b | a]
            qkv = ((Cols(0, K), Heads(nk, hk)), (Cols(K, 2 * K), Heads(nk, hk)), (Cols(2 * K, 2 * K + V), Heads(nv, hv)))
            beta = (Cols(0, nv),)
        hf = lambda name: (("bridge", None), ("hf", f"{b}.{h}.{name}"))  # noqa: E731 -- module doc
        add(f"{h}.hook_in", G, "in.hidden_states", references=(("hf", f"{b}.{h}.hook_in"),))
        for x, convert, width in zip("qkv", qkv, (K, K, V)):
            add(f"{h}.hook_{x}_pre_conv", qkvz, "out[0]", convert, width, references=hf(f"hook_{x}_pre_conv"))
        add(f"{h}.hook_beta_logit", ba, "out[0]", beta, nv, references=hf("hook_beta_logit"))
        # vLLM 0.20.2's CUDA path calls the norm on [T x v_heads, d_v] (HookSpec.flat_rows), the CPU line on [T, v_heads, d_v]
        add(f"{h}.hook_recurrence_out", f"{G}.{gm.norm}", "in[0]", (), V, references=hf("hook_recurrence_out"),
            flat_rows=nv)
        add(f"{h}.hook_gate_input", f"{G}.{gm.norm}", "in[1]", (), V, references=hf("hook_gate_input"), flat_rows=nv)
        add(f"{h}.hook_out", f"{G}.{gm.out_at}" if gm.out_at else G, gm.out_read,
            references=(("hf", f"{b}.{h}.hook_out"),))

    def _gdn_nonfiring(self, cfg: Any, n_layers: int) -> list[NonFiring]:
        """Tree.gdn_mixer: on a Gated DeltaNet layer, the attention hooks (and the scores / pattern) the attention
        layers offer, and the mixer's fused internals; on an attention layer, the mixer's hooks."""
        gm, specs = self.tree.gdn_mixer, self.hook_specs(cfg)
        kinds = lambda prefix: sorted({hook_kind(h) for h in specs if hook_kind(h).startswith(prefix)})  # noqa: E731
        attn = set(kinds("attn.")) | ({"attn.hook_attn_scores", "attn.hook_pattern"} if self.tree.score_inputs else set())
        out: list[NonFiring] = []
        for i in range(n_layers):
            key = f"{gm.layer_types_key}[{i}]"
            if gm.runs(cfg, i):
                out += [NonFiring(f"blocks.{i}.{k}", f"layer {i} runs a Gated DeltaNet mixer in attention's place "
                                                    f"({key} is {gm.layer_type!r}): no softmax attention")
                        for k in sorted(attn)]
                out += [NonFiring(nf.template.replace("{i}", str(i)), nf.reason) for nf in gm.nonfiring]
            else:
                out += [NonFiring(f"blocks.{i}.{k}", f"layer {i} runs softmax attention ({key} is not "
                                                    f"{gm.layer_type!r}): no Gated DeltaNet mixer")
                        for k in kinds(f"{gm.hook}.") + [nf.template.split(".", 2)[2] for nf in gm.nonfiring]]
        return out

    def _mla(self, add, A: str, cfg: Any, d: dict[str, int]) -> None:
        """Multi-head latent attention (vLLM's ``MultiHeadLatentAttentionWrapper``, prefill), in TL's order:
        the latents (``q_a_layernorm`` / ``kv_a_layernorm`` outputs, and their un-folded
        ``hook_normalized``), the rotated rope parts (``rotary_emb``: ``[T, H, rope]`` and the shared
        ``[T, 1, rope]`` key), the final q entering attention (the MLA layer's input: ``[nope | rope]``
        per head), v (``kv_b_proj``'s per-head ``[k_nope | v]``, v columns); q / v heads-first as TL's."""
        att = self.tree.attention
        H, nope = d["n_heads"], int(config_get(cfg, "qk_nope_head_dim"))
        rope, v_dim = int(config_get(cfg, "qk_rope_head_dim")), int(config_get(cfg, "v_head_dim"))
        kv_rank, q_rank = int(config_get(cfg, "kv_lora_rank")), config_get(cfg, "q_lora_rank")
        deint = bool(att.rope_deinterleave_key and config_get(cfg, att.rope_deinterleave_key, default=False))
        rot = (DeInterleave(0, rope),) if deint else ()
        q_rot = (DeInterleave(nope, nope + rope),) if deint else ()
        for x, norm, width in (("q", att.mla_q_norm, q_rank), ("kv", att.mla_kv_norm, kv_rank)):
            if width is None:  # no q compression (V2-Lite): q_proj reads the layer's input
                continue
            module = f"{A}.{norm}"
            add(f"attn.hook_{x}_latent", module, "out", (), int(width))
            add(f"attn.{norm}.hook_normalized", module, "out", (self.unfold(module),), int(width))
        if att.mla_rot_at_core:  # Attention.mla_rot_at_core: [T, H, nope + rope] -> the rope columns; [T, 1, rope]
            add("attn.hook_rot_q", f"{A}.{att.mla_core}", "in[0]", (Cols(nope, nope + rope), *rot), H * rope)
            add("attn.hook_rot_k", f"{A}.{att.mla_core}", "in[2]", rot, rope)
        else:
            add("attn.hook_rot_q", f"{A}.{att.rotary}", "out[0]", rot, H * rope)
            add("attn.hook_rot_k", f"{A}.{att.rotary}", "out[1]", rot, rope)
        add("attn.hook_q", f"{A}.{att.mla_core}", "in[0]", (*q_rot, SwapAxes(0, 1)), H * (nope + rope))
        add("attn.hook_v", f"{A}.{att.mla_kv_up}", "out[0]",
            (Heads(H, nope + v_dim), Cols(nope, nope + v_dim), SwapAxes(0, 1)), H * v_dim)

    def _qkv(self, A: str, d: dict[str, int], q: int, kv: int, qh: Heads, kh: Heads):
        """``(x, module, conversions, width)`` of ``hook_q`` / ``hook_k`` / ``hook_v``."""
        att = self.tree.attention
        if att.qkv_layout == MLA:
            return ()
        widths = (q, kv, kv) if att.qkv_width == "slice" else (q + 2 * kv,) * 3
        if att.qkv_layout == SEPARATE:
            return zip("qkv", (f"{A}.{p}" for p in att.q_k_v), ((qh,), (kh,), (kh,)), widths)
        if att.qkv_layout == PER_HEAD:  # [T, heads, 3 * head_dim], then q / k / v columns of each head
            hd, per_head = d["head_dim"], Heads(d["n_heads"], 3 * d["head_dim"])
            converts = tuple((per_head, Cols(j * hd, (j + 1) * hd)) for j in range(3))
        elif att.output_gate:  # Attention.output_gate: [q_h | gate_h] per head, then k, v
            # hook_q is TL's: q_proj's whole output in head_dim slices, [q_0 | gate_0 | q_1 | gate_1 | ...]
            converts = ((Cols(0, 2 * q), Heads(2 * d["n_heads"], d["head_dim"])), (Cols(2 * q, 2 * q + kv), kh),
                        (Cols(2 * q + kv, 2 * q + 2 * kv), kh))
            widths = (2 * q, kv, kv)
        else:  # FUSED: [q | k | v]
            converts = ((Cols(0, q), qh), (Cols(q, q + kv), kh), (Cols(q + kv, q + 2 * kv), kh))
        if att.qk_rows_halved:  # Attention.qk_rows_halved: back to HF's adjacent pairs, per head
            back = DeInterleave(0, d["head_dim"], inverse=True)
            converts = ((*converts[0], back), (*converts[1], back), converts[2])
        return zip("qkv", (f"{A}.{att.qkv}",) * 3, converts, widths)


__all__ = ["ALIBI", "Attention", "GdnMixer", "ShortConv", "FUSED", "FUSED_PAIR", "GATED", "GEMMA_RMS", "LAYER_NORM", "MLA", "MOE", "Mlp", "NO_AFFINE",
           "Norms", "NormKind", "PARALLEL", "PER_HEAD", "PLAIN", "PLAIN_STREAM", "POST_NORM", "QK_PER_HEAD", "QK_PER_HEAD_HEADS_FIRST", "QK_PER_HEAD_WEIGHTS", "QK_WHOLE", "RMS",
           "BACKEND_FUSED", "Residual", "SCORES_FROM_QK", "SCORES_FROM_ROTATED", "SEPARATE", "SPARSEMIXER", "STREAM_PAIR", "Scale", "Tree",
           "TreeOverlay", "alibi_slopes", "transformers_backend"]
