"""A pattern's reductions: their space, their stages, and the operand element a point reads.

All reductions of a one-space kernel share one *reduction space* O x R (a reduction turns R
operand elements into each of its O results, over any dimensions in any layout). A *thread
group* owns one result index and runs through its R points; stages are the reductions that
depend on the same number of earlier reductions.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from ...hlo.ir import Shape
from ..errors import CodegenError, Refusal
from ..flatten import FlatOp, Pattern
from ..index_expr import Ix, delinearize, div, ix, linearize, mod, row_major
from ..ops import REDUCIBLE


@dataclass(frozen=True)
class Space:
    """A reduction space O x R: each reduction turns R operand elements into each of its O
    results; a thread group owns one result."""

    groups: int  # O: results of each reduction (1 for the loop schedule)
    reduced: int  # R: operand elements per result (0: no reductions, loop schedule)


def reduction_space(pattern: Pattern) -> Space:
    spaces = set()
    for op in pattern.ops:
        if op.opcode != "reduce":
            continue
        if op.combiner is None and (op.shape.dtype, op.reducer) not in REDUCIBLE:
            raise CodegenError(Refusal.UNSUPPORTED_COMBINER, f"reduce {op.name}: {op.reducer} "
                               f"over {op.shape.dtype} is not supported")
        operand = pattern.op_map()[op.operands[0]].shape
        result = result_shape(op)
        spaces.add((result.num_elements, operand.num_elements // max(result.num_elements, 1)))
    if len(spaces) > 1:
        raise CodegenError(Refusal.DIFFERENT_SPACES,
                           f"reductions over different spaces (results x reduced) "
                           f"{sorted(spaces)}: one kernel needs one thread-group mapping")
    if not spaces:
        return Space(1, 0)
    groups, reduced = spaces.pop()
    return Space(groups, reduced)


def outside_main_space(pattern: Pattern) -> list[str]:
    """Entry nodes holding reductions outside the pattern's main reduction space (the one
    with the most operand elements): a pattern refused for reductions over different spaces
    may build without them (a loss summed over rows beside the rows' own reductions)."""
    by_space: dict[Space, list[str]] = {}
    for op in pattern.ops:
        if op.opcode == "reduce":
            by_space.setdefault(space_of(pattern, op), []).append(op.name)
    if len(by_space) < 2:
        return []
    main = max(by_space, key=lambda s: (s.groups * s.reduced, s.groups))
    # a FlatOp inside a fusion is named "<fusion>/<name>"
    return sorted({name.split("/")[0] for space, names in by_space.items() if space != main
                   for name in names})


def result_shape(op: FlatOp) -> Shape:
    """The shape of a reduction's result (of each result of a variadic one: the same dims)."""
    return op.shape.tuple_shapes[0] if op.shape.is_tuple else op.shape


def space_of(pattern: Pattern, red: FlatOp) -> Space:
    operand = pattern.op_map()[red.operands[0]].shape
    result = result_shape(red)
    return Space(result.num_elements, operand.num_elements // max(result.num_elements, 1))


def reduction_stages(pattern: Pattern) -> list[list[FlatOp]]:
    """Reductions grouped by how many reductions precede them on any path (one loop each)."""
    depth: dict[str, int] = {}
    for op in pattern.ops:
        below = max((depth[o] for o in op.operands), default=0)
        depth[op.name] = below + (1 if op.opcode == "reduce" else 0)
    stages: dict[int, list[FlatOp]] = {}
    for op in pattern.ops:
        if op.opcode == "reduce":
            stages.setdefault(depth[op.name], []).append(op)
    return [stages[k] for k in sorted(stages)]


def ancestors(by_name: dict[str, FlatOp], name: str) -> set[str]:
    """Every op ``name`` depends on. Only this value's: a closure over every op of a large
    pattern was a fifth of the explorer's capability queries."""
    seen, stack = set(), list(by_name[name].operands)
    while stack:
        operand = stack.pop()
        if operand not in seen:
            seen.add(operand)
            stack.extend(by_name[operand].operands)
    return seen


def independent(pattern: Pattern, names: list[str]) -> bool:
    """Whether some two of these values do not depend on each other (kernel packing)."""
    by_name = pattern.op_map()
    distinct = list(dict.fromkeys(names))
    above = {name: ancestors(by_name, name) for name in distinct}
    return any(a not in above[b] and b not in above[a]
               for a, b in itertools.combinations(distinct, 2))


def reduce_operand_index(r: FlatOp, operand: Shape, group: Ix, point: Ix) -> tuple[Ix, ...]:
    """The operand element that point ``point`` (0..R-1) of result ``group`` of r reads.

    Kept dimensions come from the result's physical index, reduced ones from ``point`` taken
    minor-first in the operand's layout (so consecutive points are consecutive in memory when
    the reduced dimensions are the minor ones).
    """
    reduced = set(r.dimensions)
    kept = [d for d in range(operand.rank) if d not in reduced]
    index: list[Ix] = [ix(0)] * operand.rank
    for d, i in zip(kept, delinearize(group, result_shape(r))):
        index[d] = i
    stride = 1
    for d in operand.minor_to_major:
        if d in reduced:
            index[d] = mod(div(point, stride), operand.dims[d])
            stride *= operand.dims[d]
    return tuple(index)


def reshaped(index: tuple[Ix, ...], source: Shape, target: Shape) -> tuple[Ix, ...]:
    """The index of `target` holding the same row-major position as `index` of `source`."""
    return delinearize(linearize(index, row_major(source)), row_major(target))
