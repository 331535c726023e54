"""The read grammar (``overlays.base.READ_GRAMMAR``) evaluated on a torch module tree: which module a
path names, which argument or output element each term of a read is, and the read's value as one copy.

Contract: pure functions of modules and tensors, no vLLM.  :func:`parse_read` splits
``"in.hidden_states+in.residual"`` into its side and terms; :func:`group_reads` groups ``[module path,
read]`` pairs by (module, side), so one hook serves every read of a module's side;
:func:`pick_outputs` / :func:`pick_inputs` pick a call's terms (they run inside hooks that
torch.compile traces, so they keep no state and call no ``inspect``: :func:`input_terms` settles each
named input's position once, at install); :func:`sum_terms` copies a read once, its terms summed left
to right (the bits of ``a.clone() + b``).  :func:`eval_output` / :func:`eval_input` are the same rule
outside a forward.  The worker extension that runs them is harness.engines.vllm_worker.

Traps: a ``None`` term counts as zero (vLLM's first decoder layer has no residual); a norm called
without a residual returns a bare tensor, which is its own ``out[0]``; vLLM shares one rotary module
across layers, so :func:`sibling_paths` finds every layer path that is that very module.
"""
from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from typing import Any

import torch

_TERM = re.compile(r"^(out|in)(?:\[(\d+)\]|\.(\w+))?$")
_ABSENT = sys.maxsize  # the position of a named input that is not a positional parameter


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


# -- picking terms: runs inside the hook (traced under torch.compile), so pure ------------------
def pick_outputs(output: Any, indices: tuple) -> list:
    """Each term of a module's output: ``out`` (index None) or ``out[i]``; None where absent."""
    picked = []
    for index in indices:
        if index is None:
            picked.append(output)
        elif isinstance(output, (tuple, list)):
            picked.append(output[index])
        elif index == 0:
            picked.append(output)  # a norm called without residual returns a bare tensor
        else:
            picked.append(None)
    return picked


def pick_inputs(args: tuple, kwargs: dict, terms: tuple) -> list:
    """Each term of a module's input; ``terms`` are ``(index, name, position of name)``."""
    picked = []
    for index, name, pos in terms:
        if index is None and name in kwargs:
            picked.append(kwargs[name])
        else:
            i = pos if index is None else index
            picked.append(args[i] if i < len(args) else None)
    return picked


def input_terms(module: torch.nn.Module, terms: list) -> tuple:
    """``terms`` of :func:`parse_read` with each name's positional slot, read once: dynamo
    cannot trace ``inspect``'s binding inside a hook."""
    names = parameter_names(module) if any(name for _, name in terms) else ()
    return tuple((index, name, names.index(name) if name in names else _ABSENT) for index, name in terms)


def parameter_names(module: torch.nn.Module) -> tuple[str, ...]:
    """Names of ``module.forward``'s positional parameters, in order."""
    return tuple(p.name for p in inspect.signature(module.forward).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


# -- copying a read: runs in the sink, eagerly ------------------------------------------------
def _fresh(shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def sum_terms(values: list, read: str, alloc: Callable = _fresh) -> torch.Tensor:
    """The read's value, copied once into ``alloc(shape, dtype, device)``: its term, or its
    terms summed left to right; None terms count as zero (vLLM's first layer has no residual)."""
    tensors = [v for v in values if v is not None]
    if not tensors:
        raise RuntimeError(f"read {read!r}: every term was None")
    first = tensors[0]
    if len(tensors) == 1:
        return alloc(first.shape, first.dtype, first.device).copy_(first)
    if all(t.shape == first.shape and t.dtype == first.dtype for t in tensors):
        out = torch.add(first, tensors[1], out=alloc(first.shape, first.dtype, first.device))
        for t in tensors[2:]:
            out.add_(t)
        return out
    total = first + tensors[1]  # broadcasting or type promotion: torch's own rules, then the copy
    for t in tensors[2:]:
        total = total + t
    return alloc(total.shape, total.dtype, total.device).copy_(total)


def eval_output(output: Any, terms: list, read: str) -> torch.Tensor:
    """A read of ``output`` as a fresh copy (the sink's rule, outside a forward)."""
    return sum_terms(pick_outputs(output, tuple(index for index, _ in terms)), read)


def eval_input(module: torch.nn.Module, args: tuple, kwargs: dict, terms: list, read: str,
               sig_cache: dict) -> torch.Tensor:
    """A read of a call's inputs as a fresh copy; ``sig_cache`` keeps each module's term positions."""
    slot = (id(module), tuple(terms))
    picks = sig_cache.get(slot)
    if picks is None:
        picks = sig_cache[slot] = input_terms(module, terms)
    return sum_terms(pick_inputs(args, kwargs, picks), read)


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


def group_reads(model: torch.nn.Module, reads: list[list[str]]) -> tuple[dict, list[str]]:
    """``[module path, read]`` pairs -> ``({(id(module), side): (module, side, {read: [paths]})}, missing)``,
    in the order the pairs first name them."""
    groups: dict[tuple[int, str], tuple[torch.nn.Module, str, dict[str, list[str]]]] = {}
    missing = []
    for module_path, read in reads:
        module = resolve_module(model, module_path)
        if module is None:
            missing.append(module_path)
            continue
        side, _ = parse_read(read)
        groups.setdefault((id(module), side), (module, side, {}))[2].setdefault(read, []).append(module_path)
    return groups, missing
