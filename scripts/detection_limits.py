"""The smallest planted engine bug the parity gate catches, per hook kind and dtype.

Command (what was run; add bfloat16 / smollm2 when the time is there):

    .venv/bin/python scripts/detection_limits.py --families llama,smollm2 --dtypes float32,bfloat16 \\
        --out reports/detection_limits.json

For each family (synthetic ``llama``: its middle layer; real ``smollm2``: layer
20 of 30, >= 2/3 depth) and dtype, the references are captured ONCE
(harness.pipeline.fault_sweep.prepare, selective: ``embed.hook_out``, layer 0's
and the planted layer's hooks), then one vLLM engine per planted bug
(harness.engines.engine_faults, applied before vLLM's weight post-processing):

=============  ==========================================  =========================
kind           planted in layer L                          caught at (bridge row)
=============  ==========================================  =========================
attn_out       ``o_proj.weight`` x (1 + eps)               ``blocks.L.attn.hook_out``
mlp_down       ``down_proj.weight`` x (1 + eps)            ``blocks.L.mlp.hook_out``
q_proj         q rows of ``qkv_proj.weight`` x (1 + eps)   ``blocks.L.attn.hook_q``
norm_weight    ``input_layernorm.weight`` x (1 + eps)      the first failing hook at the probe eps
                                                           (the overlay un-folds ``ln1`` with the
                                                           engine's own weight: see the table)
embed          ``embed_tokens.weight`` x (1 + eps)         ``embed.hook_out``
norm_eps       ``input_layernorm`` epsilon 1e-6 <-> 1e-5   ``blocks.L.ln1.hook_normalized``
=============  ==========================================  =========================

"Caught" = that hook's row against the bridge reference has status ``fail``;
``inconclusive`` (bf16 rows whose reference noise is above the gate's ceiling) and
``pass`` are not caught, and the table says which.  Search over the geometric
ladder (``--ladder``, default 1e-5 ... 1e-1 in half decades), assuming the
error grows with eps: one probe engine at ``--probe`` (1e-2 fp32, 1e-1 bf16)
gives rel_err / eps, hence a predicted threshold; the walk then boots the
ladder rungs around the prediction until it finds a caught rung whose lower
neighbour is not caught (typically 2-3 engines per kind).  Every engine run is
kept in the JSON (``runs``); the markdown table (hook kind | dtype | synthetic
eps | real eps) is printed and written beside the JSON (``.md``).

Trap: in bf16 the fault is applied to bf16 weights, so a factor 1 + eps with eps
below bf16's half-ulp (~2e-3 relative) rounds away on most elements: the
smallest bf16 eps can never be below ~4e-3 whatever the gate does.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.engines.engine_faults import EngineFault  # noqa: E402

LADDER = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
PROBE = {"float32": 1e-2, "bfloat16": 1e-1, "float16": 1e-1}
TARGETS = {"float32": 3e-4, "bfloat16": 3e-2}  # the detection targets per dtype
KINDS = ("attn_out", "mlp_down", "q_proj", "norm_weight", "embed", "norm_eps")
DEFAULT_LAYER = {"smollm2": 20}  # else the middle layer


def _layer(family: str, n_layers: int) -> int:
    return DEFAULT_LAYER.get(family, n_layers // 2)


def _fault(kind: str, layer: int, eps: float, cfg) -> tuple[EngineFault, str | None]:
    """The fault of ``kind`` at ``eps`` and the hook that must catch it (None: found by the probe)."""
    p = f"model.layers.{layer}"
    if kind == "attn_out":
        return EngineFault.scale(f"{p}.self_attn.o_proj.weight", eps), f"blocks.{layer}.attn.hook_out"
    if kind == "mlp_down":
        return EngineFault.scale(f"{p}.mlp.down_proj.weight", eps), f"blocks.{layer}.mlp.hook_out"
    if kind == "q_proj":
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        q = cfg.num_attention_heads * head_dim
        return EngineFault.scale(f"{p}.self_attn.qkv_proj.weight", eps, rows=(0, q)), f"blocks.{layer}.attn.hook_q"
    if kind == "norm_weight":
        return EngineFault.scale(f"{p}.input_layernorm.weight", eps), None
    if kind == "embed":
        return EngineFault.scale("model.embed_tokens.weight", eps), "embed.hook_out"
    raise ValueError(kind)


def _record(run, hook: str) -> dict:
    row, first = run.row(hook), run.first_failure_row()
    return {"hook": hook, "status": row.status if row else "missing",
            "rel_err": row.rel_err if row else math.nan, "tolerance": row.tolerance if row else math.nan,
            "floor": row.floor if row else None, "first_failure": first and f"{first.hook} ({first.reference})",
            "engine_s": round(run.wall_s, 1)}


def sweep_kind(base, kind: str, layer: int, ladder, probe: float, log) -> dict:
    from harness.pipeline.fault_sweep import run_fault

    cfg = base.target.hf_config
    runs: dict[float, dict] = {}
    hook = None

    def at(eps: float) -> dict:
        nonlocal hook
        if eps not in runs:
            fault, expect = _fault(kind, layer, eps, cfg)
            run = run_fault(base, fault)
            if hook is None:
                hook = expect or run.first_failure(("fail", "error", "inconclusive"))
                if hook is None:  # nothing moved at the probe: report the ln1 row
                    hook = f"blocks.{layer}.ln1.hook_normalized"
            runs[eps] = {"eps": eps, **_record(run, hook),
                         "statuses": {h: run.status(h) for h in base.order if run.status(h) is not None}}
            r = runs[eps]
            log(f"  {kind:11s} eps={eps:<8g} {r['hook']}: {r['status']:12s} rel={r['rel_err']:.3g} "
                f"tol={r['tolerance']:.3g} first failure: {r['first_failure']} ({r['engine_s']} s)")
        return runs[eps]

    first = at(probe)
    caught = lambda eps: at(eps)["status"] == "fail"  # noqa: E731
    ladder = sorted(ladder)
    if first["status"] == "fail" and first["rel_err"] > 0:
        predicted = first["tolerance"] * probe / first["rel_err"]
        i = next((k for k, e in enumerate(ladder) if e >= predicted), len(ladder) - 1)
    else:
        predicted, i = math.nan, next((k for k, e in enumerate(ladder) if e > probe), len(ladder) - 1)
    smallest = None
    if caught(ladder[i]):
        smallest = ladder[i]
        while i > 0 and caught(ladder[i - 1]):
            i -= 1
            smallest = ladder[i]
    else:
        while i + 1 < len(ladder):
            i += 1
            if caught(ladder[i]):
                smallest = ladder[i]
                break
    below = [r["status"] for e, r in runs.items() if smallest is None or e < smallest]
    verdict = ("caught" if smallest is not None else
               "inconclusive" if "inconclusive" in below else "missed")
    return {"kind": kind, "layer": layer, "hook": hook, "predicted_eps": predicted, "smallest_eps": smallest,
            "verdict": verdict, "runs": [runs[e] for e in sorted(runs)]}


def sweep_norm_eps(base, layer: int, log) -> dict:
    from harness.pipeline.fault_sweep import run_fault

    module = f"model.layers.{layer}.input_layernorm"
    old = float(getattr(base.target.hf_config, "rms_norm_eps", 1e-6))
    new = 1e-5 if abs(old - 1e-5) > 1e-9 else 1e-6
    hook = f"blocks.{layer}.ln1.hook_normalized"
    run = run_fault(base, EngineFault.norm_eps(module, new))
    r = {"eps_from": old, "eps_to": new, **_record(run, hook),
         "statuses": {h: run.status(h) for h in base.order if run.status(h) is not None}}
    log(f"  norm_eps    {old:g} -> {new:g} {hook}: {r['status']} rel={r['rel_err']:.3g} tol={r['tolerance']:.3g} "
        f"first failure: {r['first_failure']} ({r['engine_s']} s)")
    return {"kind": "norm_eps", "layer": layer, "hook": hook, "verdict": "caught" if r["status"] == "fail" else r["status"],
            "smallest_eps": None, "runs": [r]}


def _cell(res: dict | None) -> str:
    if res is None:
        return "not run"
    if res["kind"] == "norm_eps":
        r = res["runs"][0]
        return (f"{r['eps_from']:g}→{r['eps_to']:g}: {res['verdict']} (rel {r['rel_err']:.2g}, "
                f"tol {r['tolerance']:.2g}) at `{res['hook'].split('.', 2)[-1]}`")
    if res["smallest_eps"] is None:
        return f"{res['verdict']} up to {max(r['eps'] for r in res['runs']):g}"
    where = "" if res["kind"] != "norm_weight" else f" at `{res['hook']}`"
    return f"{res['smallest_eps']:g}{where}"


def table(results: dict) -> str:
    lines = ["| hook kind | dtype | synthetic ε (llama) | real ε (smollm2) | target |", "|---|---|---|---|---|"]
    dtypes = sorted({d for (_, d) in results}, key=lambda d: ("float32", "bfloat16", "float16").index(d))
    for kind in KINDS:
        for dtype in dtypes:
            syn = results.get(("llama", dtype), {}).get(kind)
            real = results.get(("smollm2", dtype), {}).get(kind)
            if syn is None and real is None:
                continue
            tgt = TARGETS.get(dtype)
            lines.append(f"| {kind} | {dtype} | {_cell(syn)} | {_cell(real)} | "
                         f"{'≤ %g' % tgt if tgt and kind != 'norm_eps' else ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="llama,smollm2")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--ladder", default=",".join(f"{e:g}" for e in LADDER))
    ap.add_argument("--probe", type=float, default=None, help="probe eps (default 1e-2 fp32, 1e-1 bf16)")
    ap.add_argument("--out", type=Path, default=Path("reports/detection_limits.json"))
    args = ap.parse_args(argv)

    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_family
    from harness.pipeline.fault_sweep import hooks_for_layers, prepare
    from harness.values.variant import Variant

    ladder = [float(x) for x in args.ladder.split(",") if x]
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"--kinds {sorted(unknown)}: known {KINDS}")
    log = lambda s: print(s, flush=True)  # noqa: E731
    results: dict[tuple[str, str], dict] = {}
    out: dict = {"command": " ".join(sys.argv), "ladder": ladder, "targets": TARGETS, "sweeps": []}
    t_all = time.perf_counter()

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        out["wall_s"] = round(time.perf_counter() - t_all, 1)
        out["table"] = table(results)
        args.out.write_text(json.dumps(out, indent=1, default=str))
        args.out.with_suffix(".md").write_text(out["table"] + "\n")

    for family in [f for f in args.families.split(",") if f]:
        if family not in FAMILIES:
            log(f"{family}: not a family here, skipped")
            continue
        target = target_for_family(FAMILIES[family])
        n_layers = int(target.hf_config.num_hidden_layers)
        layer = _layer(family, n_layers)
        for dtype in [d for d in args.dtypes.split(",") if d]:
            variant = Variant.make(dtype, "cpu")
            # layer 0 too: a selection without it loses processed compatibility mode's rows today
            hooks = hooks_for_layers(target, variant, {0, layer})
            t0 = time.perf_counter()
            base = prepare(target, variant, hooks)
            log(f"{family} {dtype}: layer {layer} of {n_layers}, {len(base.order)} hooks, "
                f"references {time.perf_counter() - t0:.0f} s")
            per_kind = results.setdefault((family, dtype), {})
            probe = args.probe or PROBE[dtype]
            for kind in kinds:
                try:
                    res = (sweep_norm_eps(base, layer, log) if kind == "norm_eps"
                           else sweep_kind(base, kind, layer, ladder, probe, log))
                except Exception as exc:  # noqa: BLE001 -- one kind's failure must not lose the others
                    res = {"kind": kind, "layer": layer, "hook": None, "verdict": f"error: {exc}"[:500],
                           "smallest_eps": None, "runs": [{"eps": probe}]}
                    log(f"  {kind}: {res['verdict']}")
                per_kind[kind] = res
                out["sweeps"].append({"family": family, "dtype": dtype, **res})
                save()
    print()
    print(table(results))
    print(f"\nJSON: {args.out}  ({time.perf_counter() - t_all:.0f} s)")
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
