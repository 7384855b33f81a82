"""The HLO ops and element types the code generator builds, and their combiners' identities."""
from __future__ import annotations

import math

# Transcendental ops each backend calls (host: LLVM intrinsic or libm; GPU: libdevice).
MATH_OPS = {"exponential", "log", "tanh", "power", "sine", "cosine", "tan", "atan2",
            "exponential-minus-one", "log-plus-one", "cbrt", "erf"}
UNARY = {"abs", "negate", "exponential", "exponential-minus-one", "log", "log-plus-one", "sqrt",
         "rsqrt", "cbrt", "tanh", "logistic", "sine", "cosine", "tan", "floor", "ceil",
         "round-nearest-afz", "round-nearest-even", "sign", "not", "is-finite", "erf",
         "popcnt", "convert", "bitcast-convert"}
BINARY = {"add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power",
          "atan2", "and", "or", "xor", "compare", "shift-left", "shift-right-logical",
          "shift-right-arithmetic"}
TERNARY = {"select", "clamp"}
ELEMENTWISE = UNARY | BINARY | TERNARY
FLOAT_ONLY = MATH_OPS | {"sqrt", "rsqrt", "logistic", "is-finite", "floor", "ceil",
                         "round-nearest-afz", "round-nearest-even"}
INT_ONLY = {"popcnt", "xor", "shift-left", "shift-right-logical", "shift-right-arithmetic"}
NARROW_FLOATS = {"f16", "bf16"}  # stored as such, computed in f32 and rounded, as XLA:GPU does
INTS = {"s32", "s64", "u32", "u64"}
DTYPES = {"f32", "pred"} | INTS | NARROW_FLOATS
# Combiners a reduction (or a scatter) may use: a single binary op over the computation's two
# parameters.
REDUCERS = {"add", "maximum", "minimum", "multiply", "and", "or"}
# (element type, combiner) pairs the schedules combine across threads.
REDUCIBLE = {("f32", k) for k in ("add", "maximum", "minimum", "multiply")} | {
    (t, k) for t in ("s32", "s64") for k in ("add", "multiply", "maximum", "minimum")} | {
    ("pred", "and"), ("pred", "or")}


def identity(kind: str, dtype: str) -> float | int | bool:
    """The value a combiner leaves unchanged (partial results start here)."""
    if dtype == "pred":
        return kind == "and"
    if dtype in ("s32", "s64"):
        bits = {"s32": 31, "s64": 63}[dtype]
        return {"add": 0, "multiply": 1, "maximum": -(1 << bits), "minimum": (1 << bits) - 1}[kind]
    return {"add": 0.0, "multiply": 1.0, "maximum": -math.inf, "minimum": math.inf}[kind]
