"""Which hooks a run captures and compares, chosen by layer and by kind (``--layers``, ``--hook-kinds``).

Contract: :func:`parse_layers` / :func:`parse_kinds` turn the options' text into sets (a bad value
raises ``argparse.ArgumentTypeError`` naming it, so both front ends stop before any engine boots);
:class:`HookSelection` holds both and :meth:`HookSelection.resolve` turns them, for one model's
offered hooks, into the set of hook names :func:`harness.values.plan.build_plan` keeps (plus the
captured inputs of a kept derived hook).  A layer the model does not have, or a kind it does not
offer, is a :class:`SelectionError` naming the input and what the model has.

What a selection means: fewer hooks captured (vLLM's reads, every reference's captures, the floor
runs' captures) and compared; ``logprobs`` and ``argmax`` are always compared.  The run is a
*selective* run: its report is ``...-selection`` and says which hooks, the matrix leaves it out,
and ``--resume`` never skips it (harness.reporting.naming, harness.frontends.cli).

Trap: ``--layers`` keeps the hooks outside the layers (``embed.*``, ``ln_final.*``,
``unembed.*``) unless ``--hook-kinds`` leaves them out; a kind is what
:func:`harness.vocab.hooks.hook_kind` says (``blocks.3.attn.hook_z`` -> ``attn.hook_z``;
``embed.hook_out`` is its own kind).
"""
from __future__ import annotations

import re
from argparse import ArgumentTypeError
from collections.abc import Iterable
from dataclasses import dataclass

from harness.vocab.hooks import hook_kind, layer_of


class SelectionError(ValueError):
    """A selection that does not fit the model; the message names the option and what the model has."""


def parse_layers(text: str) -> frozenset[int]:
    """``"0,15,29"``, ``"0-3"``, ``"0-3,29"`` -> the layer indices."""
    out: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise ArgumentTypeError(f"--layers {text!r}: layer indices or ranges, e.g. 0,15,29 or 0-3")
        out |= set(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return frozenset(out)


def parse_kinds(text: str) -> frozenset[str]:
    """``"hook_out,attn.hook_z"`` -> the hook kinds (checked against a model's offer at plan time)."""
    kinds = frozenset(p.strip() for p in text.split(",") if p.strip())
    if not kinds:
        raise ArgumentTypeError(f"--hook-kinds {text!r}: comma-separated hook kinds, e.g. hook_out,attn.hook_z")
    return kinds


@dataclass(frozen=True)
class HookSelection:
    layers: frozenset[int] | None = None  # None: every layer
    kinds: frozenset[str] | None = None  # None: every kind

    def describe(self) -> str:
        parts = []
        if self.layers is not None:
            parts.append(f"--layers {','.join(map(str, sorted(self.layers)))}")
        if self.kinds is not None:
            parts.append(f"--hook-kinds {','.join(sorted(self.kinds))}")
        return " ".join(parts) or "every hook"

    def resolve(self, offered: Iterable[str], n_layers: int, model: str = "the model") -> set[str]:
        offered = list(offered)
        if self.layers is not None and n_layers and max(self.layers) >= n_layers:
            raise SelectionError(f"--layers {','.join(map(str, sorted(self.layers)))}: {model} has {n_layers} "
                                 f"layers (0-{n_layers - 1})")
        if self.kinds is not None:
            unknown = self.kinds - {hook_kind(h) for h in offered}
            if unknown:
                raise SelectionError(f"--hook-kinds: {model} offers no {', '.join(sorted(unknown))}; it offers "
                                     f"{', '.join(sorted({hook_kind(h) for h in offered}))}")
        out = set()
        for hook in offered:
            layer = layer_of(hook)
            if self.layers is not None and layer is not None and layer not in self.layers:
                continue
            if self.kinds is not None and hook_kind(hook) not in self.kinds:
                continue
            out.add(hook)
        return out
