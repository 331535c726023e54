"""Graph-safe capture: the CUDA graph itself writes every read into preallocated device buffers.

Contract: under vLLM's default CUDA-graph mode (``FULL_AND_PIECEWISE``) a decode step replays one
full graph that never returns to Python, so a hook whose sink runs Python (the ``vllm_parity::tap``
op of harness.engines.vllm_worker, a piecewise splitting op) records nothing there.  In *graph mode*
(:func:`graph_mode`) every traced hook calls :data:`GRAPH_OP` instead, ``vllm_parity::tap_into(counts,
xs, slot)``, a custom op with ``mutates_args=("counts",)`` and a fake implementation, which is no
splitting op: it is captured inside full and piecewise graphs alike.  Its body runs Python only when
the graph is *captured* or the compiled code runs without a graph; there it copies each read (the
sink's ``copy_`` / ``torch.add(out=)``, :func:`harness.engines.reads.sum_terms`, so the bits are
the eager sink's) into a static buffer owned by (hook slot, read, call of this forward) and adds 1
to ``counts[slot]``.  Every replay repeats those kernels on the replay's inputs.

The host side, per forward (:class:`GraphBuffers`): :meth:`~GraphBuffers.begin` before it (the
model's pre-hook, or the replay wrapper) resets the Python call index; :meth:`~GraphBuffers.drain`
after it (the model's post-hook, or the wrapper around the runner's full-graph replay) reads
``counts`` (one host copy), checks every hook ran as many times as the capture recorded, copies
each buffer's rows into the worker's records, and zeroes ``counts``.  The shape each buffer holds
depends on the forward's padded token count ``T`` only (vLLM captures one graph per ``T``), so the
shapes seen when the body ran for ``T`` (:attr:`GraphBuffers.table`) say how to read a replay of
``T``.

Traps:

- Static addresses: a captured graph holds the buffer's address.  Buffers are allocated the first
  time a (slot, read, call) runs for ``rows`` tokens or fewer, sized for ``rows`` tokens; they may
  grow only before the first capture (:attr:`GraphBuffers.captured`), and a larger value after it
  raises instead of reallocating (a replay would write freed memory).
- ``rows`` (the largest forward a buffer holds): vLLM's memory-profiling forward runs
  ``max_num_batched_tokens`` dummy tokens; the buffers are sized to the harness's forwards
  (``max(max_model_len, largest capture size)``, capped by ``max_num_batched_tokens``), and a
  larger forward writes nothing -- fine while capture is off (boot), an error when it is on.
  Measured on an H200: 444 MiB of buffers for smollm2 in fp32 (every hook of 30 layers, 320 rows),
  4.6 MiB for the synthetic gemma in bf16 (``device_info.engine.graph_buffer_mib`` of each report).
- Shared modules: the n-th call of a hook *in one forward* takes ``keys[n % len(keys)]`` (one
  rotary module serving every layer is called once per layer).
- Hooks outside dynamo's sight (a module called inside another custom op, or the uncompiled top
  module) run Python at capture: while a stream is captured they call the body directly, so the
  graph records their copies too.  Inside a model forward (:meth:`GraphBuffers.begin` ..
  :meth:`~GraphBuffers.drain`: :attr:`GraphBuffers.open`) they call the body too: a module called
  inside a *splitting* op runs eagerly between the pieces of a piecewise replay, while the full graph
  of the same ``T`` recorded its copies at capture, so both paths must count it (Mamba-1's mixer, all
  inside ``vllm::mamba_mixer``, measured on an H200: with the eager sink there, a piecewise forward
  of 8 tokens counted 0 calls of the slots its capture had recorded once).  Outside a forward (the
  logits processor, called after the model) they take the eager sink.
- CPU has no CUDA graphs: graph mode is off there (the eager / compiled sink keeps its bits), and
  ``VLLM_PARITY_CAPTURE=graph`` forces it on only for the unit tests of the op under
  ``torch.compile`` (tests/unit/engines/test_graph_capture.py).
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Optional

import torch

GRAPH_OP = "vllm_parity::tap_into"
ENV = "VLLM_PARITY_CAPTURE"  # "graph" / "sink": force a capture path (default: graph on CUDA with CUDA graphs)
ROWS_ENV = "VLLM_PARITY_GRAPH_ROWS"  # override the buffers' row count
DEFAULT_ROWS = 4096

_GRAPH_SINKS: list[Callable[[list], None]] = []  # slot -> graph sink of one hooked (module, side)


def _tap_into_impl(counts: torch.Tensor, xs: list, slot: int) -> None:
    _GRAPH_SINKS[slot](xs)
    counts.narrow(0, slot, 1).add_(1)


@torch.library.custom_op(GRAPH_OP, mutates_args=("counts",))
def tap_into(counts: torch.Tensor, xs: list[Optional[torch.Tensor]], slot: int) -> None:  # noqa: UP045
    """Copy hook ``slot``'s reads into their static buffers and count the call (graph-safe)."""
    _tap_into_impl(counts, xs, slot)


@tap_into.register_fake
def _tap_into_fake(counts: torch.Tensor, xs: list[Optional[torch.Tensor]], slot: int) -> None:  # noqa: UP045
    return None


def graph_mode(worker) -> bool:
    """Whether this worker records through the graph: ``VLLM_PARITY_CAPTURE`` when set, else on
    CUDA with torch.compile and any CUDA-graph mode (``PIECEWISE``, ``FULL``, ``FULL_AND_PIECEWISE``)."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced in ("graph", "sink"):
        return forced == "graph"
    if not torch.cuda.is_available():
        return False
    try:
        cc = worker.vllm_config.compilation_config
    except AttributeError:
        return False
    mode = str(getattr(cc.cudagraph_mode, "name", cc.cudagraph_mode)).upper()
    comp = str(getattr(cc.mode, "name", cc.mode)).upper()
    return "NONE" not in mode and comp not in ("NONE", "0")


def buffer_rows(worker) -> int:
    """Rows (tokens) every graph buffer holds: ``VLLM_PARITY_GRAPH_ROWS``, else the largest forward
    the harness runs (``max(max_model_len, largest capture size)``), at most ``max_num_batched_tokens``."""
    if os.environ.get(ROWS_ENV):
        return int(os.environ[ROWS_ENV])
    try:
        cfg = worker.vllm_config
        sizes = list(cfg.compilation_config.cudagraph_capture_sizes or [])
        want = max([int(cfg.model_config.max_model_len)] + [int(s) for s in sizes])
        return min(want, int(cfg.scheduler_config.max_num_batched_tokens))
    except (AttributeError, TypeError, ValueError):
        return DEFAULT_ROWS


def tokens_of(args: tuple, kwargs: dict) -> int | None:
    """The forward's (padded) token count from the model's arguments: ``positions`` (last dim:
    M-RoPE is ``[3, T]``), ``input_ids``, ``inputs_embeds``, else the first positional tensor."""
    for name, pos in (("positions", 1), ("input_ids", 0), ("inputs_embeds", 3)):
        t = kwargs.get(name, args[pos] if len(args) > pos else None)
        if torch.is_tensor(t) and t.dim() > 0:
            if name == "positions":
                return int(t.shape[-1])
            return int(t.shape[0])
    first = next((a for a in args if torch.is_tensor(a)), None)
    return int(first.shape[0]) if first is not None and first.dim() > 0 else None


class GraphBuffers:
    """Static buffers of one worker, the per-forward call index and the shape table."""

    def __init__(self, n_slots: int, rows: int, device: torch.device) -> None:
        self.rows = rows
        with torch.inference_mode(False):
            self.counts = torch.zeros(n_slots, dtype=torch.int64, device=device)
        self.calls = [0] * n_slots
        self.tokens: int | None = None  # T of the forward now running (begin)
        self.flat: dict[tuple[int, int, int], torch.Tensor] = {}
        # T -> {(slot, call): [shape or None (not requested) or "over" (T > rows), per read]}
        self.table: dict[int, dict[tuple[int, int], list]] = {}
        self.captured = False
        # inside a model forward (begin .. drain): a Python hook there takes the op's body, not the eager sink
        self.open = False

    def begin(self, tokens: int | None) -> None:
        """A forward of ``tokens`` (padded) tokens starts: reset the call index and the counts (a
        forward nobody drained, e.g. vLLM's own dummy runs, leaves counts behind; inside a full-graph
        capture the zeroing joins the graph)."""
        self.tokens = tokens
        self.calls = [0] * len(self.calls)
        self.counts.zero_()
        self.open = True

    def _view(self, key: tuple[int, int, int], shape: torch.Size, dtype: torch.dtype,
              device: torch.device, tokens: int) -> torch.Tensor:
        numel = math.prod(shape)
        flat = self.flat.get(key)
        if flat is None or flat.numel() < numel or flat.dtype != dtype or flat.device != device:
            if flat is not None and self.captured:
                raise RuntimeError(
                    f"graph-safe capture: read {key} needs {numel} {dtype} elements for {tokens} tokens, its "
                    f"buffer holds {flat.numel()} {flat.dtype} and a captured CUDA graph writes it: cannot grow "
                    f"(set {ROWS_ENV} larger)")
            per_row = numel // tokens if tokens and numel % tokens == 0 else numel
            cap = max(numel, per_row * self.rows)
            with torch.inference_mode(False):  # a normal tensor every later forward may write
                flat = self.flat[key] = torch.empty(cap, dtype=dtype, device=device)
        return flat[:numel].view(shape)

    def write(self, slot: int, plan: tuple, values: list, add: Callable) -> None:
        """The body of :data:`GRAPH_OP` for hook ``slot`` (executed, or recorded into a graph)."""
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            self.captured = True
        tokens = self.tokens if self.tokens is not None else -1
        i = self.calls[slot]
        self.calls[slot] = i + 1
        shapes: list = []
        for r, (keys, lo, hi, read) in enumerate(plan):
            if keys[i % len(keys)] is None:
                shapes.append(None)
                continue
            if tokens > self.rows:
                shapes.append("over")
                continue
            out = add(values[lo:hi], read,
                      lambda shape, dtype, device, _k=(slot, r, i): self._view(_k, shape, dtype, device, tokens))
            shapes.append(tuple(out.shape))
        self.table.setdefault(tokens, {})[(slot, i)] = shapes

    def drain(self, tokens: int | None, plans: list[tuple], record: Callable | None) -> int:
        """After a forward of ``tokens`` tokens: hand each read's rows to ``record(key, value)``
        (None: capture off, only reset); return the number of hook calls read.  Raises when a
        hook ran a different number of times than the graph recorded, or the forward exceeded
        the buffers."""
        self.open = False
        counts = self.counts.tolist()
        self.counts.zero_()
        if record is None:
            return 0
        tokens = tokens if tokens is not None else -1
        entries = self.table.get(tokens, {})
        expected = [0] * len(counts)
        for slot, _ in entries:
            expected[slot] += 1
        if counts != expected:
            bad = {s: (c, e) for s, (c, e) in enumerate(zip(counts, expected)) if c != e}
            raise RuntimeError(f"graph-safe capture, forward of {tokens} tokens: hook slots ran (counted by the "
                               f"graph, expected from its capture) {dict(list(bad.items())[:8])}")
        n = 0
        for (slot, i), shapes in sorted(entries.items()):
            for r, (keys, _lo, _hi, _read) in enumerate(plans[slot]):
                shape = shapes[r]
                if shape is None:
                    continue
                if shape == "over":
                    raise RuntimeError(f"graph-safe capture: a forward of {tokens} tokens is larger than the "
                                       f"buffers' {self.rows} rows (set {ROWS_ENV})")
                numel = math.prod(shape)
                record(keys[i % len(keys)], self.flat[(slot, r, i)][:numel].view(shape))
            n += 1
        return n
