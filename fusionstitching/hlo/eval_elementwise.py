"""Elementwise ops: unary and binary math, compare, select, convert, bitcast-convert.

Numerics follow XLA:CPU: arithmetic in the instruction's element type, except f16/bf16/f8,
computed in f32 and rounded back; integer division, shifts, float->int conversion and
max/min of signed zeros as XLA:CPU defines them (checked against it in tests).
"""
from __future__ import annotations

import numpy as np

from .eval_values import integer_range, is_float, is_integer_type, total_order_key, unsigned, widen


def _elementwise(fn):
    """An HLO op from a numpy function: widen narrow floats, apply, round to the result type."""
    def op(ev, inst, operands):
        result = fn(*[widen(np.asarray(x)) for x in operands])
        return np.asarray(result).astype(inst.shape.numpy_dtype, copy=False)
    return op


def _sign(x):
    if not is_float(x):
        return np.sign(x)
    # XLA: copysign(x != 0, x) so that sign(-0.0) = -0.0; NaN stays NaN.
    return np.where(np.isnan(x), x, np.copysign((x != 0).astype(x.dtype), x))


def _round_half_away_from_zero(x):
    # x - trunc(x) is exact, unlike floor(x + 0.5) which misrounds 0.49999997.
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _logistic(x):
    return np.reciprocal(1 + np.exp(-x))


def _erf(x):
    from scipy.special import erf  # on first use: importing scipy takes 0.27 s (jax needs it)

    return erf(x.astype(np.float64))


_POPCOUNT_BYTE = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def _popcount(x):
    as_bytes = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    counts = _POPCOUNT_BYTE[as_bytes].reshape(x.size, x.dtype.itemsize).sum(axis=1)
    return counts.reshape(x.shape)


def _count_leading_zeros(x):
    bits = x.dtype.itemsize * 8
    u = unsigned(x).astype(np.uint64)
    bit_length = np.zeros(u.shape, np.int64)
    for step in (32, 16, 8, 4, 2, 1):  # binary search for the highest set bit
        high = u >= (np.uint64(1) << np.uint64(step))
        bit_length += np.where(high, step, 0)
        u = np.where(high, u >> np.uint64(step), u)
    return bits - (bit_length + (u > 0))


UNARY = {
    "abs": np.abs,
    "negate": np.negative,
    "exponential": np.exp,
    "exponential-minus-one": np.expm1,
    "log": np.log,
    "log-plus-one": np.log1p,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: np.reciprocal(np.sqrt(x)),
    "cbrt": np.cbrt,
    "tanh": np.tanh,
    "logistic": _logistic,
    "sine": np.sin,
    "cosine": np.cos,
    "tan": np.tan,
    "erf": _erf,
    "floor": np.floor,
    "ceil": np.ceil,
    "round-nearest-afz": _round_half_away_from_zero,
    "round-nearest-even": np.rint,
    "sign": _sign,
    "not": np.invert,  # logical on pred, bitwise on integers
    "is-finite": np.isfinite,
    "popcnt": _popcount,
    "count-leading-zeros": _count_leading_zeros,
    "real": np.real,
    "imag": np.imag,
}


def _divide(a, b):
    if is_float(a):
        return np.true_divide(a, b)
    # Integer division truncates toward zero (C); x/0 = -1 (all ones) and INT_MIN/-1 = INT_MIN.
    a, b = np.broadcast_arrays(a, b)
    by_zero = b == 0
    b = np.where(by_zero, 1, b).astype(b.dtype)
    q = np.floor_divide(a, b)
    q = q + ((q * b != a) & ((a < 0) != (b < 0))).astype(q.dtype)  # floor -> trunc
    return np.where(by_zero, np.array(-1).astype(a.dtype), q)


def _remainder(a, b):
    if is_float(a):
        return np.fmod(a, b)  # sign of the dividend, like C fmod
    # Integer x % 0 = x in XLA; np.fmod on integers already has C semantics otherwise.
    a, b = np.broadcast_arrays(a, b)
    by_zero = b == 0
    return np.where(by_zero, a, np.fmod(a, np.where(by_zero, 1, b).astype(b.dtype)))


def _power(a, b):
    if is_float(a):
        return np.power(a, b)
    # Integer power by squaring (wrapping); negative exponents give 0 unless |base| == 1.
    a, b = np.broadcast_arrays(a, b)
    result, base = np.ones_like(a), a.copy()
    exponent = np.maximum(b, 0)
    while np.any(exponent > 0):
        result = np.where(exponent & 1, result * base, result)
        base, exponent = base * base, exponent >> 1
    negative = b < 0
    if np.any(negative):
        reciprocal = np.where(a == 1, 1, np.where(a == -1, np.where(b & 1, -1, 1), 0))
        result = np.where(negative, reciprocal.astype(a.dtype), result)
    return result


def _extremum(ufunc, negative_zero_wins: bool):
    """max/min: NaN-propagating (as numpy's), and -0.0 < +0.0 as on XLA:CPU (IEEE 754-2019),
    where numpy returns either zero."""
    def fn(a, b):
        result = ufunc(a, b)
        if not is_float(a):
            return result
        both_zero = (a == 0) & (b == 0)
        return np.where(both_zero, np.where(np.signbit(a) == negative_zero_wins, a, b), result)
    return fn


def _shift(kind: str):
    """XLA shifts: amounts >= the bit width (read as unsigned) give 0, or the sign fill for
    arithmetic shifts."""
    def fn(a, b):
        a, b = np.broadcast_arrays(a, b)
        bits = a.dtype.itemsize * 8
        in_range = unsigned(b) < bits
        amount = np.where(in_range, b, 0).astype(a.dtype)
        if kind == "left":
            return np.where(in_range, np.left_shift(a, amount), 0)
        if kind == "logical":
            shifted = np.right_shift(unsigned(a), unsigned(amount)).astype(a.dtype)
            return np.where(in_range, shifted, 0)
        signed = a.astype(np.dtype(f"i{a.dtype.itemsize}"))
        fill = np.where(signed < 0, -1, 0)
        return np.where(in_range, np.right_shift(signed, amount.astype(signed.dtype)), fill)
    return fn


BINARY = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": _divide,
    "remainder": _remainder,
    "maximum": _extremum(np.maximum, negative_zero_wins=False),
    "minimum": _extremum(np.minimum, negative_zero_wins=True),
    "power": _power,
    "atan2": np.arctan2,
    "complex": lambda re_, im: re_ + 1j * im,
    "and": np.bitwise_and,  # logical on pred
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
    "shift-left": _shift("left"),
    "shift-right-logical": _shift("logical"),
    "shift-right-arithmetic": _shift("arithmetic"),
}

# Reducers/combiners of the form op(p0, p1) that numpy can reduce (or scatter with ``.at``).
REDUCER_UFUNCS = {
    "add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}

_COMPARISONS = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
                "GT": np.greater, "GE": np.greater_equal}


def _compare(ev, inst, operands):
    a, b = (widen(np.asarray(x)) for x in operands)
    if inst.attrs.get("type") == "TOTALORDER":
        a, b = total_order_key(a), total_order_key(b)
    return np.asarray(_COMPARISONS[inst.attrs["direction"]](a, b))


def _select(ev, inst, operands):
    pred, on_true, on_false = operands
    return np.where(pred, on_true, on_false)


def _convert(ev, inst, operands):
    x, out = widen(np.asarray(operands[0])), inst.shape.numpy_dtype
    if x.dtype.kind == "c" and out.kind != "c":
        x = x.real  # complex -> real keeps the real part
    if not (is_float(x) and is_integer_type(out)):
        return x.astype(out)
    # Float -> integer truncates toward zero, saturates at the type's range and maps NaN to 0
    # (XLA's semantics; checked against jax on XLA:CPU). Done in f64 to compare exactly.
    lowest, highest = integer_range(out)
    t = np.trunc(x.astype(np.float64))
    high, low = t >= float(highest), t <= float(lowest)
    result = np.where(np.isnan(t) | high | low, 0, t).astype(np.int64)
    return np.where(high, highest, np.where(low, lowest, result)).astype(out)


def _bitcast_convert(ev, inst, operands):
    # A changed element size adds or drops the minor-most dimension, as numpy's ``view`` does.
    flat = np.ascontiguousarray(operands[0]).reshape(-1)
    return flat.view(inst.shape.numpy_dtype).reshape(inst.shape.dims)


OPS = {
    **{name: _elementwise(fn) for name, fn in UNARY.items()},
    **{name: _elementwise(fn) for name, fn in BINARY.items()},
    "clamp": _elementwise(lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi)),
    "compare": _compare,
    "select": _select,
    "convert": _convert,
    "bitcast-convert": _bitcast_convert,
}
