"""The peers'-terms capture-cost benchmark under pytest-benchmark: one run of benchmarks/bench_capture_peers.py
(bare step against our capture of the residual stream, TransformerLens's hook set and every offered hook,
prefill and decode at B = 1, 8, 32, under vLLM's default CUDA graphs; the generate loop's tokens/s; TL's
``boot_vllm`` beside it), its rows, generate rows and target checks in ``extra_info``.

Run on a CUDA host with vLLM (docs/gpu/run_capture_peers.sh runs the script itself)::

    BENCH_PEERS_CHECKPOINT=/tmp/llama3-8b-shaped python -m pytest benchmarks/test_bench_capture_peers.py \\
        --benchmark-json capture-peers.json [BENCH_PEERS_ARGS="--rounds 4"]

Skipped without ``BENCH_PEERS_CHECKPOINT`` or without a CUDA device (the table is about CUDA graphs).
"""
from __future__ import annotations

import os
import shlex

import pytest


def test_capture_cost_on_the_peers_terms(benchmark, tmp_path) -> None:
    ckpt = os.environ.get("BENCH_PEERS_CHECKPOINT")
    if not ckpt:
        pytest.skip("set BENCH_PEERS_CHECKPOINT (an 8B-shaped checkpoint: python -m benchmarks.shaped_checkpoint)")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: the benchmark measures the capture under CUDA graphs")
    from benchmarks import bench_capture_peers as bcp

    argv = ["--checkpoint", ckpt, "--out", str(tmp_path / "capture_peers")] + shlex.split(
        os.environ.get("BENCH_PEERS_ARGS", ""))
    got = {}

    def once() -> None:
        got["res"] = bcp.run(bcp.parse_args(argv))
    benchmark.group = "capture cost on the peers' terms"
    benchmark.pedantic(once, rounds=1, iterations=1)
    res = got["res"]
    benchmark.extra_info.update(rows=res["rows"], generate=res["generate"], checks=res["checks"],
                                errors=res["errors"])
    print(bcp.to_markdown(res))
    assert res["rows"], "no round completed"
