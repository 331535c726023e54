"""Where does a family's vLLM boot or first prompt spend its time?  Boot it in-process and dump every thread's stack.

Usage (a host with vLLM on the path)::

    python scripts/boot_probe.py --model glm_moe_dsa [--dtype bfloat16] [--every 60] [--limit 420]

Builds the family's synthetic checkpoint, boots ``vllm.LLM`` on it in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
eager, no prefix caching), sends one 16-token prompt and prints ``BOOTED <s>`` and ``GENERATED <s>`` as each ends.
Every ``--every`` seconds the stacks of all threads go to stderr (``faulthandler.dump_traceback_later``); at
``--limit`` the process exits, so a hang ends with a stack that says where it is (a JIT build, a kernel, a lock).

Contract: a diagnosis tool, not a test; nothing of the harness's capture is installed (``VLLM_PLUGINS=""`` is set).
Trap: the stacks are Python's only; a hang inside one CUDA call shows as that call's Python frame.
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a family of harness/models/families.py")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--every", type=float, default=60.0, help="seconds between stack dumps")
    ap.add_argument("--limit", type=float, default=420.0, help="seconds before the process exits")
    args = ap.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_PLUGINS"] = ""
    from harness.models.targets import targets_from_options

    target = targets_from_options(args.model, None)[0]
    start = time.monotonic()
    faulthandler.dump_traceback_later(args.every, repeat=True, file=sys.stderr)
    deadline = threading.Timer(args.limit, lambda: (print(f"LIMIT {args.limit:.0f}s", flush=True), os._exit(124)))
    deadline.daemon = True
    deadline.start()
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(target.checkpoint), dtype=args.dtype, max_model_len=256, seed=0, enforce_eager=True,
              gpu_memory_utilization=0.3, enable_prefix_caching=False)
    print(f"BOOTED {time.monotonic() - start:.1f}", flush=True)
    llm.generate([{"prompt_token_ids": list(range(4, 20))}], SamplingParams(max_tokens=2, temperature=0.0))
    print(f"GENERATED {time.monotonic() - start:.1f}", flush=True)
    faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
