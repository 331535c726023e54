"""vLLM worker extension that records hook reads (mixed into vLLM's Worker).

Contract: vLLM mixes :class:`CaptureExtension` into its worker class through
``LLM(worker_extension_cls="harness.engines.vllm_worker.CaptureExtension")``; the
driver calls the ``vp_*`` methods by name with ``llm.collective_rpc``, so no
insecure serialization is needed.  Files, not tensors, cross the RPC boundary:
``vp_dump(path)`` writes a safetensors file per rank, which works the same for
the in-process executor and for multi-process / tensor-parallel workers.

Reads follow ``overlays.base.READ_GRAMMAR``.  Input terms are read in a
forward *pre*-hook and cloned at once, output terms in a forward hook, cloned
at once: vLLM's fused add-norm kernels update ``(x, residual)`` in place, so a
tensor read later would hold someone else's value.

Every hook hands its value to one custom op, ``vllm_parity::tap(x, slot)``,
whose Python body records it.  Under torch.compile the hooks are traced into
the graph (they are installed before compilation, see harness.engines.vllm_plugin) and
the op stays in it as an ordered side effect; with piecewise CUDA graphs vLLM
splits the graph at the op (harness.engines.vllm_compat.add_splitting_op), so it runs
eagerly between graph replays and records the values of *this* replay.  Inside
a stream capture (full CUDA graphs) it records nothing: only replays count.
Counting calls of a shared module and the on/off switch happen in the op's
body, at run time, so they hold in compiled mode too.

vLLM internals (the model inside the runner, the batch layout, how a module
is sharded across tensor-parallel ranks) are reached through
:mod:`harness.engines.vllm_compat` only.
"""
from __future__ import annotations

import inspect
import re
import time
from typing import Any

import torch

from harness.vocab.capture_keys import call_key, read_key
from harness.engines.tensor_parallel import in_parallel_region, tp_layout
from harness.engines.vllm_compat import CAPTURE_OP, batch_layout, engine_info, runner_model

_TERM = re.compile(r"^(out|in)(?:\[(\d+)\]|\.(\w+))?$")
_SINKS: list = []  # slot -> the recording function of this process's CaptureExtension


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


@torch.library.custom_op(CAPTURE_OP, mutates_args=())
def tap(x: torch.Tensor, slot: int) -> None:
    """Record ``x`` for hook ``slot`` (a no-op inside a CUDA-graph capture)."""
    if not _capturing():
        _SINKS[slot](x)


@tap.register_fake
def _tap_fake(x: torch.Tensor, slot: int) -> None:
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


def resolve_module(root: torch.nn.Module, path: str) -> torch.nn.Module | None:
    target: Any = root
    for seg in path.split("."):
        if seg == "":
            continue
        target = target[int(seg)] if seg.isdigit() else getattr(target, seg, None)
        if target is None:
            return None
    return target


def natural_key(path: str) -> list:
    """``model.layers.10`` sorts after ``model.layers.9``."""
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", path)]


def parse_read(read: str) -> tuple[str, list[tuple[int | None, str | None]]]:
    """``"in.hidden_states+in.residual"`` -> ("in", [(None, "hidden_states"), (None, "residual")])."""
    sides, terms = set(), []
    for term in read.split("+"):
        m = _TERM.match(term)
        if not m:
            raise ValueError(f"bad read term {term!r} in {read!r}")
        sides.add(m.group(1))
        terms.append((int(m.group(2)) if m.group(2) is not None else None, m.group(3)))
    if len(sides) != 1:
        raise ValueError(f"read {read!r} mixes inputs and outputs; read them as two hooks")
    return sides.pop(), terms


def _sum_terms(values: list[Any], read: str) -> torch.Tensor:
    tensors = [v for v in values if v is not None]
    if not tensors:
        raise RuntimeError(f"read {read!r}: every term was None")
    total = tensors[0].detach().clone()
    for t in tensors[1:]:
        total = total + t.detach()
    return total


def eval_output(output: Any, terms: list, read: str) -> torch.Tensor:
    values = []
    for index, _ in terms:
        if index is None:
            values.append(output)
        elif isinstance(output, (tuple, list)):
            values.append(output[index])
        elif index == 0:
            values.append(output)  # a norm called without residual returns a bare tensor
        else:
            values.append(None)
    return _sum_terms(values, read)


def eval_input(module: torch.nn.Module, args: tuple, kwargs: dict, terms: list, read: str,
               sig_cache: dict) -> torch.Tensor:
    values = []
    for index, name in terms:
        if index is not None:
            values.append(args[index] if index < len(args) else None)
        elif name in kwargs:
            values.append(kwargs[name])
        else:
            # Positional: the parameter names are read once, at install time, because
            # torch.compile cannot trace inspect's binding inside a hook.
            names = sig_cache.get(id(module))
            if names is None:
                names = sig_cache[id(module)] = parameter_names(module)
            pos = names.index(name) if name in names else len(args)
            values.append(args[pos] if pos < len(args) else None)
    return _sum_terms(values, read)


def parameter_names(module: torch.nn.Module) -> tuple[str, ...]:
    """Names of ``module.forward``'s positional parameters, in order."""
    return tuple(p.name for p in inspect.signature(module.forward).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def sibling_paths(model: torch.nn.Module, module: torch.nn.Module, paths: list[str]) -> list[str]:
    """``paths`` plus every other layer's path that resolves to the same module object (vLLM shares
    one rotary embedding across layers): ``model.layers.5.self_attn.rotary_emb`` -> the same path at
    every index of ``model.layers`` that is that very module."""
    out = set(paths)
    for path in paths:
        m = re.match(r"^(.*?)\.(\d+)\.(.*)$", path)
        if m is None:
            continue
        container = resolve_module(model, m.group(1))
        for i in range(len(container) if isinstance(container, torch.nn.ModuleList) else 0):
            cand = f"{m.group(1)}.{i}.{m.group(3)}"
            if resolve_module(model, cand) is module:
                out.add(cand)
    return sorted(out)


class CaptureExtension:
    """Mixed into vLLM's Worker; every method is prefixed ``vp_``."""

    model_runner: Any

    def _vp_model(self) -> torch.nn.Module:
        return runner_model(self)

    def vp_install(self, reads: list[list[str]]) -> list[str]:
        """Install one hook per distinct (module, read); return modules not found."""
        model = self._vp_model()
        self._vp_records: dict[str, list[torch.Tensor]] = {}
        self._vp_handles = getattr(self, "_vp_handles", [])
        self._vp_forward_s: list[float] = []
        self._vp_enabled = True
        self._vp_counters: list[list[int]] = []
        self._vp_batches: list[dict] = []
        self._vp_layouts: dict[str, dict] = {}  # raw key -> tensor-parallel layout (vllm_compat.tp_layout)
        tp = int(getattr(getattr(self, "parallel_config", None), "tensor_parallel_size", 1) or 1)
        _SINKS.clear()
        sig_cache: dict = {}
        missing = []
        # Group paths by the module object they resolve to: vLLM shares one
        # rotary embedding across layers, so the n-th call of a shared module
        # belongs to the n-th path in forward (natural) order.
        groups: dict[tuple[int, str], tuple[torch.nn.Module, list[str]]] = {}
        for module_path, read in reads:
            module = resolve_module(model, module_path)
            if module is None:
                missing.append(module_path)
                continue
            groups.setdefault((id(module), read), (module, []))[1].append(module_path)
        for (_, read), (module, paths) in groups.items():
            side, terms = parse_read(read)
            wanted = {read_key(p, read) for p in paths}
            # every path the shared module answers to, requested or not: a selection of layer L alone
            # must not take layer 0's call (the n-th call belongs to the n-th sibling, not the n-th request)
            keys = [read_key(p, read) for p in sorted(sibling_paths(model, module, paths), key=natural_key)]
            parent = resolve_module(model, paths[0].rpartition(".")[0]) if "." in paths[0] else model
            layout = tp_layout(module, side, tp, in_parallel_region(parent))
            self._vp_layouts.update({k: layout for k in keys if k in wanted})
            counter = [0]

            def record(value, _keys=keys, _counter=counter, _wanted=wanted):  # runs eagerly, in the op's body
                if not self._vp_enabled:
                    return
                n = _counter[0]
                _counter[0] += 1
                key = _keys[n % len(_keys)]
                if key in _wanted:
                    # a copy now: under CUDA graphs ``value`` is a static buffer the next replay overwrites
                    self._vp_records.setdefault(key, []).append(value.detach().clone())

            slot = len(_SINKS)
            _SINKS.append(record)
            if side == "in" and any(name for _, name in terms):
                # now, not while torch.compile traces the hook: a dict filled during tracing is a
                # side effect dynamo replays with ``dict.update``, which vLLM refuses under CUDA graphs
                sig_cache[id(module)] = parameter_names(module)
            if side == "in":
                def pre(mod, args, kwargs, _t=terms, _r=read, _slot=slot):
                    value = eval_input(mod, args, kwargs, _t, _r, sig_cache)
                    if value is not None:
                        torch.ops.vllm_parity.tap(value, _slot)
                self._vp_handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            else:
                def post(mod, args, output, _t=terms, _r=read, _slot=slot):
                    value = eval_output(output, _t, _r)
                    if value is not None:
                        torch.ops.vllm_parity.tap(value, _slot)
                self._vp_handles.append(module.register_forward_hook(post))
            self._vp_counters.append(counter)
        # Forward latency: wall time of the model's own forward (no scheduling, no sampling).
        # Not inside a CUDA-graph capture: no synchronize there, and a capture is no forward.
        def t0(mod, args):
            if _capturing():
                return
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if self._vp_enabled:
                self._vp_batches.append(self._vp_batch_layout())
            self._vp_t0 = time.perf_counter()

        def t1(mod, args, out):
            if _capturing():
                return
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self._vp_forward_s.append(time.perf_counter() - self._vp_t0)
        self._vp_handles.append(model.register_forward_pre_hook(t0))
        self._vp_handles.append(model.register_forward_hook(t1))
        return missing

    def _vp_batch_layout(self) -> dict:
        """Which rows of this forward belong to which request (vLLM flattens a batch)."""
        return batch_layout(self.model_runner)

    def vp_missing(self) -> list[str] | None:
        """Modules the pre-compile install (harness.engines.vllm_plugin) could not find; None if it never ran."""
        return getattr(self, "_vp_missing", None)

    def vp_engine_info(self) -> dict:
        """Compilation and CUDA-graph mode of this worker (harness.engines.vllm_compat.engine_info)."""
        return engine_info(self)

    def vp_set_enabled(self, enabled: bool) -> None:
        self._vp_enabled = enabled

    def vp_reset(self) -> None:
        self._vp_records = {}
        self._vp_forward_s = []
        self._vp_batches = []
        for counter in self._vp_counters:
            counter[0] = 0

    def vp_dump(self, path: str) -> dict:
        """Write this rank's records to ``path`` (+ rank suffix); return a summary."""
        from safetensors.torch import save_file

        rank = getattr(self, "rank", 0)
        # clone: under torch.compile, inductor may return one buffer for two equal reads
        out = {call_key(k, n): t.cpu().contiguous().clone() for k, ts in self._vp_records.items() for n, t in enumerate(ts)}
        target = path if rank == 0 else f"{path}.rank{rank}"
        save_file(out, target)
        return {"rank": rank, "path": target, "calls": {k: len(v) for k, v in self._vp_records.items()},
                "forward_s": list(self._vp_forward_s), "batches": list(self._vp_batches),
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
