"""The overlay contract: where each canonical hook lives in vLLM, as data.

An overlay never boots an engine.  For an HF config it returns, per canonical
TransformerLens hook name (``blocks.0.hook_out``), a :class:`HookSpec`:

* ``module``  -- dot path in vLLM's model tree (``model.layers.0``);
* ``read``    -- what to take from that module's call, in a tiny grammar the
  worker evaluates (see :data:`READ_GRAMMAR`), e.g. ``out[0]+out[1]`` for the
  fused ``(delta, residual)`` pair a vLLM decoder layer returns, or
  ``in.hidden_states`` for a module's input;
* ``convert`` -- pure conversions applied host-side, in order, to turn the raw
  read into the TransformerLens value (un-fold a norm weight, apply an
  embedding scale, slice a fused projection, split heads).

Conversions run on the host, not in the worker, so a planted mapping bug can be
tested against real captured tensors without rebooting vLLM (fault injection),
and so each conversion is a pure function with its own unit test.

The seed contract of TransformerLens's vLLM overlay is kept as two derived
views: :meth:`Overlay.capture_specs` ``-> {hook: (dot_path, width)}`` and
:meth:`Overlay.nonfiring_hooks` ``-> [template]``.  Non-firing hooks carry the
reason they cannot be observed (:meth:`Overlay.nonfiring`), and the report
lists them; they are never dropped silently.

Layering: this module is the leaf of the overlay package (every other overlay
module and harness.comparison import it); it imports only :mod:`harness.vocab`.
:func:`expand_layers`, :func:`layer_of` and :func:`hook_kind` are
:mod:`harness.vocab.hooks`'s, re-exported for existing callers; hook names are
parsed there only.  The overlays themselves are declared as rows in
:mod:`overlays.tree`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Mapping

from harness.vocab.capture_keys import read_key
from harness.vocab.hooks import expand_layers, hook_kind, layer_of

# read := term ('+' term)*
# term := 'out' | 'out[' N ']' | 'in[' N ']' | 'in.' NAME
#   out[N] of a plain tensor output is the tensor itself for N == 0 (a vLLM
#   norm returns a tensor when called without a residual, a tuple with one);
#   in.NAME is a keyword argument, or the positional one bound to that name.
# A term that evaluates to None (vLLM's residual entering layer 0) adds nothing.
_TERM = r"(out(\[\d+\])?|in\[\d+\]|in\.[A-Za-z_][A-Za-z0-9_]*)"
READ_GRAMMAR = re.compile(rf"^{_TERM}(\+{_TERM})*$")


@dataclass(frozen=True)
class Mul:
    """Multiply by a constant cast to the capture's dtype (embedding scale)."""

    factor: float

    def describe(self) -> str:
        return f"x * {self.factor:.6g}"


@dataclass(frozen=True)
class UnfoldNorm:
    """Divide by a norm's weight (+ offset): vLLM applies it, TL's
    ``hook_normalized`` is taken before it.  ``offset`` is 1 for Gemma-style
    norms, which multiply by ``(1 + w)``.  ``bias`` names a LayerNorm's bias:
    TL's LayerNorm ``hook_normalized`` is ``(x - mean) / std`` before the
    weight *and* the bias, so the un-fold is ``(y - b) / w``."""

    param: str
    offset: float = 0.0
    bias: str | None = None

    def describe(self) -> str:
        y = f"(x - {self.bias})" if self.bias else "x"
        return f"{y} / ({self.param}{' + %g' % self.offset if self.offset else ''})"


@dataclass(frozen=True)
class Cols:
    """Keep columns ``[start, stop)`` of the last dim (fused qkv / gate_up)."""

    start: int
    stop: int

    def describe(self) -> str:
        return f"x[..., {self.start}:{self.stop}]"


@dataclass(frozen=True)
class Heads:
    """Split the last dim into ``(n_heads, head_dim)``."""

    n_heads: int
    head_dim: int

    def describe(self) -> str:
        return f"x.view(T, {self.n_heads}, {self.head_dim})"


@dataclass(frozen=True)
class DropBatch:
    """Drop a leading batch dim of size 1: vLLM's Transformers modeling backend
    runs the HF modules on ``[1, T, ...]`` where native vLLM models see
    ``[T, ...]``.  Raises where the leading dim is not 1."""

    def describe(self) -> str:
        return "x[0]  (batch of 1)"


@dataclass(frozen=True)
class SwapAxes:
    """Swap two dims, e.g. ``[T, heads, d]`` -> ``[heads, T, d]`` for a hook TL
    takes in its attention's heads-first layout (Gemma-3's q/k norms)."""

    dim0: int
    dim1: int

    def describe(self) -> str:
        return f"x.transpose({self.dim0}, {self.dim1})"


@dataclass(frozen=True)
class DeInterleave:
    """Reorder last-dim entries ``[start, stop)`` from adjacent pairs to halves: ``(x0, x1, x2, x3, ...)``
    -> ``(x0, x2, ..., x1, x3, ...)``.  vLLM's GPT-J-style rotary (``is_neox_style=False``, DeepSeek's MLA)
    rotates pairs ``(x[2j], x[2j+1])`` in place, while HF's DeepSeek-V3 (``rope_interleave``) first
    moves the even and the odd entries into two halves and rotates those: the same numbers, in
    another order.  Entries outside ``[start, stop)`` (MLA's non-rotary ``nope`` part) stay."""

    start: int
    stop: int
    # True: the inverse, halves -> pairs: vLLM's Llama-4 loader permutes each q / k head's rows from HF's adjacent
    # pairs to halves (permute_qk_weight_for_rotary) so its NeoX rotary matches HF's complex one; HF's q / k are
    # the pairs order (overlays/llama4.py)
    inverse: bool = False

    def __post_init__(self) -> None:
        if self.start < 0 or self.stop <= self.start or (self.stop - self.start) % 2:
            raise ValueError(f"DeInterleave: [{self.start}, {self.stop}) is not an even, non-empty range")

    def describe(self) -> str:
        return f"x[..., {self.start}:{self.stop}] {'halves -> pairs' if self.inverse else 'pairs -> halves'}"


@dataclass(frozen=True)
class Flatten:
    """Merge dims ``start..end`` into one, ``x.flatten(start, end)``: a per-group split back to TL's per-head
    layout (Qwen3-Next's Gated DeltaNet projections, interleaved per key-head group: ``[T, k_heads, ratio, d]``
    -> ``[T, v_heads, d]``)."""

    start: int
    end: int

    def describe(self) -> str:
        return f"x.flatten({self.start}, {self.end})"


Conversion = Mul | UnfoldNorm | Cols | Heads | DropBatch | SwapAxes | DeInterleave | Flatten


@dataclass(frozen=True)
class Routing:
    """How a mixture-of-experts router's logits choose each token's experts, where the rule is more than
    the top-k logits: what the comparison needs to tell a near-tie flip from a routing bug
    (harness.comparison.routing).  Declared on the router-logits hook (``mlp.gate.hook_out``).

    ``scoring``: ``"softmax"`` or ``"sigmoid"`` scores of the logits; plus ``bias`` (the engine's and the
    checkpoint's name of ``e_score_correction_bias``, added to the scores for the choice only) where
    set; then ``topk_group`` of ``n_group`` expert groups by group score (the top two scores summed
    with a bias, the best score without), then the top-k experts inside them: vLLM's CPU
    ``_grouped_topk`` and HF's DeepSeek-V3 / GLM-4-MoE routers compute the same choice."""

    scoring: str = "softmax"
    n_group: int = 1
    topk_group: int = 1
    bias: str | None = None
    # scoring "sparsemixer" (Phi-3.5-MoE, top-2): expert 1 the arg-max logit, expert 2 the arg-max of the rest, each
    # weighted by a softmax over the logits within a relative 2 * jitter_eps of its own: the choice is the two ids
    # *and* each softmax's members, whose threshold is a second kind of near-tie (harness.comparison.routing)
    jitter_eps: float | None = None
    # the checkpoint's name of ``bias`` where the engine's loader renames it (LFM2-MoE's ``feed_forward.expert_bias``,
    # vLLM's ``feed_forward.gate.e_score_correction_bias``): the reference side's bias is read there
    # (harness.pipeline.runner.routing_params); None: ``bias``
    checkpoint_bias: str | None = None

    def __post_init__(self) -> None:
        if self.scoring not in ("softmax", "sigmoid", "sparsemixer"):
            raise ValueError(f"Routing.scoring {self.scoring!r} is none of 'softmax', 'sigmoid', 'sparsemixer'")
        if (self.scoring == "sparsemixer") != (self.jitter_eps is not None):
            raise ValueError("Routing: jitter_eps is the sparsemixer's, and it needs one")
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"Routing: topk_group {self.topk_group} outside 1..n_group {self.n_group}")


@dataclass(frozen=True)
class HookSpec:
    module: str
    read: str = "out"
    convert: tuple[Conversion, ...] = ()
    width: int | None = None
    # "first": the module's first call per prompt.  "all": every call, stitched
    # into one [T, ...] tensor by row counts (harness.comparison.conversions.stitch_calls),
    # e.g. vLLM's logits processor, called once for the sampled last position
    # and once for the prompt positions when prompt log-probs are requested.
    calls: str = "first"
    # This hook's name on a reference where it differs from harness.vocab.hook_names'
    # defaults: ((reference, name or None), ...), reference "bridge", "compat" or "hf".
    # None: that reference holds no tensor equal to this hook, so no row is made
    # against it (Granite: the legacy hook_attn_out is attn.hook_out times the
    # residual multiplier; HF's embedding module output lacks the embedding
    # multiplier).  ("bridge", None): captured only as the input of derived
    # hooks, compared nowhere (GPT-NeoX's rotated q/k, which TransformerBridge
    # does not expose).  ("compat-processed", None): no processed compatibility-mode row, where
    # HookedTransformer's weight processing does not move this hook into the centred coordinates
    # harness.comparison.processing assumes (BERT's post-LN stream, overlays/bert.py).
    # The overlay's docstring must say why.
    references: tuple[tuple[str, str | None], ...] = ()
    # A router-logits hook's choice rule where it is not the top-k logits (:class:`Routing`); its bias
    # parameter is read from the engine with the hook's other parameters.
    routing: Routing | None = None
    # The raw read's token dim where it is neither 0 nor, after a leading DropBatch, 1: HF's heads-first
    # [1, heads, T, d_head] reads under vLLM's Transformers backend (HunYuan's q/k norms): 2.  Stitching
    # and the ragged-batch split cut the raw read along it (:attr:`raw_token_dim`).
    token_dim: int | None = None
    # A module the model calls several times per forward (HRM-Text's looped stacks run each layer at several
    # recurrence steps): ``per_forward`` calls per forward, and this hook is call ``call`` of them (0 the first).
    # The engine records every call in order, so the read is that record; a serving scheme that stitches one call
    # per step, and the ragged batch, cannot tell the steps of such a module apart (harness.values.plan).
    call: int = 0
    per_forward: int = 1
    # A read some vLLM line passes with its heads folded into the token rows, ``[T x flat_rows, d]`` where the
    # canonical layout is ``[T, flat_rows, d]`` (vLLM 0.20.2's CUDA Gated DeltaNet calls its gated norm on
    # ``[T x v_heads, d_v]``, the CPU line on ``[T, v_heads, d_v]``): a 2-D raw read is viewed ``[T, flat_rows, d]``
    # before its token rows are cut (harness.comparison.shapes.unflatten_rows), and a serving run's stitcher cuts
    # its rows in units of flat_rows (harness.engines.stitch, fed by EngineRequest.flat_rows); a raw read of the
    # canonical rank is left as it is.
    flat_rows: int | None = None
    # The same tensor read where the engine's module tree keeps apart what this read takes from a fused module: vLLM's
    # Transformers backend fuses HF's q_proj / k_proj / v_proj into ``qkv_proj`` and gate_proj / up_proj into
    # ``gate_up_proj`` only where its fusers match the HF class's traced forward, which depends on the line (which
    # lines keep which apart: docs/evidence/vllm-lines.md), so the tree does.  The engine is asked for both reads; the
    # plan keeps this one only where the primary module is not in the loaded tree and this one's is
    # (harness.values.plan.Plan.reads_found), and the report says so.  Never a silent fallback: both name the same
    # tensor, declared by the overlay row (overlays.tree.BACKEND_FUSED).
    unfused: "HookSpec | None" = None

    def __post_init__(self) -> None:
        if self.unfused is not None and self.unfused.unfused is not None:
            raise ValueError("HookSpec.unfused is one alternative read, not a chain")
        if self.flat_rows is not None and self.flat_rows < 1:
            raise ValueError(f"HookSpec.flat_rows {self.flat_rows} is not a positive head count")
        if not 0 <= self.call < self.per_forward:
            raise ValueError(f"HookSpec.call {self.call} is not a call of the {self.per_forward} per forward")
        if self.calls == "all" and self.per_forward != 1:
            raise ValueError("HookSpec.calls 'all' stitches every call: it cannot also pick one (per_forward)")
        if not READ_GRAMMAR.match(self.read):
            raise ValueError(f"HookSpec.read {self.read!r} does not match the read grammar")
        if self.calls not in ("first", "all"):
            raise ValueError(f"HookSpec.calls {self.calls!r} is neither 'first' nor 'all'")
        unknown = {ref for ref, _ in self.references} - {"bridge", "compat", "compat-processed", "hf"}
        if unknown:
            raise ValueError(f"HookSpec.references names unknown reference(s) {sorted(unknown)}")

    def reference_name(self, reference: str, default: str | None) -> str | None:
        """This hook's name on ``reference`` (``bridge`` | ``compat`` | ``hf``): the override, else ``default``."""
        return dict(self.references).get(reference, default)

    @property
    def raw_key(self) -> str:
        """Key of the raw capture this hook is converted from."""
        return read_key(self.module, self.read)

    @property
    def raw_token_dim(self) -> int:
        """The token dim of the raw read: :attr:`token_dim` where set, else 1 for a ``[1, T, ...]`` read
        (a leading :class:`DropBatch`), else 0."""
        if self.token_dim is not None:
            return self.token_dim
        return 1 if self.convert and isinstance(self.convert[0], DropBatch) else 0

    def params(self) -> list[str]:
        """The engine parameters this hook's conversion and comparison read."""
        out = [p for c in self.convert if isinstance(c, UnfoldNorm) for p in (c.param, c.bias) if p]
        return out + ([self.routing.bias] if self.routing is not None and self.routing.bias else [])

    def engine_reads(self) -> list["HookSpec"]:
        """This read and its :attr:`unfused` alternative, each one the engine is asked to record."""
        return [self] if self.unfused is None else [self, self.unfused]

    def with_convert(self, *convert: Conversion) -> "HookSpec":
        return replace(self, convert=tuple(convert))


@dataclass(frozen=True)
class Derived:
    """A hook vLLM never materializes, computed host-side from captured hooks
    (:mod:`harness.comparison.derived`).  Reported as derived: it proves the formula on
    vLLM's inputs, not a tensor vLLM computed.

    ``kind`` ``"attn_scores"``: ``softcap(q @ k^T * scale)`` with k's heads
    repeated for grouped-query attention, then the causal (and sliding
    ``window``) mask; ``"pattern"``: the softmax of that over keys.  ``inputs``
    are canonical hook names ``(q, k)``, shapes ``[T, n_heads, d_head]`` and
    ``[T, n_kv_heads, d_head]``.
    """

    kind: str
    inputs: tuple[str, ...]
    scale: float
    window: int | None = None
    softcap: float | None = None
    # False: bidirectional attention (an encoder, :class:`Encoder`): every query sees every key, no mask
    causal: bool = True
    # ALiBi (BLOOM): per-head slopes; scores get ``slope_h * j`` for key position ``j`` (HF's build_alibi_tensor)
    alibi_slopes: tuple[float, ...] | None = None
    # chunked attention (Llama-4's attention_chunk_size on its "chunked_attention" layers): key ``j`` is visible from
    # query ``i`` only within the same chunk, ``i // chunk == j // chunk`` (HF's chunked_overlay, vLLM's
    # ChunkedLocalAttention); None: no chunking
    chunk: int | None = None
    # False: HF's eager attention holds no pre-softmax score tensor of its own for this layer (the reason is the
    # overlay's: Tree.scores_not_in_hf), so the derived hook is compared with TransformerLens's references only
    hf_reference: bool = True

    def describe(self) -> str:
        extra = "".join(f", {n}={v:g}" for n, v in (("window", self.window), ("softcap", self.softcap),
                                                    ("chunk", self.chunk)) if v)
        extra += ", alibi" if self.alibi_slopes else ""
        return f"{self.kind}({', '.join(self.inputs)}; scale={self.scale:.6g}{extra}{'' if self.causal else ', bidirectional'})"


@dataclass(frozen=True)
class Encoder:
    """The model is an encoder (BERT's masked LM), not a causal decoder: what the harness does
    differently, declared once on the overlay (:attr:`Overlay.encoder`) and read by the plan, the
    subject, the references and the pipeline -- never an ``if name == ...``.

    * vLLM runs it with its pooling runner (``LLM(runner="pooling")``) and returns the head's
      per-token output from ``LLM.encode(..., pooling_task=pooling_task)``, with the pooler's
      activation off: the MLM logits ``[T, vocab]``, compared as the log-prob and argmax rows;
      there is no ``generate`` and no sampler.
    * attention is bidirectional: derived scores / pattern are unmasked (``Derived.causal``), and a
      chaotic token sets its whole prompt aside (every position attends to it).
    * the references are built with ``hf_class`` (``AutoModelForMaskedLM``), not a causal LM.
    * ``second_segment``: token type 1 from position ``floor(T * second_segment)`` on, type 0 before
      (:meth:`token_types`): vLLM takes token types only as "zeros, then ones" (its pooling params'
      ``compressed_token_type_ids``: the position of the first 1); ``None``: type 0 everywhere.
    * ``not_applicable``: serving shapes (``--serving``, harness.engines.serving) that do not exist
      for this model, with the reason: the run is reported skipped with it, never run or passed.
    * ``output``: what ``encode`` returns per token.  ``"logits"``: the head's logits ``[T, vocab]``.
      ``"hidden"``: the encoder's last hidden state ``[T, d_model]``, where vLLM serves the architecture
      without its head, as an embedding model (RoBERTa, ModernBERT): the engine is booted with
      ``pooler_config={"task": pooling_task}`` (``token_embed``: such a model's default task is the pooled
      ``embed``), and the references' counterpart is HF's last hidden state (``last_hidden_state``, else
      the last of ``hidden_states``); the log-prob and argmax rows then compare the log-softmax of those
      ``d_model`` values.
    """

    pooling_task: str = "token_classify"
    hf_class: str = "AutoModelForMaskedLM"
    second_segment: float | None = 0.5
    not_applicable: tuple[tuple[str, str], ...] = ()
    output: str = "logits"

    def __post_init__(self) -> None:
        if self.second_segment is not None and not 0.0 < self.second_segment < 1.0:
            raise ValueError(f"Encoder.second_segment {self.second_segment!r} is not in (0, 1)")
        if self.output not in ("logits", "hidden"):
            raise ValueError(f"Encoder.output {self.output!r} is not 'logits' or 'hidden'")

    def token_types(self, n_tokens: int) -> list[int] | None:
        """One prompt's token type ids (``None``: the model's default, type 0 everywhere)."""
        if self.second_segment is None:
            return None
        first = min(max(int(n_tokens * self.second_segment), 1), n_tokens)
        return [0] * first + [1] * (n_tokens - first)

    def why_not(self, serving: str) -> str | None:
        """Why serving shape ``serving`` does not apply to this model (None: it applies)."""
        return dict(self.not_applicable).get(serving)


@dataclass(frozen=True)
class NonFiring:
    template: str  # e.g. "blocks.{i}.attn.hook_pattern"
    reason: str


class Overlay:
    """The contract callers use.  Every registered overlay is an :class:`overlays.tree.TreeOverlay`
    (a declared row, expanded by one builder); subclass this directly only to wrap an overlay
    (tests/engine/test_fault_injection.py plants bugs that way): implement :meth:`hook_specs` and
    :meth:`nonfiring`."""

    name = "base"
    # Set: an encoder-only model run by vLLM's pooling runner (:class:`Encoder`); None: a causal LM
    encoder: Encoder | None = None

    def hook_specs(self, hf_config: Any) -> dict[str, HookSpec]:
        raise NotImplementedError

    def nonfiring(self) -> list[NonFiring]:
        return []

    def cuda_graph_nonfiring(self, hf_config: Any) -> list[NonFiring]:
        """Hooks that fire in eager mode but not on CUDA-graph replays (compiled mode on CUDA):
        modules vLLM calls inside another custom op, out of dynamo's sight, so their hooks
        run while the graph is captured and never again (see harness.engines.vllm_compat)."""
        return []

    def derived_specs(self, hf_config: Any) -> dict[str, Derived]:
        """Hooks computed host-side from :meth:`hook_specs` captures (none by default)."""
        return {}

    # False: TransformerLens has no adapter for the architecture (TransformerBridge cannot boot it), so HF is the
    # only reference: no bridge, compatibility-mode or ragged rows, derived hooks against HF's own scores only, the
    # floors and chaotic tokens from HF's run alone (harness.references.reference), every hook's references naming
    # ``hf`` (:meth:`hf_reads` where HF's plain forward hooks do not hold it)
    tl_adapter: bool = True

    def hf_reads(self, hf_config: Any) -> dict[str, HookSpec]:
        """Hooks the HF reference reads at HF's own modules (``module``: a path in HF's model, ``read``: ``out`` or
        ``in[0]``, ``convert``: with HF's parameter names, the batch dim left to the reference's own drop), under
        the name the hook's ``("hf", name)`` reference gives; none by default (HF's forward hooks: the layers'
        input / output and the input embeddings)."""
        return {}

    def nonfiring_for(self, hf_config: Any) -> list[NonFiring]:
        """Non-firing hooks for this config: :meth:`nonfiring` plus whatever the
        config rules out (e.g. a soft-capped unembedding).  Callers that have a
        config use this one."""
        return self.nonfiring()

    # --- the seed's contract, derived -------------------------------------
    def capture_specs(self, hf_config: Any) -> dict[str, tuple[str, int | None]]:
        return {h: (s.module, s.width) for h, s in self.hook_specs(hf_config).items()}

    def nonfiring_hooks(self) -> list[str]:
        return [n.template for n in self.nonfiring()]


def config_get(cfg: Any, *names: str, default: Any = None) -> Any:
    """First attribute of ``cfg`` among ``names`` (HF configs name things differently)."""
    text = getattr(cfg, "text_config", None)
    for obj in (cfg, text) if text is not None else (cfg,):
        for n in names:
            v = getattr(obj, n, None) if not isinstance(obj, Mapping) else obj.get(n)
            if v is not None:
                return v
    return default


__all__ = ["READ_GRAMMAR", "Cols", "Conversion", "DeInterleave", "Derived", "DropBatch", "Flatten", "Encoder", "Heads", "HookSpec", "Mul", "Routing",
           "NonFiring", "Overlay", "SwapAxes", "UnfoldNorm", "config_get", "expand_layers", "hook_kind", "layer_of"]
