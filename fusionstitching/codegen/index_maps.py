"""Values of integer ops known from the index alone, before any code is emitted.

`known_index` follows an element through the ops that only move elements (bitcast, reshape,
copy, broadcast, transpose, slice, concatenate at a known position) down to an `iota` or a
scalar constant, and returns its value as an index expression of the element's own index.
The scatter of a one-hot gradient (``take_along_axis`` transposed: indices built as
``concatenate(iota, labels)``) uses it to see that window ``b`` can only land on row ``b``.
"""
from __future__ import annotations

import re

from ..hlo.evaluator import parse_literal
from ..hlo.ir import Shape
from .flatten import FlatOp
from .kernel_ir import Ix, Var, add, delinearize, ix, linearize, row_major, scale, value_range


def slice_starts_strides(op: FlatOp) -> list[tuple[int, int]]:
    """(start, stride) per dimension of a slice's ``slice={[a:b:s], ...}``."""
    ranges = re.findall(r"\[(-?\d+):(-?\d+)(?::(\d+))?\]", op.attrs.get("slice", ""))
    return [(int(a), int(s or 1)) for a, _, s in ranges]


def known_index(ops: dict[str, FlatOp], name: str, index: tuple[Ix, ...]) -> Ix | None:
    """The s32 value of element ``index`` of op ``name`` as an index expression, or None
    when it depends on data (or goes through an op not followed here)."""
    op = ops[name]
    if op.shape.dtype != "s32":
        return None
    source = lambda i: ops[op.operands[i]].shape  # noqa: E731 (one line per op below)
    match op.opcode:
        case "iota":
            return index[int(op.attrs["iota_dimension"])]
        case "constant" if not op.shape.dims and op.literal is not None:
            return ix(int(parse_literal(op.literal, op.shape).reshape(-1)[0]))
        case "broadcast":
            return known_index(ops, op.operands[0], tuple(index[d] for d in op.dimensions))
        case "copy":
            return known_index(ops, op.operands[0], index)
        case "reshape":
            flat = linearize(index, row_major(op.shape))
            return known_index(ops, op.operands[0], delinearize(flat, row_major(source(0))))
        case "bitcast" if source(0).dtype == "s32":
            return known_index(ops, op.operands[0],
                               delinearize(linearize(index, op.shape), source(0)))
        case "transpose":
            moved: list[Ix] = [ix(0)] * len(index)
            for out_dim, in_dim in enumerate(op.dimensions):
                moved[in_dim] = index[out_dim]
            return known_index(ops, op.operands[0], tuple(moved))
        case "slice":
            return known_index(ops, op.operands[0], tuple(
                add(scale(i, stride), start)
                for i, (start, stride) in zip(index, slice_starts_strides(op))))
        case "concatenate":
            return _concatenated(ops, op, index)
    return None


def _concatenated(ops: dict[str, FlatOp], op: FlatOp, index: tuple[Ix, ...]) -> Ix | None:
    """Only where the position along the concatenated dimension is a known number."""
    dim = op.dimensions[0]
    lo, hi = value_range(index[dim])
    if lo != hi:
        return None
    start = 0
    for name in op.operands:
        size: Shape = ops[name].shape
        if lo < start + size.dims[dim]:
            local = index[:dim] + (ix(lo - start),) + index[dim + 1:]
            return known_index(ops, name, local)
        start += size.dims[dim]
    return None


def iota_starts(ops: dict[str, FlatOp], op: FlatOp, to_operand: tuple[int, ...], vector_dim: int,
                extents: tuple[int, ...], size: list[int], operand: Shape) -> dict[int, int]:
    """A scatter's operand dims whose start index is, for every window, the window's own
    coordinate on one scatter dim (``indices = concatenate(iota, labels)``), mapped to that
    scatter dim. Taken only for windows of size 1 there and a scatter dim that covers every
    row (each row then receives exactly the one window at its own coordinate)."""
    coordinates = [Var(f"window{s}", n) for s, n in enumerate(extents)]
    indices_rank = ops[op.operands[1]].shape.rank
    fixed: dict[int, int] = {}
    for k, d in enumerate(to_operand):
        batch = [ix(v) for v in coordinates]
        at = batch[:vector_dim] + [ix(k)] + batch[vector_dim:] \
            if vector_dim < indices_rank else batch
        start = known_index(ops, op.operands[1], tuple(at))
        for s, v in enumerate(coordinates):
            if start == ix(v) and size[d] == 1 and operand.dims[d] <= extents[s] \
                    and s not in fixed.values():
                fixed[d] = s
    return fixed
