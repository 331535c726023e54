"""vLLM worker extension that records hook reads (mixed into vLLM's Worker).

Contract: vLLM mixes :class:`CaptureExtension` into its worker class through
``LLM(worker_extension_cls="harness.engines.vllm_worker.CaptureExtension")``
(harness.engines.boot.CAPTURE_EXTENSION); the driver calls the ``vp_*`` methods by
name with ``llm.collective_rpc``, so no insecure serialization is needed.  This
class captures and nothing else: the benchmarks' probes of the capture (copy
floor, record stats, the graph path's drain anatomy, uninstalling the hooks) are
a mixin of their own, harness.engines.bench_probes, that only benchmarks load.
Files, not tensors, cross the RPC boundary: ``vp_dump(path)`` writes a
safetensors file per rank, which works the same for the in-process executor and
for multi-process / tensor-parallel workers.

Reads follow ``overlays.base.READ_GRAMMAR``, evaluated by harness.engines.reads (which module, which
argument or output element, how terms sum); this module is the worker side: the hooks, the tap ops,
the sinks and their buffers, the ``vp_*`` entry points.  The capture path, per forward:

* **One hook per module and side.**  Every read of a module's outputs is taken
  by one forward hook, every read of its inputs by one forward pre-hook, however
  many reads there are (one shared rotary module serving q and k on every layer
  is one hook).  Everything knowable before the first forward -- which argument
  or output element each term is, parameter positions, the read key of every
  call of a shared module and whether it was requested, tensor-parallel layouts
  -- is settled in :meth:`CaptureExtension.vp_install`; a call only picks its
  terms out of ``args``/``output`` and hands them, uncopied, to its *sink*.
* **One copy.**  The sink writes each read into a buffer in one pass
  (``copy_`` for one term, ``torch.add(..., out=)`` for a sum, left to right, so
  the bits are those of ``a.clone() + b``), before the module's caller runs
  another kernel.  Buffers are kept per (read key, call) and reused by every
  forward after :meth:`~CaptureExtension.vp_reset`: the steady state allocates
  nothing and faults in no fresh pages.  A record is therefore valid until the
  next reset; :meth:`~CaptureExtension.vp_dump` writes records as they are.

Traps:

- In-place kernels: vLLM's fused add-norm kernels update ``(x, residual)`` in
  place, and its rotary embedding rotates q and k inside the qkv output, so a
  read is copied inside the hook's own call, never later and never by keeping a
  reference (tests/unit/engines/test_vllm_worker.py plants such a kernel).
- torch.compile traces the hooks (installed before compilation, see
  harness.engines.vllm_plugin).  While tracing (``torch.compiler.is_compiling()``)
  a hook hands its terms to one custom op, ``vllm_parity::tap(xs, slot)``, which
  stays in the graph as an ordered side effect and whose Python body calls the
  sink at run time; its inputs may be buffers inductor reuses for later kernels,
  which the copy covers too.  A hook keeps no Python state: a dict filled while
  dynamo traces is replayed as ``dict.update``, which vLLM refuses under CUDA
  graphs, and dynamo cannot trace ``inspect`` -- so parameter positions are
  read at install.  In eager mode the hook calls the sink directly: the op's
  dispatcher round trip would cost every hook every forward and buy nothing.
- CUDA graphs, *sink* path (CPU; CUDA with ``VLLM_PARITY_CAPTURE=sink``): with
  piecewise graphs vLLM splits the graph at the op
  (harness.engines.vllm_compat.add_splitting_op), so it runs eagerly between
  replays and copies *this* replay's values out of the graph's static buffers.
  Inside a stream capture (full CUDA graphs, or an eager model being captured)
  the sink records nothing: only replays count, and a full-graph replay has none.
- CUDA graphs, *graph* path (the default on CUDA with torch.compile and CUDA
  graphs, vLLM's ``FULL_AND_PIECEWISE`` included): traced hooks call
  ``vllm_parity::tap_into`` instead (harness.engines.graph_capture), which is no
  splitting op; the graph itself copies every read (harness.engines.tap_kernel:
  one kernel per read, where a device table points) into static device buffers,
  or, in a recorded forward whose token count the capture knows, straight into
  that step's records (GraphBuffers.prepare, before the model's forward or the
  runner's replay), and the worker drains them after each forward -- after the model's own
  forward hook, or after the runner's full-graph replay
  (harness.engines.vllm_compat.wrap_forward_calls), where no hook runs.  The
  drain is O(1) Python per forward (one batched copy per dtype into one flat
  tensor, GraphBuffers.drain), off the step's critical path (the forward timers
  are CUDA events, not synchronizations, and the drain enqueues its copies
  without a host wait), and leaves a DrainedStep pending; the pending steps'
  counts are checked and they become the per-key record lists, in step order,
  when the records are read (``_vp_records``: vp_dump, and the benchmarks'
  vp_take / vp_take_record_stats).  A sink
  record of a key a drain plan also holds (none in vLLM's layout: a module runs
  inside or outside the forward) resolves the pending steps first, so each
  key's list stays in call order.
- Shared modules: vLLM shares one rotary embedding across layers; its n-th call
  in a forward belongs to the n-th layer path that resolves to it (natural
  order), requested or not, so a selection of layer L alone does not take layer
  0's call.  The call counter and the on/off switch live in the sink, at run
  time, so they hold in compiled mode too.
- Buffers: allocated outside inference mode, so any later forward may write
  them.  The sink path keeps one per (read key, call); the graph path one flat
  tensor per (drained step since the reset, dtype), whose records are
  non-overlapping contiguous views: safetensors refuses overlapping storage
  only, so both dump as they are.

vLLM internals (the model inside the runner, the batch layout, how a module
is sharded across tensor-parallel ranks) are reached through
:mod:`harness.engines.vllm_compat` only.
"""
from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any, Optional

import torch

from harness.vocab.capture_keys import call_key, read_key
from harness.engines.tensor_parallel import in_parallel_region, tp_layout
from harness.engines import graph_capture, route_tap, tap_kernel
from harness.engines.reads import (group_reads, input_terms, natural_key, parse_read, pick_inputs, pick_outputs,
                                   resolve_module, sibling_paths, sum_terms)
from harness.engines.graph_capture import (GraphBuffers, _tap_into_impl, buffer_rows, check_steps, graph_mode,
                                          tokens_of)
from harness.engines.vllm_compat import (CAPTURE_OP, batch_layout, engine_info, hookable_call, kernel_path,
                                         replay_inputs, runner_model, track_batch_requests, wrap_forward_calls)

_SINKS: list[Callable[[list], None]] = []  # slot -> sink of one hooked (module, side) of this process
_CUDA = False  # set by vp_install: no torch.cuda query before the worker has chosen its device


def _capturing() -> bool:
    return _CUDA and torch.cuda.is_current_stream_capturing()


def _mark() -> torch.cuda.Event:
    """A timing event on the current stream: the graph path's forward timer, which does not make the host
    wait for the device (:meth:`CaptureExtension._vp_times` reads the pairs later)."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


@torch.library.custom_op(CAPTURE_OP, mutates_args=())
def tap(xs: list[Optional[torch.Tensor]], slot: int) -> None:  # noqa: UP045 -- torch's schema inference
    """Hand the terms of hook ``slot`` to its sink (compiled graphs only; eager hooks call the sink)."""
    _SINKS[slot](xs)


@tap.register_fake
def _tap_fake(xs: list[Optional[torch.Tensor]], slot: int) -> None:  # noqa: UP045
    return None


def _mark_side_effects(op) -> None:
    """Neither dynamo nor inductor may drop or reorder the op: it returns nothing."""
    from torch.fx.node import has_side_effect

    has_side_effect(op)
    try:
        from torch._higher_order_ops.effects import _EffectType, _register_effectful_op

        _register_effectful_op(op, _EffectType.ORDERED)
    except (ImportError, AttributeError, TypeError, RuntimeError):  # older/newer torch: side effect only
        pass


_mark_side_effects(torch.ops.vllm_parity.tap.default)


class _Buffers:
    """One buffer per (read key, call), reused by every forward after a reset."""

    def __init__(self) -> None:
        self._flat: dict[tuple[str, int], torch.Tensor] = {}
        self._views: dict[tuple[str, int], torch.Tensor] = {}

    def take(self, slot: tuple[str, int], shape: torch.Size, dtype: torch.dtype,
             device: torch.device) -> torch.Tensor:
        view = self._views.get(slot)
        if view is not None and view.shape == shape and view.dtype == dtype and view.device == device:
            return view
        numel = math.prod(shape)
        flat = self._flat.get(slot)
        if flat is None or flat.numel() < numel or flat.dtype != dtype or flat.device != device:
            with torch.inference_mode(False):  # a normal tensor: forwards in or out of inference mode may write it
                flat = self._flat[slot] = torch.empty(numel, dtype=dtype, device=device)
        view = self._views[slot] = flat[:numel].view(shape)
        return view


def _deliver(values: list, slot: int, sink: Callable[[list], None]) -> None:
    if torch.compiler.is_compiling():
        torch.ops.vllm_parity.tap(values, slot)  # traced: the op's body calls the sink at run time
    else:
        sink(values)


def _deliver_graph(values: list, slot: int, sink: Callable[[list], None], graph: GraphBuffers) -> None:
    """Graph path (harness.engines.graph_capture): traced -> the graph-safe op; a Python hook while a
    stream is captured, or inside a model forward (a module inside a splitting op runs eagerly between
    piecewise graphs) -> the op's body directly (its copies join the graph, or the forward's drain);
    otherwise (outside any forward: the logits processor) the eager sink."""
    if torch.compiler.is_compiling():
        torch.ops.vllm_parity.tap_into(graph.counts, values, slot)
    elif _capturing() or graph.open:
        _tap_into_impl(graph.counts, values, slot)
    else:
        sink(values)


def _pre_hook(terms: tuple, slot: int, sink: Callable[[list], None], graph: GraphBuffers | None = None) -> Callable:
    if graph is not None:
        def pre_graph(mod, args, kwargs):
            _deliver_graph(pick_inputs(args, kwargs, terms), slot, sink, graph)
        return pre_graph

    def pre(mod, args, kwargs):
        _deliver(pick_inputs(args, kwargs, terms), slot, sink)
    return pre


def _post_hook(indices: tuple, slot: int, sink: Callable[[list], None], graph: GraphBuffers | None = None) -> Callable:
    if graph is not None:
        def post_graph(mod, args, output):
            _deliver_graph(pick_outputs(output, indices), slot, sink, graph)
        return post_graph

    def post(mod, args, output):
        _deliver(pick_outputs(output, indices), slot, sink)
    return post


class CaptureExtension:
    """Mixed into vLLM's Worker; every method is prefixed ``vp_``."""

    model_runner: Any

    def _vp_model(self) -> torch.nn.Module:
        return runner_model(self)

    def vp_install(self, reads: list[list[str]], enabled: bool = True) -> list[str]:
        """Install one hook per hooked (module, side) for the ``[module path, read]`` pairs;
        return the module paths not found.  ``enabled``: record from now on (False: only after
        :meth:`vp_set_enabled`; the pre-compile install of harness.engines.vllm_plugin, so the
        engine's boot forwards are not recorded)."""
        global _CUDA
        _CUDA = torch.cuda.is_available()
        model = self._vp_model()
        hookable_call(model)  # a top-level class vLLM's support_torch_compile decorates (Ernie-4.5) calls no hook
        self._vp_records = {}  # also the graph path's pending drained steps and step index (the setter)
        self._vp_buffers = _Buffers()
        self._vp_handles = getattr(self, "_vp_handles", [])
        self._vp_forward_s: list = []  # seconds, or (start, end) CUDA events on the graph path (_vp_times)
        self._vp_wait = False  # graph path: the old synchronized timers and drain (bench_probes.vp_set_drain)
        self._vp_enabled = enabled
        self._vp_positions = False
        self._vp_counters: list[list[int]] = []
        self._vp_batches: list[dict] = []
        self._vp_layouts: dict[str, dict] = {}  # raw key -> tensor-parallel layout (vllm_compat.tp_layout)
        tp = int(getattr(getattr(self, "parallel_config", None), "tensor_parallel_size", 1) or 1)
        self._vp_plans: list[tuple] = []
        self._vp_ran = False
        self._vp_replays = 0  # forwards that were full-graph replays (graph path), since the last reset
        _SINKS.clear()
        graph_capture._GRAPH_SINKS.clear()
        route_tap.install_for(model, [path for path, _ in reads])  # harness.engines.route_tap: only where read
        groups, missing = group_reads(model, reads)
        self._vp_graph: GraphBuffers | None = None
        if graph_mode(self):
            device = next((p.device for p in model.parameters()), torch.device("cuda" if _CUDA else "cpu"))
            self._vp_graph = GraphBuffers(len(groups), buffer_rows(self), device, launch=tap_kernel.launcher(device))
        for module, side, paths_by_read in groups.values():
            self._vp_hook(model, module, side, paths_by_read, tp)
        self._vp_timers(model)
        track_batch_requests(self.model_runner)
        if self._vp_graph is not None:
            self._vp_graph_wraps = wrap_forward_calls(self.model_runner, self._vp_around)
        return missing

    def _vp_hook(self, model: torch.nn.Module, module: torch.nn.Module, side: str,
                 paths_by_read: dict[str, list[str]], tp: int) -> None:
        """One hook for every read of ``module``'s ``side``; its sink records them."""
        plan, terms = [], []  # plan: per read, (key of call n % len, or None if unrequested), term span, read
        for read, paths in paths_by_read.items():
            parent_path = paths[0].rpartition(".")[0]
            parent = resolve_module(model, parent_path) if parent_path else model
            layout = tp_layout(module, side, tp, in_parallel_region(parent))
            wanted = {read_key(p, read) for p in paths}
            # every path the shared module answers to, requested or not: a selection of layer L alone
            # must not take layer 0's call (the n-th call belongs to the n-th sibling, not the n-th request)
            keys = [read_key(p, read) for p in sorted(sibling_paths(model, module, paths), key=natural_key)]
            self._vp_layouts.update({k: layout for k in keys if k in wanted})
            read_terms = parse_read(read)[1]
            plan.append((tuple(k if k in wanted else None for k in keys), len(terms),
                         len(terms) + len(read_terms), read))
            terms.extend(read_terms)
        counter = [0]
        self._vp_counters.append(counter)
        sink = self._vp_sink(tuple(plan), counter)
        slot = len(_SINKS)
        _SINKS.append(sink)
        self._vp_plans.append(tuple(plan))
        graph = self._vp_graph
        if graph is not None:
            graph_capture._GRAPH_SINKS.append(
                functools.partial(graph.write, slot, tuple(plan), add=sum_terms))
        if side == "in":
            hook = _pre_hook(input_terms(module, terms), slot, sink, graph)
            self._vp_handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        else:
            hook = _post_hook(tuple(index for index, _ in terms), slot, sink, graph)
            self._vp_handles.append(module.register_forward_hook(hook))

    def _vp_sink(self, plan: tuple, counter: list[int]) -> Callable[[list], None]:
        """Records the reads of one hook call: runs eagerly (the hook, or the op's body)."""
        def sink(values: list) -> None:
            if not self._vp_enabled or _capturing():
                return
            n = counter[0]
            counter[0] = n + 1
            for keys, lo, hi, read in plan:
                key = keys[n % len(keys)]
                if key is not None:
                    self._vp_record(key, values[lo:hi], read)
        return sink

    @property
    def _vp_records(self) -> dict[str, list[torch.Tensor]]:
        """Read key -> its records since the last reset, in call order; the graph path's pending drained
        steps are resolved into it first (AttributeError before :meth:`vp_install`)."""
        if self._vp_pending:
            self._vp_resolve()
        return self._vp_store

    @_vp_records.setter
    def _vp_records(self, value: dict[str, list[torch.Tensor]]) -> None:
        """New records (a reset: ``{}``); the pending drained steps are dropped, the step index restarts."""
        self._vp_store = value
        self._vp_pending: list = []  # graph path: graph_capture.DrainedStep per drained step, in step order
        self._vp_steps = 0  # graph path: steps drained since the reset (the record pool's index)

    def _vp_resolve(self) -> None:
        """Graph path: the pending drained steps into the per-key record lists, in step order, once their
        counts are checked (graph_capture.check_steps: a mismatch raises and records none of them)."""
        pending, self._vp_pending = self._vp_pending, []
        check_steps(pending)
        for step in pending:
            step.plan.resolve(step.flats, self._vp_store)

    def _vp_record(self, key: str, values: list, read: str) -> None:
        if self._vp_pending and key in self._vp_graph.drained_keys:
            self._vp_resolve()  # the drained calls of this key come first
        records = self._vp_store.get(key)
        if records is None:
            records = self._vp_store[key] = []
        # a copy now: fused kernels update inputs in place, CUDA-graph replays overwrite static buffers
        records.append(sum_terms(values, read, functools.partial(self._vp_buffers.take, (key, len(records)))))

    def _vp_drain(self, tokens: int | None) -> None:
        """Graph path: this forward's reads out of the graph buffers (harness.engines.graph_capture): one
        batched copy per dtype; the step is resolved into the records when they are read."""
        step = self._vp_graph.drain(tokens, self._vp_plans, self._vp_steps if self._vp_enabled else None,
                                    **({"wait_first": True} if self._vp_wait else {}))
        if step is not None:
            self._vp_pending.append(step)
            self._vp_steps += 1

    def _vp_around(self, original: Callable, args: tuple, kwargs: dict, kind: str) -> Any:
        """Graph path: around the runner's forward call (V1 ``_model_forward``, V2 ``run_fullgraph``).
        A full-graph replay calls no hook: its time, batch layout and drain are taken here."""
        if _capturing():
            return original(*args, **kwargs)
        self._vp_ran = False
        self._vp_graph.counts.zero_()
        tokens, positions, input_ids, layout = replay_inputs(self.model_runner, kind, args, kwargs)
        if self._vp_enabled and not self._vp_wait:  # a replay writes the kernel's reads into this step's records
            self._vp_graph.prepare(tokens, self._vp_plans, self._vp_steps)
        events = _CUDA and not self._vp_wait  # no host wait before the drain's own (graph_capture.drain)
        if events:
            t = _mark()
        else:
            if _CUDA:
                torch.cuda.synchronize()
            t = time.perf_counter()
        out = original(*args, **kwargs)
        if self._vp_ran:  # the model's forward ran (eagerly or piecewise): its hooks did the rest
            return out
        if events:
            self._vp_forward_s.append((t, _mark()))
        else:
            if _CUDA:
                torch.cuda.synchronize()
            self._vp_forward_s.append(time.perf_counter() - t)
        self._vp_replays += 1
        if self._vp_enabled:
            if not self._vp_positions:
                positions = input_ids = None
            self._vp_batches.append(batch_layout(self.model_runner, positions, input_ids, layout))
        self._vp_drain(tokens)
        return out

    def _vp_timers(self, model: torch.nn.Module) -> None:
        """Forward latency: wall time of the model's own forward (no scheduling, no sampling).
        Not inside a CUDA-graph capture: no synchronize there, and a capture is no forward.  On the
        graph path on CUDA the device's own time between two events instead (no host wait: the drain's
        Python runs while the device computes; :meth:`_vp_times`)."""
        graph = self._vp_graph

        def t0(mod, args, kwargs):
            if graph is not None:
                self._vp_ran = True
                graph.begin(tokens_of(args, kwargs))
                if self._vp_enabled and not self._vp_wait:  # no-op inside a capture
                    graph.prepare(graph.tokens, self._vp_plans, self._vp_steps)
            if _capturing():
                return
            events = graph is not None and _CUDA and not self._vp_wait
            if _CUDA and not events:
                torch.cuda.synchronize()
            if self._vp_enabled:
                positions = input_ids = None
                if self._vp_positions:  # serving runs only: a host copy of every step's ids and positions
                    positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
                    input_ids = kwargs.get("input_ids", args[0] if args else None)
                self._vp_batches.append(self._vp_batch_layout(positions, input_ids))
            self._vp_t0 = _mark() if events else time.perf_counter()

        def t1(mod, args, out):
            if _capturing():
                if graph is not None:
                    graph.open = False  # a full-graph capture forward: no drain, but the forward is over
                return
            if isinstance(self._vp_t0, torch.cuda.Event):
                self._vp_forward_s.append((self._vp_t0, _mark()))
            else:
                if _CUDA:
                    torch.cuda.synchronize()
                self._vp_forward_s.append(time.perf_counter() - self._vp_t0)
            if graph is not None:
                self._vp_drain(graph.tokens)
        self._vp_handles.append(model.register_forward_pre_hook(t0, with_kwargs=True))
        self._vp_handles.append(model.register_forward_hook(t1))

    def _vp_batch_layout(self, positions=None, input_ids=None) -> dict:
        """Which rows of this forward belong to which request (vLLM flattens a batch), at which positions."""
        return batch_layout(self.model_runner, positions if torch.is_tensor(positions) else None,
                            input_ids if torch.is_tensor(input_ids) else None)

    def vp_missing(self) -> list[str] | None:
        """Modules the pre-compile install (harness.engines.vllm_plugin) could not find; None if it never ran."""
        return getattr(self, "_vp_missing", None)

    def vp_engine_info(self) -> dict:
        """Compilation and CUDA-graph mode of this worker (harness.engines.vllm_compat.engine_info)."""
        info = engine_info(self)
        if getattr(self, "_vp_plans", None) is None:  # nothing installed (a bare engine): no capture path
            return info
        graph = getattr(self, "_vp_graph", None)
        info["capture_path"] = "graph" if graph is not None else "sink"
        if graph is not None:
            info.update(graph_buffer_rows=graph.rows, graph_wraps=list(getattr(self, "_vp_graph_wraps", [])),
                        graph_buffers=len(graph.flat),
                        graph_buffer_mib=sum(t.numel() * t.element_size() for t in graph.flat.values()) / 2**20)
        return info

    def vp_module_tree(self) -> list[tuple[str, str]]:
        """Every module of the loaded model as ``(dot path, class name)``: what a generic overlay is discovered
        from (overlays.generic.find_layout), for an architecture with no declared row."""
        return [(name, type(mod).__name__) for name, mod in runner_model(self).named_modules() if name]

    def vp_kernel_path(self) -> dict:
        """The kernels this worker runs (harness.engines.vllm_compat.kernel_path)."""
        return kernel_path(self)

    def vp_track_positions(self, on: bool) -> None:
        """Record each forward's positions and token ids in its batch layout (harness.engines.stitch
        needs them; a single-prompt run does not, so its forwards skip the two host copies)."""
        self._vp_positions = on

    def vp_set_enabled(self, enabled: bool) -> None:
        self._vp_enabled = enabled

    def _vp_times(self) -> list[float]:
        """The forwards' seconds: the graph path's event pairs read (one host wait for all of them)."""
        times = getattr(self, "_vp_forward_s", None) or []
        if any(isinstance(t, tuple) for t in times):
            torch.cuda.synchronize()
            return [t[0].elapsed_time(t[1]) / 1e3 if isinstance(t, tuple) else t for t in times]
        return list(times)

    def vp_reset(self) -> None:
        self._vp_records = {}  # the setter drops pending drained steps too
        if getattr(self, "_vp_graph", None) is not None:
            self._vp_graph.release()
        self._vp_forward_s = []
        self._vp_batches = []
        self._vp_replays = 0
        for counter in self._vp_counters:
            counter[0] = 0

    def vp_dump(self, path: str) -> dict:
        """Write this rank's records to ``path`` (+ rank suffix); return a summary."""
        from safetensors.torch import save_file

        rank = getattr(self, "rank", 0)
        # no second copy: each record is contiguous (a ``_Buffers`` buffer, or a non-overlapping view of a
        # drained step's flat tensor), written as it is; ``.cpu()`` moves a GPU record to the host and is a
        # no-op on CPU
        out = {call_key(k, n): t.cpu() for k, ts in self._vp_records.items() for n, t in enumerate(ts)}
        target = path if rank == 0 else f"{path}.rank{rank}"
        save_file(out, target)
        return {"rank": rank, "path": target, "calls": {k: len(v) for k, v in self._vp_records.items()},
                "forward_s": self._vp_times(), "batches": list(self._vp_batches),
                "full_graph_replays": getattr(self, "_vp_replays", 0),
                "layouts": {k: self._vp_layouts.get(k, {"kind": "replicated"}) for k in self._vp_records}}

    def vp_dump_params(self, names: list[str], path: str) -> list[str]:
        """Save the named parameters/buffers (for host-side conversions); return missing."""
        from safetensors.torch import save_file

        model = self._vp_model()
        found, missing = {}, []
        for name in names:
            owner, _, attr = name.rpartition(".")
            mod = resolve_module(model, owner)
            value = getattr(mod, attr, None) if mod is not None else None
            if isinstance(value, torch.Tensor):
                found[name] = value.detach().cpu().contiguous()
            else:
                missing.append(name)
        save_file(found, path)
        return missing

    def vp_profile(self, action: str, path: str = "") -> list[dict] | None:
        """``start`` a torch.profiler session; ``stop`` it and return top ops by self time."""
        from torch.profiler import ProfilerActivity, profile

        if action == "start":
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self._vp_prof = profile(activities=acts)
            self._vp_prof.__enter__()
            return None
        self._vp_prof.__exit__(None, None, None)
        from harness.engines.timing import top_ops

        return top_ops(self._vp_prof)
