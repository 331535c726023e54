"""pytest plugin: options, the parity session fixture, test generation, the
long-lived heap frozen after collection (harness.collector), and the end-of-session
support matrix.  Nothing else.

Options come from the one table in :mod:`harness.frontends.options` (``--model``,
``--model-path``, ``--dtype``, ``--compiled``, ``--device``, ``--precision``, ``--tp``,
``--subject``, ``--report-dir``, ``--shard``, ``--engine-timeout``, ``--prompts``); the
session's variant is one :class:`harness.values.variant.Variant` (``--engine-timeout`` is a
run setting beside it).  Bad values fail at configure time with the list of what is valid.  ``--shard I/N`` keeps this runner's share of the selected
models (harness.frontends.shard); the unit tests under ``tests/`` are not sharded.

Tests that take a ``parity_case`` argument are generated as one item per
(model, reference, hook) from each model's plan (harness.values.plan) -- ids like
``gemma-bridge-ln_final.hook_normalized`` so ``-k "gemma and ln_final"`` works.
A row a documented reference bug explains (its signature checked in this run,
harness.comparison.known_issues) xfails at run time; a row whose documented bug no
longer reproduces fails, so a stale entry cannot linger.  The same for a known bug of vLLM's
declared on a family row (harness.comparison.known_vllm_bugs): while its signature holds in the run,
the run's failing vLLM rows xfail with its reason; when it does not, its signature's hooks fail.  ``nonfiring_case`` items
are generated skipped, the skip reason naming the hook and
why vLLM cannot expose it.  Each model's engines run once per session, lazily, when
its first item runs; its report is written right then, and the matrix at session end.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class ParityCase:
    model: str
    reference: str
    hook: str


def pytest_addoption(parser: pytest.Parser) -> None:
    from harness.frontends.options import add_to_pytest

    add_to_pytest(parser.getgroup("vllm-parity", "vLLM activation parity"))


class ParitySession:
    """Lazily runs each model once per variant and writes its report."""

    def __init__(self, config: pytest.Config, variant) -> None:
        self.model = config.getoption("--model")
        self.model_path = config.getoption("--model-path")
        self.shard = config.getoption("--shard")  # harness.frontends.shard.Shard or None
        self.prompts = config.getoption("--prompts")  # harness.models.text_prompts.PromptsFile or None
        from harness.frontends.options import run_settings

        self.settings = run_settings(config)  # how the run is carried out, not a variant axis
        self.variant = variant
        rd = config.getoption("--report-dir")
        self.report_dir = Path(rd) if rd else Path(str(config.rootpath)) / "reports"
        self._targets = None
        self._by_name: dict = {}
        self._plans: dict = {}
        self.runs: dict = {}
        # model -> hooks the selected parity tests compare, where that is fewer than all
        self.selected: dict[str, frozenset[str]] = {}
        # model -> the one test that reports its engine failure (the others skip, pointing to it)
        self.engine_failures: dict[str, ParityCase] = {}
        # (model, dtype, compiled) whose run's captures a selected test reads after the run (the
        # ``reads_captures`` marker); every other run's subject captures are deleted once its report is
        # written and its references dropped (the runner's memo keeps the last few), so a session's disk
        # holds only those (harness.spill)
        self.capture_readers: set[tuple[str, str, bool]] = set()

    @property
    def device(self) -> str:
        return self.variant.device

    def targets(self):
        if self._targets is None:
            from harness.models.targets import targets_from_options
            from harness.models.text_prompts import with_prompts

            selected = with_prompts(targets_from_options(self.model, self.model_path), self.prompts)
            self._targets = self.shard.select(selected) if self.shard else selected
            self._by_name.update({t.name: t for t in self._targets})
        return self._targets

    def target(self, name: str):
        if name not in self._by_name:
            from harness.models.families import FAMILIES
            from harness.models.targets import target_for_family

            self.targets()
            if name not in self._by_name:
                self._by_name[name] = target_for_family(FAMILIES[name])
        return self._by_name[name]

    def plan(self, name: str):
        """The full plan of ``name`` under the session's variant (built once)."""
        if name not in self._plans:
            from harness.values.plan import build_plan

            self._plans[name] = build_plan(self.target(name), self.variant)
        return self._plans[name]

    def run(self, name: str, dtype: str | None = None, compiled: bool | None = None, selective: bool = False,
            **axes):
        """The session's run of ``name`` (engines booted once per (model, dtype, mode)); its report is written.

        ``selective``: capture only the hooks the selected parity tests of this pytest run compare
        (``-k`` selections stay cheap); a full selection captures everything.  ``axes``: other
        variant axes to change (``serving="decode"``, ``runner="v2"``: harness.values.variant)."""
        variant = self.variant.derive(dtype=dtype or self.variant.dtype,
                                      compiled=self.variant.compiled if compiled is None else compiled, **axes)
        hooks = self.selected.get(name) if selective else None
        key = (name, variant, hooks)
        if key not in self.runs:
            from harness.pipeline.runner import run_model
            from harness.reporting.report import write_report

            run = run_model(self.target(name), variant, hooks=hooks, settings=self.settings)
            self.runs[key] = run  # before the report: a failed write must not re-boot the engines per test
            try:
                write_report(run.result.to_dict(), self.report_dir)
            finally:
                if (name, variant.dtype, variant.compiled) not in self.capture_readers:
                    from harness.spill import release_spills

                    # the subject's captures are this run's own: deleted now.  The references may be shared with
                    # later runs of the same manifest (harness.pipeline.runner's memo: the serving shapes of one
                    # model): dropped here, deleted when the memo lets them go
                    release_spills(run.subject)
                    run.refs = None
        return self.runs[key]


def pytest_configure(config: pytest.Config) -> None:
    from harness.models.families import UnknownFamilyError, resolve_families
    from harness.models.targets import TargetError, target_for_path
    from harness.values.variant import Variant

    try:
        resolve_families(config.getoption("--model"))
        for p in filter(None, (config.getoption("--model-path") or "").split(",")):
            target_for_path(p)
        variant = Variant.make(config.getoption("--dtype"), config.getoption("--device"),
                               config.getoption("--precision"), config.getoption("--compiled"),
                               config.getoption("--tp"), config.getoption("--subject"),
                               config.getoption("--runner"), serving=config.getoption("--serving"),
                               executor=config.getoption("--executor"),
                               mla_backend=config.getoption("--mla-backend"))
        if config.getoption("--prompts") is not None:  # every selected checkpoint can tokenize them, now
            from harness.models.targets import targets_from_options
            from harness.models.text_prompts import with_prompts

            with_prompts(targets_from_options(config.getoption("--model"), config.getoption("--model-path")),
                         config.getoption("--prompts"))
    except (UnknownFamilyError, TargetError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None
    config.addinivalue_line("markers", "parity: runs real vLLM and reference engines")
    config.addinivalue_line("markers", "slow: boots vLLM compiled (about a minute); still runs in CI")
    config.addinivalue_line("markers", "reads_captures(*keys): the test reads the captures of the session's runs "
                                       "of these (model, dtype, compiled) keys; other runs' captures are deleted "
                                       "once their report is written")
    config._vllm_parity = ParitySession(config, variant)  # type: ignore[attr-defined]


REFUSAL = "refusal"  # the ParityCase reference of a family vLLM cannot run here: its one test


def refused(target, variant) -> bool:
    from harness.pipeline.refusals import applies

    return applies(target, variant)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    session: ParitySession = metafunc.config._vllm_parity  # type: ignore[attr-defined]
    if "parity_case" in metafunc.fixturenames:
        params = []
        for t in session.targets():
            if refused(t, session.variant):  # no plan: one test, the refusal re-checked (harness.pipeline.refusals)
                params.append(pytest.param(ParityCase(t.name, REFUSAL, t.architecture), id=f"{t.name}-refused"))
                continue
            for case in session.plan(t.name).cases:
                params.append(pytest.param(ParityCase(t.name, case.reference, case.hook),
                                           id=f"{t.name}-{case.test_id}"))
        if not params and session.shard:  # more shards than models: say so, not "empty parameter set"
            params = [pytest.param(None, id="none", marks=pytest.mark.skip(
                reason=f"--shard {session.shard}: no model of this selection falls in this shard"))]
        metafunc.parametrize("parity_case", params)
    if "nonfiring_case" in metafunc.fixturenames:
        params = []
        subject = session.variant.subject
        for t in session.targets():
            if refused(t, session.variant):
                continue
            for hook, why in session.plan(t.name).nonfiring_hooks():
                reason = (f"{hook} is non-firing in {subject} for {t.name} "
                          f"(overlay {t.overlay_name if subject == 'vllm' else 'TL'}): {why}")
                params.append(pytest.param(ParityCase(t.name, "none", hook), id=f"{t.name}-nonfiring-{hook}",
                                           marks=pytest.mark.skip(reason=reason)))
        if not params:  # say so, rather than pytest's "got empty parameter set"
            params = [pytest.param(None, id="none", marks=pytest.mark.skip(
                reason="no hook of the selected models is declared non-firing: every offered hook is compared"))]
        metafunc.parametrize("nonfiring_case", params)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """After -k/-m deselection: note which hooks each model's selected parity tests need, and which runs'
    captures a selected test reads after the run (``reads_captures``)."""
    ps = getattr(config, "_vllm_parity", None)
    if ps is None:
        return
    chosen: dict[str, set[str]] = {}
    for item in items:
        for mark in item.iter_markers("reads_captures"):
            ps.capture_readers.update((model, dtype, bool(compiled)) for model, dtype, compiled in mark.args)
        case = getattr(item, "callspec", None) and item.callspec.params.get("parity_case")
        if case is not None and case.reference != REFUSAL:
            chosen.setdefault(case.model, set())
            if case.reference != "hf" or case.hook not in ("logprobs", "argmax"):
                chosen[case.model].add(case.hook)
    for model, hooks in chosen.items():
        if len(hooks) < len(ps.plan(model).compared_hooks):
            ps.selected[model] = frozenset(hooks)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze the long-lived heap -- pytest's collected items and, where a selected test runs engines (marked
    ``parity``), the libraries a run imports -- so that no collection of a later run walks it
    (harness.collector); nothing a test makes is frozen."""
    if session.config.option.collectonly:  # nothing runs: the run's imports would cost 4-5 s for nothing
        return
    if any(item.get_closest_marker("parity") for item in session.items):
        from harness.pipeline.runner import freeze_before_runs

        freeze_before_runs()
    else:
        from harness.collector import freeze_long_lived

        freeze_long_lived()


@pytest.fixture(scope="session")
def parity_session(request: pytest.FixtureRequest) -> ParitySession:
    return request.config._vllm_parity  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session) -> None:
    ps = getattr(session.config, "_vllm_parity", None)
    if ps is not None and ps.runs:
        from harness.reporting.matrix import write_matrix

        ps.matrix_path, _ = write_matrix(ps.report_dir)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    ps = getattr(config, "_vllm_parity", None)
    path = getattr(ps, "matrix_path", None)
    if path is not None and path.exists():
        terminalreporter.section("vLLM parity support matrix")
        terminalreporter.write(path.read_text())
        terminalreporter.write_line(f"reports: {ps.report_dir}")
