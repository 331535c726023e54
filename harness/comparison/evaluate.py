"""Evaluate a plan: captures of both sides -> one result row per planned case.

Contract: :func:`evaluate(plan, subject, refs, prompts, gate, model)` is pure given
its inputs (no engine runs): it converts the subject's raw captures with the
overlay's conversions, derives the derived hooks, finds expert-routing flips, and
emits exactly one :class:`HookResult` per ``plan.cases`` entry, in that order, each
with its final status from ``gate.finalize``.  Every flip found is returned too.
Rows leave out the tokens that upstream events set aside (harness.comparison.set_aside):
explained routing flips found here, and the chaotic tokens the references found in their
own floor run (``refs.chaos``, harness.comparison.chaos).

Memory: vLLM's values are converted when a row first asks for them and held one decoder layer
at a time (the plan lists each section layer by layer; a value asked for again after its layer
was left is converted again), and the captures themselves are read from disk one tensor at a
time (harness.spill): the evaluation holds one layer's tensors, not the run's.

Traps:
- A capture that never fired, or whose conversion fails, makes an ``error`` row on
  every reference, and the derived hooks computed from it say which input failed.
- Ragged-batch rows are the subject's batched run split per request; they may flip
  other expert near-ties than the single-prompt runs, so their flips are their own.
- A row's message names how vLLM's value was obtained (module, read, conversions) when
  it does not pass, so a failing mapping can be read off the message.
"""
from __future__ import annotations


import torch

from overlays.base import HookSpec
from harness.comparison.chaos import RESIDUAL_OUT, ChaoticToken, find_chaotic
from harness.comparison.conversions import convert, left_out, stitch_calls
from harness.comparison.derived import derive, ignore_common_mask
from harness.comparison.gate import CROSS_REFERENCE, Band, Gate
from harness.comparison.known_issues import explain_gated_norm, gated_norm_bug, gated_norm_signature, regroup_layout
from harness.comparison.nonfinite import NEG_INF_KINDS, describe, first_nonfinite
from harness.comparison.logits import greedy_agreement, logit_rows
from harness.comparison.rows import REFERENCE_ENGINE, Pairs, axes_of, compared_row, pairs_of
from harness.comparison.routing import Flip, find_flips, routing_module
from harness.comparison.set_aside import set_aside
from harness.comparison.shapes import subject_to_canonical, unflatten_rows
from harness.values.plan import Case, Plan
from harness.values.results import HookResult
from harness.comparison.processing import to_hooked_coordinates
from harness.vocab.hook_rules import GATE
from harness.vocab.hooks import hook_kind, layer_of


class _LayerCache(dict):
    """hook -> converted values, holding one decoder layer's at a time (or the hooks outside the
    layers): the plan lists each section's cases layer by layer, so a run's memory is one layer's
    values, not every hook's.  A value evicted and asked for again is converted again."""

    def put(self, hook: str, value):
        layer = layer_of(hook)
        for old in [h for h in self if layer_of(h) != layer]:
            del self[old]
        self[hook] = value
        return value


class NoValue(Exception):
    """A hook has no value; the message is the whole reason, as the row states it."""


class _Values:
    """hook -> its values per prompt, computed once and kept one layer at a time (:class:`_LayerCache`),
    or the reason it has none (``failed``): the one "compute, else record why" rule of the evaluation."""

    def __init__(self) -> None:
        self.cache = _LayerCache()
        self.failed: dict[str, str] = {}

    def get(self, hook: str, compute, why) -> list[torch.Tensor] | None:
        """The cached value, else ``compute()``; where it raises, ``why(exc)`` is recorded (a
        :class:`NoValue`'s own message is the reason as it stands) and None returned, now and later."""
        if hook in self.failed:
            return None
        if hook in self.cache:
            return self.cache[hook]
        try:
            return self.cache.put(hook, compute())
        except NoValue as exc:
            self.failed[hook] = str(exc)
        except Exception as exc:  # noqa: BLE001 -- a conversion or derivation that cannot apply is this hook's error
            self.failed[hook] = why(exc)
        return None


class _Evaluation:
    """The state one evaluation builds: converted captures (on demand, one layer at a time), derived
    values, flips."""

    def __init__(self, plan: Plan, subject, refs, prompts: list[list[int]], gate: Gate, model: str,
                 reference_params=None) -> None:
        self.plan, self.subject, self.refs, self.gate, self.model = plan, subject, refs, gate, model
        self.reference_params = reference_params or {}
        self.n, self.lengths = len(prompts), [len(t) for t in prompts]
        self.converted = _Values()  # converted captures, also the inputs of derived hooks
        self.failed = self.converted.failed  # hook -> why its capture has no value
        self.bridge_floor = refs.floors.get("bridge", {})
        # router logits' reference: the bridge under the hook's name, else compatibility mode under the overlay's name
        # for it (GPT-OSS's / AFMoE's routers, which TransformerLens names other than mlp.gate): (store, name, reference)
        self.router_refs = {h: self._router_reference(h) for h in plan.specs if GATE.match(h)}
        self.router_tol = {h: gate.tolerance(ref, refs.floors.get(ref, {}).get(name))
                           for h, (_, name, ref) in self.router_refs.items()}
        self.flips = self._routing_flips(self.value)
        self.derived = _Values()
        self.derived_failed = self.derived.failed
        self.ragged_converted = _Values()
        self.ragged_failed = self.ragged_converted.failed
        self.ragged_hooks = {c.hook for c in plan.cases if c.reference == "bridge-ragged"}
        self._first_bad: dict[str, str | None] = {}  # engine -> its first non-finite hook in forward order
        # the batched forward may flip other near-ties than the single-prompt ones
        self.ragged_flips = self.flips + [f for f in self._routing_flips(self.ragged) if f not in self.flips]
        chaos = list(getattr(refs, "chaos", []) or [])
        # a chaotic token is the references' own low-precision run off its truth: the references' rows against each
        # other (bridge~hf) set it aside too (a routing near-tie in the reference's own run: FlexOlmo in bf16)
        self.chaos_events = chaos
        self.events, self.ragged_events = self.flips + chaos, self.ragged_flips + chaos
        self.processed_events = self.events + self._references_disagree()

    # -- subject values (converted when first asked for) -----------------------------
    def value(self, hook: str) -> list[torch.Tensor] | None:
        """vLLM's converted value of ``hook`` per prompt; None where it failed (``self.failed`` says why)
        or the plan has no such read."""
        spec = self.plan.specs.get(hook)
        if spec is None and hook not in self.converted.cache:
            return None
        return self.converted.get(hook, lambda: self._convert(hook, spec),
                                  lambda exc: f"{hook}: conversion failed: {exc}")

    def _convert(self, hook: str, spec: HookSpec) -> list[torch.Tensor]:
        out = []
        for p, n_tokens in enumerate(self.lengths):
            raw = self.subject.read(p, spec.raw_key, spec.call if spec.calls == "first" else 0)
            if raw is None:
                problem = f"{hook}: vLLM hook on {spec.module!r} ({spec.read}) never fired"
                if spec.module in (self.subject.meta.get("missing_modules") or []):
                    engine = (self.subject.meta.get("device_info") or {}).get("engine") or {}
                    problem += (f": no such module in vLLM's model tree ({engine.get('model_class', 'model class unknown')})"
                                + (f", nor {spec.unfused.module!r}, its unfused read" if spec.unfused is not None else "")
                                + "; the overlay describes another implementation of this architecture")
                raise NoValue(problem)
            out.append(convert(spec, self._canonical(p, spec, raw, n_tokens), self.subject.params))
        return out

    def _canonical(self, p: int, spec: HookSpec, first: torch.Tensor, n_tokens: int) -> torch.Tensor:
        """The raw read of one prompt in ``[T, ...]`` rows: the first call's, or every call stitched."""
        if spec.calls != "all":
            # the spec's call (HookSpec.call; value()), heads unfolded from the rows where a line folds them
            return subject_to_canonical(unflatten_rows(spec.flat_rows, first), n_tokens, spec.raw_token_dim)
        calls = [unflatten_rows(spec.flat_rows, first)]
        while (nxt := self.subject.read(p, spec.raw_key, len(calls))) is not None:
            calls.append(unflatten_rows(spec.flat_rows, nxt))
        return stitch_calls(calls, n_tokens)

    def derived_value(self, hook: str) -> list[torch.Tensor] | None:
        """A derived hook's value per prompt, from its inputs' converted values; None where an input
        is missing or the derivation fails (``self.derived_failed`` says why)."""
        spec = self.plan.derived.get(hook)
        if spec is None:
            return None

        def compute() -> list[torch.Tensor]:
            inputs = {h: self.value(h) for h in spec.inputs}
            missing = [f"input {h}: {self.failed.get(h, 'not captured')}" for h, v in inputs.items() if v is None]
            if missing:
                raise LookupError("; ".join(missing))
            return [derive(spec, {h: v[p] for h, v in inputs.items()}) for p in range(self.n)]

        return self.derived.get(hook, compute, lambda exc: f"{hook} (derived {spec.describe()}): {exc}")

    def ragged(self, hook: str) -> list[torch.Tensor] | None:
        """vLLM's value of ``hook`` in the ragged-batch run, split per prompt; None where the plan has
        no ragged case for it, or it failed (``self.ragged_failed`` says why)."""
        if hook not in self.ragged_hooks:
            return None

        def compute() -> list[torch.Tensor]:
            spec = self.plan.specs[hook]
            row_dim = spec.raw_token_dim  # 1: [1, T, ...] reads; 2: heads-first [1, heads, T, d] (HookSpec.token_dim)
            raws = [self.subject.ragged_read(p, spec.raw_key, self.lengths, row_dim,
                                             prepare=lambda v: unflatten_rows(spec.flat_rows, v))
                    for p in range(self.n)]
            if any(r is None for r in raws):
                raise NoValue(f"{hook}: no ragged-batch capture (vLLM did not report its batch layout)")
            return [convert(spec, r, self.subject.params) for r in raws]

        return self.ragged_converted.get(hook, compute, lambda exc: f"{hook}: conversion failed: {exc}")

    def _router_reference(self, hook: str):
        """``(store, name, reference)`` holding the reference's router logits for ``hook``: the bridge's own
        hook where it has it, else compatibility mode's under the overlay's name (``HookSpec.references``), else
        HF's where TransformerLens offers no router hook at all (Nemotron-H's MoE mixer: overlays/nemotron_h.py)."""
        if all(hook in self.refs.bridge.get(p, {}) for p in range(self.n)):
            return self.refs.bridge, hook, "bridge"
        names = dict(self.plan.specs[hook].references)
        for ref, store in (("compat", self.refs.compat), ("hf", self.refs.hf)):
            name = names.get(ref)
            if name and all(name in (store or {}).get(p, {}) for p in range(self.n)):
                return store, name, ref
        return self.refs.bridge, hook, "bridge"

    def _routing_flips(self, value_of) -> list[Flip]:
        """Every token whose chosen expert set differs between vLLM's router logits (``value_of(hook)``)
        and the bridge's, each chosen by the router's own rule (harness.comparison.routing.chosen)."""
        k = self.plan.routing_k
        if not k:
            return []
        out: list[Flip] = []
        for hook in self.plan.specs:
            m = GATE.match(hook)
            subj = value_of(hook) if m else None
            store, name, _ = self.router_refs.get(hook, (self.refs.bridge, hook, "bridge"))
            if subj is None or pairs_of(subj, store, name, self.n) is None:
                continue
            routing = self.plan.specs[hook].routing
            bias = routing.bias if routing is not None else None
            for p in range(self.n):
                tol = self.router_tol[hook]
                out += find_flips(subj[p], store[p][name], int(k), p, int(m.group(1)), tol,
                                  gated=tol <= self.gate.ceiling, routing=routing,
                                  subject_bias=(self.subject.params or {}).get(bias) if bias else None,
                                  reference_bias=self.reference_params.get(bias) if bias else None,
                                  module=routing_module(hook))
        return out

    def _references_disagree(self) -> list[ChaoticToken]:
        """Tokens where processed compatibility mode leaves the bridge (in hooked coordinates) in the
        residual stream by more than that hook's tolerance (at most the ceiling): its own near-tie
        (harness.comparison.chaos).  Both are references: no vLLM value decides it."""
        norm = self.refs.meta.get("normalization_type")
        bridge, processed = {}, {}
        for case in self.plan.cases:
            if case.reference != "compat-processed" or not RESIDUAL_OUT.match(case.hook):
                continue
            for p in range(self.n):
                b = self.refs.bridge.get(p, {}).get(case.hook)
                c = self.refs.compat_processed.get(p, {}).get(case.reference_hook)
                if b is not None and c is not None and b.shape == c.shape:
                    bridge.setdefault(p, {})[case.hook] = to_hooked_coordinates(b.double(), norm)
                    processed.setdefault(p, {})[case.hook] = c
        limit = lambda hook: self.gate.tolerance("bridge", self.bridge_floor.get(hook))  # noqa: E731
        return find_chaotic(processed, bridge, self.gate.ceiling, source="references", limit=limit)

    # -- non-finite values -----------------------------------------------------------
    def _first_bad_in(self, engine: str, store_of) -> str | None:
        """The first hook, in forward order, whose ``engine`` capture holds a NaN or an infinity."""
        if engine not in self._first_bad:
            self._first_bad[engine] = None
            for hook in [*self.plan.specs, *self.plan.derived]:
                values = store_of(hook)
                for p, v in enumerate(values or []):
                    hit = v is not None and first_nonfinite(v, hook_kind(hook) in NEG_INF_KINDS)
                    if hit:
                        self._first_bad[engine] = describe(engine, hook, p, hit, axes_of(v))
                        break
                if self._first_bad[engine]:
                    break
        return self._first_bad[engine]

    def _nonfinite(self, case: Case, pairs: Pairs) -> str:
        """Why this row cannot be compared because a side holds NaN / inf; "" when both are finite."""
        allow = case.kind in NEG_INF_KINDS
        engines = (("TransformerBridge", "HF") if case.reference == CROSS_REFERENCE
                   else ("vLLM", REFERENCE_ENGINE.get(case.reference, case.reference)))
        for p, pair in enumerate(pairs):
            for side, engine in enumerate(engines):
                hit = first_nonfinite(pair[side], allow)
                if hit:
                    name = case.hook if side == 0 else case.reference_hook
                    made = self._made_by_conversion(case, p) if engine == "vLLM" else ""
                    if made:
                        return (f"{case.hook} vs {case.reference}: non-finite values, not compared: "
                                f"{describe('the converted vLLM value', name, p, hit, axes_of(pair[side]))}; {made}")
                    first = self._first_bad_in(engine, self._store_of(engine))
                    return (f"{case.hook} vs {case.reference}: non-finite values, not compared: "
                            f"{describe(engine, name, p, hit, axes_of(pair[side]))}"
                            + (f"; first non-finite hook of {engine} in forward order: {first}" if first else ""))
        return ""

    def _made_by_conversion(self, case: Case, p: int) -> str:
        """Why a non-finite converted value is the harness's conversion's, not vLLM's ("" when vLLM's
        own raw read is non-finite too, or the hook is derived): only vLLM's own values are "NaN in
        vLLM's ..."."""
        spec = self.plan.specs.get(case.hook)
        if case.derived or spec is None or not spec.convert:
            return ""
        raw = self.subject.read(p, spec.raw_key)
        if raw is None or first_nonfinite(raw, case.kind in NEG_INF_KINDS):
            return ""
        convs = "; ".join(c.describe() for c in spec.convert)
        dead = left_out(spec, self.subject.params)
        return (f"vLLM's own read ({spec.module} {spec.read}) is finite: the harness's conversion ({convs}) made it"
                + (f" -- it divides by {dead[1]} at {int(dead[0].sum())} dims, where vLLM's value is not 0"
                   if dead else ""))

    def _store_of(self, engine: str):
        if engine == "vLLM":
            return lambda h: self.value(h) or self.derived_value(h)
        store = {"TransformerBridge": self.refs.bridge, "HF": self.refs.hf, "compatibility mode": self.refs.compat,
                 "processed compatibility mode": self.refs.compat_processed}[engine]
        return lambda h: [store.get(p, {}).get(h) for p in range(self.n)]

    # -- rows ------------------------------------------------------------------------
    def _pos_axis(self, hook: str) -> int:
        return self.plan.pos_axis(hook)

    def _floor(self, case: Case, stat: str = "worst") -> float | None:
        """The floor of ``case``'s reference for one statistic (``worst`` | ``median`` | ``scale``)."""
        floors = self.refs.floors if stat == "worst" else self.refs.floor_stats.get(stat, {})
        larger = (lambda a, b: max(a, b, key=abs)) if stat == "scale" else max
        bridge = floors.get("bridge", {}).get(case.hook)
        if case.hook == "logprobs":
            return floors.get("hf", {}).get("logprobs")
        if case.reference in ("bridge", "bridge-ragged"):
            return bridge
        if case.reference in ("compat", "compat-processed"):
            # |vLLM - compat| is bounded by the sum of both distances from the truth: the larger of the
            # bridge's floor (the proxy for vLLM's own rounding) and the reference's own -- compatibility
            # mode computes some hooks its own way (OLMo-2's bf16 attention scores), and processed
            # compatibility mode holds weights folded, then rounded (harness.references.reference)
            engine = "processed" if case.reference == "compat-processed" and "processed" in floors else "compat"
            own = floors.get(engine, {}).get(case.reference_hook)
            return bridge if own is None else (own if bridge is None else larger(bridge, own))
        if case.reference == "hf":
            return floors.get("hf", {}).get(case.reference_hook)
        if case.reference == CROSS_REFERENCE:
            hf = floors.get("hf", {}).get(case.reference_hook)
            if stat != "worst" and (bridge is None or hf is None):
                return None
            return larger(bridge or 0.0, hf or 0.0)
        return None

    def _band(self, case: Case) -> Band:
        return self.gate.band(case.reference, self._floor(case), self._floor(case, "median"),
                              self._floor(case, "scale"))

    def row(self, case: Case) -> HookResult:
        band = self._band(case)
        row = self._compared(case, band)
        if any(f is not None and f != f for f in (band.floor, band.floor_median, band.floor_scale)) \
                and row.status != "error":
            row.status = "error"
            row.message = (f"{case.hook} vs {case.reference}: the reference's own noise-floor run holds non-finite "
                           f"values for this hook (NaN floor), so no tolerance can be calibrated")
        return self._gated_norm(case, row)

    def _gated_norm(self, case: Case, row: HookResult) -> HookResult:
        """A gated norm's output row a documented reference bug covers (known_issues.GATED_NORM_BUGS, a model with
        more than one group): its signature checked on both sides' captured input, gate and output of the norm,
        and the row explained, left standing, or an error saying to retire the entry (explain_gated_norm)."""
        bug = None if case.derived else gated_norm_bug(self.gate.architecture, case.reference, case.hook,
                                                       self.refs.meta.get("layout_config"))
        if bug is None:
            return row
        names = [case.hook.rsplit(".", 1)[0] + n for n in (".hook_in", ".hook_gate", ".hook_out")]
        ref_names = [case.reference_hook.rsplit(".", 1)[0] + n for n in (".hook_in", ".hook_gate", ".hook_out")]
        subject = [self.ragged(h) if case.reference == "bridge-ragged" else self.value(h) for h in names]
        store = {"hf": self.refs.hf, "bridge": self.refs.bridge, "compat": self.refs.compat,
                 "bridge-ragged": self.refs.bridge}.get(case.reference) or {}
        reference = [[store.get(p, {}).get(h) for p in range(self.n)] for h in ref_names]
        complete = all(v is not None for v in subject) and all(t is not None for r in reference for t in r)
        config = self.refs.meta.get("layout_config")
        explain_gated_norm(bug, row, gated_norm_signature(tuple(subject), tuple(reference), bug.groups(config),
                                                          bug.eps(config)) if complete else None)
        return row

    def _checked(self, case: Case, pairs: Pairs | None) -> tuple[Pairs | None, str]:
        problem = self._nonfinite(case, pairs) if pairs else ""
        return (None, problem) if problem else (pairs, "")

    def _compared(self, case: Case, band: Band) -> HookResult:
        hook, ref, name, n = case.hook, case.reference, case.reference_hook, self.n
        if case.derived:
            derived = self.derived_value(hook)
            problem = self.derived_failed.get(hook, "")
            store = {"bridge": self.refs.bridge, "compat": self.refs.compat, "hf": self.refs.hf}[ref]
            pairs = None if problem else pairs_of(derived, store, name, n)
            pairs, bad = self._checked(case, pairs)  # before masking: the mask writes NaN on purpose
            pairs = pairs and [(s, ignore_common_mask(s, r)) for s, r in pairs]
            return compared_row(self.model, case, band, pairs,
                                problem or bad or ("" if pairs else f"{hook}: reference {ref} has no hook {name!r}"),
                                self.events, pos_axis=self._pos_axis(hook))
        if ref == CROSS_REFERENCE:
            bridge_vals = [self.refs.bridge.get(p, {}).get(hook) for p in range(n)]
            pairs = None if any(v is None for v in bridge_vals) else pairs_of(bridge_vals, self.refs.hf, name, n)
            pairs, bad = self._checked(case, pairs)
            return compared_row(self.model, case, band, pairs, bad or ("" if pairs else
                                f"{hook}: missing in TransformerBridge or HF"), self.chaos_events,
                                pos_axis=self._pos_axis(hook))
        if ref == "bridge-ragged":
            pairs, layout, stale = regroup_layout(self.gate.architecture, ref, hook,
                                                  pairs_of(self.ragged(hook), self.refs.bridge, hook, n),
                                                  self.refs.meta.get("layout_config"))
            pairs, bad = self._checked(case, None if stale else pairs)
            pairs, note = self._without_left_out(hook, pairs)
            return self._noted(" ".join(filter(None, (layout, note))), compared_row(
                self.model, case, band, pairs, stale or self.ragged_failed.get(hook, "") or bad,
                self.ragged_events, pos_axis=self._pos_axis(hook)))
        subj = self.value(hook)
        problem = self.failed.get(hook, "")
        if ref == "compat-processed":
            norm = self.refs.meta.get("normalization_type")
            subj = None if problem else [to_hooked_coordinates(x, norm) for x in subj]
        store, missing = {
            "bridge": (self.refs.bridge, f"{hook}: TransformerBridge has no hook {name!r}"),
            "compat": (self.refs.compat, f"{hook}: compatibility mode has no hook {name!r}"),
            "compat-processed": (self.refs.compat_processed, f"{hook}: processed compatibility mode has no hook "
                                 f"{name!r} ({self.refs.meta.get('processed_error', 'not captured')})"),
            "hf": (self.refs.hf, f"{hook}: HF forward hooks did not capture it"),
        }[ref]
        pairs, layout, stale = regroup_layout(self.gate.architecture, ref, hook,
                                              None if problem else pairs_of(subj, store, name, n),
                                              self.refs.meta.get("layout_config"))
        problem = problem or stale  # a documented reference layout bug that no longer holds: an error
        pairs, bad = self._checked(case, None if problem else pairs)
        pairs, note = self._without_left_out(hook, pairs)
        events = self.processed_events if ref == "compat-processed" else self.events
        return self._noted(" ".join(filter(None, (layout, note))), compared_row(
            self.model, case, band, pairs, problem or bad or ("" if pairs else missing), events,
            pos_axis=self._pos_axis(hook)))

    @staticmethod
    def _noted(note: str, row: HookResult) -> HookResult:
        if note and row.status != "error":
            row.message = (row.message + " " if row.message else f"{row.hook} vs {row.reference}: ") + note
        return row

    def _without_left_out(self, hook: str, pairs: Pairs | None) -> tuple[Pairs | None, str]:
        """``pairs`` with the reference's entries a un-fold cannot recover set to NaN (not compared:
        harness.comparison.conversions.left_out), and the note that counts them; after the
        non-finite check, since the mask is NaN."""
        spec = self.plan.specs.get(hook)
        dead = left_out(spec, self.subject.params) if pairs and spec is not None else None
        if dead is None:
            return pairs, ""
        mask, why = dead
        if any(r.shape[-1] != mask.shape[0] for _, r in pairs):
            return pairs, ""
        pairs = [(s, torch.where(mask, torch.full_like(r, float("nan")), r)) for s, r in pairs]
        return pairs, (f"[{int(mask.sum())} of {mask.shape[0]} dims left out, not compared: {why} there, so "
                       f"vLLM's output holds no value to un-fold (dims {mask.nonzero().flatten().tolist()[:12]}"
                       f"{' ...' if int(mask.sum()) > 12 else ''})]")

    def logit_rows(self) -> list[HookResult]:
        lp_case, am_case = [c for c in self.plan.cases if c.hook in ("logprobs", "argmax")]
        pairs = [(self.subject.logprobs[p], self.refs.logprobs[p]) for p in range(self.n)]
        serving = self.subject.meta.get("serving") or {}
        # rows vLLM returned for no request (a serving run's, or a runner's: V2 on 0.20.2 returns no
        # sampled-token log-probs): left out of both rows, and said so
        missing = {int(p): rows for p, rows in {**(self.subject.meta.get("logprob_rows_missing") or {}),
                                                **(serving.get("logprob_rows_missing") or {})}.items()}
        if missing:
            keep = [[t for t in range(len(s)) if t not in set(missing.get(p, ()))] for p, (s, _) in enumerate(pairs)]
            pairs = [(s[k], r[k]) for (s, r), k in zip(pairs, keep)]
        rows = logit_rows(self.model, lp_case, am_case, self._band(lp_case), pairs, self.events)
        if serving.get("generated") and rows[1].status != "error" and max(map(len, serving["generated"])) > 1:
            self._check_generated(rows[1], serving, [(self.subject.logprobs[p], self.refs.logprobs[p])
                                                     for p in range(self.n)])
        if missing:
            where = f"serving {serving.get('scheme')}" if serving else "single-prompt runs"
            note = (f" [{where}: log-prob rows vLLM returned for no request, not compared: "
                    f"{', '.join(f'prompt {p} pos {v}' for p, v in missing.items())}]")
            rows[0].message += note
            rows[1].message += note
        return rows


    def _check_generated(self, am: HookResult, serving: dict, pairs: list) -> None:
        """Decode runs: the argmax row checks every generated token, not only the final position."""
        generated = serving["generated"]
        prompt_lengths = [length - len(gen) + 1 for length, gen in zip(self.lengths, generated)]
        g = greedy_agreement(generated, prompt_lengths, pairs, aside=set_aside("argmax", list(self.events)))
        am.worst = {**(am.worst or {}), "generated_checked": g["checked"], "generated_exact": g["exact"],
                    "generated_near_ties": g["near_ties"], "generated_set_aside": g["set_aside"]}
        note = (f"; {g['exact']}/{g['checked']} generated tokens equal the reference's greedy token"
                + (f" ({g['set_aside']} after an explained upstream event not checked)" if g["set_aside"] else "")
                + (f", {len(g['near_ties'])} near tie(s) {g['near_ties'][:3]}" if g["near_ties"] else ""))
        if g["diverged"]:
            am.status, am.rel_err = "fail", 1.0
            note += f"; diverged beyond a near tie at {g['diverged'][:3]}"
        am.message = (am.message + note).lstrip("; ")


def evaluate(plan: Plan, subject, refs, prompts: list[list[int]], gate: Gate, model: str,
             reference_params=None) -> tuple[list[HookResult], list[Flip]]:
    """One final row per planned case, in plan order, and every routing flip found (single and ragged runs).
    ``reference_params``: the checkpoint's values of the engine parameters the comparison itself reads
    (a router's correction bias: harness.comparison.routing), by the engine's names."""
    ev = _Evaluation(plan, subject, refs, prompts, gate, model, reference_params)
    rows = [ev.row(c) for c in plan.cases if c.hook not in ("logprobs", "argmax")] + ev.logit_rows()
    for row in rows:  # say how vLLM's value was obtained, so a failing mapping can be read off the message
        spec = plan.specs.get(row.hook)
        if spec is not None and row.status != "pass" and "~" not in row.reference:
            steps = "; ".join(c.describe() for c in spec.convert) or "none"
            row.message += f" [vLLM read: {spec.module} {spec.read}; conversions: {steps}]"
    for row in rows:
        gate.finalize(row, refs)
    return rows, ev.ragged_flips
