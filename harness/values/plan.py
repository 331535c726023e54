"""The plan of one (target, variant): what is captured and which rows are compared.

Contract: :func:`build_plan` is called once per (target, variant, hook selection) and
returns a frozen :class:`Plan`: the read specs and derived specs the subject offers,
its non-firing hooks, and :attr:`Plan.cases` -- every (reference, hook) row in the
order :func:`harness.comparison.evaluate.evaluate` emits them.  The pytest plugin
parametrizes from the same cases, so test ids and report rows cannot drift apart.
Nothing here boots an engine.

Trap: ``cases`` follow the references' naming rules -- a hook makes a row against a
reference only where that reference holds an equal tensor (``HookSpec.references``
overrides, the compatibility-mode alias table, HF's three residual hooks); a hook with
no bridge name is captured only as a derived hook's input and makes no row at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from harness.engines.subjects import SUBJECTS
from overlays import NoOverlayError
from overlays.base import Derived, Encoder, HookSpec, NonFiring, SwapAxes, config_get
from harness.values.selection import HookSelection
from harness.vocab.hook_names import compat_alias, hf_hook
from harness.vocab.hook_rules import GATE, heads_first, processed_hook
from harness.vocab.hooks import expand_layers, hook_kind, layer_of, template_of

LOGIT_CASES = (("hf", "logprobs", "log_softmax(logits)"), ("hf", "argmax", "argmax(logits)"))


@dataclass(frozen=True)
class ReferenceInputs:
    """The reference engines' model inputs beyond the token ids, one value for a run
    (harness.references.reference.capture_references): the transformers class HF's model is built with,
    whether attention is causal (False: an encoder's; a chaotic token then sets its whole prompt aside),
    and each prompt's token type ids (None: none passed).  The defaults are a causal LM's."""

    hf_class: str = "AutoModelForCausalLM"
    causal: bool = True
    token_types: tuple[tuple[int, ...], ...] | None = None
    # what the log-prob rows are taken from (overlays.base.Encoder.output): "logits", or "hidden" (HF's last
    # hidden state, where vLLM serves the encoder without its head)
    output: str = "logits"
    # False: TransformerLens cannot boot the architecture (overlays.base.Overlay.tl_adapter): HF alone
    bridge: bool = True
    # (hook, HookSpec) the HF reference reads at HF's own modules (overlays.base.Overlay.hf_reads)
    hf_reads: tuple = ()

    def types(self, p: int) -> list[int] | None:
        """Prompt ``p``'s token type ids (None: none passed)."""
        return None if self.token_types is None else list(self.token_types[p])


@dataclass(frozen=True)
class Case:
    reference: str  # "bridge" | "compat" | "compat-processed" | "hf" | "bridge~hf" | "bridge-ragged"
    hook: str  # canonical name (vLLM side); "logprobs" / "argmax" for the logit rows
    reference_hook: str  # the name on the reference side
    derived: bool = False

    @property
    def layer(self) -> int | None:
        return layer_of(self.hook)

    @property
    def kind(self) -> str:
        return hook_kind(self.hook)

    @property
    def test_id(self) -> str:
        return f"{self.reference}-{self.hook}"


def bridge_name(hook: str, spec: HookSpec) -> str | None:
    """The hook's TransformerBridge name, or None for a hook captured only as a derived hook's input."""
    return spec.reference_name("bridge", hook)


def compat_name(hook: str, spec: HookSpec) -> str | None:
    """The hook's compatibility-mode name: the overlay's override (HookSpec.references), else the table's."""
    return spec.reference_name("compat", compat_alias(hook))


def processed_name(hook: str, spec: HookSpec) -> str | None:
    """The hook's name in processed compatibility mode: its compatibility-mode name where it writes the
    residual stream (harness.vocab.hook_rules.processed_hook), unless the overlay says that mode's value is
    not this hook's in hooked coordinates (``("compat-processed", None)``)."""
    alias = compat_name(hook, spec)
    if alias is None or not processed_hook(hook):
        return None
    return spec.reference_name("compat-processed", alias)


def hf_name(hook: str, spec: HookSpec) -> str | None:
    """The hook's name among the HF forward-hook captures, or None where HF holds no equal tensor."""
    return spec.reference_name("hf", hook if hf_hook(hook) else None)


def ragged_hook(hook: str) -> bool:
    """Hooks compared in the ragged-batch run: all but logits, which a batch
    without prompt log-probs computes for the sampled positions only."""
    return hook_kind(hook) != "unembed.hook_out"


def _cases(specs: dict[str, HookSpec], derived: dict[str, Derived], ragged: bool = True,
           bridge: bool = True) -> tuple[Case, ...]:
    """``ragged``: rows for the single-shape run's ragged batch (a serving scheme is itself the batch);
    ``bridge`` False: no TransformerLens reference (overlays.base.Overlay.tl_adapter), derived hooks against HF only."""
    out: list[Case] = []
    for hook, spec in specs.items():
        if bridge_name(hook, spec) is not None:
            out.append(Case("bridge", hook, hook))
        alias = compat_name(hook, spec)
        if alias is not None:
            out.append(Case("compat", hook, alias))
            if processed_name(hook, spec) is not None:
                out.append(Case("compat-processed", hook, processed_name(hook, spec)))
        hf = hf_name(hook, spec)
        if hf is not None:
            out.append(Case("hf", hook, hf))
    for hook in derived:
        if bridge:
            out.append(Case("bridge", hook, hook, derived=True))
        if bridge and compat_alias(hook) is not None:
            out.append(Case("compat", hook, compat_alias(hook), derived=True))
        if derived[hook].hf_reference:  # HF's own scores / pattern, read at its eager softmax (references.reference)
            out.append(Case("hf", hook, hook, derived=True))
    # bridge~hf: only where the bridge has the hook (Mamba-2's in_proj columns are HF's alone, overlays/mamba2.py)
    out += [Case("bridge~hf", h, hf_name(h, s)) for h, s in specs.items()
            if hf_name(h, s) is not None and bridge_name(h, s) is not None]
    if ragged:  # a module called several times per forward: the ragged split takes one call per forward
        out += [Case("bridge-ragged", h, h) for h, s in specs.items()
                if ragged_hook(h) and bridge_name(h, s) is not None and s.per_forward == 1]
    return tuple(out) + tuple(Case(ref, hook, name) for ref, hook, name in LOGIT_CASES)


@dataclass(frozen=True)
class Plan:
    specs: dict[str, HookSpec]
    derived: dict[str, Derived]
    nonfiring: tuple[NonFiring, ...]
    n_layers: int
    cases: tuple[Case, ...]
    routing_k: int | None = None  # experts per token where router logits are captured (harness.comparison.routing)
    selected: frozenset[str] | None = None  # the hooks a selective run asked for (None: all offered)
    overlay_name: str | None = None  # what the report names as the overlay (None: the target's overlay class)
    compat_names: tuple[str, ...] = field(default=())  # names to capture in compatibility mode
    processed_names: tuple[str, ...] = field(default=())  # ... and in processed compatibility mode
    # False: HF is the only reference (overlays.base.Overlay.tl_adapter); hf_reads: its module reads (hf_reads)
    bridge: bool = True
    hf_reads: tuple = ()
    # Set: an encoder run by vLLM's pooling runner (overlays.base.Encoder: bidirectional, token types,
    # encode instead of generate); None: a causal LM
    encoder: Encoder | None = None
    # True: vLLM runs each prompt as one bidirectional block (a prefix LM: HRM-Text's PrefillPrefixLMAttention), so
    # the references are given token type 1 on every prompt position, the prefix-LM mask of their own models
    prefix_lm: bool = False

    def token_types(self, prompts: list[list[int]]) -> list[list[int]] | None:
        """Each prompt's token type ids, as every engine is given them (None: none are passed)."""
        if self.encoder is None or self.encoder.second_segment is None:
            return None
        return [self.encoder.token_types(len(p)) for p in prompts]

    def reference_inputs(self, prompts: list[list[int]]) -> "ReferenceInputs":
        """What the reference engines are given beyond the token ids (a causal LM: the defaults)."""
        sides = dict(bridge=self.bridge, hf_reads=self.hf_reads)  # which references run, and HF's module reads
        if self.prefix_lm:
            return ReferenceInputs(causal=False, token_types=tuple((1,) * len(p) for p in prompts), **sides)
        if self.encoder is None:
            return ReferenceInputs(**sides)
        types = self.token_types(prompts)
        return ReferenceInputs(hf_class=self.encoder.hf_class, causal=False,
                               token_types=None if types is None else tuple(map(tuple, types)),
                               output=self.encoder.output, **sides)

    @property
    def compared_hooks(self) -> list[str]:
        """Every hook with at least one row (the logit rows excluded), in row order."""
        return list(dict.fromkeys(c.hook for c in self.cases if c.hook not in ("logprobs", "argmax")))

    @property
    def forward_order(self) -> list[str]:
        """Every compared hook in forward order: the overlay's order, each derived hook (attention scores /
        pattern) right after the last hook it is computed from, not at the end where its rows sit."""
        hooks = [h for h in self.compared_hooks if h not in self.derived]
        for name, d in self.derived.items():
            after = max((hooks.index(i) for i in d.inputs if i in hooks), default=len(hooks) - 1)
            hooks.insert(after + 1, name)
        return hooks

    def pos_axis(self, hook: str) -> int:
        """The token axis of ``hook``'s canonical value (a canonical or compatibility-mode name): 1 for
        heads-first values -- attention scores and patterns ``[heads, query, key]``, reads the overlay
        swaps heads-first -- else 0 (``[T, ...]``)."""
        if hook in self.derived or heads_first(hook):
            return 1
        spec = self.specs.get(hook)
        return 1 if spec is not None and any(isinstance(c, SwapAxes) and 0 in (c.dim0, c.dim1)
                                             for c in spec.convert) else 0

    def reads_found(self, missing_modules: list[str] | None) -> tuple["Plan", list[str]]:
        """This plan with each read whose module the loaded tree lacks (``missing_modules``, the engine's) swapped for
        its unfused alternative where that one's module is there (overlays.base.HookSpec.unfused), and the hooks so
        swapped, in plan order.  A read with neither stays, and never fires (the evaluator names the missing module)."""
        missing = set(missing_modules or ())
        swapped = [h for h, s in self.specs.items()
                   if s.unfused is not None and s.module in missing and s.unfused.module not in missing]
        if not swapped:
            return self, []
        specs = {h: (s.unfused if h in swapped else s) for h, s in self.specs.items()}
        return replace(self, specs=specs), swapped

    def nonfiring_rows(self) -> list[dict]:
        return [{"template": nf.template, "hooks": expand_layers(nf.template, self.n_layers), "reason": nf.reason}
                for nf in self.nonfiring]

    def nonfiring_hooks(self) -> list[tuple[str, str]]:
        """(hook, reason) for every concrete non-firing hook."""
        return [(h, nf.reason) for nf in self.nonfiring for h in expand_layers(nf.template, self.n_layers)]


def offered(target, variant) -> tuple[dict[str, HookSpec], dict[str, Derived], list[NonFiring]]:
    """What the variant's subject offers for ``target``: read specs, derived specs, non-firing hooks.
    Under CUDA graphs the overlay's ``cuda_graph_nonfiring`` hooks move from offered to non-firing."""
    cfg = target.hf_config
    subject_plan = SUBJECTS[variant.subject].plan_fn()  # harness.engines.subjects; None: the overlay's plan
    if subject_plan is not None:
        return subject_plan(cfg, target.overlay)  # the overlay: the references' names (None: a refused family)
    ov = target.overlay
    if ov is None:  # a family declared refused elsewhere (harness.models.families.Refusal) running here
        raise NoOverlayError(f"no vLLM overlay for architecture {target.architecture!r} ({target.name} is declared "
                             f"refused on {', '.join(d for r in target.refusals for d in r.devices)} only, and runs on "
                             f"{variant.device}); "
                             "add an overlay row to overlays/__init__.py")
    specs, derived, nonfiring = ov.hook_specs(cfg), ov.derived_specs(cfg), ov.nonfiring_for(cfg)
    if variant.cuda_graphs:
        n_layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
        for nf in ov.cuda_graph_nonfiring(cfg):
            gone = set(expand_layers(nf.template, n_layers))
            specs = {h: s for h, s in specs.items() if h not in gone}
            derived = {h: d for h, d in derived.items() if h not in gone and not gone & set(d.inputs)}
            nonfiring = nonfiring + [nf]
    specs, derived, nonfiring = _backend_uncalled(cfg, variant, specs, derived, nonfiring)
    from harness.engines.serving import SCHEMES

    if SCHEMES[variant.serving].stitched:
        per_row = {h for h, s in specs.items() if s.calls != "first"}
        looped = {h: s.per_forward for h, s in specs.items() if s.per_forward != 1}
        specs = {h: s for h, s in specs.items() if h not in per_row | set(looped)}
        derived = {h: d for h, d in derived.items() if not (per_row | set(looped)) & set(d.inputs)}
        nonfiring = nonfiring + [NonFiring(h, f"not one row per position under --serving {variant.serving}: vLLM's "
                                              "logits processor runs on each step's sampled rows only; the "
                                              "distribution is compared through the log-prob rows") for h in sorted(per_row)]
        nonfiring = nonfiring + [NonFiring(h, f"its module runs {looped[h]} times per forward (a looped "
                                              f"stack): --serving {variant.serving} stitches one call per step")
                                 for h in sorted(looped)]
    return specs, derived, nonfiring


def _backend_uncalled(cfg, variant, specs: dict[str, HookSpec], derived: dict[str, Derived],
                      nonfiring: list[NonFiring]):
    """An MLA model's hooks read at modules its MLA backend never calls (harness.engines.mla_backends:
    ``kv_b_proj`` outside CPU_MLA) move from offered to non-firing, with the backend's reason."""
    from harness.engines import mla_backends

    if not mla_backends.uses_mla(cfg):
        return specs, derived, nonfiring
    uncalled = mla_backends.uncalled_modules(variant.mla_backend)
    gone = {h for h, s in specs.items() if s.module.rsplit(".", 1)[-1] in uncalled}
    if not gone:
        return specs, derived, nonfiring
    reason = mla_backends.BACKENDS[variant.mla_backend].uncalled_reason
    return ({h: s for h, s in specs.items() if h not in gone},
            {h: d for h, d in derived.items() if not gone & set(d.inputs)},
            nonfiring + [NonFiring(t, reason) for t in sorted({template_of(h) for h in gone})])


def select_hooks(specs: dict[str, HookSpec], derived: dict[str, Derived], hooks: set[str]
                 ) -> tuple[dict[str, HookSpec], dict[str, Derived]]:
    """Keep the hooks asked for, plus the captured hooks a kept derived hook is computed from."""
    kept_derived = {h: d for h, d in derived.items() if h in hooks}
    needed = set(hooks) | {i for d in kept_derived.values() for i in d.inputs}
    return {h: s for h, s in specs.items() if h in needed}, kept_derived


def build_plan(target, variant, hooks: set[str] | frozenset[str] | HookSelection | None = None) -> Plan:
    """The plan of ``target`` under ``variant``; ``hooks``: a selective run's hooks (plus derived inputs),
    as names or as a :class:`~harness.values.selection.HookSelection` (``--layers``, ``--hook-kinds``)."""
    cfg = target.hf_config
    specs, derived, nonfiring = offered(target, variant)
    if isinstance(hooks, HookSelection):  # --layers / --hook-kinds: this model's hook names
        hooks = hooks.resolve([*specs, *derived], int(getattr(cfg, "num_hidden_layers", 0) or 0), target.name)
    if hooks is not None:
        specs, derived = select_hooks(specs, derived, set(hooks))
    compat = [a for a in [*(compat_name(h, s) for h, s in specs.items()), *(compat_alias(h) for h in derived)] if a]
    processed = [processed_name(h, s) for h, s in specs.items() if processed_name(h, s) is not None]
    routing_k = config_get(cfg, "num_experts_per_tok") if any(GATE.match(h) for h in specs) else None
    return Plan(specs=specs, derived=derived, nonfiring=tuple(nonfiring),
                n_layers=int(getattr(cfg, "num_hidden_layers", 0) or 0),
                cases=_cases(specs, derived, ragged=variant.serving == "single",
                             bridge=getattr(target.overlay, "tl_adapter", True)),
                routing_k=routing_k, selected=frozenset(hooks) if hooks is not None else None,
                overlay_name=SUBJECTS[variant.subject].overlay_text(target.overlay),
                compat_names=tuple(compat), processed_names=tuple(processed),
                encoder=getattr(target.overlay, "encoder", None),
                bridge=getattr(target.overlay, "tl_adapter", True),
                hf_reads=tuple(target.overlay.hf_reads(cfg).items()) if hasattr(target.overlay, "hf_reads") else (),
                prefix_lm=bool(getattr(target.overlay, "prefix_lm", False)))
