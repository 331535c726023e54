"""The model-support matrix, regenerated from the per-model report JSON files.

Contract: :func:`build_matrix(report_dir)` reads every
``<report_dir>/*/report*.json`` and returns one row per (model, variant);
:func:`write_matrix` writes ``support_matrix.md`` and ``support_matrix.json``
beside them; :func:`to_grid` is the compact view (a family per row, a variant
per column) the README shows for the GPU runs.  Never hand-edited: reports from several runs, machines or
shards merge simply by sitting in the same folder, or by passing several folders
(``report_dir`` a list; ``python -m harness matrix --report-dir A --report-dir B --out DIR``):
the matrix is then written to ``out_dir`` and each row's ``report`` path is relative to it.

A run a declared known vLLM bug explains (its signature held: harness.comparison.known_vllm_bugs) stays
❌, its cell naming the bug; a stale declaration's message is in its cell too.

Trap: two folders holding a report of the same model and variant (``<model>/<stem>.json``):
the later folder's wins, and the matrix lists the one it replaced (a re-run shard's folder
goes last).
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

Folders = Path | str | Sequence[Path | str]  # one folder, or several to merge

from harness.reporting.matrix_html import write_html
from harness.comparison.verdict import summary_of
from harness.reporting.naming import SELECTION_SUFFIX, variant_of


def _folders(report_dir: Folders) -> list[Path]:
    return [Path(report_dir)] if isinstance(report_dir, (str, Path)) else [Path(d) for d in report_dir]


def selection_reports(report_dir: Folders) -> list[Path]:
    """Reports of selective runs (``-k``): never in the matrix, which is of full runs only."""
    return [p for d in _folders(report_dir) for p in sorted(d.glob(f"*/report*{SELECTION_SUFFIX}.json"))]


def full_reports(report_dir: Folders) -> tuple[list[Path], list[Path]]:
    """The full-run report files of every folder, sorted by ``<model>/<stem>.json``, and the ones a
    later folder's report of the same model and variant replaced (see the module's trap)."""
    selections = set(selection_reports(report_dir))
    chosen: dict[str, Path] = {}
    replaced: list[Path] = []
    for folder in _folders(report_dir):
        for path in sorted(folder.glob("*/report*.json")):
            if path in selections:
                continue
            key = str(path.relative_to(folder))
            if key in chosen:
                replaced.append(chosen[key])
            chosen[key] = path
    return [chosen[k] for k in sorted(chosen)], replaced


def build_matrix(report_dir: Folders, relative_to: Path | None = None) -> list[dict]:
    """One row per (model, variant) of every folder's full-run reports; each row's ``report`` path is
    relative to ``relative_to`` (default: the one folder given)."""
    folders = _folders(report_dir)
    base = Path(relative_to) if relative_to is not None else folders[0]
    rows = []
    for path in full_reports(folders)[0]:
        try:
            r = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            rows.append({"model": path.parent.name, "verdict": "error", "error": f"unreadable {path}: {exc}"})
            continue
        s = summary_of(r)  # the verdict the run stored
        v = r.get("versions", {})
        rows.append({
            "model": r["model"], "architecture": r["architecture"], "overlay": r["overlay"],
            "variant": variant_of(r), "subject": r.get("subject") or "vllm", "device": r.get("device", "cpu"), "dtype": r["dtype"],
            "kernel_path": r.get("kernel_path") or "unknown",
            "vllm": v.get("vllm"), "transformers": v.get("transformers"),
            "transformer_lens": v.get("transformer-lens"),
            "hooks_passed": s["hooks_passed"], "hooks_offered": s["hooks_offered"], "hook_kinds": s["hook_kinds"],
            "hooks_gated": s["hooks_gated"], "hooks_compared": s["hooks_compared"],
            "nonfiring": s["nonfiring"], "worst_rel_err": s["worst_rel_err"], "worst_where": s["worst_where"],
            "worst_margin": s.get("worst_margin"),
            "verdict": s["verdict"], "report": os.path.relpath(path, base),
            "known_issues": s.get("known_issues", 0), "inconclusive": s.get("inconclusive", 0),
            "skipped": r.get("skipped"),
            # a declared known vLLM bug whose signature held (its name), or the stale declaration's message
            "known_vllm_bug": s.get("known_vllm_bug"), "stale_vllm_bug": s.get("stale_vllm_bug"),
            "error": (r.get("error") or "").strip().splitlines()[0] if r.get("error") else None,
        })
    return rows


def to_markdown(rows: list[dict]) -> str:
    head = ("| family | HF architecture | overlay | variant | kernel path | vLLM | transformers | TL | hooks gated / compared "
            "| hooks passed / offered | hook kinds (TL's vLLM overlay: 5) | non-firing "
            "| worst rel err (where; margin = err / tol) | verdict |")
    out = ["# Model-support matrix", "",
           "Generated by `python -m harness matrix` from `reports/*/report*.json`; do not edit. "
           "✅ only where every offered hook was gated (compared and decided); 🟡 partial: some hooks "
           "were not compared (inconclusive in this dtype), counted in *gated / compared*.", "",
           head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "architecture" not in r:
            out.append(f"| {r['model']} | — | — | — | — | — | — | — | — | — | — | — | {r.get('error')} | error |")
            continue
        worst = "—" if r["worst_rel_err"] is None else (
            f"{r['worst_rel_err']:.1e} ({r['worst_where']}; margin {r['worst_margin']:.2f})"
            if r.get("worst_margin") is not None else f"{r['worst_rel_err']:.1e} ({r['worst_where']})")
        verdict = {"pass": "✅ pass", "partial": "🟡 partial", "fail": "❌ fail", "error": "💥 error",
                   "skipped": "⏭ skipped"}[r["verdict"]]
        if r.get("skipped"):
            verdict += f": {r['skipped']}"
        if r.get("known_vllm_bug"):
            verdict += f" — known vLLM bug: {r['known_vllm_bug']} (its signature held in this run; see report)"
        if r.get("stale_vllm_bug"):
            verdict += f" — stale: {r['stale_vllm_bug'][:160]}"
        if r.get("error"):
            verdict += f": {r['error'][:80]}"
        if r.get("inconclusive"):
            verdict += (f" ({r['inconclusive']} rows inconclusive: {r['dtype']} noise above the ceiling, "
                        "or every prompt set aside at an expert-routing near-tie)")
        if r.get("known_issues"):
            verdict += f" ({r['known_issues']} rows explained by a known reference bug, see report)"
        out.append(f"| {r['model']} | `{r['architecture']}` | {r['overlay']} | {r['variant']} "
                   f"| {r.get('kernel_path', 'unknown')} | {r['vllm']} "
                   f"| {r['transformers']} | {r['transformer_lens']} | {r['hooks_gated']} / {r['hooks_compared']} "
                   f"| {r['hooks_passed']} / {r['hooks_offered']} "
                   f"| {r['hook_kinds']} | {r['nonfiring']} | {worst} | {verdict} |")
    return "\n".join(out) + "\n"


_CELL = {"pass": "✅", "partial": "🟡", "fail": "❌", "error": "💥", "skipped": "⏭"}


KINDS = ("dense", "MoE", "MLA", "SSM / hybrid", "encoder", "generic overlay", "refusals")


def kind_of(architecture: str, overlay: str = "") -> str:
    """Which group of :data:`KINDS` an architecture's matrix rows go in, from its overlay row (MLA attention,
    MoE feed-forward, a mixer-only tree, an encoder); ``refusals`` is decided by the runs (:func:`to_grid`)."""
    if overlay.startswith("GenericDecoderOverlay"):
        return "generic overlay"
    from overlays import NoOverlayError, get_overlay, implementations
    from overlays.tree import MLA, MOE

    try:
        ov = get_overlay(architecture, implementations(architecture)[0])
    except (NoOverlayError, ValueError):
        return "dense"
    if getattr(ov, "encoder", None) is not None:
        return "encoder"
    if getattr(ov, "matrix_kind", None) is not None:  # an overlay without a tree says its kind (HRM-Text, Gemma-3n)
        return ov.matrix_kind
    tree = getattr(ov, "tree", None)
    if tree is None or any(getattr(tree, mixer, None) is not None for mixer in ("ssm_mixer", "short_conv", "gdn_mixer")):
        return "SSM / hybrid"  # a mixer-only tree, or a tree with state-space / convolution / linear-attention layers
    if tree.attention.qkv_layout == MLA:
        return "MLA"
    return "MoE" if tree.mlp.kind == MOE else "dense"


def to_grid(rows: list[dict], grouped: bool = True) -> str:
    """Families by variants: verdict, hooks passed / offered, and the inconclusive rows' count; ``grouped``:
    one table per kind (:data:`KINDS`), families whose every run is a declared refusal last."""
    variants = sorted({r["variant"] for r in rows if "variant" in r},
                      key=lambda v: (v.endswith("-tp2"), "compiled" in v, v))
    families = list(dict.fromkeys(r["model"] for r in rows))
    if not grouped:
        return _grid_table(rows, families, variants)
    by_family = {f: [r for r in rows if r["model"] == f] for f in families}
    kind = {f: ("refusals" if all(r.get("verdict") == "skipped" for r in rs) else
                kind_of(rs[0].get("architecture", ""), rs[0].get("overlay") or "")) for f, rs in by_family.items()}
    out = []
    for k in KINDS:
        members = [f for f in families if kind[f] == k]
        if members and k == "refusals":  # one line: every cell would read "⏭ 0/0"
            ran = sorted({r["variant"] for f in members for r in by_family[f]})
            out += [f"**{k}** ({len(members)}; ⏭ in {', '.join(f'`{v}`' for v in ran)}, re-checked every run, vLLM's "
                    f"words in each report): {', '.join(members)}", ""]
        elif members:
            out += [f"**{k}** ({len(members)})", "", _grid_table(rows, members, variants)]
    return "\n".join(out)


def _grid_table(rows: list[dict], families: list[str], variants: list[str]) -> str:
    cell = {(r["model"], r.get("variant")): r for r in rows}
    variants = [v for v in variants if any((f, v) in cell for f in families)]
    out = ["| family | " + " | ".join(f"`{v}`" for v in variants) + " |", "|---|" + "---|" * len(variants)]
    for fam in families:
        cells = []
        for v in variants:
            r = cell.get((fam, v))
            if r is None:
                cells.append("—")
                continue
            c = f"{_CELL[r['verdict']]} {r['hooks_passed']}/{r['hooks_offered']}"
            if r["hooks_gated"] < r["hooks_compared"]:
                c += f" gated {r['hooks_gated']}/{r['hooks_compared']}"
            if r.get("inconclusive"):
                c += f" ({r['inconclusive']} inc.)"
            if r.get("known_vllm_bug"):
                c += " known vLLM bug"
            elif r.get("stale_vllm_bug"):
                c += " stale vLLM-bug declaration"
            cells.append(c)
        out.append(f"| {fam} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def peer_cell(r: dict | None) -> str:
    """One peer's run of one family: verdict, hooks passed / offered (the hooks *that peer* offers) and the vLLM
    line it ran on; a refusal or an error with the first words of its reason."""
    if r is None:
        return "—"
    line = f" on {r['vllm']}" if r.get("vllm") else ""
    if r["verdict"] == "skipped":
        said = (r.get("skipped") or "").split(": ", 1)[-1]
        return f"⏭ refused{line}: {said[:70].rstrip()}…" if len(said) > 70 else f"⏭ refused{line}: {said}"
    c = f"{_CELL[r['verdict']]} {r['hooks_passed']}/{r['hooks_offered']}{line}"
    if r["verdict"] == "error" and r.get("error"):
        words = error_words(r["error"])
        c += f": {words[:70].rstrip()}…" if len(words) > 70 else f": {words}"
    return c


def error_words(error: str) -> str:
    """The innermost exception of an error's first line, from its class name on (``SubjectError: pkg.mod.XError:
    words -- harness... exited 1`` -> ``XError: words``)."""
    import re

    text = error.splitlines()[0].split(" -- ")[0] if error else ""
    found = list(re.finditer(r"\b(\w+(?:Error|Exception)): ", text))
    return text[found[-1].start():] if found else text


def to_peer_grid(rows: list[dict], peers: Sequence[str], compact: bool = False) -> str:
    """Families by peers (``peers``: the subjects' names, a column each; the command line passes ``tl-vllm``,
    TransformerLens's own vLLM backend, and harness.engines.subjects.PEERS, which reporting does not import): each cell the peer's verdict on the hooks it offers, on the vLLM line it ran on (:func:`peer_cell`).
    Only families some peer ran; the default subject's runs are not a peer's and never fill a cell.  ``compact``
    (the README's): a peer per row, its vLLM line(s) in a column, a family per column, cells without words
    (``⏭`` a refusal, ``💥`` an error)."""
    peers = list(peers)
    cell = {(r["model"], r.get("subject")): r for r in rows if r.get("subject") in peers}
    families = list(dict.fromkeys(r["model"] for r in rows if r.get("subject") in peers))
    if compact:
        def short(r: dict | None) -> str:
            if r is None or r["verdict"] in ("skipped", "error"):
                return {None: "—", "skipped": "⏭", "error": "💥"}[None if r is None else r["verdict"]]
            return f"{_CELL[r['verdict']]} {r['hooks_passed']}/{r['hooks_offered']}"
        out = ["| peer | vLLM | " + " | ".join(families) + " |", "|---|---|" + "---|" * len(families)]
        for p in peers:
            lines = sorted({str(r.get("vllm")) for (f, q), r in cell.items() if q == p and r.get("vllm")})
            out.append(f"| `{p}` | {', '.join(lines) or '—'} | "
                       + " | ".join(short(cell.get((f, p))) for f in families) + " |")
        return "\n".join(out) + "\n"
    out = ["| family | " + " | ".join(f"`{p}`" for p in peers) + " |", "|---|" + "---|" * len(peers)]
    out += [f"| {f} | " + " | ".join(peer_cell(cell.get((f, p))) for p in peers) + " |" for f in families]
    return "\n".join(out) + "\n"


def write_matrix(report_dir: Folders, out_dir: Path | None = None) -> tuple[Path, list[dict]]:
    """``support_matrix.{md,json,html}`` in ``out_dir`` (default: the one folder given; required
    with several) from the reports of every folder in ``report_dir``."""
    folders = _folders(report_dir)
    if out_dir is None and len(folders) != 1:
        raise ValueError(f"write_matrix: {len(folders)} report folders need an out_dir for the merged matrix")
    out = Path(out_dir) if out_dir is not None else folders[0]
    out.mkdir(parents=True, exist_ok=True)
    rows = build_matrix(folders, relative_to=out)
    md = out / "support_matrix.md"
    text = to_markdown(rows) + _notes(folders, out)
    md.write_text(text)
    (out / "support_matrix.json").write_text(json.dumps(rows, indent=1))
    write_html(out, rows)
    return md, rows


def _notes(folders: list[Path], out: Path) -> str:
    """What the table does not show: the folders merged, reports left out or replaced."""
    text = ""
    if folders != [out]:
        text += "\nMerged from " + ", ".join(f"`{os.path.relpath(f, out)}`" for f in folders) + ".\n"
    left_out = selection_reports(folders)
    if left_out:
        text += (f"\n{len(left_out)} selective run report(s) (`-k`, some hooks only) left out: "
                 + ", ".join(f"`{os.path.relpath(p, out)}`" for p in left_out) + "\n")
    replaced = full_reports(folders)[1]
    if replaced:
        text += (f"\n{len(replaced)} report(s) replaced by a later folder's report of the same model and variant: "
                 + ", ".join(f"`{os.path.relpath(p, out)}`" for p in replaced) + "\n")
    return text
