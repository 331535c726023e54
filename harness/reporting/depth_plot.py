"""Depth profile: error per layer, per hook kind, as a PNG (pure function of report rows).

Contract: :func:`write_depth_plot(result, path)` draws, for the vLLM-vs-bridge
rows of every per-layer hook kind, ``rel_err`` (solid) and the calibrated
tolerance (dotted) against the layer index on a log scale, and writes ``path``.
Returns the path, or ``None`` when there is nothing per-layer to draw or
matplotlib is missing (the report says so rather than failing).
"""
from __future__ import annotations

import os

import math
from collections import defaultdict
from pathlib import Path


def depth_series(rows: list[dict], reference: str = "bridge") -> dict[str, list[tuple[int, float, float]]]:
    series: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for r in rows:
        if r.get("reference") != reference or r.get("layer") is None:
            continue
        err = r.get("rel_err")
        if isinstance(err, (int, float)) and math.isfinite(err):
            series[r["kind"]].append((int(r["layer"]), max(float(err), 1e-12), float(r["tolerance"])))
    return {k: sorted(v) for k, v in series.items()}


def write_depth_plot(result: dict, path: Path) -> Path | None:
    series = depth_series(result.get("rows", []))
    if not series:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    cmap = plt.get_cmap("tab20")
    for n, (kind, pts) in enumerate(sorted(series.items())):
        layers = [p[0] for p in pts]
        color = cmap(n % 20)
        ax.plot(layers, [p[1] for p in pts], marker="o", ms=3, lw=1.2, color=color, label=kind)
        ax.plot(layers, [p[2] for p in pts], ls=":", lw=0.8, color=color)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("rel err = worst-row ||vLLM − bridge|| / ||bridge||")
    ax.set_title(f"{result['model']} ({result.get('device', 'cpu')}, {result['dtype']}): error by depth "
                 "(dotted: calibrated tolerance)", fontsize=9)
    ax.legend(fontsize=6, ncol=2, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.png")
    fig.savefig(tmp)
    os.replace(tmp, path)  # atomic: a killed run never leaves half a PNG
    plt.close(fig)
    return path
