"""What LLVM and ptxas make of kernel IR, as both counts (instructions, registers) need it:
which loops LLVM unrolls and their trip counts, registers per value, the vector lanes used.
"""
from __future__ import annotations

import dataclasses
import functools

from ..index_expr import Ix, Mod, Var, value_range
from ..kernel_ir import (UNROLL_FACTOR, Compute, GlobalStore, If, Kernel, Loop, Value,
                         VectorExtract, all_statements, used_values)

# 32-bit registers per value; default 1 (a 128-bit vector load's value holds 4)
REGISTER_WIDTH = {"s64": 2, "u64": 2, "f64": 2, "pred": 0, "f32x4": 4, "s32x4": 4}
VECTOR_WIDTHS = ("f32x4", "s32x4")


def trip_count(loop: Loop) -> int:
    """Iterations of the thread that runs the loop longest (its warp waits for it)."""
    lowest_start, _ = value_range(loop.start)
    return max(0, -(-(loop.stop - lowest_start) // loop.step))


def compute_dtype(s: Compute) -> str:
    # compare and select produce pred / take pred; the arithmetic happens in the data type.
    return s.args[-1].dtype if s.args else s.dst.dtype


def used_lanes(body: list) -> dict[Value, int]:
    """Registers of each vector value only read through lane extracts: the lanes whose
    extract is used (ptxas drops the dead lanes of a 128-bit load: the corpus's v4 loads of
    which one lane is used are 32-bit LDGs in their SASS)."""
    used: set[Value] = set()
    extracts: list[VectorExtract] = []
    whole: set[Value] = set()  # vectors read whole (stored, packed): every lane is a register
    _read(body, used, extracts, whole)
    lanes: dict[Value, set[int]] = {}
    for s in extracts:
        lanes.setdefault(s.src, set())
        if s.dst in used:
            lanes[s.src].add(s.lane)
    return {v: max(1, len(used_lanes)) for v, used_lanes in lanes.items() if v not in whole}


def _read(body: list, used: set[Value], extracts: list[VectorExtract], whole: set[Value]
          ) -> None:
    """`used_lanes`' one walk: the values read, the lane extracts in order, the vectors read
    whole. A loop's or branch's used_values repeat its body's, visited here statement by
    statement: only a loop's accumulations add to them."""
    for s in body:
        if isinstance(s, Loop):
            for a in s.accumulates:
                used.add(a.init)
                used.add(a.value)
            _read(s.body, used, extracts, whole)
        elif isinstance(s, If):
            _read(s.body, used, extracts, whole)
        else:
            values = used_values(s)
            used.update(values)
            if isinstance(s, VectorExtract):
                extracts.append(s)
            else:
                whole.update(v for v in values if v.dtype in VECTOR_WIDTHS)


@functools.lru_cache(maxsize=None)
def statement_fields(kind: type) -> tuple[str, ...]:
    """A statement type's field names (none for a type that is not a dataclass): the walks
    read them per statement, where ``dataclasses.fields`` is slow."""
    return tuple(f.name for f in dataclasses.fields(kind)) if dataclasses.is_dataclass(kind) \
        else ()


def _reads_var(body: list, var: Var) -> bool:
    """Whether any index expression in ``body`` reads ``var``."""
    return any(isinstance(value, Ix) and var in value.vars()
               for s in all_statements(body)
               for value in (getattr(s, name) for name in statement_fields(type(s))))


def _known_range(index: Ix, kernel: Kernel) -> tuple[int, int] | None:
    """The range of an index LLVM can prove: threadIdx.x is below the block size (the kernel's
    ``maxntidx`` annotation, from which LLVM's NVVMIntrRange pass bounds the intrinsic: a
    16 x 32 tile of 512 threads unrolls its 8-trip loop over ``tid // 16`` fully, as it would
    not for tid < 1024), remainders are below their divisor; other variables are unknown."""
    lo = hi = index.const
    for atom, c in index.terms:
        if isinstance(atom, Var):
            if atom != kernel.tid:
                return None
            alo, ahi = 0, kernel.block[0] - 1
        elif isinstance(atom, Mod):
            alo, ahi = 0, atom.k - 1
        else:
            inner = _known_range(atom.arg, kernel)
            if inner is None:
                return None
            alo, ahi = inner[0] // atom.k, inner[1] // atom.k
        lo, hi = lo + min(c * alo, c * ahi), hi + max(c * alo, c * ahi)
    return lo, hi


def trip_bounds(loop: Loop, kernel: Kernel) -> tuple[int, int] | None:
    """The fewest and most iterations of any thread, if LLVM can prove them."""
    known = _known_range(loop.start, kernel)
    if known is None:
        return None
    return (max(0, -(-(loop.stop - known[1]) // loop.step)),
            max(0, -(-(loop.stop - known[0]) // loop.step)))


def unrolled_trips(loop: Loop, kernel: Kernel) -> int | None:
    """How often LLVM repeats the body as straight-line code, or None if the loop stays a loop.

    A loop that runs at most once, or whose body never reads its variable (the stores of a
    scalar, seen without a loop in the PTX), is a guarded body. Otherwise only a loop of
    exactly ``UNROLL_FACTOR`` trips for every start LLVM can prove (``_known_range``) becomes
    straight-line code; longer loops are unrolled in groups (counted as loops here), shorter
    ones not at all; loops that store were seen unrolled only partially, which leaves their
    values short-lived, so they count as loops. LLVM also keeps an 8-trip loop with a large
    body a loop (UNROLL_FACTOR), which this does not see: such a loop is priced as unrolled."""
    if not loop.accumulates and not _reads_var(loop.body, loop.var):
        return 1
    bounds = trip_bounds(loop, kernel)
    if bounds is None:
        return None
    least, most = bounds
    if most <= 1:
        return most
    stores = any(isinstance(x, GlobalStore) for x in all_statements(loop.body))
    if most == least == UNROLL_FACTOR and not stores:
        return most
    return None
