"""Tolerances, as data, with the reason for each number.

The gate is the *error relative to the reference's scale*:
``rel = max|subject - reference| / rms(reference)``.  Dividing by the RMS
makes one number meaningful for every hook, whatever its magnitude (a
residual stream of norm 11 or a normalized tensor of norm 1).

fp32: measured on these machines, vLLM CPU vs TransformerLens/HF sits at
~1e-7..1e-6 relative on every hook (different but valid kernel orders:
oneDNN GEMMs, vLLM's attention vs SDPA).  The gate is 1e-4: two orders of
magnitude above that noise, and four below what a mapping bug produces
(a wrong norm un-fold, a missing residual, a missing embedding scale each give
rel >= 1e-1).  The fault-injection tests show those margins.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    rel: float
    why: str


TOLERANCES: dict[str, dict[str, Tolerance]] = {
    "float32": {
        "activation": Tolerance(1e-4, "fp32 noise ~1e-6 rel; 100x headroom, >=1000x below mapping bugs"),
        "logprobs": Tolerance(1e-4, "fp32 log-softmax of logits that differ by ~1e-6 rel"),
    },
}


class UnsupportedDtypeError(ValueError):
    pass


def tolerance_for(dtype: str, kind: str) -> Tolerance:
    try:
        table = TOLERANCES[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            f"no tolerance table for dtype {dtype!r}; calibrated dtypes: {', '.join(TOLERANCES)}"
        ) from None
    return table["logprobs" if kind == "logprobs" else "activation"]
