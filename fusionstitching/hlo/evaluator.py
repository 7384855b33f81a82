"""Reference evaluator: runs an HLO ``Module`` on numpy arrays with XLA's semantics.

Every correctness check in the project compares against this, so it favours clarity and XLA
fidelity over speed, while staying vectorized (a ~1M-element op takes milliseconds).

Values are *logical* numpy arrays (index order = HLO dimension order) or nested Python tuples.
Layouts only matter where XLA semantics read the physical buffer: ``bitcast``.

Numerics follow XLA:CPU: arithmetic happens in the instruction's element type, except that
f16/bf16/f8 elementwise math is done in f32 and rounded back (XLA:CPU upcasts those too).
Float dots, convolutions and reduces accumulate in f64 and round once (``_accumulation_dtype``):
XLA sums in an order of its own, so no order of ours is bit-exact, and only a sum at least as
accurate as XLA's keeps a whole step's drift from f64 no larger than XLA's.

Scalar computations (reducers, comparators, scatter combiners, ``map`` bodies) are evaluated
*lifted*: their parameters are whole arrays instead of scalars. Elementwise ops broadcast, so
one evaluation of the computation processes every element at once.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import numpy as np

from .inline import inline_calls, nesting_depth
from .ir import NUMPY_DTYPES, Computation, Instruction, Module, Shape


MAX_NESTING = 64  # fusions or calls deep; deeper ones are inlined first (hlo/inline.py)


class UnsupportedOp(Exception):
    """The module uses an op (or a form of one) the evaluator does not implement."""


# ----------------------------------------------------------------------------------------------
# Public API


def evaluate(module: Module, args: list, computation: str | None = None,
             rounding_noise: np.random.Generator | None = None):
    """Runs ``computation`` (the entry by default) on ``args``; tuple results are tuples.

    With ``rounding_noise``, every float result of an op that rounds is scaled by a random
    1 + u * eps (u uniform in [-1, 1], eps of its type): one of the f32 executions XLA could
    have been, to tell which output elements f32 rounding decides (stochastic arithmetic)."""
    comp = module.entry if computation is None else module.computation(computation)
    return evaluate_computation(module, comp, args, rounding_noise)


def evaluate_computation(module: Module, comp: Computation | str, args: list,
                         rounding_noise: np.random.Generator | None = None):
    """Runs one computation of ``module``; arguments are checked against its parameter shapes."""
    if isinstance(comp, str):
        comp = module.computation(comp)
    if nesting_depth(module, comp) > MAX_NESTING:  # past Python's recursion limit otherwise
        module, comp = inline_calls(module, comp)
    params = comp.parameters
    if len(args) != len(params):
        raise ValueError(f"{comp.name} takes {len(params)} arguments, got {len(args)}")
    checked = [_as_value(a, p.shape, f"argument {p.parameter_number} ({p.name})")
               for a, p in zip(args, params)]
    with np.errstate(all="ignore"):  # overflow, NaN and wrap-around are XLA semantics here
        result = _Evaluator(module, rounding_noise).call(comp, checked)
    return _materialize(result)


def _as_value(arg, shape: Shape, what: str):
    if shape.is_tuple:
        if not isinstance(arg, (tuple, list)) or len(arg) != len(shape.tuple_shapes):
            raise ValueError(f"{what}: expected a tuple of {len(shape.tuple_shapes)} values")
        return tuple(_as_value(a, s, f"{what}[{i}]")
                     for i, (a, s) in enumerate(zip(arg, shape.tuple_shapes)))
    array = np.asarray(arg, dtype=shape.numpy_dtype)
    if array.shape != shape.dims:
        raise ValueError(f"{what}: expected shape {shape.dims}, got {array.shape}")
    return array


def _materialize(value):
    """Turns broadcast views into ordinary arrays, so callers may write to the results."""
    if isinstance(value, tuple):
        return tuple(_materialize(v) for v in value)
    return value if value.flags.c_contiguous and value.flags.writeable else np.array(value)


# ----------------------------------------------------------------------------------------------
# The interpreter loop


class _Evaluator:
    def __init__(self, module: Module, rounding_noise: np.random.Generator | None = None):
        self.module = module
        self.rounding_noise = rounding_noise
        self.computations = module.computation_map()
        # Instruction -> table of its computation, so ops can look at operand shapes (layouts).
        self._scope: dict[int, dict[str, Instruction]] = {}
        for comp in module.computations:
            table = comp.by_name()
            for inst in comp.instructions:
                self._scope[id(inst)] = table
        self._constants: dict[int, object] = {}  # parsed literals (loop bodies re-run them)
        self._reducer_ufuncs: dict[str, np.ufunc | None] = {}

    def call(self, comp: Computation | str, args: list, result: str | None = None):
        """Runs ``comp``; returns its root's value, or that of instruction ``result``."""
        if isinstance(comp, str):
            comp = self.computations[comp]
        env: dict[str, object] = {}
        for inst in comp.instructions:
            if inst.opcode == "parameter":
                env[inst.name] = args[inst.parameter_number]
                continue
            op = _OPS.get(inst.opcode)
            if op is None:
                raise UnsupportedOp(f"{inst.opcode} (%{inst.name} in {comp.name})")
            try:
                env[inst.name] = op(self, inst, [env[name] for name in inst.operands])
                if self.rounding_noise is not None and inst.opcode in _ROUNDING:
                    env[inst.name] = _with_rounding_noise(env[inst.name], self.rounding_noise)
            except Exception as err:
                err.add_note(f"while evaluating %{inst.name} = {inst.opcode} in {comp.name}")
                raise
        return env[result or comp.root.name]

    def called(self, inst: Instruction, key: str) -> Computation:
        return self.computations[inst.attrs[key].strip().lstrip("%")]

    def operand_shape(self, inst: Instruction, i: int) -> Shape:
        return self._scope[id(inst)][inst.operands[i]].shape

    def constant(self, inst: Instruction):
        if id(inst) not in self._constants:
            self._constants[id(inst)] = parse_literal(inst.literal or "", inst.shape)
        return self._constants[id(inst)]

    def reducer_ufunc(self, comp: Computation) -> np.ufunc | None:
        """The numpy ufunc when ``comp`` is just ``op(parameter(0), parameter(1))`` for an
        associative, commutative op; such reducers/combiners skip lifted calls."""
        if comp.name not in self._reducer_ufuncs:
            root, params = comp.root, comp.parameters
            simple = (len(comp.instructions) == 3 and len(params) == 2
                      and sorted(root.operands) == sorted(p.name for p in params))
            self._reducer_ufuncs[comp.name] = _REDUCER_UFUNCS.get(root.opcode) if simple else None
        return self._reducer_ufuncs[comp.name]


def _with_rounding_noise(value, rng: np.random.Generator):
    if isinstance(value, tuple):
        return tuple(_with_rounding_noise(v, rng) for v in value)
    if not (isinstance(value, np.ndarray) and value.dtype.kind == "f"):
        return value
    eps = np.finfo(value.dtype).eps
    noise = rng.uniform(-eps, eps, size=value.shape)
    return (value * (1.0 + noise)).astype(value.dtype)


def _results(value) -> list:
    """A computation result as a list of arrays (variadic reducers return tuples)."""
    return list(value) if isinstance(value, tuple) else [value]


def _pack(values: list):
    return values[0] if len(values) == 1 else tuple(values)


# ----------------------------------------------------------------------------------------------
# Literals


def parse_literal(text: str, shape: Shape):
    """Parses a printed HLO literal: ``1.5``, ``{ {1, 2}, {3, 4} }``, ``-inf``, ``true``, tuples."""
    text = text.strip()
    text = re.sub(r"^\w+\[[^\]]*\](\{[^}]*\})?\s*", "", text)  # old printers prefix the shape
    if "..." in text:
        raise ValueError("constant literal is elided ('{...}'); dump the HLO with large "
                         "constants printed (print_large_constants) to evaluate it")
    if shape.is_tuple:
        parts = _split_top_level(text[1:-1] if text.startswith("(") else text)
        return tuple(parse_literal(p, s) for p, s in zip(parts, shape.tuple_shapes))
    text = re.sub(r"nan\(0x[0-9a-fA-F]+\)", "nan", text)  # NaN payloads are not kept
    tokens = re.findall(r"[^\s{}(),]+", text)
    dtype = shape.numpy_dtype
    if dtype.kind == "c":  # complex elements print as (re, im)
        values = np.array([complex(float(r), float(i)) for r, i in zip(tokens[::2], tokens[1::2])])
    elif dtype.kind in "biu":
        values = np.array([int(_BOOL_WORDS.get(t, t)) for t in tokens], dtype=dtype)
    else:  # floats, including bf16/f8: parsed in f64 and rounded once
        values = np.array([float(t) for t in tokens], dtype=np.float64)
    if values.size != shape.num_elements:
        raise ValueError(f"literal has {values.size} values, shape {shape.dims} needs "
                         f"{shape.num_elements}")
    return values.astype(dtype).reshape(shape.dims)


_BOOL_WORDS = {"true": "1", "false": "0"}


def _split_top_level(text: str) -> list[str]:
    """Splits at commas outside any braces/parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "({":
            depth += 1
        elif ch in ")}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


# ----------------------------------------------------------------------------------------------
# Elementwise ops

_NARROW_FLOATS = {np.dtype(np.float16)} | {
    NUMPY_DTYPES[t] for t in ("bf16", "f8e4m3fn", "f8e5m2") if t in NUMPY_DTYPES}


def _widen(x: np.ndarray) -> np.ndarray:
    """f16/bf16/f8 -> f32, as XLA:CPU computes them; other types unchanged."""
    return x.astype(np.float32) if x.dtype in _NARROW_FLOATS else x


def _elementwise(fn):
    """An HLO op from a numpy function: widen narrow floats, apply, round to the result type."""
    def op(ev, inst, operands):
        result = fn(*[_widen(np.asarray(x)) for x in operands])
        return np.asarray(result).astype(inst.shape.numpy_dtype, copy=False)
    return op


def _accumulation_dtype(out: np.dtype) -> np.dtype:
    """Where dots, convolutions and reduces of ``out`` elements accumulate.

    Floats in f64, rounded once to ``out``: numpy's own f32 sums are less accurate than
    XLA:CPU's. Its f32 matmul adds the K products in sequence (the TF Transformer's attention
    logits, K=16: 2.7 ulps mean error, XLA:CPU's dot 1.6) and a reduce over a major dimension
    adds row after row (512 rows: 2.7 ulps mean, XLA:CPU 0.4); test_sums_are_as_accurate_as_xla
    in tests/test_evaluator.py. Integers in 64 bits: the same bits as wrapping in the narrower
    type, after the final cast."""
    if out.kind == "f" or out in _NARROW_FLOATS:  # bf16/f8 are not numpy kind "f"
        return np.dtype(np.float64)
    if out.kind == "c":
        return np.dtype(np.complex128)
    return np.dtype(np.int64) if out.kind in "biu" else out


def _is_float(x: np.ndarray) -> bool:
    return x.dtype.kind in "fc"


def _unsigned(x: np.ndarray) -> np.ndarray:
    """Same bits as the unsigned integer type of equal width (two's complement wrap)."""
    return x.astype(np.dtype(f"u{x.dtype.itemsize}"))


def _sign(x):
    if not _is_float(x):
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
    from scipy.special import erf  # scipy comes with jax

    return erf(x.astype(np.float64))


_POPCOUNT_BYTE = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def _popcount(x):
    as_bytes = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    counts = _POPCOUNT_BYTE[as_bytes].reshape(x.size, x.dtype.itemsize).sum(axis=1)
    return counts.reshape(x.shape)


def _count_leading_zeros(x):
    bits = x.dtype.itemsize * 8
    u = _unsigned(x).astype(np.uint64)
    bit_length = np.zeros(u.shape, np.int64)
    for step in (32, 16, 8, 4, 2, 1):  # binary search for the highest set bit
        high = u >= (np.uint64(1) << np.uint64(step))
        bit_length += np.where(high, step, 0)
        u = np.where(high, u >> np.uint64(step), u)
    return bits - (bit_length + (u > 0))


_UNARY = {
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
    if _is_float(a):
        return np.true_divide(a, b)
    # Integer division truncates toward zero (C); x/0 = -1 (all ones) and INT_MIN/-1 = INT_MIN.
    a, b = np.broadcast_arrays(a, b)
    by_zero = b == 0
    b = np.where(by_zero, 1, b).astype(b.dtype)
    q = np.floor_divide(a, b)
    q = q + ((q * b != a) & ((a < 0) != (b < 0))).astype(q.dtype)  # floor -> trunc
    return np.where(by_zero, np.array(-1).astype(a.dtype), q)


def _remainder(a, b):
    if _is_float(a):
        return np.fmod(a, b)  # sign of the dividend, like C fmod
    # Integer x % 0 = x in XLA; np.fmod on integers already has C semantics otherwise.
    a, b = np.broadcast_arrays(a, b)
    by_zero = b == 0
    return np.where(by_zero, a, np.fmod(a, np.where(by_zero, 1, b).astype(b.dtype)))


def _power(a, b):
    if _is_float(a):
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
        if not _is_float(a):
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
        in_range = _unsigned(b) < bits
        amount = np.where(in_range, b, 0).astype(a.dtype)
        if kind == "left":
            return np.where(in_range, np.left_shift(a, amount), 0)
        if kind == "logical":
            shifted = np.right_shift(_unsigned(a), _unsigned(amount)).astype(a.dtype)
            return np.where(in_range, shifted, 0)
        signed = a.astype(np.dtype(f"i{a.dtype.itemsize}"))
        fill = np.where(signed < 0, -1, 0)
        return np.where(in_range, np.right_shift(signed, amount.astype(signed.dtype)), fill)
    return fn


_BINARY = {
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
_REDUCER_UFUNCS = {
    "add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}

_COMPARISONS = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
                "GT": np.greater, "GE": np.greater_equal}


def _total_order_key(x: np.ndarray) -> np.ndarray:
    """Floats -> signed integers ordered like TOTALORDER: -NaN < -inf < -0 < +0 < inf < NaN."""
    if x.dtype.kind != "f":
        return x
    ints = np.ascontiguousarray(x).view(np.dtype(f"i{x.dtype.itemsize}"))
    # Negative floats are sign-magnitude: flip the magnitude bits so larger magnitudes sort lower.
    return np.where(ints < 0, ints ^ np.iinfo(ints.dtype).max, ints)


def _compare(ev, inst, operands):
    a, b = (_widen(np.asarray(x)) for x in operands)
    if inst.attrs.get("type") == "TOTALORDER":
        a, b = _total_order_key(a), _total_order_key(b)
    return np.asarray(_COMPARISONS[inst.attrs["direction"]](a, b))


def _select(ev, inst, operands):
    pred, on_true, on_false = operands
    return np.where(pred, on_true, on_false)


def _convert(ev, inst, operands):
    x, out = _widen(np.asarray(operands[0])), inst.shape.numpy_dtype
    if x.dtype.kind == "c" and out.kind != "c":
        x = x.real  # complex -> real keeps the real part
    if not (_is_float(x) and out.kind in "iu"):
        return x.astype(out)
    # Float -> integer truncates toward zero, saturates at the type's range and maps NaN to 0
    # (XLA's semantics; checked against jax on XLA:CPU). Done in f64 to compare exactly.
    info = np.iinfo(out)
    t = np.trunc(x.astype(np.float64))
    high, low = t >= float(info.max), t <= float(info.min)
    result = np.where(np.isnan(t) | high | low, 0, t).astype(out)
    return np.where(high, info.max, np.where(low, info.min, result)).astype(out)


def _bitcast_convert(ev, inst, operands):
    # A changed element size adds or drops the minor-most dimension, as numpy's ``view`` does.
    flat = np.ascontiguousarray(operands[0]).reshape(-1)
    return flat.view(inst.shape.numpy_dtype).reshape(inst.shape.dims)


# ----------------------------------------------------------------------------------------------
# Shape and data-movement ops


def _constant(ev, inst, operands):
    return ev.constant(inst)


def _iota(ev, inst, operands):
    dims, d = inst.shape.dims, int(inst.attrs["iota_dimension"])
    line = np.arange(dims[d]).reshape([dims[d] if i == d else 1 for i in range(len(dims))])
    return np.broadcast_to(line.astype(inst.shape.numpy_dtype), dims)


def _broadcast(ev, inst, operands):
    # ``dimensions`` maps operand dim i to result dim dimensions[i]; put them in result order,
    # insert the new unit dims, and let numpy broadcast.
    x, dims = operands[0], inst.dimensions
    x = np.transpose(x, np.argsort(dims))
    shape = [1] * inst.shape.rank
    for size, d in zip(x.shape, sorted(dims)):
        shape[d] = size
    return np.broadcast_to(x.reshape(shape), inst.shape.dims)


def _reshape(ev, inst, operands):
    return np.reshape(operands[0], inst.shape.dims)


def _physical_order(shape: Shape) -> list[int]:
    """Dimensions from major to minor: the order in which they are laid out in memory."""
    return list(reversed(shape.minor_to_major))


def _bitcast(ev, inst, operands):
    # Reinterpret the operand's buffer: read it in its physical (layout) order, reinterpret the
    # element type if it changes, and lay the same bytes out in the result's layout.
    source = ev.operand_shape(inst, 0)
    if source.dims == inst.shape.dims and source.minor_to_major == inst.shape.minor_to_major:
        # Only the element type changes: reinterpret in place (also works on lifted scalars).
        return np.ascontiguousarray(operands[0]).view(inst.shape.numpy_dtype)
    buffer = np.transpose(operands[0], _physical_order(source)).reshape(-1)
    buffer = buffer.view(inst.shape.numpy_dtype)
    order = _physical_order(inst.shape)
    physical = buffer.reshape([inst.shape.dims[d] for d in order])
    return np.transpose(physical, np.argsort(order))


def _transpose(ev, inst, operands):
    return np.transpose(operands[0], inst.dimensions)


def _identity(ev, inst, operands):
    return operands[0]


def _slice(ev, inst, operands):
    bounds = re.findall(r"\[(-?\d+):(-?\d+)(?::(\d+))?\]", inst.attrs["slice"])
    return operands[0][tuple(slice(int(lo), int(hi), int(step or 1)) for lo, hi, step in bounds)]


def _clamped_starts(starts, operand_dims, sizes) -> list[int]:
    # Dynamic slicing clamps each start so the whole window stays inside the operand.
    return [min(max(int(s), 0), n - k) for s, n, k in zip(starts, operand_dims, sizes)]


def _dynamic_slice(ev, inst, operands):
    x, sizes = operands[0], inst.int_list_attr("dynamic_slice_sizes")
    starts = _clamped_starts(operands[1:], x.shape, sizes)
    return x[tuple(slice(s, s + k) for s, k in zip(starts, sizes))]


def _dynamic_update_slice(ev, inst, operands):
    x, update = operands[0], operands[1]
    starts = _clamped_starts(operands[2:], x.shape, update.shape)
    result = np.array(x)
    result[tuple(slice(s, s + k) for s, k in zip(starts, update.shape))] = update
    return result


def _concatenate(ev, inst, operands):
    return np.concatenate(operands, axis=inst.dimensions[0])


def _pad_array(x: np.ndarray, value, config) -> np.ndarray:
    """Pads with (low, high, interior) per dim; negative low/high cut elements away."""
    sizes, placed, kept = [], [], []
    for n, (low, high, interior) in zip(x.shape, config):
        core = n + max(n - 1, 0) * interior
        size = max(low, 0) + core + max(high, 0)
        sizes.append(size)
        placed.append(slice(max(low, 0), max(low, 0) + core, interior + 1))
        kept.append(slice(max(-low, 0), size - max(-high, 0)))
    result = np.full(sizes, value, dtype=x.dtype)
    result[tuple(placed)] = x
    return result[tuple(kept)]


def _pad(ev, inst, operands):
    x, value = operands
    text = inst.attrs.get("padding", "")
    config = [tuple(int(v) for v in dim.split("_")) for dim in text.split("x") if dim]
    return _pad_array(x, value, [c if len(c) == 3 else (*c, 0) for c in config])


def _reverse(ev, inst, operands):
    return np.flip(operands[0], axis=inst.dimensions)


def _tuple(ev, inst, operands):
    return tuple(operands)


def _get_tuple_element(ev, inst, operands):
    return operands[0][int(inst.attrs["index"])]


# ----------------------------------------------------------------------------------------------
# Reductions and windows


def _reduce_arrays(ev, comp: Computation, inputs: list, inits: list, axes: tuple[int, ...]):
    """Reduces ``inputs`` over ``axes`` with ``comp``, starting from the scalar ``inits``."""
    ufunc = ev.reducer_ufunc(comp) if len(inputs) == 1 else None
    kept = [d for d in range(inputs[0].ndim) if d not in axes]
    out_shape = tuple(inputs[0].shape[d] for d in kept)
    count = int(np.prod([inputs[0].shape[d] for d in axes], dtype=np.int64))
    if count == 0:
        return [np.broadcast_to(init, out_shape) for init in inits]
    if ufunc is not None:
        x = inputs[0]
        acc = _accumulation_dtype(x.dtype)
        partial = ufunc.reduce(x.astype(acc), axis=axes, dtype=acc)
        return [np.asarray(ufunc(partial, inits[0].astype(acc))).astype(x.dtype)]
    # General (e.g. variadic argmax) reducers: XLA may combine elements in any order, so combine
    # the two halves of the reduced elements pairwise: log2(count) lifted calls.
    parts = [np.transpose(x, kept + list(axes)).reshape(out_shape + (count,)) for x in inputs]
    while count > 1:
        half = count // 2
        combined = _results(ev.call(comp, [p[..., :half] for p in parts]
                                    + [p[..., half:2 * half] for p in parts]))
        parts = [np.concatenate([c, p[..., 2 * half:]], axis=-1) for c, p in zip(combined, parts)]
        count = half + count % 2
    results = _results(ev.call(comp, [np.broadcast_to(i, out_shape) for i in inits]
                               + [p[..., 0] for p in parts]))
    return [np.broadcast_to(r, out_shape) for r in results]


def _reduce(ev, inst, operands):
    n = len(operands) // 2
    results = _reduce_arrays(ev, ev.called(inst, "to_apply"), operands[:n], operands[n:],
                             inst.dimensions)
    return _pack([r.astype(s.numpy_dtype, copy=False)
                  for r, s in zip(results, inst.shape.leaves())])


@dataclass
class _Window:
    size: list[int]
    stride: list[int]
    padding: list[tuple[int, int]]
    base_dilation: list[int]  # lhs_dilate
    window_dilation: list[int]  # rhs_dilate
    reversal: list[int]

    @staticmethod
    def parse(text: str | None, rank: int) -> "_Window":
        """``{size=3x3 stride=2x2 pad=0_1x0_1 lhs_dilate=.. rhs_dilate=.. rhs_reversal=..}``."""
        fields = dict(item.split("=", 1) for item in (text or "").strip("{} ").split())

        def ints(key, default):
            return [int(v) for v in fields[key].split("x")] if key in fields else [default] * rank

        padding = ([tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x")]
                   if "pad" in fields else [(0, 0)] * rank)
        return _Window(ints("size", 1), ints("stride", 1), padding, ints("lhs_dilate", 1),
                       ints("rhs_dilate", 1), ints("rhs_reversal", 0))

    def pad(self, x: np.ndarray, value, leading: int = 0) -> np.ndarray:
        """Applies padding and base dilation to the last dims of ``x`` (after ``leading`` dims)."""
        config = [(0, 0, 0)] * leading + [
            (lo, hi, d - 1) for (lo, hi), d in zip(self.padding, self.base_dilation)]
        return _pad_array(x, value, config)

    def offsets(self):
        return itertools.product(*[range(s) for s in self.size])

    def slices(self, offset, out_sizes) -> tuple[slice, ...]:
        """For a padded input: the element at window position ``offset`` of every output."""
        return tuple(slice(o * d, o * d + max((n - 1) * s + 1, 0), s) for o, d, s, n in
                     zip(offset, self.window_dilation, self.stride, out_sizes))


def _reduce_window(ev, inst, operands):
    n = len(operands) // 2
    inputs, inits = operands[:n], operands[n:]
    comp = ev.called(inst, "to_apply")
    window = _Window.parse(inst.attrs.get("window"), inputs[0].ndim)
    out_shapes = inst.shape.leaves()
    out_sizes = out_shapes[0].dims
    # Window positions in the padding or in a base dilation hole are skipped, as XLA:CPU does
    # (combining them as the init value, as XLA's operation semantics word it, differs from
    # XLA's result when the init is not the reducer's identity: a sum starting at 1).
    padded = [window.pad(x, init) for x, init in zip(inputs, inits)]
    inside = window.pad(np.ones(inputs[0].shape, bool), np.zeros((), bool))
    ufunc = ev.reducer_ufunc(comp) if n == 1 else None
    acc = [np.broadcast_to(init, out_sizes) for init in inits]
    for offset in window.offsets():
        sl = window.slices(offset, out_sizes)
        elements = [p[sl] for p in padded]
        if ufunc is not None:
            new = [ufunc(_widen(acc[0]), _widen(elements[0])).astype(inputs[0].dtype)]
        else:
            new = _results(ev.call(comp, acc + elements))
        acc = [np.where(inside[sl], v, a) for v, a in zip(new, acc)]
    return _pack([np.broadcast_to(a, out_sizes).astype(s.numpy_dtype, copy=False)
                  for a, s in zip(acc, out_shapes)])


def _scatter_combine(ev, comp: Computation, targets: list, index: np.ndarray, updates: list):
    """targets[k][index[i]] = comp(targets..., updates...[i]) in order; targets are flat arrays.

    Repeated indices must see each other's results, so the generic path applies the updates in
    rounds in which every target element is touched at most once.
    """
    ufunc = ev.reducer_ufunc(comp) if len(targets) == 1 else None
    if ufunc is not None and targets[0].dtype not in _NARROW_FLOATS:
        ufunc.at(targets[0], index, updates[0])
        return
    order = np.argsort(index, kind="stable")
    ordered = index[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]]
    rank = np.arange(len(order)) - np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
    for r in range(int(rank.max(initial=-1)) + 1):
        chosen = order[rank == r]
        where = index[chosen]
        new = _results(ev.call(comp, [t[where] for t in targets] + [u[chosen] for u in updates]))
        for t, v in zip(targets, new):
            t[where] = v


def _select_and_scatter(ev, inst, operands):
    operand, source, init = operands
    window = _Window.parse(inst.attrs.get("window"), operand.ndim)
    select, scatter = ev.called(inst, "select"), ev.called(inst, "scatter")
    # Padding is never selected: track flat operand positions, -1 in the padding.
    positions = window.pad(np.arange(operand.size).reshape(operand.shape), -1)
    padded = window.pad(operand, np.zeros((), operand.dtype))
    chosen_value, chosen_position = None, np.full(source.shape, -1)
    for offset in window.offsets():
        sl = window.slices(offset, source.shape)
        value, position = padded[sl], positions[sl]
        if chosen_value is None:
            chosen_value = value
            take = position >= 0
        else:
            # select(current, candidate) true keeps the current choice, as in XLA.
            keep = np.broadcast_to(ev.call(select, [chosen_value, value]), source.shape)
            take = (position >= 0) & ((chosen_position < 0) | ~keep)
        chosen_value = np.where(take, value, chosen_value)
        chosen_position = np.where(take, position, chosen_position)
    result = np.full(operand.size, init, dtype=operand.dtype)
    valid = chosen_position >= 0
    _scatter_combine(ev, scatter, [result], chosen_position[valid], [source[valid]])
    return result.reshape(operand.shape)


# ----------------------------------------------------------------------------------------------
# Gather / scatter


def _window_starts(indices: np.ndarray, index_vector_dim: int, start_index_map, operand_batching,
                   index_batching, operand_rank: int, batch_positions: list[int], rank: int):
    """Per operand dim, the window start chosen by each index vector (shared by gather/scatter).

    The result has ``rank`` dims, the index batch dims at ``batch_positions`` and 1 elsewhere,
    so it broadcasts against the gather output / scatter updates. Not clamped.
    """
    if index_vector_dim == indices.ndim:
        indices = indices[..., None]
    else:
        indices = np.moveaxis(indices, index_vector_dim, -1)
    batch_shape = indices.shape[:-1]

    def placed(values: np.ndarray, batch_dim: int | None = None) -> np.ndarray:
        shape = [1] * rank
        for i, (pos, size) in enumerate(zip(batch_positions, batch_shape)):
            if batch_dim is None or i == batch_dim:
                shape[pos] = size
        return values.reshape(shape)

    starts = [np.zeros((), np.int64)] * operand_rank
    for k, d in enumerate(start_index_map):
        starts[d] = placed(indices[..., k].astype(np.int64))
    # Batching dims pair operand dim d with index dim i: the start is that batch coordinate.
    for d, i in zip(operand_batching, index_batching):
        i = i if i < index_vector_dim else i - 1  # numbering without the index vector dim
        starts[d] = placed(np.arange(batch_shape[i]), batch_dim=i)
    return starts


def _window_offset(size: int, position: int, rank: int) -> np.ndarray:
    return np.arange(size).reshape([size if i == position else 1 for i in range(rank)])


def _gather(ev, inst, operands):
    operand, indices = operands
    attr = inst.int_list_attr
    offset_dims = attr("offset_dims") or ()
    slice_sizes = attr("slice_sizes")
    operand_batching = attr("operand_batching_dims") or ()
    rank = inst.shape.rank
    starts = _window_starts(indices, int(inst.attrs["index_vector_dim"]), attr("start_index_map"),
                            operand_batching, attr("start_indices_batching_dims") or (),
                            operand.ndim, [d for d in range(rank) if d not in offset_dims], rank)
    windowed = [d for d in range(operand.ndim)
                if d not in (attr("collapsed_slice_dims") or ()) and d not in operand_batching]
    index = []
    for d in range(operand.ndim):
        # Gather clamps each window into the operand.
        start = np.clip(starts[d], 0, operand.shape[d] - slice_sizes[d])
        if d in windowed:
            start = start + _window_offset(slice_sizes[d], offset_dims[windowed.index(d)], rank)
        index.append(start)
    return np.broadcast_to(operand[tuple(index)], inst.shape.dims)


def _scatter(ev, inst, operands):
    n = (len(operands) - 1) // 2
    targets, indices, updates = operands[:n], operands[n], operands[n + 1:]
    attr = inst.int_list_attr
    window_dims = attr("update_window_dims") or ()
    input_batching = attr("input_batching_dims") or ()
    shape, rank = targets[0].shape, updates[0].ndim
    starts = _window_starts(indices, int(inst.attrs["index_vector_dim"]),
                            attr("scatter_dims_to_operand_dims"), input_batching,
                            attr("scatter_indices_batching_dims") or (), len(shape),
                            [d for d in range(rank) if d not in window_dims], rank)
    windowed = [d for d in range(len(shape))
                if d not in (attr("inserted_window_dims") or ()) and d not in input_batching]
    index, in_bounds = [], np.ones((), bool)
    for d in range(len(shape)):
        size = updates[0].shape[window_dims[windowed.index(d)]] if d in windowed else 1
        # Unlike gather, scatter skips a whole update window that does not fit the operand.
        in_bounds = in_bounds & (starts[d] >= 0) & (starts[d] + size <= shape[d])
        offset = _window_offset(size, window_dims[windowed.index(d)], rank) if d in windowed else 0
        index.append(np.broadcast_to(starts[d] + offset, updates[0].shape))
    valid = np.broadcast_to(in_bounds, updates[0].shape)
    flat_index = np.ravel_multi_index([i[valid] for i in index], shape)
    results = [np.array(t).reshape(-1) for t in targets]
    _scatter_combine(ev, ev.called(inst, "to_apply"), results, flat_index,
                     [u[valid] for u in updates])
    return _pack([r.reshape(shape) for r in results])


# ----------------------------------------------------------------------------------------------
# Linear algebra


def _dot(ev, inst, operands):
    lhs, rhs = operands
    lb, lc, rb, rc = (list(inst.int_list_attr(key) or ()) for key in (
        "lhs_batch_dims", "lhs_contracting_dims", "rhs_batch_dims", "rhs_contracting_dims"))
    lf = [d for d in range(lhs.ndim) if d not in lb + lc]
    rf = [d for d in range(rhs.ndim) if d not in rb + rc]

    def size(x, dims):
        return int(np.prod([x.shape[d] for d in dims], dtype=np.int64))

    acc = _accumulation_dtype(inst.shape.numpy_dtype)
    # As a batched matmul: [batch, free, contracting] x [batch, contracting, free].
    a = np.transpose(lhs, lb + lf + lc).reshape(size(lhs, lb), size(lhs, lf), size(lhs, lc))
    b = np.transpose(rhs, rb + rc + rf).reshape(size(rhs, rb), size(rhs, rc), size(rhs, rf))
    product = np.matmul(a.astype(acc), b.astype(acc))
    return product.reshape(inst.shape.dims).astype(inst.shape.numpy_dtype)


def _convolution(ev, inst, operands):
    lhs, rhs = operands
    if int(inst.attrs.get("batch_group_count", "1")) != 1:
        raise UnsupportedOp(f"convolution with batch_group_count (%{inst.name})")
    lhs_labels, rest = inst.attrs["dim_labels"].split("_", 1)
    rhs_labels, out_labels = rest.split("->")
    spatial = [str(i) for i in range(len(lhs_labels) - 2)]
    groups = int(inst.attrs.get("feature_group_count", "1"))
    window = _Window.parse(inst.attrs.get("window"), len(spatial))
    acc = _accumulation_dtype(inst.shape.numpy_dtype)
    # Canonical layouts: input [N, C, spatial...], kernel [O, I, spatial...].
    x = np.transpose(lhs, [lhs_labels.index(c) for c in "bf" + "".join(spatial)]).astype(acc)
    w = np.transpose(rhs, [rhs_labels.index(c) for c in "oi" + "".join(spatial)]).astype(acc)
    w = np.flip(w, axis=[2 + i for i, r in enumerate(window.reversal) if r])
    x = window.pad(x, np.zeros((), acc), leading=2)
    out_sizes = [inst.shape.dims[out_labels.index(c)] for c in spatial]
    batch, out_features, in_per_group = x.shape[0], w.shape[0], w.shape[1]
    x = x.reshape(batch, groups, in_per_group, *x.shape[2:])
    w = w.reshape(groups, out_features // groups, in_per_group, *w.shape[2:])
    result = np.zeros((batch, groups, out_features // groups, *out_sizes), acc)
    for offset in window.offsets():  # one matmul per kernel tap
        patch = x[(slice(None),) * 3 + window.slices(offset, out_sizes)]
        result += np.einsum("ngi...,goi->ngo...", patch, w[(Ellipsis,) + offset])
    result = result.reshape(batch, out_features, *out_sizes)
    canonical = "bf" + "".join(spatial)
    return np.transpose(result, [canonical.index(c) for c in out_labels]).astype(
        inst.shape.numpy_dtype)


# ----------------------------------------------------------------------------------------------
# Control flow and calls


def _call(key: str):
    def op(ev, inst, operands):
        return ev.call(ev.called(inst, key), operands)
    return op


def _map(ev, inst, operands):
    result = ev.call(ev.called(inst, "to_apply"), operands)  # lifted over all elements
    return np.broadcast_to(result, inst.shape.dims)


def _while(ev, inst, operands):
    condition, body = ev.called(inst, "condition"), ev.called(inst, "body")
    state = operands[0]
    while bool(ev.call(condition, [state])):
        state = ev.call(body, [state])
    return state


def _conditional(ev, inst, operands):
    selector, branch_args = operands[0], operands[1:]
    branches = inst.called_computations  # branch_computations, or true then false
    if selector.dtype == np.bool_:
        branch = 0 if bool(selector) else 1
    else:  # out-of-range indices run the last branch
        branch = int(selector) if 0 <= int(selector) < len(branches) else len(branches) - 1
    return ev.call(branches[branch], [branch_args[branch]])


def _uses_parameters(table: dict[str, Instruction], inst: Instruction) -> bool:
    return inst.opcode == "parameter" or any(_uses_parameters(table, table[o])
                                             for o in inst.operands)


def _signature(inst: Instruction) -> tuple:
    """What an instruction computes, apart from its operands (metadata is only debug info)."""
    attrs = {k: v for k, v in inst.attrs.items() if k != "metadata"}
    return inst.opcode, inst.shape, inst.literal, attrs, len(inst.operands)


def _mirrored(table: dict[str, Instruction], lhs: Instruction, rhs: Instruction) -> bool:
    """True when ``rhs`` computes from the comparator's rhs parameters (odd numbers) exactly
    what ``lhs`` computes from the lhs parameters (even numbers)."""
    if lhs.opcode == "parameter" or rhs.opcode == "parameter":
        return (lhs.opcode == rhs.opcode and lhs.parameter_number % 2 == 0
                and rhs.parameter_number == lhs.parameter_number + 1)
    if _signature(lhs) != _signature(rhs):
        return False
    return all(_mirrored(table, table[a], table[b]) if a != b
               else not _uses_parameters(table, table[a])  # a shared constant subexpression
               for a, b in zip(lhs.operands, rhs.operands))


def _sort_key(comp: Computation) -> tuple[str, bool] | None:
    """(lhs key instruction, descending) for comparators ``f(lhs) < f(rhs)`` (or ``>``).

    That covers plain comparisons and JAX's float comparator, which maps floats to a total-order
    integer key with selects and bitcasts before one compare; those sort by numpy's argsort.
    """
    root = comp.root
    if root.opcode != "compare" or root.attrs["direction"] not in ("LT", "GT"):
        return None
    table = comp.by_name()
    a, b = (table[o] for o in root.operands)
    descending = root.attrs["direction"] == "GT"
    if _mirrored(table, a, b):
        return a.name, descending
    if _mirrored(table, b, a):
        return b.name, not descending
    return None


def _sort_order(ev, comp: Computation, keys: list) -> np.ndarray:
    """Stable sorting permutation along the last axis of ``keys`` under comparator ``comp``."""
    lhs_and_rhs = [k for key in keys for k in (key, key)]  # comparator params alternate lhs/rhs
    found = _sort_key(comp)
    if found is None:
        return _merge_sort_order(ev, comp, keys)
    name, descending = found
    key = np.broadcast_to(ev.call(comp, lhs_and_rhs, result=name), keys[0].shape)
    key = _total_order_key(_widen(key))
    if not descending:
        return np.argsort(key, axis=-1, kind="stable")
    n = key.shape[-1]  # stable descending = mirrored stable ascending of the mirror
    return n - 1 - np.flip(np.argsort(np.flip(key, -1), axis=-1, kind="stable"), -1)


def _merge_sort_order(ev, comp: Computation, keys: list) -> np.ndarray:
    """Bottom-up merge sort with any comparator, vectorized over all rows and runs.

    Each pass merges runs of ``width``: an element's new position is its rank in its own run
    plus the number of partner-run elements that go before it, found by a binary search (the
    partner run is sorted). log2(n) passes of log2(width) lifted comparator calls.
    """
    n = keys[0].shape[-1]
    order = np.broadcast_to(np.arange(n), keys[0].shape).copy()
    position = np.broadcast_to(np.arange(n), order.shape)
    width = 1
    while width < n:
        current = [np.take_along_axis(k, order, -1) for k in keys]

        def less(i, j):  # comparator on the elements at positions i and j of this pass
            args = [np.take_along_axis(k, p, -1) for k in current for p in (i, j)]
            return np.broadcast_to(ev.call(comp, args), i.shape)

        start = position // width * width
        in_left_run = (position // width) % 2 == 0
        partner = np.minimum(np.where(in_left_run, start + width, start - width), n)
        lo, hi = partner, np.minimum(partner + width, n)
        while np.any(lo < hi):
            active = lo < hi
            mid = np.where(active, (lo + hi) // 2, 0)
            # Stability: equal elements of the left run go before those of the right run.
            before = np.where(in_left_run, less(mid, position), ~less(position, mid))
            lo = np.where(active & before, mid + 1, lo)
            hi = np.where(active & ~before, mid, hi)
        new_position = np.minimum(start, partner) + (position - start) + (lo - partner)
        merged = np.empty_like(order)
        np.put_along_axis(merged, new_position, order, axis=-1)
        order, width = merged, width * 2
    return order


def _sort(ev, inst, operands):
    axis = inst.dimensions[0]
    keys = [np.moveaxis(x, axis, -1) for x in operands]
    order = _sort_order(ev, ev.called(inst, "to_apply"), keys)
    return _pack([np.moveaxis(np.take_along_axis(k, order, axis=-1), -1, axis) for k in keys])


def _top_k(ev, inst, operands):
    """XLA's ``TopK`` custom call (lax.top_k on XLA:CPU): the k first elements along the last
    dimension in the order of its comparator (largest first) and their indices, ties in index
    order (XLA:CPU's runtime sorts by the float total order, stabilized by index)."""
    (x,) = operands
    values_shape, index_shape = inst.shape.tuple_shapes
    k = values_shape.dims[-1]
    index = np.broadcast_to(np.arange(x.shape[-1], dtype=index_shape.numpy_dtype), x.shape)
    called = inst.attrs.get("called_computations", "").strip("{} ").lstrip("%")
    if called:
        order = _sort_order(ev, ev.computations[called], [x, index])
    else:
        key = _total_order_key(_widen(x))
        order = np.argsort(-key.astype(np.int64), axis=-1, kind="stable")
    order = order[..., :k]
    return np.take_along_axis(x, order, -1), np.take_along_axis(index, order, -1)


def _custom_call(ev, inst, operands):
    if inst.custom_call_target == "TopK":
        return _top_k(ev, inst, operands)
    # XLA:GPU's library calls (cuBLAS GEMMs, cuDNN convolutions) per their backend_config;
    # gpu_library raises UnsupportedOp for any other target.
    from .gpu_library import evaluate_custom_call  # local: gpu_library imports this module
    return evaluate_custom_call(ev.module, inst, operands)


def _opaque(ev, inst, operands):
    raise UnsupportedOp(f"{inst.opcode} (%{inst.name}): random bits are backend-defined")


# Ops whose float results are rounded (data movement, selection, max/min and sign-like ops are
# exact); fusions, calls, maps and loops round in the computations they run.
_ROUNDING = (set(_UNARY) | set(_BINARY) | {"convert", "reduce", "reduce-window", "scatter",
                                           "select-and-scatter", "dot", "convolution",
                                           "custom-call"}) - {
    "abs", "negate", "maximum", "minimum", "sign", "floor", "ceil", "round-nearest-afz",
    "round-nearest-even", "real", "imag"}

_OPS = {
    **{name: _elementwise(fn) for name, fn in _UNARY.items()},
    **{name: _elementwise(fn) for name, fn in _BINARY.items()},
    "clamp": _elementwise(lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi)),
    "compare": _compare,
    "select": _select,
    "convert": _convert,
    "bitcast-convert": _bitcast_convert,
    "constant": _constant,
    "iota": _iota,
    "broadcast": _broadcast,
    "reshape": _reshape,
    "bitcast": _bitcast,
    "transpose": _transpose,
    "copy": _identity,
    "opt-barrier": _identity,
    "slice": _slice,
    "dynamic-slice": _dynamic_slice,
    "dynamic-update-slice": _dynamic_update_slice,
    "concatenate": _concatenate,
    "pad": _pad,
    "reverse": _reverse,
    "tuple": _tuple,
    "get-tuple-element": _get_tuple_element,
    "reduce": _reduce,
    "reduce-window": _reduce_window,
    "select-and-scatter": _select_and_scatter,
    "gather": _gather,
    "scatter": _scatter,
    "dot": _dot,
    "convolution": _convolution,
    "fusion": _call("calls"),
    "call": _call("to_apply"),
    "map": _map,
    "while": _while,
    "conditional": _conditional,
    "sort": _sort,
    "custom-call": _custom_call,
    "rng": _opaque,
    "rng-bit-generator": _opaque,
}
