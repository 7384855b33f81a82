"""The shape rules of HLO the stages rely on, checked before they read an instruction.

The parser checks syntax; XLA's verifier checks these rules, but a module written or edited
by hand (or mutated by a fuzz) reaches us without it. ``instruction_problem`` says which rule
an instruction breaks (None when it breaks none we check), so that the graph leaves it to XLA
as malformed instead of a later stage indexing past a dimension list. Only array shapes are
checked; an opcode without rules here passes.
"""
from __future__ import annotations

import math
import re

from .ir import Computation, Instruction, Module, Shape

ELEMENTWISE = frozenset((
    "abs", "add", "and", "atan2", "cbrt", "ceil", "cosine", "divide", "exponential",
    "exponential-minus-one", "floor", "imag", "is-finite", "log", "log-plus-one", "logistic",
    "maximum", "minimum", "multiply", "negate", "not", "or", "popcnt", "power", "real",
    "remainder", "round-nearest-afz", "round-nearest-even", "rsqrt", "select", "shift-left",
    "shift-right-arithmetic", "shift-right-logical", "sign", "sine", "sqrt", "subtract", "tan",
    "tanh", "xor", "compare", "convert", "erf", "copy", "clz", "reduce-precision", "clamp",
))
_SLICE = re.compile(r"\[(-?\d+):(-?\d+)(?::(-?\d+))?\]")


def module_problem(module: Module, computation: Computation) -> str | None:
    """The first broken rule in ``computation`` and the computations it calls, as
    ``%name: detail``; None when there is none."""
    seen, pending = set(), [computation.name]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        comp = module.computation(name)
        shapes = {inst.name: inst.shape for inst in comp.instructions}
        for inst in comp.instructions:
            problem = instruction_problem(inst, [shapes.get(o) for o in inst.operands])
            if problem is not None:
                return f"%{inst.name}: {problem}"
            pending += inst.called_computations
    return None


def instruction_problem(inst: Instruction, operands: list[Shape | None]) -> str | None:
    """Which shape rule ``inst`` breaks, given its operands' shapes; None when none."""
    result = inst.shape
    if result.is_tuple or any(s is None for s in operands):
        return None
    arrays = [s for s in operands if not s.is_tuple]
    try:
        return _problem(inst, result, operands, arrays)
    except ValueError as exc:  # an attribute that is not a list of integers
        return f"{inst.opcode}: unreadable attribute ({exc})"


def _problem(inst: Instruction, result: Shape, operands: list[Shape],
             arrays: list[Shape]) -> str | None:
    code, dims = inst.opcode, inst.dimensions
    if code in ELEMENTWISE:
        scalars_allowed = code == "clamp"
        for shape in arrays:
            if shape.dims != result.dims and not (scalars_allowed and shape.rank == 0):
                return f"{code} of {shape} has result dimensions {list(result.dims)}"
        return None
    if code == "broadcast":
        return _broadcast(operands[0], result, dims) if len(operands) == 1 else \
            "broadcast takes one operand"
    if code == "iota":
        dim = inst.attrs.get("iota_dimension", "")
        if not dim.strip().isdigit() or int(dim) >= max(result.rank, 1):
            return f"iota_dimension {dim or 'missing'} for a rank-{result.rank} result"
        return None
    if code == "transpose" and len(operands) == 1:
        if sorted(dims) != list(range(operands[0].rank)) or \
                tuple(operands[0].dims[d] for d in dims) != result.dims:
            return f"dimensions {list(dims)} do not transpose {operands[0]} into {result}"
        return None
    if code == "reshape" and len(operands) == 1:
        if operands[0].num_elements != result.num_elements:
            return f"reshape of {operands[0]} into {result} changes the element count"
        return None
    if code == "reverse":
        return _in_range(dims, result.rank, "dimensions")
    if code == "reduce":
        return _reduce(operands, result, dims)
    if code == "concatenate":
        return _concatenate(operands, result, dims)
    if code == "slice" and len(operands) == 1:
        return _slice(operands[0], result, inst.attrs.get("slice", ""))
    if code == "pad" and len(operands) == 2:
        return _pad(operands[0], result, inst.attrs.get("padding", ""))
    if code == "dynamic-slice" and operands:
        return _dynamic_slice(operands, result, inst.int_list_attr("dynamic_slice_sizes"))
    if code == "dynamic-update-slice" and len(operands) >= 2:
        operand, update = operands[0], operands[1]
        if operand.dims != result.dims or update.rank != operand.rank or \
                any(u > o for u, o in zip(update.dims, operand.dims)):
            return f"update {update} does not fit {operand} (result {result})"
        if len(operands) != 2 + operand.rank:
            return f"{len(operands) - 2} start indices for rank {operand.rank}"
    return None


def _in_range(dims: tuple[int, ...], rank: int, what: str) -> str | None:
    if len(set(dims)) != len(dims) or any(not 0 <= d < rank for d in dims):
        return f"{what} {list(dims)} are not distinct dimensions of rank {rank}"
    return None


def _broadcast(operand: Shape, result: Shape, dims: tuple[int, ...]) -> str | None:
    if operand.dtype != result.dtype:
        return f"broadcast changes the element type {operand.dtype} to {result.dtype}"
    if len(dims) != operand.rank:
        return f"{len(dims)} dimensions for a rank-{operand.rank} operand"
    if (problem := _in_range(dims, result.rank, "dimensions")) is not None:
        return problem
    if any(operand.dims[i] != result.dims[d] for i, d in enumerate(dims)):
        return f"{operand} does not broadcast into {result} along {list(dims)}"
    return None


def _reduce(operands: list[Shape], result: Shape, dims: tuple[int, ...]) -> str | None:
    if not operands or len(operands) % 2:
        return "a reduce takes inputs and as many initial values"
    source = operands[0]
    if (problem := _in_range(dims, source.rank, "dimensions")) is not None:
        return problem
    kept = tuple(n for d, n in enumerate(source.dims) if d not in dims)
    if any(s.dims != source.dims for s in operands[:len(operands) // 2]):
        return "the inputs of a reduce differ in shape"
    if kept != result.dims:
        return f"reducing {source} over {list(dims)} does not give {result}"
    return None


def _concatenate(operands: list[Shape], result: Shape, dims: tuple[int, ...]) -> str | None:
    if len(dims) != 1 or not 0 <= dims[0] < result.rank:
        return f"dimensions {list(dims)} of a rank-{result.rank} concatenate"
    dim = dims[0]
    for shape in operands:
        if shape.rank != result.rank or any(n != m for d, (n, m) in
                                            enumerate(zip(shape.dims, result.dims)) if d != dim):
            return f"{shape} does not concatenate into {result} along {dim}"
    if sum(s.dims[dim] for s in operands) != result.dims[dim]:
        return f"the operands' sizes along {dim} do not add up to {result}"
    return None


def _slice(operand: Shape, result: Shape, text: str) -> str | None:
    bounds = _SLICE.findall(text)
    if len(bounds) != operand.rank or result.rank != operand.rank:
        return f"slice={text or 'missing'} for {operand}"
    for size, out, (start, limit, stride) in zip(operand.dims, result.dims, bounds):
        start, limit, stride = int(start), int(limit), int(stride or 1)
        if not 0 <= start <= limit <= size or stride < 1 or \
                out != math.ceil((limit - start) / stride):
            return f"slice={text} of {operand} does not give {result}"
    return None


def _pad(operand: Shape, result: Shape, text: str) -> str | None:
    configs = [part.split("_") for part in text.split("x")] if text else []
    if len(configs) != operand.rank or result.rank != operand.rank or \
            any(len(c) not in (2, 3) for c in configs):
        return f"padding={text or 'missing'} for {operand}"
    for size, out, config in zip(operand.dims, result.dims, configs):
        low, high, interior = (int(v) for v in (config + ["0"])[:3])
        if interior < 0 or out != low + high + size + max(size - 1, 0) * interior:
            return f"padding={text} of {operand} does not give {result}"
    return None


def _dynamic_slice(operands: list[Shape], result: Shape,
                   sizes: tuple[int, ...] | None) -> str | None:
    operand = operands[0]
    if sizes is None or len(sizes) != operand.rank or tuple(sizes) != result.dims or \
            any(s > n for s, n in zip(sizes, operand.dims)):
        return f"dynamic_slice_sizes {sizes} of {operand} for {result}"
    if len(operands) != 1 + operand.rank:
        return f"{len(operands) - 1} start indices for rank {operand.rank}"
    return None
