"""Tolerances: calibrated per (model, dtype, hook) from the reference's own noise floor.

The gated metric is the *error relative to the reference's scale*, row by
row (:func:`harness.comparison.compare.compare_tensors`): ``rel = max over rows of
||subject - reference|| / ||reference||``, a row being a vector along the
last dim (a token's residual vector, a head's d_head vector, a query's
attention row).  The worst row localizes an error; the L2 inside the row
keeps one rounded element of a heavy-tailed activation from dominating.

Calibration.  For every hook the reference engine (TransformerBridge; HF for
the ``hf`` rows) is run twice: in the run dtype and in a more precise "truth"
dtype (fp64 for fp32 runs, fp32 for bf16/fp16 runs).  ``floor =
rel(reference_dtype, reference_truth)`` is how far one valid implementation in
this dtype sits from the truth.  vLLM in the same dtype is another valid
implementation, so its distance to the reference may be up to about twice the
floor (two independent errors) plus kernel-order differences; the gate is

    tolerance = max(multiple * floor, minimum)

with ``multiple`` and ``minimum`` per dtype below.  ``minimum`` covers hooks
whose floor is ~0 (an embedding lookup is exact in both dtypes) while vLLM
computes the same value in a different order (oneDNN vs MKL GEMMs, its own
attention kernel).  The same formula calibrates each of a row's three statistics
(worst row, median row, median scale) from its own floor; which of them gate a row,
and when a tolerance above ``ceiling`` makes it "inconclusive" instead of letting it
pass, is harness.comparison.gate's rule (see :class:`Calibration`).

Measured on these machines (``python -m harness run --dtype float32,bfloat16``;
numbers per hook in every report): fp32 floors ~1e-7..2e-6 and vLLM fp32
errors ~6e-7..3e-6 (worst 1.6e-5, derived attention scores of a MoE model),
so the fp32 gate is the 1e-4 minimum everywhere; bf16 floors ~1e-2..4e-2 give
tolerances ~0.05..0.15 with vLLM's bf16 errors at about a quarter of them.
Each reference is calibrated by its own floor on the entries its rows compare: processed
compatibility mode by its own (its folded weights are rounded again), the ``logprobs`` row on the
top-k entries vLLM returns (harness.logprob_request); measured on an AVX2 CPU, where a borrowed
floor false-alarmed (docs/numerics.md).  Planted mapping bugs (tests/engine/test_fault_injection.py) sit >= 3.6e3x above the
fp32 tolerance and >= 18x above the bf16 one.  Mixture-of-experts models in
bf16 flip expert choices at near-tie tokens, which moves those tokens by O(1)
in *both* engines: their worst rows are then above the ceiling, and the median
row gates them (mixtral / qwen3_moe bf16: every hook gated, docs/evidence.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Calibration:
    truth_dtype: str
    multiple: float
    minimum: float
    why: str
    # A calibrated tolerance above the ceiling could let a mapping bug through
    # (the smallest planted bug, ln1 left folded, sits near 0.3): such a row is
    # reported "inconclusive" (the reference's own noise in this dtype is too
    # large to tell a bug from rounding there), never "pass".
    ceiling: float = 0.25

    def tolerance(self, floor: float | None) -> float:
        """The gate for one hook given its measured noise floor (None or NaN: not measured)."""
        if floor is None or floor != floor:  # NaN
            return self.minimum
        return max(self.multiple * floor, self.minimum)


CALIBRATION: dict[str, Calibration] = {
    "float32": Calibration(
        "float64", 10.0, 1e-4,
        "fp32 noise ~1e-6 rel; the 1e-4 minimum is 100x that and >=1000x below mapping bugs"),
    "bfloat16": Calibration(
        "float32", 4.0, 2e-2,
        "two independent bf16 roundings of the same computation: ~2x the floor, 4x leaves room for "
        "vLLM's own (valid) accumulation order; the minimum covers exact hooks (embedding lookups)"),
    "float16": Calibration(
        "float32", 4.0, 5e-3,
        "fp16 has 3 more mantissa bits than bf16; same reasoning as bf16"),
    # fp32 on CUDA with --precision tf32: vLLM's Triton kernels (attention) round
    # matmul inputs to TF32 (10 mantissa bits, unit roundoff 2^-11 ~ 4.9e-4) by
    # design.  Its error grows with depth and through the softmax (measured on an
    # H200: ~1e-3 on q/k/v up to a few 1e-2 on later layers' patterns), so no
    # constant fits every hook: the floor is the reference's own distance from fp64
    # *with its fp32 matmuls in TF32* (runner.tf32_floors; the compared reference
    # itself stays IEEE), and the multiple is bf16's reasoning (two independent
    # roundings ~2x the floor, 4x leaves room).  Planted-bug margins per gate are in
    # docs/gpu/README.md.  The default, --precision ieee (TRITON_F32_DEFAULT=ieee),
    # uses "float32".
    "float32-tf32": Calibration(
        "float64", 4.0, 1e-4,
        "TF32 matmuls (Triton's fp32 default on GPU): 4x the reference's own TF32 floor, as bf16"),
}

def reference_key(key: str) -> str:
    """The gate for the references checked against each other: they never run in TF32."""
    return key.split("-", 1)[0]

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "float64": torch.float64}


class UnsupportedDtypeError(ValueError):
    pass


def calibration_for(dtype: str) -> Calibration:
    try:
        return CALIBRATION[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            f"--dtype {dtype!r} has no calibration; supported: {', '.join(CALIBRATION)}"
        ) from None


def tolerance(dtype: str, floor: float | None) -> float:
    """The gate for one hook given its measured noise floor (None: not measured)."""
    return calibration_for(dtype).tolerance(floor)

