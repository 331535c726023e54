"""Graph-safe capture: the CUDA graph itself writes every read into preallocated device buffers.

Contract: under vLLM's default CUDA-graph mode (``FULL_AND_PIECEWISE``) a decode step replays one
full graph that never returns to Python, so a hook whose sink runs Python (the ``vllm_parity::tap``
op of harness.engines.vllm_worker, a piecewise splitting op) records nothing there.  In *graph mode*
(:func:`graph_mode`) every traced hook calls :data:`GRAPH_OP` instead, ``vllm_parity::tap_into(counts,
xs, slot)``, a custom op with ``mutates_args=("counts",)`` and a fake implementation, which is no
splitting op: it is captured inside full and piecewise graphs alike.  Its body runs Python only when
the graph is *captured* or the compiled code runs without a graph; there it enqueues, per read, one
launch of the copy kernel (harness.engines.tap_kernel: the read's terms summed, written where the
kernel's destination table :attr:`GraphBuffers.dests` points *when it runs*; the hook's first kernel
also adds 1 to ``counts[slot]``), or, for a read the kernel does not take (more terms, broadcasting,
no CUDA), the sink's ``copy_`` / ``torch.add(out=)`` (:func:`harness.engines.reads.sum_terms`, so the
bits are the eager sink's) into a static buffer owned by (hook slot, read, call of this forward).
Every replay repeats those kernels on the replay's inputs.

*Direct steps*: a table entry points at the read's static buffer, except during a recorded forward of
a token count whose drain plan is known (:meth:`GraphBuffers.prepare` .. :meth:`~GraphBuffers.drain`):
then it points at the read's place in that step's record tensors, so the replay writes the records
itself and the drain copies nothing the kernel wrote (one copy of the reads per step, not two).

The host side, per forward (:class:`GraphBuffers`): :meth:`~GraphBuffers.begin` before it (the
model's pre-hook, or the replay wrapper) resets the Python call index; :meth:`~GraphBuffers.drain`
after it (the model's post-hook, or the wrapper around the runner's full-graph replay) enqueues the
copy of the forward's rows into record storage and a copy of ``counts`` into the step's snapshot, and
zeroes ``counts``: no host wait, so the step's next kernels are launched while the device still
computes.  When the records are read, :func:`check_steps` reads every pending snapshot at once (one
host copy) and checks every hook ran as many times as the capture recorded (a mismatch raises and
nothing of those steps is recorded).  The shape each buffer holds
depends on the forward's padded token count ``T`` only (vLLM captures one graph per ``T``), so the
shapes seen when the body ran for ``T`` (:attr:`GraphBuffers.table`) say how to read a replay of
``T``.  They are compiled once per ``T`` into a :class:`DrainPlan` (the record key, shape and flat
source view of every (slot, read, call), grouped by dtype, and the expected counts), so a drain does
O(1) Python work whatever the number of reads: per dtype, one ``torch.cat(sources, out=)`` of every
source into one flat record tensor (one batched copy, bitwise: no arithmetic), taken from a pool kept
per (step index since the worker's reset, dtype) and reused after a reset, as the sink's record
buffers are.  The drain returns ``(plan, flats)``; :meth:`DrainPlan.resolve` splits the flats into
the per-key record views later, when the records are read (the worker's ``vp_dump``, a benchmark's
``vp_take``).

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
- Drain plans: a plan holds views of the static buffers and the table's shapes for its ``T``; a
  write that changes the table of ``T`` (a new (slot, call), another shape) drops that plan, and a
  buffer (re)allocation drops every plan (a buffer serves every ``T``).  The count check and the
  "forward larger than the buffers" error stay exact per drain (the plan's expected counts and its
  ``over`` flag), before anything is copied.
- Record storage: the records of one drained step are views into one flat tensor per dtype (non-
  overlapping, contiguous: safetensors saves them), valid until the worker's next reset, when the pool
  tensor of step ``n`` is written again by the next call's step ``n``.
- Destinations: the kernel trusts its table.  An entry's static address is set outside any capture
  (the warm-up forwards before vLLM's captures write every read first; an entry new inside a capture
  raises); a direct step's table is set before the forward and the static one put back after its drain
  and on a reset, so a replay nobody prepared (vLLM's dummy runs) writes static buffers, never records.
  In a direct step a Python body whose read does not match the plan (a new call, another shape) sends
  that read to its static buffer, and the drain sends the kernel's reads back there and drains the step
  as without the kernel.
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

from harness.engines.tap_kernel import ALIGN, kernel_terms

GRAPH_OP = "vllm_parity::tap_into"
ENV = "VLLM_PARITY_CAPTURE"  # "graph" / "sink": force a capture path (default: graph on CUDA with CUDA graphs)
ROWS_ENV = "VLLM_PARITY_GRAPH_ROWS"  # override the buffers' row count
DEFAULT_ROWS = 4096
MIN_ENTRIES, ENTRIES_PER_SLOT = 4096, 16  # the copy kernel's destination table: entries (8 bytes each)

_GRAPH_SINKS: list[Callable[[list, torch.Tensor], None]] = []  # slot -> graph sink of one hooked (module, side)


def _tap_into_impl(counts: torch.Tensor, xs: list, slot: int) -> None:
    _GRAPH_SINKS[slot](xs, counts=counts)  # GraphBuffers.write: copies the reads, counts the call in ``counts``


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


class DrainPlan:
    """How to drain a forward of ``tokens`` (padded) tokens, built once from the table of ``tokens``.

    ``records``: per read, in the old drain order (sorted (slot, call), then read), ``(key, group,
    shape)``; ``groups``: per dtype, ``(dtype, sources, sizes, total)``, the flat source views (prefixes
    of the static buffers) in record order; ``expected``: the calls per slot the capture recorded;
    ``over``: a requested read of a forward larger than the buffers; ``kernel``: per read the copy
    kernel writes, ``(slot, read, call) -> (entry, group, offset, numel, shape, direct)``, where it
    lies in the step's records and whether a direct step aims the kernel there (its place is
    ``tap_kernel.ALIGN``-aligned); ``copied``: ``(group, offset, numel, source)`` of every other read,
    which sits in its static buffer after the forward (a direct step's drain copies those alone)."""

    __slots__ = ("tokens", "records", "groups", "expected", "over", "keys", "kernel", "copied")

    def __init__(self, tokens: int, records: list, groups: list, expected: list, over: bool,
                 kernel: dict | None = None, copied: list | None = None) -> None:
        self.tokens = tokens
        self.records = records
        self.groups = groups
        self.expected = expected
        self.over = over
        self.keys = frozenset(key for key, _, _ in records)
        self.kernel = kernel or {}
        self.copied = copied or []

    def resolve(self, flats: list[torch.Tensor], store: dict[str, list[torch.Tensor]]) -> None:
        """Append this plan's records, read from ``flats`` (one per group, as :meth:`GraphBuffers.drain`
        filled them), to ``store``'s per-key lists, in the order the per-read drain appended them."""
        pieces = [iter(flat.split_with_sizes(sizes)) for flat, (_, _, sizes, _) in zip(flats, self.groups)]
        for key, group, shape in self.records:
            records = store.get(key)
            if records is None:
                records = store[key] = []
            records.append(next(pieces[group]).view(shape))


class DirectStep:
    """A recorded forward whose kernel reads go straight to its records (:meth:`GraphBuffers.prepare`):
    the plan it was aimed by, its step index, the flat record tensors, and the reads sent back to their
    static buffers because they did not match the plan (``redirected``)."""

    __slots__ = ("plan", "n", "flats", "redirected")

    def __init__(self, plan: DrainPlan, n: int, flats: list[torch.Tensor]) -> None:
        self.plan = plan
        self.n = n
        self.flats = flats
        self.redirected: set = set()


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class GraphBuffers:
    """Static buffers of one worker, the per-forward call index, the shape table, its drain plans, the
    record pool, and the copy kernel's destination table."""

    def __init__(self, n_slots: int, rows: int, device: torch.device, launch: Callable | None = None) -> None:
        self.rows = rows
        # harness.engines.tap_kernel.launch, or None: every read is copied by torch into its static buffer
        self.launch = launch
        with torch.inference_mode(False):
            self.counts = torch.zeros(n_slots, dtype=torch.int64, device=device)
            # the kernel's destination address per entry, read when the kernel runs: a static buffer,
            # or during a direct step (prepare .. drain) the read's place in the step's records
            self.dests = torch.zeros(max(MIN_ENTRIES, ENTRIES_PER_SLOT * n_slots), dtype=torch.int64, device=device)
            self.static_dests = torch.zeros_like(self.dests)  # every entry's static buffer
        self.static_host = [0] * self.dests.numel()
        self.static_version = 0  # bumped whenever an entry's static address is set
        self.entries: dict[tuple[int, int, int], int] = {}  # (slot, read, call) -> entry of the kernel's table
        self.direct: DirectStep | None = None
        self.direct_tables: dict[tuple[int, int], tuple] = {}  # (T, step) -> (plan, ptrs, static version, table)
        self.calls = [0] * n_slots
        self.tokens: int | None = None  # T of the forward now running (begin)
        self.flat: dict[tuple[int, int, int], torch.Tensor] = {}
        # T -> {(slot, call): [None (not requested), "over" (T > rows) or (shape, copied by the kernel), per read]}
        self.table: dict[int, dict[tuple[int, int], list]] = {}
        self.plans: dict[int, DrainPlan] = {}  # T -> drain plan of table[T] (dropped when it changes)
        self.pool: dict[tuple[int, torch.dtype], torch.Tensor] = {}  # (step since reset, dtype) -> records
        self.count_pool: dict[int, torch.Tensor] = {}  # step since reset -> its counts, until checked
        self.drained_keys: set[str] = set()  # every record key a drain plan holds
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
            self.plans.clear()  # every plan holding the old buffer (any T) is stale
        return flat[:numel].view(shape)

    def _entry(self, key: tuple[int, int, int], view: torch.Tensor) -> int | None:
        """The kernel's table entry of read ``key``, aimed at its static buffer ``view``; None when the
        table is full (torch copies the read).  Raises inside a stream capture when the entry or its
        buffer is new: its address could not reach the device before a replay (the warm-up forwards
        that precede vLLM's captures make them)."""
        e = self.entries.get(key)
        if e is None:
            if len(self.entries) >= len(self.static_host):
                return None
            e = len(self.entries)
        addr = view.data_ptr()
        if self.static_host[e] != addr:
            if _capturing():
                raise RuntimeError(f"graph-safe capture: read {key} is first written inside a CUDA-graph "
                                   "capture; its copy kernel's destination cannot be set before a replay "
                                   "(run the forward once before capturing it)")
            self.entries[key] = e
            self.static_host[e] = addr
            self.static_version += 1
            self.static_dests[e] = addr
            self.dests[e] = addr
            if self.direct is not None:  # a new buffer in a direct step: this read goes to it, not the records
                self.direct.redirected.add(key)
        return e

    def _aim(self, key: tuple[int, int, int], e: int, shape: tuple) -> None:
        """In a direct step, a read the plan does not hold as written (a new call, another shape) goes
        to its static buffer instead: the drain then copies the whole step as before."""
        d = self.direct
        if d is None or key in d.redirected:
            return
        want = d.plan.kernel.get(key)
        if want is None or want[0] != e or want[4] != shape:
            self.dests[e] = self.static_host[e]
            d.redirected.add(key)

    def write(self, slot: int, plan: tuple, values: list, add: Callable, counts: torch.Tensor | None = None) -> None:
        """The body of :data:`GRAPH_OP` for hook ``slot`` (executed, or recorded into a graph): each
        requested read copied by the kernel (:mod:`harness.engines.tap_kernel`) where it can, else by
        ``add`` into its static buffer, and the call counted in ``counts`` (by the first kernel): the
        op's own argument, which functionalization may hand over as a copy; :attr:`counts` by default."""
        counts = self.counts if counts is None else counts
        if _capturing():
            self.captured = True
        tokens = self.tokens if self.tokens is not None else -1
        i = self.calls[slot]
        self.calls[slot] = i + 1
        shapes: list = []
        counted = False
        for r, (keys, lo, hi, read) in enumerate(plan):
            if keys[i % len(keys)] is None:
                shapes.append(None)
                continue
            if tokens > self.rows:
                shapes.append("over")
                continue
            key = (slot, r, i)
            terms = values[lo:hi]
            found = kernel_terms(terms) if self.launch is not None else None
            if found is not None:
                tensors, rows, cols, strides = found
                first = tensors[0]
                view = self._view(key, first.shape, first.dtype, first.device, tokens)
                e = self._entry(key, view)
                if e is not None:
                    shape = tuple(view.shape)
                    self._aim(key, e, shape)
                    self.launch(self.dests, e, counts, -1 if counted else slot, tensors, rows, cols, strides)
                    counted = True
                    shapes.append((shape, True))
                    continue
            out = add(terms, read, lambda shape, dtype, device, _k=key: self._view(_k, shape, dtype, device, tokens))
            shapes.append((tuple(out.shape), False))
        if not counted:
            counts.narrow(0, slot, 1).add_(1)
        entries = self.table.setdefault(tokens, {})
        if entries.get((slot, i)) != shapes:
            entries[(slot, i)] = shapes
            self.plans.pop(tokens, None)

    def plan(self, tokens: int, plans: list[tuple]) -> DrainPlan:
        """The drain plan of a forward of ``tokens`` tokens (built from :attr:`table` on first use)."""
        got = self.plans.get(tokens)
        if got is not None:
            return got
        entries = self.table.get(tokens, {})
        expected = [0] * self.counts.numel()
        records: list = []
        groups: list = []  # [dtype, sources, sizes, total]
        index: dict[torch.dtype, int] = {}
        kernel: dict = {}
        copied: list = []
        over = False
        for (slot, i), shapes in sorted(entries.items()):
            expected[slot] += 1
            for r, (keys, _lo, _hi, _read) in enumerate(plans[slot]):
                entry = shapes[r]
                if entry is None:
                    continue
                if entry == "over":
                    over = True
                    continue
                shape, by_kernel = entry
                numel = math.prod(shape)
                src = self.flat[(slot, r, i)][:numel]
                g = index.get(src.dtype)
                if g is None:
                    g = index[src.dtype] = len(groups)
                    groups.append([src.dtype, [], [], 0])
                offset = groups[g][3]
                groups[g][1].append(src)
                groups[g][2].append(numel)
                groups[g][3] += numel
                records.append((keys[i % len(keys)], g, shape))
                direct = by_kernel and offset * src.element_size() % ALIGN == 0
                if by_kernel:
                    kernel[(slot, r, i)] = (self.entries[(slot, r, i)], g, offset, numel, shape, direct)
                if not direct:
                    copied.append((g, offset, numel, src))
        got = self.plans[tokens] = DrainPlan(tokens, records, [tuple(g) for g in groups], expected, over,
                                             kernel, copied)
        self.drained_keys.update(got.keys)
        return got

    def record_flat(self, n: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """The flat record tensor of step ``n`` (since the worker's reset) for ``dtype``: ``numel``
        elements of the pool's tensor, which grows (a new tensor) when too small."""
        flat = self.pool.get((n, dtype))
        if flat is None or flat.numel() < numel:
            with torch.inference_mode(False):  # a normal tensor: forwards in or out of inference mode may write it
                flat = self.pool[(n, dtype)] = torch.empty(numel, dtype=dtype, device=self.counts.device)
        return flat if flat.numel() == numel else flat[:numel]

    def count_snapshot(self, n: int) -> torch.Tensor:
        """The device tensor that keeps step ``n``'s counts until the records are read (a pool like
        :meth:`record_flat`'s, reused after a reset)."""
        snap = self.count_pool.get(n)
        if snap is None or snap.numel() != self.counts.numel():
            with torch.inference_mode(False):
                snap = self.count_pool[n] = torch.empty_like(self.counts)
        return snap

    def prepare(self, tokens: int | None, plans: list[tuple], n: int) -> None:
        """Before a recorded forward (step ``n`` since the reset) of ``tokens`` tokens: when the plan of
        ``tokens`` is known and the kernel copies some of its reads, aim the kernel at step ``n``'s
        record tensors (one copy of the destination table), so its drain copies nothing the kernel
        wrote.  Not inside a stream capture (a capture is no forward)."""
        if self.launch is None or tokens is None or _capturing():
            return
        d = self.direct
        if d is not None and d.plan.tokens == tokens and d.n == n:
            return
        self.release()
        if tokens not in self.table:
            return
        plan = self.plan(tokens, plans)
        if plan.over or not any(k[5] for k in plan.kernel.values()):
            return
        flats = [self.record_flat(n, dtype, total) for dtype, _sources, _sizes, total in plan.groups]
        self.dests.copy_(self._direct_table(plan, n, flats))
        self.direct = DirectStep(plan, n, flats)

    def _direct_table(self, plan: DrainPlan, n: int, flats: list[torch.Tensor]) -> torch.Tensor:
        """The destination table of step ``n`` under ``plan``: the static buffers, the kernel's reads at
        their place in ``flats``; kept per (T, step) while the plan, the record tensors and the static
        buffers stay."""
        ptrs = tuple(f.data_ptr() for f in flats)
        got = self.direct_tables.get((plan.tokens, n))
        if got is not None and got[0] is plan and got[1] == ptrs and got[2] == self.static_version:
            return got[3]
        addrs = list(self.static_host)
        for e, g, offset, _numel, _shape, direct in plan.kernel.values():
            if direct:
                addrs[e] = ptrs[g] + offset * flats[g].element_size()
        with torch.inference_mode(False):
            table = torch.tensor(addrs, dtype=torch.int64).to(self.dests.device)
        self.direct_tables[(plan.tokens, n)] = (plan, ptrs, self.static_version, table)
        return table

    def release(self) -> None:
        """End a direct step: the kernel's destinations back to the static buffers (a replay nobody
        prepared, e.g. one of vLLM's dummy runs, must not write a step's records)."""
        if self.direct is not None:
            self.dests.copy_(self.static_dests)
            self.direct = None

    def drain(self, tokens: int | None, plans: list[tuple], n: int | None,
              copy: bool = True, wait_first: bool = False) -> Optional["DrainedStep"]:
        """After a forward of ``tokens`` tokens: the step's records and the counts' snapshot, as a
        :class:`DrainedStep` (``n`` None: capture off, only reset; None).  A direct step
        (:meth:`prepare`) already holds the kernel's reads in its record tensors: only torch's reads are
        copied there.  Otherwise every read's rows are copied into the flat record tensors of step ``n``
        (:meth:`record_flat`, one batched copy per dtype); a direct step whose plan changed while it ran
        first sends the kernel's reads back to their static buffers.  Raises at once when the forward
        exceeded the buffers (the host knows that); a hook that ran a different number of times than
        the graph recorded raises when the step is checked (:func:`check_steps`, before any of its
        records is read).  ``copy=False`` (graph_anatomy's bookkeeping) does everything but the copy.

        No host wait (off the step's critical path): the plan, the "over" check and the record tensors
        are host work, the copies and the counts' snapshot are *enqueued*, so the Python runs while the
        device still computes and vLLM launches its next kernels without a gap.  ``wait_first`` (the
        benchmark's comparison with the drain before 2026-12-03): read the counts and check them first,
        then copy."""
        self.open = False
        d = self.direct
        self.release()
        if n is None:
            self.counts.zero_()
            return None
        tokens = tokens if tokens is not None else -1
        plan = self.plan(tokens, plans)
        if wait_first:
            counts = self.counts.tolist()
            if counts != plan.expected:
                self.counts.zero_()
                raise RuntimeError(_mismatch(tokens, counts, plan.expected))
        if plan.over:
            self.counts.zero_()
            raise RuntimeError(f"graph-safe capture: a forward of {tokens} tokens is larger than the "
                               f"buffers' {self.rows} rows (set {ROWS_ENV})")
        if d is not None and d.plan is plan and d.n == n and not d.redirected:
            flats = d.flats
            if plan.copied:
                torch._foreach_copy_([flats[g][o:o + k] for g, o, k, _src in plan.copied],
                                     [src for _g, _o, _k, src in plan.copied])
        else:
            if d is not None:
                self._send_back(d)
            flats = []
            for dtype, sources, _sizes, total in plan.groups:
                flat = self.record_flat(n, dtype, total)
                if copy:
                    torch.cat(sources, out=flat)  # one batched copy of every source, in record order
                flats.append(flat)
        if wait_first:
            snap = None  # checked above
        else:
            snap = self.count_snapshot(n)
            snap.copy_(self.counts)
        self.counts.zero_()
        return DrainedStep(plan, flats, snap)

    def _send_back(self, d: DirectStep) -> None:
        """The kernel's reads a direct step wrote into its records, back into their static buffers (the
        plan changed while it ran: the step is drained from the buffers, as without the kernel)."""
        for key, (_e, g, offset, numel, _shape, direct) in d.plan.kernel.items():
            if direct and key not in d.redirected:
                self.flat[key][:numel].copy_(d.flats[g][offset:offset + numel])


class DrainedStep:
    """One drained forward: its :class:`DrainPlan`, the flat record tensors its copy fills, and the
    device snapshot of its counts (None once checked)."""

    __slots__ = ("plan", "flats", "counts")

    def __init__(self, plan: DrainPlan, flats: list[torch.Tensor], counts: torch.Tensor | None) -> None:
        self.plan = plan
        self.flats = flats
        self.counts = counts


def _mismatch(tokens: int, counts: list[int], expected: list[int], step: str = "") -> str:
    bad = {s: (c, e) for s, (c, e) in enumerate(zip(counts, expected)) if c != e}
    return (f"graph-safe capture, {step}forward of {tokens} tokens: hook slots ran (counted by the "
            f"graph, expected from its capture) {dict(list(bad.items())[:8])}")


def check_steps(steps: list[DrainedStep]) -> None:
    """Check every step's counts against its plan, with one host read for all of them; raise on the first
    step where a hook ran a different number of times than the graph recorded (the caller then records
    none of ``steps``)."""
    snaps = [s.counts for s in steps if s.counts is not None]
    if not snaps:
        return
    rows = iter(torch.stack(snaps).tolist())
    for i, step in enumerate(steps):
        if step.counts is None:
            continue
        counts = next(rows)
        if counts != step.plan.expected:
            raise RuntimeError(_mismatch(step.plan.tokens, counts, step.plan.expected, f"pending step {i}, "))
        step.counts = None
