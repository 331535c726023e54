"""Command line: ``python -m harness run|matrix``.

``run``    -- the main job: parity on the default families (or ``--model``,
              ``--model-path``), one engine process per model, reports under
              ``reports/``, then the support matrix, printed and written.
              ``--subject tl-vllm`` tests TransformerLens's own vLLM
              backend instead (``report-tl-vllm.*`` beside ``report.*``).
              Exit status 1 if any hook fails or any model errors.
``matrix`` -- regenerate ``reports/support_matrix.{md,json}`` from the
              per-model JSON files already there.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_REPORTS = REPO / "reports"


def _cmd_run(args: argparse.Namespace) -> int:
    from .matrix import write_matrix
    from .report import summarize, write_report
    from .runner import run_model
    from .targets import TargetError, targets_from_options

    from .tolerances import UnsupportedDtypeError, calibration_for

    dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
    try:
        for d in dtypes:
            calibration_for(d)
        targets = targets_from_options(args.model, args.model_path)
    except (TargetError, UnsupportedDtypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    status = 0
    for target, dtype in [(t, d) for t in targets for d in dtypes]:
        mode = "compiled" if args.compiled else "eager"
        print(f"== {target.name} ({target.architecture}, {target.overlay.name}, subject {args.subject}, "
              f"{dtype}, {mode}) ...", flush=True)
        result = run_model(target, dtype=dtype, subject=args.subject, compiled=args.compiled).result.to_dict()
        path = write_report(result, args.report_dir)
        s = summarize(result)
        print(f"   {s['verdict']}: {s['passed']}/{s['rows']} rows pass, worst rel err "
              f"{s['worst_rel_err']} ({s['worst_where']}), {result['wall_s']:.0f} s -> {path}", flush=True)
        if result.get("error"):
            print("   " + result["error"].strip().splitlines()[0], flush=True)
        status |= s["verdict"] != "pass"
    md, _ = write_matrix(args.report_dir)
    print()
    print(md.read_text())
    return int(status)


def _cmd_matrix(args: argparse.Namespace) -> int:
    from .matrix import write_matrix

    md, rows = write_matrix(args.report_dir)
    print(md.read_text())
    return 0 if rows else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run parity and write reports + matrix")
    run.add_argument("--model", default=None, help="comma-separated families (default: the default set)")
    run.add_argument("--model-path", default=None, help="local HF checkpoint directory (comma-separated for several)")
    run.add_argument("--dtype", default="float32",
                     help="comma-separated dtypes, one report each (float32, bfloat16, float16)")
    run.add_argument("--compiled", action="store_true", help="vLLM with torch.compile instead of eager")
    run.add_argument("--subject", default="vllm", choices=("vllm", "tl-vllm"),
                     help="vllm: this harness's overlays (default); tl-vllm: TransformerLens's own vLLM backend "
                          "(reports report-tl-vllm.*)")
    run.add_argument("--report-dir", type=Path, default=DEFAULT_REPORTS)
    run.set_defaults(fn=_cmd_run)
    mat = sub.add_parser("matrix", help="regenerate the support matrix from reports/*/report*.json")
    mat.add_argument("--report-dir", type=Path, default=DEFAULT_REPORTS)
    mat.set_defaults(fn=_cmd_matrix)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
