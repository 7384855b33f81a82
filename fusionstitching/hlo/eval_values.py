"""The evaluator's values: logical numpy arrays in XLA:CPU's element types, or tuples of them.

Shared by the evaluator's op modules: the error for what it cannot evaluate, packing of
variadic results, and where XLA:CPU computes a type differently from numpy (narrow floats in
f32, sums in f64, the float total order).
"""
from __future__ import annotations

import numpy as np

from .ir import NUMPY_DTYPES


class UnsupportedOp(Exception):
    """The module uses an op (or a form of one) the evaluator does not implement."""


def results(value) -> list:
    """A computation result as a list of arrays (variadic reducers return tuples)."""
    return list(value) if isinstance(value, tuple) else [value]


def pack(values: list):
    return values[0] if len(values) == 1 else tuple(values)


NARROW_FLOATS = {np.dtype(np.float16)} | {
    NUMPY_DTYPES[t] for t in ("bf16", "f8e4m3fn", "f8e5m2") if t in NUMPY_DTYPES}


def widen(x: np.ndarray) -> np.ndarray:
    """f16/bf16/f8 -> f32, as XLA:CPU computes them; other types unchanged."""
    return x.astype(np.float32) if x.dtype in NARROW_FLOATS else x


def accumulation_dtype(out: np.dtype) -> np.dtype:
    """Where dots, convolutions and reduces of ``out`` elements accumulate: floats in f64,
    rounded once to ``out`` (numpy's own f32 sums are less accurate than XLA:CPU's);
    integers in 64 bits, the same bits as wrapping in the narrower type after the final cast."""
    if out.kind == "f" or out in NARROW_FLOATS:  # bf16/f8 are not numpy kind "f"
        return np.dtype(np.float64)
    if out.kind == "c":
        return np.dtype(np.complex128)
    return np.dtype(np.int64) if out.kind in "biu" else out


def is_float(x: np.ndarray) -> bool:
    return x.dtype.kind in "fc"


SUB_BYTE_INTS = {NUMPY_DTYPES[t] for t in ("s2", "s4", "u2", "u4") if t in NUMPY_DTYPES}


def is_float_type(dtype: np.dtype) -> bool:
    """Floats and complex numbers of every width (bf16/f8 are numpy kind "V")."""
    return dtype.kind in "fc" or dtype in NARROW_FLOATS


def is_integer_type(dtype: np.dtype) -> bool:
    """Integers of every width, sub-byte ones included (numpy kind "V"); not pred."""
    return dtype.kind in "iu" or dtype in SUB_BYTE_INTS


def integer_range(dtype: np.dtype) -> tuple[int, int]:
    """(lowest, highest) of an integer type, sub-byte ones included."""
    if dtype in SUB_BYTE_INTS:
        import ml_dtypes

        info = ml_dtypes.iinfo(dtype)
    else:
        info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def unsigned(x: np.ndarray) -> np.ndarray:
    """Same bits as the unsigned integer type of equal width (two's complement wrap)."""
    return x.astype(np.dtype(f"u{x.dtype.itemsize}"))


def total_order_key(x: np.ndarray) -> np.ndarray:
    """Floats -> signed integers ordered like TOTALORDER: -NaN < -inf < -0 < +0 < inf < NaN."""
    if x.dtype.kind != "f":
        return x
    ints = np.ascontiguousarray(x).view(np.dtype(f"i{x.dtype.itemsize}"))
    # Negative floats are sign-magnitude: flip the magnitude bits so larger magnitudes sort lower.
    return np.where(ints < 0, ints ^ np.iinfo(ints.dtype).max, ints)
