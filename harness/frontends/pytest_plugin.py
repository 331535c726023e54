"""pytest plugin: options, the parity session fixture, test generation, and
the end-of-session support matrix.  Nothing else.

Options: ``--model qwen3,gemma`` (families; default set when absent),
``--model-path DIR`` (a local checkpoint), ``--dtype``, ``--report-dir``,
``--subject vllm|tl-vllm`` (TransformerLens's own vLLM backend instead of this
harness's overlays; its reports are ``report-tl-vllm.*``), ``--device
auto|cpu|cuda`` (vLLM and the references on the same device; auto: cuda where
torch sees one), ``--precision ieee|tf32`` (fp32 matmuls of vLLM on CUDA, see
harness.references.tolerances), ``--tp N`` (vLLM's tensor_parallel_size).  Bad values fail
at configure time with the list of what is valid.

Tests that take a ``parity_case`` argument are generated as one item per
(model, reference, hook) -- ids like ``gemma-bridge-ln_final.hook_normalized``
so ``-k "gemma and ln_final"`` works.  ``nonfiring_case`` items are generated
skipped, the skip reason naming the hook and why vLLM cannot expose it.  Each
model's engines run once per session, lazily, when its first item runs; its
report is written right then, and the matrix at session end.
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
    group = parser.getgroup("vllm-parity", "vLLM activation parity")
    group.addoption("--model", default=None,
                    help="comma-separated model families to test (default: the default set; see harness/models/families.py)")
    group.addoption("--model-path", default=None, help="a local HF checkpoint directory to test (comma-separated for several)")
    group.addoption("--dtype", default="float32", help="dtype for both engines (default float32)")
    group.addoption("--compiled", action="store_true", default=False,
                    help="run vLLM compiled (torch.compile; CUDA graphs on GPU) instead of eager")
    group.addoption("--report-dir", default=None, help="where reports go (default: <rootdir>/reports)")
    group.addoption("--device", default="auto", choices=("auto", "cpu", "cuda"),
                    help="where vLLM and the reference engines run (default auto: cuda if torch sees a GPU)")
    group.addoption("--precision", default="ieee", choices=("ieee", "tf32"),
                    help="fp32 matmuls of vLLM on CUDA: ieee (TRITON_F32_DEFAULT=ieee, default) or tf32 "
                         "(Triton's default; gated by its own calibration, harness/references/tolerances.py)")
    group.addoption("--tp", type=int, default=1, help="vLLM tensor_parallel_size (default 1)")
    group.addoption("--subject", default="vllm", choices=("vllm", "tl-vllm"),
                    help="what is compared with the references: vllm (this harness's overlays, default) or "
                         "tl-vllm (TransformerLens's own vLLM backend); reports go to report-<subject>.json")


class ParitySession:
    """Lazily runs each model once and writes its report."""

    def __init__(self, config: pytest.Config) -> None:
        self.model = config.getoption("--model")
        self.model_path = config.getoption("--model-path")
        self.dtype = config.getoption("--dtype")
        self.subject = config.getoption("--subject")
        self.compiled = config.getoption("--compiled")
        from harness.pipeline.runner import resolve_device

        self.device = resolve_device(config.getoption("--device"))
        self.precision = config.getoption("--precision")
        self.tp = config.getoption("--tp")
        rd = config.getoption("--report-dir")
        self.report_dir = Path(rd) if rd else Path(str(config.rootpath)) / "reports"
        self._targets = None
        self._by_name: dict = {}
        self.runs: dict = {}
        # model -> hooks the selected parity tests compare, where that is fewer than all
        self.selected: dict[str, frozenset[str]] = {}

    def targets(self):
        if self._targets is None:
            from harness.models.targets import targets_from_options

            self._targets = targets_from_options(self.model, self.model_path)
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

    def run(self, name: str, dtype: str | None = None, compiled: bool | None = None, selective: bool = False):
        """The session's run of ``name`` (engines booted once per (model, dtype, mode)); its report is written.

        ``selective``: capture only the hooks this session's selected parity tests compare
        (``-k`` selections stay cheap); a full selection captures everything."""
        dtype = dtype or self.dtype
        compiled = self.compiled if compiled is None else compiled
        hooks = self.selected.get(name) if selective else None
        key = (name, dtype, compiled, hooks)
        if key not in self.runs:
            from harness.reporting.report import write_report
            from harness.pipeline.runner import run_model

            run = run_model(self.target(name), dtype=dtype, device=self.device, subject=self.subject,
                            compiled=compiled, precision=self.precision, tp=self.tp,
                            hooks=set(hooks) if hooks is not None else None)
            self.runs[key] = run  # before the report: a failed write must not re-boot the engines per test
            write_report(run.result.to_dict(), self.report_dir)
        return self.runs[key]


def pytest_configure(config: pytest.Config) -> None:
    from harness.models.families import UnknownFamilyError, resolve_families
    from harness.models.targets import TargetError, target_for_path
    from harness.references.tolerances import UnsupportedDtypeError, calibration_for, calibration_key

    try:
        resolve_families(config.getoption("--model"))
        for p in filter(None, (config.getoption("--model-path") or "").split(",")):
            target_for_path(p)
        calibration_for(calibration_key(config.getoption("--dtype"), config.getoption("--precision")))
        if config.getoption("--tp") < 1:
            raise UnsupportedDtypeError(f"--tp {config.getoption('--tp')}: must be 1 or more")
        from harness.pipeline.runner import resolve_device

        resolve_device(config.getoption("--device"))
    except (UnknownFamilyError, TargetError, UnsupportedDtypeError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None
    config.addinivalue_line("markers", "parity: runs real vLLM and reference engines")
    config.addinivalue_line("markers", "slow: boots vLLM compiled (about a minute); still runs in CI")
    config._vllm_parity = ParitySession(config)  # type: ignore[attr-defined]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    session: ParitySession = metafunc.config._vllm_parity  # type: ignore[attr-defined]
    if "parity_case" in metafunc.fixturenames:
        from harness.references.known_issues import known_issue
        from harness.pipeline.runner import planned_cases, subject_plan

        params = []
        for t in session.targets():
            specs, derived, _ = subject_plan(t, session.subject, session.device == "cuda" and session.compiled)
            for ref, hook in planned_cases(specs, derived):
                issue = known_issue(t.architecture, ref, hook)
                marks = [pytest.mark.xfail(strict=True, reason=f"known reference bug: {issue.reason}")] if issue else []
                params.append(pytest.param(ParityCase(t.name, ref, hook), id=f"{t.name}-{ref}-{hook}", marks=marks))
        metafunc.parametrize("parity_case", params)
    if "nonfiring_case" in metafunc.fixturenames:
        from harness.pipeline.runner import subject_plan
        from overlays.base import expand_layers

        params = []
        for t in session.targets():
            n_layers = int(getattr(t.hf_config, "num_hidden_layers", 0) or 0)
            for nf in subject_plan(t, session.subject, session.device == "cuda" and session.compiled)[2]:
                for hook in expand_layers(nf.template, n_layers):
                    reason = (f"{hook} is non-firing in {session.subject} for {t.name} "
                              f"(overlay {t.overlay.name if session.subject == 'vllm' else 'TL'}): {nf.reason}")
                    params.append(pytest.param(ParityCase(t.name, "none", hook), id=f"{t.name}-nonfiring-{hook}",
                                               marks=pytest.mark.skip(reason=reason)))
        if not params:  # say so, rather than pytest's "got empty parameter set"
            params = [pytest.param(None, id="none", marks=pytest.mark.skip(
                reason="no hook of the selected models is declared non-firing: every offered hook is compared"))]
        metafunc.parametrize("nonfiring_case", params)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """After -k/-m deselection: note which hooks each model's selected parity tests need."""
    ps = getattr(config, "_vllm_parity", None)
    if ps is None:
        return
    chosen: dict[str, set[str]] = {}
    total: dict[str, int] = {}
    for item in items:
        case = getattr(item, "callspec", None) and item.callspec.params.get("parity_case")
        if case is not None:
            chosen.setdefault(case.model, set())
            if case.reference != "hf" or case.hook not in ("logprobs", "argmax"):
                chosen[case.model].add(case.hook)
    if not chosen:
        return
    from harness.pipeline.runner import planned_cases, subject_plan

    for model, hooks in chosen.items():
        specs, derived, _ = subject_plan(ps.target(model), ps.subject, ps.device == "cuda" and ps.compiled)
        total[model] = len({h for _, h in planned_cases(specs, derived)} - {"logprobs", "argmax"})
        if len(hooks) < total[model]:
            ps.selected[model] = frozenset(hooks)


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
