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

RAGGED = "ragged"


def read_key(module: str, read: str) -> str:
    return f"{module}|{read}"


def call_key(read_key_: str, call: int) -> str:
    """``{module}|{read}#{call}``: one call's record inside a prompt's capture."""
    return f"{read_key_}#{call}"


def capture_key(prompt: int | str, read_key_: str, call: int = 0) -> str:
    return f"{prompt}:{read_key_}#{call}"


def strip_call(key: str) -> str:
    """``...#3`` -> ``...``."""
    return key.rsplit("#", 1)[0]


def split_call(key: str) -> tuple[str, int]:
    """``{module}|{read}#{call}`` -> (``{module}|{read}``, call)."""
    read, call = key.rsplit("#", 1)
    return read, int(call)
