"""The drift rule: is a result about as close to the module's exact result as XLA's own?

``widened_to_f64`` writes a module with every float computed in f64 (complex in c128), the
near-exact yardstick for the same inputs (``widened_args``); ``drift_problems`` then asks of
each float output whether it is within DRIFT_FACTOR of XLA's own distance from that yardstick,
plus a floor scaled to the output type's precision (``tolerance``). Other types must equal
XLA's. Reinterpreted bits (dropout's random bits, a sort's total-order keys) keep their width.
"""
from __future__ import annotations

import re

import numpy as np

from .eval_values import NARROW_FLOATS

# The float types the exact module computes in f64 (complex ones in c128); f8 types stay, as
# their conversions are part of what quantized code means.
_WIDENED = re.compile(r"\b(?:bf16|f16|f32)\[")
_WIDENED_COMPLEX = re.compile(r"\bc64\[")
_FLOAT = r"(?:bf16|f16|f32)"
_BITS = r"(?:[su]16|[su]32)"
_SHAPE = r"\[[^\]]*\](?:\{[^}]*\})?"
_RESULT = re.compile(r"^\s*(?:ROOT )?(%?[\w.\-]+) = ((\w+)\[[^\]]*\](?:\{[^}]*\})?) ")
# A float result that reinterprets integer bits (dropout's random bits -> floats in [1, 2): a
# bitcast-convert, or on XLA:GPU a bitcast from u32): in f64 it must stay a reinterpretation of
# the same width, followed by an exact widening.
_FLOAT_REINTERPRET = re.compile(rf"^(\s*)(ROOT )?(%?[\w.\-]+) = ({_FLOAT}{_SHAPE}) "
                                rf"(bitcast-convert|bitcast)\((%?[\w.\-]+)(.*)$")
# The other way: integers that reinterpret a float (a sort's total-order comparator, as in
# TopK): the widened f64 operand is rounded back to its own type first.
_BITS_REINTERPRET = re.compile(rf"^(\s*)(ROOT )?(%?[\w.\-]+) = ({_BITS}{_SHAPE}) "
                               rf"(bitcast-convert|bitcast)\((%?[\w.\-]+)(.*)$")
# XLA:CPU's TopK custom call takes f32 only: in f64 it runs on the operand rounded to f32.
_TOP_K = re.compile(r"^(\s*)(ROOT )?(%?[\w.\-]+) = \((f32\[[^\]]*\](?:\{[^}]*\})?), "
                    r"([su]32\[[^\]]*\](?:\{[^}]*\})?)\) custom-call\((%?[\w.\-]+)\)(.*"
                    r'custom_call_target="TopK".*)$')


def _widened(text: str) -> str:
    return _WIDENED_COMPLEX.sub("c128[", _WIDENED.sub("f64[", text))


def widened_to_f64(text: str) -> str:
    """The module with every f16, bf16 and f32 value computed in f64 and every c64 in c128
    (constants read at f64 precision).

    Running it on ``widened_args`` gives XLA's near-exact result for the same inputs: the
    yardstick for how far an evaluation of the module may drift by rounding alone."""
    results = {m.group(1): m.group(2) for m in map(_RESULT.match, text.splitlines()) if m}
    types = {name: shape.partition("[")[0] for name, shape in results.items()}
    lines = []
    for line in text.splitlines():
        as_float = _FLOAT_REINTERPRET.match(line)
        as_bits = _BITS_REINTERPRET.match(line)
        if as_float and (as_float.group(5) == "bitcast-convert" or
                         re.fullmatch(r"[su]\d+", types.get(as_float.group(6), ""))):
            indent, root, name, shape, opcode, operand, rest = as_float.groups()
            lines.append(f"{indent}{name}.bits = {shape} {opcode}({operand}{rest}")
            lines.append(f"{indent}{root or ''}{name} = {_widened(shape)} convert({name}.bits)")
        elif (top_k := _TOP_K.match(line)) and types.get(top_k.group(6)) == "f32":
            indent, root, name, values, indices, operand, rest = top_k.groups()
            wide = _widened(values)
            lines += [f"{indent}{name}.f32 = {results[operand]} convert({operand})",
                      f"{indent}{name}.top = ({values}, {indices}) custom-call({name}.f32){rest}",
                      f"{indent}{name}.values = {values} get-tuple-element({name}.top), index=0",
                      f"{indent}{name}.indices = {indices} get-tuple-element({name}.top), index=1",
                      f"{indent}{name}.wide = {wide} convert({name}.values)",
                      f"{indent}{root or ''}{name} = ({wide}, {indices}) tuple({name}.wide, "
                      f"{name}.indices)"]
        elif as_bits and re.fullmatch(_FLOAT, types.get(as_bits.group(6), "")):
            indent, root, name, shape, opcode, operand, rest = as_bits.groups()
            lines.append(f"{indent}{name}.narrow = {results[as_bits.group(6)]} "
                         f"convert({operand})")
            lines.append(f"{indent}{root or ''}{name} = {shape} {opcode}({name}.narrow{rest}")
        else:
            lines.append(_widened(line))
    return "\n".join(lines)


def widened_args(args: list) -> list:
    """The arguments of ``widened_to_f64``'s module: the same values, floats in f64 and
    complex numbers in c128."""
    out = []
    for a in args:
        a = np.asarray(a)
        if a.dtype == np.float32 or a.dtype == np.float16 or a.dtype in NARROW_FLOATS:
            a = a.astype(np.float64)
        elif a.dtype == np.complex64:
            a = a.astype(np.complex128)
        out.append(a)
    return out


# How much further from XLA's f64 result an execution of a whole step may be than XLA's own
# result. Measured over the model-zoo workloads (tests/test_evaluator.py, evaluator vs
# XLA:CPU): at most 2.5x per output on ASR, BERT and DIEN, where the evaluator is as often the
# closer one; XLA's own distance moves 2.5x between two compiles of the same module (as is,
# and with every entry value as an output). A 1e-4 relative error in one rsqrt or erf of BERT
# exceeds the bound 15x / 2x. The TF Transformer's training step's worst element is an Adam
# update with the smallest second moment, where which f32 execution lands closer is a coin
# toss: XLA's second compile of the module is 1.5x further than its first on one output and
# 12x on the loss; on six other input seeds the evaluator is at most 3.1x.
DRIFT_FACTOR = 4.0


def tolerance(dtype: np.dtype) -> float:
    """The floor of the drift bound for outputs of ``dtype`` (as rtol and atol): 1e-5 for f32
    (about 84 ulp), two ulp of the narrower types, 1e-12 for f64."""
    dtype = np.dtype(dtype)
    if dtype in (np.dtype(np.float64), np.dtype(np.complex128)):
        return 1e-12
    if dtype in (np.dtype(np.float32), np.dtype(np.complex64)):
        return 1e-5
    import ml_dtypes

    return 2.0 * float(ml_dtypes.finfo(dtype).eps)


def is_float_output(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind in "fc" or np.dtype(dtype) in NARROW_FLOATS


def drift_problems(actual: list, xla: list, exact: list, spread: list | None = None,
                   ) -> list[str]:
    """Outputs where ``actual`` is not about as close to XLA's f64 result (``exact``, from
    ``widened_to_f64``) as XLA's own result (``xla``) is; empty when all are.

    Per float output of type T: |actual - exact| <= DRIFT_FACTOR * max|xla - exact| + tol(T) *
    (1 + max|exact|) over the elements finite in both references (``tolerance``); NaNs and
    infinities where XLA has them. Other element types must equal XLA's. A whole training step
    with random weights amplifies rounding 10^3x and more, so two correct executions differ by
    far more than a fixed tolerance allows; this bound follows the step's own sensitivity.
    ``spread`` (per output, per element: how far from ``exact`` other executions reach, e.g.
    the evaluator with rounding noise) widens the bound element by element."""
    return [text for _, text in _drift(actual, xla, exact, spread)]


def drift_elements(actual: list, xla: list, exact: list, spread: list | None = None) -> int:
    """How many elements ``drift_problems`` finds beyond the bound (a whole output where its
    type, shape or non-finite elements differ)."""
    return sum(elements for elements, _ in _drift(actual, xla, exact, spread))


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)


def _drift(actual, xla, exact, spread) -> list[tuple[int, str]]:
    if not len(actual) == len(xla) == len(exact):
        return [(sum(np.size(a) for a in actual),
                 f"{len(actual)} outputs, XLA has {len(xla)} (f64: {len(exact)})")]
    problems = []
    for i, (a, w, x) in enumerate(zip(actual, xla, exact)):
        a, w, x = np.asarray(a), np.asarray(w), np.asarray(x)
        if a.shape != w.shape or a.dtype != w.dtype:
            problems.append((a.size, f"output {i}: {a.dtype}{list(a.shape)}, XLA "
                                     f"{w.dtype}{list(w.shape)}"))
        elif not is_float_output(a.dtype) or not is_float_output(x.dtype):
            if not np.array_equal(a, w):
                differ = int((a != w).sum())
                problems.append((differ, f"output {i}: {differ} elements differ from XLA"))
        else:
            a, w, x = _wide(a), _wide(w), _wide(x)
            finite = np.isfinite(x) & np.isfinite(w)
            if not np.array_equal(a[~finite], w[~finite], equal_nan=True):
                problems.append((a.size, f"output {i}: NaN/inf elements differ from XLA's"))
                continue
            if not np.isfinite(a[finite]).all():  # a NaN has no distance: never within it
                count = int((~np.isfinite(a[finite])).sum())
                problems.append((count, f"output {i}: {count} NaN/inf elements where XLA's "
                                        f"are finite"))
                continue
            ours = np.abs(a[finite] - x[finite])
            xlas = np.abs(w[finite] - x[finite]).max(initial=0.0)
            scale = np.abs(x[finite]).max(initial=0.0)
            reach = xlas if spread is None else np.maximum(xlas, np.asarray(spread[i])[finite])
            floor = tolerance(np.asarray(actual[i]).dtype) * (1.0 + scale)
            beyond = int((ours > DRIFT_FACTOR * reach + floor).sum())
            if beyond:
                problems.append((beyond, f"output {i}: {beyond} of {ours.size} elements up to "
                                         f"{ours.max():.3g} from XLA's f64 result, XLA's own "
                                         f"{xlas:.3g} (scale {scale:.3g})"))
    return problems
