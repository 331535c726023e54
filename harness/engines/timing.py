"""Kernel timings: turn a finished torch.profiler session into plain rows.

Contract: :func:`top_ops(prof, n)` returns the ``n`` operators with the most
self time (device time where a GPU ran, else CPU), each as a dict of plain
numbers in microseconds, ready for JSON.  :func:`profile_call` profiles one
call of a function in this process (used for the reference engine; the vLLM
subject profiles inside its worker through ``CaptureExtension.vp_profile``).
"""
from __future__ import annotations

from typing import Any, Callable


def top_ops(prof: Any, n: int = 15) -> list[dict]:
    rows = []
    for evt in prof.key_averages():
        device_us = float(getattr(evt, "self_device_time_total", 0.0) or 0.0)
        rows.append({
            "op": evt.key,
            "calls": int(evt.count),
            "self_cpu_us": float(evt.self_cpu_time_total),
            "self_device_us": device_us,
        })
    key = "self_device_us" if any(r["self_device_us"] > 0 for r in rows) else "self_cpu_us"
    rows.sort(key=lambda r: r[key], reverse=True)
    return rows[:n]


def profile_call(fn: Callable[[], Any], n: int = 15) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        fn()
    return top_ops(prof, n)

