"""``--shard I/N``: split the selected models across N CI runners, deterministically.

Contract: :func:`parse_shard` turns ``"2/3"`` into a :class:`Shard` or raises an
``argparse.ArgumentTypeError`` naming the option and the fix (argparse and pytest both
print it and stop before anything runs); :meth:`Shard.select` keeps this shard's targets.

The rule, a pure function of the selection and N: each target has a cost (:data:`COST` by
family name, else :data:`DEFAULT_COST`); targets are taken by decreasing cost, then by name,
and each goes to the shard whose total cost is lowest so far, the lowest-numbered shard on a
tie (greedy longest-first).  So every target lands in exactly one shard for any N, the
expensive family runs beside the fewest others, and a shard is empty only when N exceeds
the number of targets.  A shard runs its targets in the selection's own order.

Traps:

* Every shard must be given the same ``--model`` / ``--model-path`` selection: the assignment
  is a function of it (and of nothing else: not the host, not the order of ``--model``).
* It splits the parity suite's targets only.  The unit tests (``tests/``) are not sharded:
  run them in one job, or they run N times.
* A ``--model-path`` checkpoint has :data:`DEFAULT_COST` whatever its size: the table
  knows families only.
"""
from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

DEFAULT_COST = 1.0
# A target's run time relative to a tiny synthetic family (3 layers, d_model 128).  smollm2 is the
# real SmolLM2-135M (30 layers, vocab 49152, 1812 rows against 204): its fp32 run took 327 s on
# these 2-core machines (docs/DESIGN.md, section 3); measured with this module, on cores shared with
# other jobs, `python -m harness run --dtype float32` took 73 s for qwen3 and 1495 s for smollm2
# (its report's phases: 80 % in `compare`).  8 keeps it with the fewest families at 3 shards (one
# more tiny family beside it: exact balance is not worth a noisy number); raise it if `compare`
# stays that slow.
COST: dict[str, float] = {"smollm2": 6.0, "gemma3_270m": 10.5}  # wall per dtype / a synthetic family's (~18 s): 108 s and 187 s at 2d72287, 2 cores

_SPEC = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based: shard 1 of N is the first
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def select(self, targets: Sequence[T], name: Callable[[T], str] = lambda t: t.name) -> list[T]:
        """This shard's targets, in the selection's order."""
        owners = assign([name(t) for t in targets], self.count)
        return [t for t, owner in zip(targets, owners) if owner == self.index]


def cost(name: str) -> float:
    return COST.get(name, DEFAULT_COST)


def assign(names: Sequence[str], count: int) -> list[int]:
    """The shard (1..count) of each name, by the module's rule."""
    load = [0.0] * count
    owner = [0] * len(names)
    # position as the last key: two targets of one name (two paths to one folder name) stay distinct
    for i in sorted(range(len(names)), key=lambda i: (-cost(names[i]), names[i], i)):
        shard = min(range(count), key=lambda s: (load[s], s))
        load[shard] += cost(names[i])
        owner[i] = shard + 1
    return owner


def parse_shard(text: str) -> Shard:
    """``"I/N"`` with 1 <= I <= N; anything else fails with the form and an example."""
    fix = "give this runner's shard number and the shard count as I/N with 1 <= I <= N, e.g. --shard 1/3"
    m = _SPEC.fullmatch(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"--shard {text!r} is not of the form I/N: {fix}")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1 or not 1 <= index <= count:
        raise argparse.ArgumentTypeError(f"--shard {text}: shard {index} of {count} does not exist: {fix}")
    return Shard(index, count)
