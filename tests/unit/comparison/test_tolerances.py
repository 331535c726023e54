"""harness.comparison.tolerances: tolerance = max(multiple x floor, minimum) per dtype, and the
calibration table each number of which the docstring justifies.

Contracts checked: the per-dtype multiples, minimums (floors ~0 get the minimum), truth dtypes and
the shared 0.25 ceiling; an unmeasured (None) or NaN floor gives the minimum, never NaN; the
TF32 key has its own multiple while reference_key strips it for the references' own rows; an
unknown dtype raises UnsupportedDtypeError (a ValueError) naming the supported ones.
"""
from __future__ import annotations

import math

import pytest
import torch

from harness.comparison.tolerances import (CALIBRATION, TORCH_DTYPES, UnsupportedDtypeError, calibration_for,
                                           reference_key, tolerance)


@pytest.mark.parametrize("dtype, truth, multiple, minimum", [
    ("float32", "float64", 10.0, 1e-4),
    ("bfloat16", "float32", 4.0, 2e-2),
    ("float16", "float32", 4.0, 5e-3),
    ("float32-tf32", "float64", 4.0, 1e-4),
])
def test_calibration_table(dtype, truth, multiple, minimum):
    cal = calibration_for(dtype)
    assert (cal.truth_dtype, cal.multiple, cal.minimum, cal.ceiling) == (truth, multiple, minimum, 0.25)
    assert cal.why  # every number carries its reason


def test_table_has_exactly_the_documented_keys():
    assert set(CALIBRATION) == {"float32", "bfloat16", "float16", "float32-tf32"}


@pytest.mark.parametrize("dtype, floor, expected", [
    ("float32", 0.0, 1e-4),        # exact hook: the minimum
    ("float32", 1e-6, 1e-4),       # 10 x 1e-6 = 1e-5 < minimum
    ("float32", 1e-5, 1e-4),       # 10 x 1e-5 = 1e-4: the boundary
    ("float32", 1e-4, 1e-3),
    ("bfloat16", 1e-3, 2e-2),      # 4e-3 < minimum
    ("bfloat16", 5e-3, 2e-2),      # exactly the minimum
    ("bfloat16", 1e-2, 4e-2),
    ("bfloat16", 0.1, 0.4),        # above the ceiling: tolerance() does not clip (the gate decides)
    ("float16", 1e-3, 5e-3),
    ("float16", 1e-2, 4e-2),
    ("float32-tf32", 1e-3, 4e-3),
])
def test_tolerance_is_max_of_multiple_times_floor_and_minimum(dtype, floor, expected):
    assert tolerance(dtype, floor) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float32-tf32"])
def test_unmeasured_or_nan_floor_gives_the_minimum(dtype):
    assert tolerance(dtype, None) == CALIBRATION[dtype].minimum
    t = tolerance(dtype, math.nan)
    assert t == CALIBRATION[dtype].minimum and not math.isnan(t)


def test_negative_floor_gives_the_minimum():
    assert tolerance("bfloat16", -0.5) == 2e-2


def test_bf16_minimum_is_below_the_ceiling():
    # a row whose floor was never measured must be gateable in every dtype
    for dtype, cal in CALIBRATION.items():
        assert cal.minimum < cal.ceiling, dtype


def test_reference_key_strips_tf32_only():
    assert reference_key("float32-tf32") == "float32"
    assert reference_key("float32") == "float32"
    assert reference_key("bfloat16") == "bfloat16"


def test_unsupported_dtype_names_supported_ones():
    with pytest.raises(UnsupportedDtypeError) as exc:
        tolerance("int8", 0.1)
    assert str(exc.value) == ("--dtype 'int8' has no calibration; supported: float32, bfloat16, float16, "
                              "float32-tf32")
    assert isinstance(exc.value, ValueError)


def test_torch_dtypes():
    assert TORCH_DTYPES == {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                            "float64": torch.float64}
    # every truth dtype maps to a torch dtype
    assert all(c.truth_dtype in TORCH_DTYPES for c in CALIBRATION.values())
