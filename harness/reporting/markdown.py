"""A per-model report as markdown: a pure function of the result dict (:func:`to_markdown`).

Contract: every number shown is one the result holds (the rows' statistics and the margins the gate
stored, the summary the run stored: harness.comparison.verdict.summary_of); nothing is decided here.
Sections, in order: verdict (and a declared known vLLM bug: held, or stale) and header table, prompts,
skip / error, the hook rows and failures, routing flips, chaotic tokens, serving, non-firing hooks, timings.
Trap: the report phase's own time is in the timings table only when harness.reporting.report.write_report
added it before rendering.
"""
from __future__ import annotations

import math
from typing import Any

from harness.comparison.known_vllm_bugs import explains
from harness.comparison.verdict import stored_margin, summary_of
from harness.vocab.hooks import hook_kind

# How a row's status is decided: the rule has one home, docs/concepts.md (reports land in
# <repo>/reports/<model>/ by default, so the link is relative to that)
GATE_LINK = ("How each row's status is decided (pass, fail, inconclusive against the dtype's ceiling): "
             "[docs/concepts.md, \"The gate\"](../../docs/concepts.md#the-gate).")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _fmt(x: Any, spec: str = ".2e") -> str:
    return format(x, spec) if _finite(x) else ("—" if x is None else str(x))


def _device_line(result: dict) -> str:
    info = result.get("device_info") or {}
    if result.get("device") != "cuda":
        return result.get("device", "cpu")
    tp = info.get("tp_check")
    return (f"cuda: {info.get('gpu', '?')}, driver {info.get('driver', '?')}, CUDA {info.get('cuda', '?')}; "
            f"fp32 matmuls {info.get('precision', 'ieee')}; tensor parallel {info.get('tp', 1)}"
            + (f" (ranks agree on {tp['replicated_reads']} replicated reads, worst "
               f"{tp['max_rank_disagreement']:.1e}; {tp['sharded_reads_gathered']} sharded reads gathered)"
               if tp else ""))


def _kernel_line(result: dict) -> str:
    """Which kernels computed the numbers (harness.kernel_path): the label, then vLLM's and the
    references' details."""
    info = result.get("device_info") or {}
    parts = [f"**{result.get('kernel_path') or 'unknown'}**"]
    eng = info.get("kernel_path") or {}
    if eng.get("device") == "cuda":
        parts.append(f"vLLM: attention {eng.get('attention')}, compilation {eng.get('compilation_mode')}, "
                     f"CUDA graphs {eng.get('cudagraph_mode')}")
    elif eng:
        parts.append(f"vLLM: `{eng.get('vllm_library')}`, attention {eng.get('attention')}, GEMMs "
                     f"{', '.join(f'{k} x{v}' for k, v in (eng.get('gemm') or {}).items()) or '—'}, ATen "
                     f"{eng.get('aten_capability')}, oneDNN {eng.get('onednn_isa')}")
    ref = info.get("reference_kernel_path") or {}
    if ref:
        parts.append(f"references: ATen {ref.get('aten_capability')}, bf16 matmuls "
                     f"{'oneDNN' if ref.get('aten_bf16_matmul_onednn') else 'ATen (fp32 accumulation)'}")
    cpu = ref or eng
    if cpu and "cpu_avx512" in cpu:
        parts.append(f"CPU: AVX-512 {'yes' if cpu['cpu_avx512'] else 'no'}, AVX-512-BF16 "
                     f"{'yes' if cpu['cpu_avx512_bf16'] else 'no'}, AMX {'yes' if cpu['cpu_amx'] else 'no'}"
                     + (f"; emulating {cpu['emulated']}" if cpu.get("emulated") else ""))
    return "; ".join(parts)


def _provenance(p: dict) -> str:
    return "; ".join(f"{k}: {v}" for k, v in p.items() if not isinstance(v, (dict, list)))


def to_markdown(result: dict) -> str:
    s = summary_of(result)
    out = _header(result, s)
    if result.get("skipped"):
        out += [f"**Skipped**: {result['skipped']}", ""]
    if result.get("selected_hooks") is not None:
        out += [f"*Selective run*: only the {len(result['selected_hooks'])} hook(s) the selected tests compare were "
                "captured (pytest -k/-m selection); run without a selection for the full report.", ""]
    if result.get("error"):
        out += ["## Engine error", "", "```", result["error"].strip(), "```", ""]
    out += _hook_rows(result)
    if result.get("routing_flips"):
        out += _routing_flips(result["routing_flips"])
    if result.get("chaotic_tokens"):
        out += _chaotic_tokens(result["chaotic_tokens"], result.get("prompt_names") or [])
    if result.get("serving"):
        out += serving_markdown(result["serving"], result.get("prompt_names") or [])
    out += ["", "## Non-firing hooks", "", "| hook | layers | reason |", "|---|---|---|"]
    for n in result.get("nonfiring", []):
        out.append(f"| `{n['template']}` | {len(n['hooks'])} | {n['reason']} |")
    out += _timings(result)
    return "\n".join(out) + "\n"


def _vllm_bug(result: dict, s: dict) -> list[str]:
    """A declared known vLLM bug that applies to this run (harness.comparison.known_vllm_bugs): held, or stale."""
    bug = result.get("known_vllm_bug")
    tried = [f"'{c['name']}' (family row `{c['inferred_from']}`: {c['why']})"
             for c in result.get("candidate_vllm_bugs") or []]
    if not bug:
        return ["**Known vLLM bugs of this architecture, checked as candidates** (declared on family rows in "
                "harness/models/families.py; signature hooks at any layer, no rel-err range): none holds in this "
                "run, so none explains its failures: " + "; ".join(tried) + ".", ""] if tried else []
    if s.get("known_vllm_bug"):
        where = (f"declared on the family row `{bug['inferred_from']}` in harness/models/families.py and checked here "
                 "as a candidate for this architecture, its signature hooks at any layer and no rel-err range"
                 if bug.get("inferred_from") else "declared in harness/models/families.py")
        return [f"**Known vLLM bug** ({where}; its signature holds in this run: "
                f"{bug['why']}): {bug['reason']}. The failing vLLM rows below are this bug's"
                + (f"; the {s['errors']} rows that error are not, and fail the run." if s["errors"] else "; "
                   "the run is ❌ and does not fail `python -m harness run`."), ""]
    return [f"**Stale declaration**: {s.get('stale_vllm_bug')}", ""]


def _header(result: dict, s: dict) -> list[str]:
    """The verdict, what was gated, the header table and the prompts."""
    v = result.get("versions", {})
    return [
        f"# Parity report: {result['model']} ({result['dtype']}, {result.get('device', 'cpu')})",
        "",
        f"**Verdict: {s['verdict'].upper()}** — {s['passed']}/{s['rows']} rows pass; "
        f"{s['hooks_passed']}/{s['hooks_offered']} hooks pass on every reference; "
        f"{s['nonfiring']} hooks declared non-firing; worst margin (error / tolerance) "
        f"{_fmt(s.get('worst_margin'), '.3f')}: relative error {_fmt(s['worst_rel_err'])} ({s['worst_where']})"
        + _worst_text(result, s) + ".",
        "",
        *_vllm_bug(result, s),
        f"**Gated {s['hooks_gated']}/{s['hooks_compared']} hooks** (compared against at least one reference and "
        "decided pass or fail; an inconclusive row is *not compared*, never a pass)"
        + (f"; not gated: {', '.join(s['ungated_hooks'][:20])}{' ...' if len(s['ungated_hooks']) > 20 else ''}"
           if s["ungated_hooks"] else "") + ".",
        *([f"**Selective run**: only {len(result['selected_hooks'])} hook(s) asked for; this report never "
           "replaces the full one and the matrix leaves it out.", ""] if s["selection"] else [""]),
        "| field | value |", "|---|---|",
        f"| subject | {result.get('subject', 'vllm')} |",
        f"| device | {_device_line(result)} |",
        f"| kernel path | {_kernel_line(result)} |",
        f"| architecture | `{result['architecture']}` |",
        f"| overlay | `{result['overlay']}` |",
        *([f"| unfused reads | {_unfused_line(result['unfused_reads'])} |"] if result.get("unfused_reads") else []),
        f"| checkpoint | {result['source']}: `{result['checkpoint']}` |",
        *([f"| provenance | {_provenance(result['provenance'])} |"] if result.get("provenance") else []),
        f"| dtype / seed | {result['dtype']} / {result.get('seed')} |",
        f"| vllm / torch | {v.get('vllm')} / {v.get('torch')} |",
        f"| transformers / transformer-lens | {v.get('transformers')} / {v.get('transformer-lens')} |",
        f"| prompts (token ids) | {'; '.join(f'{n}: {len(p)} tokens' for n, p in zip(result.get('prompt_names') or range(99), result.get('prompts', [])))} ({'one run each, plus all in one ragged batch' if not result.get('serving') else 'served as below'}) |",
        *([f"| prompt source | {_cell((result.get('prompt_info') or {})['source'])} |"]
          if (result.get("prompt_info") or {}).get("source") else []),
        *([f"| references | {result['references_stored']['action']} (`{result['references_stored']['path']}`) |"]
          if result.get("references_stored") else []),
        *([f"| reference corrected | {_cell(result['reference_corrected'])}: every reference ran corrected for this "
           "documented reference bug, its signature checked in this run (a gated-norm bug: downstream of its own "
           "row, which is the bug's, harness/comparison/known_issues.py; a config field the installed transformers "
           "misreads: from the config on, harness/references/config_mends.py) |"]
          if result.get("reference_corrected") else []),
        *([f"| serving | `{result['serving'].get('scheme')}`: {result['serving'].get('doc')} |"]
          if result.get("serving") else []),
        f"| wall time | {result.get('wall_s', 0):.1f} s |",
        "",
        *prompt_lines(result),
    ]


def _unfused_line(hooks: list[str]) -> str:
    """The hooks read from HF's own projections (harness.values.plan.Plan.reads_found), by kind."""
    kinds = ", ".join(dict.fromkeys(f"`{hook_kind(h)}`" for h in hooks))
    return (f"{len(hooks)} hooks ({kinds}) read from HF's own q/k/v or gate/up projections: this vLLM line's "
            "Transformers backend did not fuse them (overlays.base.HookSpec.unfused)")


def _hook_rows(result: dict) -> list[str]:
    """The rows table (every compared reference and hook), the logit metrics and the failures."""
    out = ["## Hooks", "",
            "`rel_err` = ||vLLM − reference|| / ||reference|| of the worst last-dim row (a token's vector, a head's "
            "vector, a query's attention row), worst prompt. `floor` = the reference's own "
            "distance from itself in the truth dtype; `tol` = max(multiple × floor, minimum) "
            "(harness/comparison/tolerances.py); `margin` = rel_err / tol (< 1 passes). `median` = the median row's "
            "relative error and `scale` = the median of ||vLLM row|| / ||reference row|| − 1, each with its own floor "
            "and tolerance (harness/comparison/gate.py). "
            "`cos_min` = worst per-token cosine. "
            "References: `bridge` TransformerBridge, `compat` its compatibility mode, `hf` plain HF forward hooks, "
            "`bridge~hf` the two references against each other, `compat-processed` compatibility mode with "
            "HookedTransformer's weight processing (harness/comparison/processing.py), `bridge-ragged` vLLM's ragged-batch run "
            "(all prompts in one batch) against the bridge run alone. *(derived)*: computed host-side from "
            "captured hooks (harness/comparison/derived.py; entries masked on both sides ignored), not a tensor vLLM "
            "materialized.", "",
            GATE_LINK, "",
            "| status | reference | hook | rel_err | floor | tol | margin | median (floor, tol) | scale (tol) | max_abs "
            "| cos_min | worst (prompt, index) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    names = result.get("prompt_names") or []
    for r in result.get("rows", []):
        worst = r.get("worst") or {}
        if "prompt" in worst:
            p = worst["prompt"]
            where = f"{names[p] if p < len(names) else 'p' + str(p)} {worst.get('index')}"
        else:
            where = f"{worst.get('agree_positions')}/{worst.get('positions')} top-1" if worst else ""
        name = r["hook"] if r["reference_hook"] == r["hook"] else f"{r['hook']} → `{r['reference_hook']}`"
        if r.get("derived"):
            name += " *(derived)*"
        margin_ = stored_margin(r)
        out.append(f"| {r['status']} | {r['reference']} | {name} | {_fmt(r['rel_err'])} | {_fmt(r.get('floor'))} "
                   f"| {_fmt(r['tolerance'], '.1e')} | {_fmt(margin_, '.3f')} "
                   f"| {_fmt(r.get('rel_median'))} ({_fmt(r.get('floor_median'))}, {_fmt(r.get('tolerance_median'), '.1e')}) "
                   f"| {_fmt(r.get('scale_median'), '+.1e')} ({_fmt(r.get('tolerance_scale'), '.1e')}) | {_fmt(r['max_abs'])} "
                   f"| {_fmt(r['cos_min'], '.7f')} | {where} |")
    lm = next((r.get("logit_metrics") for r in result.get("rows", []) if r.get("logit_metrics")), None)
    if lm:
        out += ["", "Logits vs HF: " + ", ".join(f"{k} {_fmt(v, '.3g')}" for k, v in lm.items()) + "."]
    failing = [r for r in result.get("rows", []) if r["status"] != "pass"]
    bug = result.get("known_vllm_bug")
    if failing:
        out += ["", "### Failures", ""] + [
            f"- {r['message']}" + (f" — **known reference bug**: {r['known_issue']}" if r.get("known_issue") else "")
            + (" — **known vLLM bug**" if not r.get("known_issue") and explains(bug, r["reference"], r["status"])
               else "")
            + (f" — text there: {_code(ctx)}" if (ctx := row_context(result, r)) else "")
            for r in failing]
    return out


def _routing_flips(flips: list[dict]) -> list[str]:
    out = ["", "## Expert-routing flips (harness.comparison.routing)", "",
            "Tokens whose top-k experts differ between vLLM and the bridge (single-prompt runs, then the "
            "flips only the ragged batch adds).  An *explained* flip (vLLM's "
            "router logits at that token within the router hook's calibrated tolerance, so rounding swapped "
            "a near-tie) sets its prompt aside in every row downstream of that layer's routing; an "
            "unexplained one sets nothing aside.", "",
            "| prompt | layer | token | reference top-k gap | max router-logit difference | router rel err "
            "| tolerance | explained |", "|---|---|---|---|---|---|---|---|"]
    for f in flips:
        out.append(f"| {f['prompt']} | {f['layer']} | {f['token']} | {f['gap']:.2e} | {f['noise']:.2e} "
                   f"| {f['rel_err']:.1e} | {f['tolerance']:.1e} | {'yes' if f['explained'] else '**no**'} |")
    return out


def _chaotic_tokens(chaotic: list[dict], names: list[str]) -> list[str]:
    out = ["", "## Chaotic tokens (harness.comparison.chaos)", "",
            "Tokens whose residual stream in the reference's own run-dtype run is farther than the dtype's "
            "ceiling from its truth-dtype run (no vLLM value involved).  Two valid implementations diverge "
            "there by no multiple of one's own error, and attention carries that to every later query: "
            "every row from that layer on (and the final norm, unembed and logits) leaves out that prompt's "
            "tokens at and after it, and the floors are computed without them too.", "",
            "| prompt | token | first layer | reference's own row error | ceiling |", "|---|---|---|---|---|"]
    own = [c for c in chaotic if c.get("source") == "routing"]
    for c in (c for c in chaotic if c.get("source") != "routing"):
        name = names[c["prompt"]] if c["prompt"] < len(names) else c["prompt"]
        out.append(f"| {name} | {c['token']} | {c['layer']} | {c['floor']:.2f} | {c['ceiling']:g} |")
    if own:
        out += ["", "Expert-routing flips of the reference's own run (its run-dtype expert choice against its "
                "truth-dtype choice, no vLLM value involved): the rows downstream of that layer's routing leave out "
                "that prompt's tokens at and after it, and the floors are computed without them too.", "",
                "| prompt | token | layer | run-dtype experts | truth-dtype experts | hook |", "|---|---|---|---|---|---|"]
        for c in own:
            name = names[c["prompt"]] if c["prompt"] < len(names) else c["prompt"]
            out.append(f"| {name} | {c['token']} | {c['layer']} | {c['run']} | {c['truth']} | `{c['hook']}` |")
    return out


def _timings(result: dict) -> list[str]:
    """Time and memory per phase, forward latency per engine, the top operators."""
    out: list[str] = []
    t = result.get("timings") or {}
    if t:
        out += ["", "## Timings", ""]
        out += phases_markdown(t.get("phases") or {}, result.get("wall_s"), t.get("peak_memory"), t.get("memory"))
    if t.get("vllm") or t.get("hf"):
        out += ["", "| engine | forward latency (median) | boot |", "|---|---|---|"]
        for eng, label in (("vllm", "vLLM (model forward, capture off)"), ("hf", "HF transformers (forward)")):
            tt = t.get(eng, {})
            out.append(f"| {label} | {_fmt(tt.get('forward_ms_median'), '.2f')} ms "
                       f"| {_fmt(tt.get('boot_s') or tt.get('bridge_boot_s'), '.1f')} s |")
        for eng in ("vllm", "hf"):
            ops = (t.get(eng) or {}).get("top_ops") or []
            if ops:
                out += ["", f"### Top operators by self time: {eng} (one profiled forward)", "",
                        "| op | calls | self CPU µs | self device µs |", "|---|---|---|---|"]
                out += [f"| `{o['op']}` | {o['calls']} | {o['self_cpu_us']:.0f} | {o['self_device_us']:.0f} |"
                        for o in ops[:10]]
    return out


def row_context(result: dict, row: dict, width: int = 6) -> str:
    """The decoded text around ``row``'s worst token, that token in brackets (``…capital of [France]
    is…``), where the prompts are text (``prompt_info["pieces"]``); else ""."""
    from harness.models.text_prompts import token_context

    pieces = (result.get("prompt_info") or {}).get("pieces") or []
    p, tok = (row.get("worst") or {}).get("prompt"), _worst_token(row)
    if not isinstance(p, int) or not isinstance(tok, int) or not 0 <= p < len(pieces):
        return ""
    return token_context(pieces[p], tok, width)


def _worst_token(row: dict) -> int | None:
    """The worst row's token position (``worst["token"]``; a report from before it was recorded: index
    axis 0, or 1 for a heads-first ``[heads, query, key]`` value)."""
    worst = row.get("worst") or {}
    if worst.get("token") is not None or not worst.get("index"):
        return worst.get("token")
    from harness.vocab.hook_rules import heads_first

    idx = worst["index"]
    return idx[1] if (row.get("derived") or heads_first(row["hook"])) and len(idx) > 1 else idx[0]


def _worst_text(result: dict, s: dict) -> str:
    row = next((r for r in result.get("rows", []) if f"{r['hook']} vs {r['reference']}" == s.get("worst_where")), None)
    ctx = row_context(result, row) if row else ""
    if not ctx:
        return ""
    names = result.get("prompt_names") or []
    p = row["worst"]["prompt"]
    return f", at {names[p] if p < len(names) else p} token {_worst_token(row)}: {_code(ctx)}"


def _code(text: str, table: bool = False) -> str:
    """``text`` as inline code (``table``: its pipes escaped, for a table cell)."""
    text = text.replace("|", "\\|") if table else text
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def prompt_lines(result: dict, limit: int = 100) -> list[str]:
    """The text prompts as a table (each text cut to ``limit`` characters) and the tokenization notes;
    nothing for token-id prompts."""
    info = result.get("prompt_info") or {}
    texts = info.get("texts") or []
    if not texts:
        return []
    names, prompts, chats = result.get("prompt_names") or [], result.get("prompts") or [], info.get("chat") or []
    out = ["| prompt | tokens | text |", "|---|---|---|"]
    for i, text in enumerate(texts):
        flat = text.strip().replace("\r", "").replace("\n", "⏎")
        short = flat if len(flat) <= limit else flat[:limit - 1] + "…"
        chat = " *(chat template)*" if i < len(chats) and chats[i] else ""
        out.append(f"| {names[i] if i < len(names) else i} | {len(prompts[i]) if i < len(prompts) else '—'} "
                   f"| {_code(short, table=True)}{chat} |")
    out += [""] + [f"- {_cell(n)}" for n in info.get("notes") or []] + ([""] if info.get("notes") else [])
    return out


# what each phase covers and where it is measured (names: harness.pipeline.runner and
# harness.references.reference); a phase without an entry renders without a note
PHASE_NOTES = {
    "setup": "library versions, fingerprint",
    "plan": "overlay specs, derived and non-firing hooks, prompts",
    "refusal_recheck": "vLLM asked to boot a dtype it is declared to refuse",
    "subject": "the vLLM subject end to end: process start, boot, captures, read-back",
    "subject.engine_boot": "the engine's boot, timed in its own process",
    "subject.timed_forwards": "the clean (capture off) latency forwards, timed in the engine's process",
    "references": "every reference engine, floor runs included",
    "references.bridge_boot": "TransformerBridge boot (run dtype)",
    "references.bridge_forward": "TransformerBridge forwards, every prompt",
    "references.compat": "compatibility mode switched on, its forwards",
    "references.processed": "compatibility mode with weight processing: boot and forwards",
    "references.truth_bridge": "truth-dtype bridge and compatibility runs, their floors",
    "references.truth_bridge.bridge_boot": "TransformerBridge boot in the truth dtype, weights rounded",
    "references.truth_bridge.bridge_forward": "its forwards, every prompt",
    "references.truth_bridge.compat": "its compatibility mode and forwards",
    "references.truth_bridge.floors": "the floors: run dtype against truth, every hook",
    "references.hf": "HF load and forwards",
    "references.truth_hf": "truth-dtype HF load, forwards, its floors",
    "references.hf_timing": "HF latency repeats and one profiled forward",
    "references.tf32_floors": "the references again with TF32 matmuls (the tf32 gate's floors)",
    "compare": "evaluate: every row's metrics and verdict",
    "report": "depth plot and summary, in the report writer (after the run)",
}


def phases_markdown(phases: dict, wall_s: float | None, peak: dict | None = None,
                    memory: dict | None = None) -> list[str]:
    """The phases as a table (a sub-phase indented under its parent, each with its share of the
    run's wall time and, where the run sampled memory, the peak RSS of this process and the engine
    processes together while it was the innermost phase: harness.memory), then peak memory.  Pure."""
    if not phases:
        return []
    by_phase = (memory or {}).get("by_phase") or {}
    mem_col = bool(by_phase)
    out = ["| phase | seconds | share of the run |" + (" peak RSS, MiB |" if mem_col else "")
           + " what, and where it is measured |", "|---|---|---|" + ("---|" if mem_col else "") + "---|"]
    for name, seconds in phases.items():
        depth = name.count(".")
        label = ("&nbsp;&nbsp;" * depth + "└ " if depth else "") + name.rsplit(".", 1)[-1]
        share = "after the run" if name == "report" else (
            f"{100 * seconds / wall_s:.0f} %" if _finite(wall_s) and wall_s else "—")
        mem = f" {_fmt(by_phase.get(name), '.0f')} |" if mem_col else ""
        out.append(f"| {label} | {seconds:.2f} | {share} |{mem} {PHASE_NOTES.get(name, '')} |")
    if _finite(wall_s):
        mem = f" {_fmt(memory.get('rss_peak_mib'), '.0f')} |" if mem_col else ""
        out.append(f"| **run (wall)** | {wall_s:.2f} | 100 % |{mem} run_model, end to end (the report excluded) |")
    if memory and memory.get("rss_peak_mib") is not None:
        out += ["", f"Sampled peak memory of this run (every {memory.get('interval_s', 0.05)} s, harness.memory): "
                    f"this process {_fmt(memory.get('rss_self_peak_mib'), '.0f')} MiB, the vLLM engine processes "
                    f"{_fmt(memory.get('rss_engines_peak_mib'), '.0f')} MiB, both together "
                    f"{_fmt(memory.get('rss_peak_mib'), '.0f')} MiB (a phase's column: the innermost phase open)."]
    if peak:
        out += ["", _peak_line(peak)]
    return out


def _peak_line(peak: dict) -> str:
    """Peak memory in words (harness.phases.peak_memory says which process each covers)."""
    gpu = (f"; GPU (this process) {_fmt(peak.get('gpu_allocated_mib'), '.0f')} MiB allocated, "
           f"{_fmt(peak.get('gpu_reserved_mib'), '.0f')} MiB reserved" if peak.get("gpu_allocated_mib") is not None
           else "; GPU: none used in this process")
    return (f"Peak memory: this process {_fmt(peak.get('rss_self_mib'), '.0f')} MiB RSS, the vLLM engine "
            f"processes {_fmt(peak.get('rss_children_mib'), '.0f')} MiB (largest finished child){gpu}.  "
            "Lifetime peaks of the process: in pytest or a `--jobs 1` CLI run they include earlier models.")


def serving_markdown(serving: dict, names: list[str]) -> list[str]:
    """Where every compared position of a serving run came from (harness.engines.stitch.Coverage)."""
    out = ["", f"## Serving: `{serving.get('scheme')}` (harness.engines.serving)", "",
           f"{serving.get('doc', '')}.  {serving.get('forwards')} engine steps; engine arguments "
           f"`{serving.get('engine')}`.  Every position of every prompt is compared: a position the prompt's "
           "own request did not compute (served from the prefix cache) is taken from the request that "
           "computed it, with the same tokens up to it.", "",
           "| prompt | positions compared | computed by its request | from the cache's origin | recomputed "
           "(preemption) | engine steps | vLLM cached tokens | generated |", "|---|---|---|---|---|---|---|---|"]
    cached = serving.get("num_cached_tokens") or {}
    generated = serving.get("generated") or []
    for c in serving.get("coverage") or []:
        p = c["prompt"]
        name = names[p] if p < len(names) else p
        gen = generated[p] if p < len(generated) else []
        out.append(f"| {name} | {c['positions']} | {c['from_main']} (from position {c['first_main_position']}) "
                   f"| {c['from_other']} | {c['recomputed']} | {c['forwards']} | {cached.get(str(p), cached.get(p, 0))} "
                   f"| {len(gen)} |")
    if serving.get("logprob_rows_missing"):
        out += ["", f"Log-prob rows no request returned (not compared): {serving['logprob_rows_missing']}."]
    return out
