"""Reference engines: TransformerLens's TransformerBridge (canonical names),
its compatibility mode (HookedTransformer names), and plain HF transformers
(log-probs).  All in fp32/fp64 on CPU or the run's device, in this process.

Contract: :func:`capture_references` returns a :class:`ReferenceCapture` with
``bridge[prompt][hook]`` and ``compat[prompt][legacy_name]`` tensors with the
batch dim removed (see :mod:`harness.shapes`), ``logprobs[prompt]`` as an fp64
``[T, V]`` log-softmax of HF's logits, versions and timings.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .shapes import reference_to_canonical
from .timing import profile_call

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ReferenceCapture:
    bridge: dict[int, dict[str, torch.Tensor]]
    compat: dict[int, dict[str, torch.Tensor]]
    logprobs: dict[int, torch.Tensor]
    meta: dict = field(default_factory=dict)


def _boot_bridge(checkpoint: Path, dtype: torch.dtype, device: str):
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(str(checkpoint), device=device, dtype=dtype)


def _run_cache(bridge, tokens: list[int], names: set[str], device: str) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        _, cache = bridge.run_with_cache(torch.tensor([tokens], device=device),
                                         names_filter=lambda n: n in names)
    return {n: reference_to_canonical(n, cache[n]) for n in names if n in cache}


def capture_references(checkpoint: Path, *, dtype: str, prompts: list[list[int]], hooks: list[str],
                       compat_names: list[str], device: str = "cpu", timing_repeats: int = 5
                       ) -> ReferenceCapture:
    from transformers import AutoModelForCausalLM

    tdtype = _DTYPES[dtype]
    meta: dict = {}
    t = time.perf_counter()
    bridge = _boot_bridge(checkpoint, tdtype, device)
    meta["bridge_boot_s"] = time.perf_counter() - t
    want = set(hooks)
    bridge_caps = {p: _run_cache(bridge, toks, want, device) for p, toks in enumerate(prompts)}
    meta["bridge_missing"] = sorted(want - set(bridge_caps[0])) if prompts else []
    del bridge

    compat = _boot_bridge(checkpoint, tdtype, device)
    compat.enable_compatibility_mode(no_processing=True)
    legacy = set(compat_names)
    compat_caps = {p: _run_cache(compat, toks, legacy, device) for p, toks in enumerate(prompts)}
    meta["compat_missing"] = sorted(legacy - set(compat_caps[0])) if prompts else []
    del compat

    hf = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=tdtype).to(device).eval()
    logprobs = {}
    with torch.no_grad():
        for p, toks in enumerate(prompts):
            logits = hf(torch.tensor([toks], device=device)).logits[0]
            logprobs[p] = torch.log_softmax(logits.double(), dim=-1).cpu()
        ids = torch.tensor([prompts[0]], device=device)
        hf(ids)  # warm-up
        times = []
        for _ in range(timing_repeats):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            hf(ids)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        meta["forward_ms_median"] = statistics.median(times) * 1e3
        meta["forward_ms_all"] = [x * 1e3 for x in times]
        meta["top_ops"] = profile_call(lambda: hf(ids))
    return ReferenceCapture(bridge_caps, compat_caps, logprobs, meta)
