"""Host kernels: an expensive value with few distinct inputs, computed many times over, is
computed once per input into a table by each part's prologue (`Kernel.part_prologue`) and
read from there.

Two forms: an op of one element of a small input (``sin(angles[i])``), and a value computed
from index values and constants alone (``cos(position * 10000^(-d/4))``, RoPE's angles from
iota). XLA and the GPU schedule compute both once per output element; on one CPU core each is
a polynomial or a C-library call per element (keras_hub Llama train: 9,216 sines and cosines
of 128 angles in one kernel). A table costs one evaluation per entry and part.
"""
from __future__ import annotations

import dataclasses
import math

from ..host import max_parts, split_extent
from ..index_expr import FloorDiv, Ix, Mod, Var, add, ix, scale, value_range
from ..kernel_ir import (Compute, Const, GlobalLoad, If, IndexValue, Kernel, Loop, SharedArray,
                         SharedLoad, SharedStore, Value, all_statements)
from .host_reuse import EXPENSIVE

# A value is tabulated when the kernel would compute it at least this many times per entry
# and part: each part fills its own table (one evaluation, one store per entry).
TABULATE_REUSE = 4
TABULATED_ELEMENTS = 1 << 16  # at most this many entries per table (heap memory of the call)


@dataclasses.dataclass
class _Candidate:
    """The values of one table: its entries, how to fill entry ``at`` (statements and the
    value stored), and each use's entry as an index expression."""

    dtype: str
    entries: int
    fill: object  # (vars of the fill loops, names) -> (statements, value to store)
    extents: tuple[int, ...]  # the fill loops' trips, outer first
    uses: dict[Value, Ix] = dataclasses.field(default_factory=dict)
    evaluations: int = 0


def tabulate_small_inputs(kernel: Kernel) -> Kernel:
    """``kernel`` with each expensive value of few distinct inputs that it computes at least
    TABULATE_REUSE times per table entry and part read from a table its parts fill first."""
    if kernel.block[0] != 1:  # the threads of a block would each fill the table
        return kernel
    reuse = TABULATE_REUSE * max_parts(split_extent(kernel),
                                       sum(b.shape.byte_size for b in kernel.buffers))
    defs = {v: s for s in all_statements(kernel.body) for v in _defined(s)}
    candidates: dict[tuple, _Candidate] = {}  # in the body's order
    for s, trips in _with_trips(kernel.body, kernel.grid[0]):
        if not (isinstance(s, Compute) and s.op in EXPENSIVE):
            continue
        found = _of_an_input(kernel, s, defs) or _of_indices(s, defs)
        if found is None:
            continue
        key, candidate, at = found
        candidate = candidates.setdefault(key, candidate)
        candidate.uses[s.dst] = at
        candidate.evaluations += trips
    tables, prologue, uses = [], [], {}
    for candidate in candidates.values():
        if candidate.evaluations < reuse * candidate.entries \
                or candidate.entries > TABULATED_ELEMENTS:
            continue
        k = len(tables)
        table = SharedArray(f"table{k}", candidate.dtype, candidate.entries)
        tables.append(table)
        loops = [Var(f"tab{k}_{i}", n) for i, n in enumerate(candidate.extents)]
        statements, value = candidate.fill(loops, f"tab{k}v")
        at = add(*[scale(v, math.prod(candidate.extents[i + 1:])) for i, v in enumerate(loops)])
        body = statements + [SharedStore(table, at, value)]
        for var, n in reversed(list(zip(loops, candidate.extents))):
            body = [Loop(var, ix(0), n, 1, body)]
        prologue += body
        uses.update({v: SharedLoad(v, table, entry) for v, entry in candidate.uses.items()})
    if not tables:
        return kernel
    return dataclasses.replace(kernel, body=_rewritten(kernel.body, uses),
                               part_prologue=prologue, scratch=kernel.scratch + tables)


def _of_an_input(kernel: Kernel, s: Compute, defs: dict):
    """``op(buffer[i])`` of an input buffer: (key, candidate, the use's entry) or None."""
    load = defs.get(s.args[0]) if len(s.args) == 1 else None
    if not isinstance(load, GlobalLoad) or kernel.buffers[load.buffer].is_output \
            or "x" in load.dst.dtype:  # a 4-lane vector load
        return None
    elements = kernel.buffers[load.buffer].shape.num_elements

    def fill(loops: list[Var], prefix: str):
        x, y = Value(prefix + "x", load.dst.dtype), Value(prefix + "y", s.dst.dtype)
        return [GlobalLoad(x, load.buffer, ix(loops[0])), Compute(y, s.op, [x], s.attr)], y

    return (("input", s.op, s.attr, load.buffer),
            _Candidate(s.dst.dtype, elements, fill, (elements,)), load.offset)


def _of_indices(s: Compute, defs: dict):
    """A value computed from index values and constants alone: (key, candidate, the use's
    entry) or None. The table's entries run over every index value's range (row-major)."""
    leaves: list[IndexValue] = []
    forms: dict[Value, tuple | None] = {}  # a value's operands are often shared: walk each once

    def form(v: Value):
        if v not in forms:
            forms[v] = _form(v)
        return forms[v]

    def _form(v: Value):
        d = defs.get(v)
        if isinstance(d, Compute):
            args = [form(a) for a in d.args]
            return None if None in args else ("op", d.op, d.dst.dtype, d.attr, tuple(args))
        if isinstance(d, Const):
            return ("const", d.dst.dtype, repr(d.value))
        if isinstance(d, IndexValue):
            if d not in leaves:
                leaves.append(d)
            return ("leaf", leaves.index(d))
        return None  # a load, an accumulator, a value from outside

    shape = form(s.dst)
    if shape is None or not leaves or not all(_exact_range(leaf.index) for leaf in leaves):
        return None
    ranges = [value_range(leaf.index) for leaf in leaves]
    extents = tuple(hi - lo + 1 for lo, hi in ranges)
    entries = math.prod(extents)
    at = add(*[scale(add(leaf.index, -lo), math.prod(extents[i + 1:]))
               for i, (leaf, (lo, _)) in enumerate(zip(leaves, ranges))])

    def fill(loops: list[Var], prefix: str):
        statements, names = [], {}

        def emit(v: Value) -> Value:
            if v in names:
                return names[v]
            d = defs[v]
            args = [emit(a) for a in d.args] if isinstance(d, Compute) else []
            new = names[v] = Value(f"{prefix}{len(names)}", v.dtype)  # after its operands'
            if isinstance(d, Compute):
                statements.append(Compute(new, d.op, args, d.attr))
            elif isinstance(d, Const):
                statements.append(Const(new, d.value))
            else:
                i = leaves.index(d)
                statements.append(IndexValue(new, add(loops[i], ranges[i][0])))
            return new

        return statements, emit(s.dst)

    return ("indices", shape, tuple(ranges)), _Candidate(s.dst.dtype, entries, fill, extents), at


def _exact_range(x: Ix) -> bool:
    """`value_range` holds the values x takes: no quotient or remainder of a value that may be
    negative (there the range is a guess, and the lowering divides unsigned)."""
    for atom, _ in x.terms:
        if isinstance(atom, (FloorDiv, Mod)) and (value_range(atom.arg)[0] < 0
                                                   or not _exact_range(atom.arg)):
            return False
    return True


def _defined(s) -> list[Value]:
    return [s.dst] if isinstance(s, (Compute, Const, IndexValue, GlobalLoad)) else []


def _rewritten(body: list, uses: dict[Value, SharedLoad]) -> list:
    out = []
    for s in body:
        if isinstance(s, Compute) and s.dst in uses:
            out.append(uses[s.dst])
        elif isinstance(s, (Loop, If)):
            out.append(dataclasses.replace(s, body=_rewritten(s.body, uses)))
        else:
            out.append(s)
    return out


def _with_trips(body: list, trips: int):
    """(statement, how many times a call runs it) of every statement, inner ones included
    (a loop's trips as stop / step; an If as if always taken)."""
    for s in body:
        yield s, trips
        if isinstance(s, Loop):
            yield from _with_trips(s.body, trips * -(-s.stop // s.step))
        elif isinstance(s, If):
            yield from _with_trips(s.body, trips)
