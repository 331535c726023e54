"""Raw capture keys: the names under which the vLLM subject hands captures back.

Contract: a *read key* is ``"{module}|{read}"`` (a module path and a read in
the overlay grammar, overlays.base.READ_GRAMMAR); a *capture key* adds the
prompt (an index, or ``"ragged"`` for the batched run) and the call number:
``"{prompt}:{module}|{read}#{call}"``.  Build and parse them here only.

Trap: module paths contain dots and reads contain ``[`` and ``+``, never ``|``,
``:`` or ``#``: those three separators are unambiguous, but only if nobody
splits by hand.
"""
from __future__ import annotations

from typing import NamedTuple

RAGGED = "ragged"


def read_key(module: str, read: str) -> str:
    return f"{module}|{read}"


def split_read_key(key: str) -> tuple[str, str]:
    module, read = key.split("|", 1)
    return module, read


def call_key(read_key_: str, call: int) -> str:
    """``{module}|{read}#{call}``: one call's record inside a prompt's capture."""
    return f"{read_key_}#{call}"


def capture_key(prompt: int | str, read_key_: str, call: int = 0) -> str:
    return f"{prompt}:{read_key_}#{call}"


class CaptureKey(NamedTuple):
    prompt: str  # an index as text, or RAGGED
    read_key: str
    call: int


def parse_capture_key(key: str) -> CaptureKey:
    """Inverse of :func:`capture_key`; also accepts a key without the prompt part (``{read_key}#{call}``)."""
    head, call = key.rsplit("#", 1)
    prompt, _, rk = head.partition(":") if ":" in head.split("|", 1)[0] else ("", "", head)
    return CaptureKey(prompt, rk, int(call))


def strip_call(key: str) -> str:
    """``...#3`` -> ``...``."""
    return key.rsplit("#", 1)[0]
