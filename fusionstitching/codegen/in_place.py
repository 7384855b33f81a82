"""Whether a host kernel may write an output over one of its inputs (XLA's
``output_to_operand_aliasing``), proved on its kernel IR.

It may when each element of the input is read only by the iteration that writes that element
of the output: every load of the input sits in the store's statement list, at its offset and
width, and the store's offsets over all blocks, threads, loops and guards never repeat (seen
in a mixed-radix offset, else enumerated). One thread may also read it all in statements
before the store's. `written_over` moves loads that follow the store before it.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

import numpy as np

from .host import split_loop
from .index_expr import Var, ix
from .kernel_ir import LANE_TYPES, VECTOR_LANES, DynamicIndex, GlobalLoad, GlobalStore, If, \
    IndexLet, Kernel, Loop

# The store's iterations are enumerated up to this many (64 MiB of int64 per index array).
MAX_ITERATIONS = 1 << 23


class RefusalKind(str, enum.Enum):
    SHAPE = "shape"  # the two buffers differ in dtype, dimensions or layout
    STORES = "stores"  # the output is stored by more or fewer than one statement
    READ_ELSEWHERE = "read-elsewhere"  # a load of the input outside the store's statement
    # list, or at another offset or width
    VALUE_INDEXED = "value-indexed"  # the store's offset depends on loaded data
    REPEATED = "repeated"  # two iterations store the same element
    TOO_MANY = "too-many"  # more iterations than MAX_ITERATIONS to enumerate


@dataclass(frozen=True)
class Refusal:
    kind: RefusalKind
    detail: str


def refusal(kernel: Kernel, source: int, output: int) -> Refusal | None:
    """None when buffer ``output`` may be written over buffer ``source`` (an input)."""
    a, o = kernel.buffers[source].shape, kernel.buffers[output].shape
    if not a.same_array(o):
        return Refusal(RefusalKind.SHAPE, f"{a} against {o}")
    stores, loads = [], []
    for statements, path in _lists(kernel):
        for position, s in enumerate(statements):
            if isinstance(s, GlobalStore) and s.buffer == output:
                stores.append((statements, path, position, s))
            elif isinstance(s, GlobalLoad) and s.buffer == source:
                loads.append((statements, _top(kernel, path, position), s))
    if len(stores) != 1:
        return Refusal(RefusalKind.STORES, f"{len(stores)} stores of the output")
    statements, path, at, store = stores[0]
    if path is None:
        return Refusal(RefusalKind.STORES, "the output is stored before the blocks")
    if _sequential(kernel):  # one thread runs it all: reads in statements before the
        # store's are over before the first write
        loads = [load for load in loads if load[1] >= _top(kernel, path, at)]
        if not loads:
            return None
    lanes = _lanes(store.value.dtype)
    for where, _, load in loads:
        if where is not statements or load.offset != store.offset \
                or _lanes(load.dst.dtype) != lanes:
            return Refusal(RefusalKind.READ_ELSEWHERE, f"input read at [{load.offset}] against "
                           f"the store at [{store.offset}]")
    if _mixed_radix(kernel, path, store.offset, lanes):
        return None
    offsets = _offsets(kernel, path, statements[:at], store)
    if isinstance(offsets, Refusal):
        return offsets
    elements = (offsets[:, None] + np.arange(lanes)).ravel()
    size = max(o.num_elements, 1)
    if elements.size and (elements.min() < 0 or elements.max() >= size
                          or np.bincount(elements, minlength=size).max() > 1):
        return Refusal(RefusalKind.REPEATED, f"stores at [{store.offset}] repeat an element")
    return None


def written_over(kernel: Kernel, pairs: tuple[tuple[int, int], ...]) -> Kernel:
    """``kernel`` storing each (input, output) pair's output over its input (`refusal` said
    None for each): the input's loads after the store move before it (they read the
    element the store replaces), and ``in_place`` lists the pairs."""
    body = kernel.body
    for source, output in pairs:
        body = _loads_first(body, source, output)
    return dataclasses.replace(kernel, body=body, in_place=tuple(pairs))


def _loads_first(statements: list, source: int, output: int) -> list:
    """``statements`` (a new list where anything moved) with the loads of ``source`` that
    follow the store of ``output`` moved just before it."""
    for at, s in enumerate(statements):
        if isinstance(s, GlobalStore) and s.buffer == output:
            after = [t for t in statements[at + 1:]
                     if isinstance(t, GlobalLoad) and t.buffer == source]
            if not after:
                return statements
            rest = [t for t in statements[at + 1:] if not any(t is a for a in after)]
            return statements[:at] + after + [s] + rest
        if isinstance(s, (Loop, If)):
            body = _loads_first(s.body, source, output)
            if body is not s.body:
                return statements[:at] + [dataclasses.replace(s, body=body)] + \
                    statements[at + 1:]
    return statements


def _mixed_radix(kernel: Kernel, path: list, offset, lanes: int) -> bool:
    """True when the offset is ``sum(c_i * v_i) + k`` over loop variables (from 0, step 1),
    threads and blocks, whose coefficients, in increasing order, each clear the span of the
    terms below (the first clears the store's width): distinct iterations then store
    distinct elements, however many there are (an embedding's update has more iterations
    than are worth enumerating)."""
    extents = {kernel.bid: kernel.grid[0], kernel.tid: kernel.block[0]}
    for s in path:
        if isinstance(s, Loop):
            if s.start != ix(0) or s.step != 1:
                return False
            extents[s.var] = s.stop
    terms = []
    for atom, c in offset.terms:
        if not isinstance(atom, Var) or atom not in extents or c <= 0:
            return False
        terms.append((c, extents[atom]))
    span = lanes
    for c, n in sorted(terms):
        if c < span:
            return False
        span = c * n
    return True


def _sequential(kernel: Kernel) -> bool:
    """One block of one thread, run as one part: statements run in their order, once."""
    return kernel.grid[0] == 1 and kernel.block[0] == 1 and split_loop(kernel) is None


def _top(kernel: Kernel, path: list | None, position: int) -> int:
    """Which top-level statement of the body holds statement ``position`` of the list at
    ``path`` (-1: a prologue, run before the body)."""
    if path is None:
        return -1
    return position if not path else next(i for i, s in enumerate(kernel.body) if s is path[0])


def _lanes(dtype: str) -> int:
    return VECTOR_LANES if dtype in LANE_TYPES else 1


def _lists(kernel: Kernel):
    """Every statement list with the Loops and Ifs around it (None: a prologue's, run once
    per call or part, outside the blocks)."""
    for prologue in (kernel.part_prologue, kernel.prologue):
        yield from _nested(prologue, None)
    yield from _nested(kernel.body, [])


def _nested(statements: list, path: list | None):
    yield statements, path
    for s in statements:
        if isinstance(s, (Loop, If)):
            yield from _nested(s.body, None if path is None else path + [s])


def _offsets(kernel: Kernel, path: list, before: list, store: GlobalStore
             ) -> np.ndarray | Refusal:
    """The store's offset in every iteration that runs it: blocks x threads, each Loop of
    ``path`` expanded, each If filtered, the IndexLets before it evaluated on the way."""
    env = {kernel.bid.name: np.repeat(np.arange(kernel.grid[0]), kernel.block[0]),
           kernel.tid.name: np.tile(np.arange(kernel.block[0]), kernel.grid[0])}
    dynamic: set[str] = set()
    levels = [kernel.body] + [s.body for s in path]
    for depth, statements in enumerate(levels):
        inner = path[depth] if depth < len(path) else None
        for s in before if inner is None else statements[:_index(statements, inner)]:
            _let(s, env, dynamic)
        if inner is None:
            break
        env = _enter(inner, env, dynamic)
        if isinstance(env, Refusal):
            return env
    if any(v.name in dynamic for v in store.offset.vars()):
        return Refusal(RefusalKind.VALUE_INDEXED, f"the store's offset [{store.offset}] "
                       "depends on loaded values")
    count = len(next(iter(env.values())))
    return np.broadcast_to(store.offset.evaluate(env), (count,)).astype(np.int64)


def _index(statements: list, target) -> int:
    return next(i for i, s in enumerate(statements) if s is target)


def _let(s, env: dict, dynamic: set) -> None:
    count = len(next(iter(env.values())))
    if isinstance(s, IndexLet):
        if any(v.name in dynamic for v in s.index.vars()):
            dynamic.add(s.var.name)
        else:
            env[s.var.name] = np.broadcast_to(s.index.evaluate(env), (count,))
    elif isinstance(s, DynamicIndex):
        dynamic.add(s.var.name)


def _enter(s, env: dict, dynamic: set) -> dict | Refusal:
    """``env`` inside Loop or If ``s``."""
    bounds = (s.lhs, s.rhs) if isinstance(s, If) else (s.start,)
    if any(v.name in dynamic for b in bounds for v in b.vars()):
        return Refusal(RefusalKind.VALUE_INDEXED, "the store runs under a loop or guard that "
                       "depends on loaded values")
    count = len(next(iter(env.values())))
    if isinstance(s, If):
        lhs = np.broadcast_to(s.lhs.evaluate(env), (count,))
        rhs = np.broadcast_to(s.rhs.evaluate(env), (count,))
        keep = lhs == rhs if s.cmp == "eq" else lhs < rhs
        return {k: v[keep] for k, v in env.items()}
    start = np.broadcast_to(s.start.evaluate(env), (count,)).astype(np.int64)
    trips = np.maximum(0, -((start - s.stop) // s.step))  # ceil((stop - start) / step)
    total = int(trips.sum())
    if total > MAX_ITERATIONS:
        return Refusal(RefusalKind.TOO_MANY, f"{total} iterations to enumerate")
    inner = {k: np.repeat(v, trips) for k, v in env.items()}
    first = np.repeat(np.cumsum(trips) - trips, trips)
    inner[s.var.name] = np.repeat(start, trips) + s.step * (np.arange(total) - first)
    return inner
