"""A thread's walk over its points: loops, unrolled runs, and the packed loops over outputs.

`over_points` visits a thread's points as a loop or straight-line code; `in_runs` as a loop
over unrolled runs of UNROLL_FACTOR; `packed_outputs` writes outputs of other sizes as
independent grid-stride loops (kernel packing).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...hlo.ir import Shape
from ..flatten import Pattern
from ..index_expr import Ix, Var, add, delinearize, ix, linearize, scale, value_range
from ..kernel_ir import (UNROLL_FACTOR, Accumulate, GlobalStore, If, IndexLet, Loop, Value,
                         wide_accumulator)
from ..ops import identity
from .emitter import Emitter
from .space import independent, reshaped


@dataclass(frozen=True)
class Points:
    """The points 0..count-1 a thread visits: chunks of ``vector`` consecutive points, chunk
    ``member`` first and every ``step``-th after it; a loop, or unrolled into straight-line
    code (then the values computed at the points stay at thread level, cached for later
    stages by the emitter)."""

    member: Ix
    count: int
    step: int
    vector: int = 1
    unrolled: bool = False
    name: str = "r"
    # A lone thread's loop over all chunks (step 1) as two nested loops, the inner over this
    # many chunks (an output's minor dimension): its index is then ``outer * minor + inner``,
    # so a broadcast operand reads at ``inner`` or ``outer``, not at a remainder or quotient
    # of the flat index, and LLVM vectorizes the inner loop (the host kernel's loop schedule).
    minor: int = 0


def over_points(em: Emitter, points: Points, visit, reducers: list[str]) -> list[Value]:
    """Calls ``visit(point)`` at each of the thread's points; ``visit`` returns one value per
    reducer, combined in point order into the thread's partial results (starting from the
    identity), which are returned.

    When the threads cover the chunks in one pass (step >= chunks), there is no loop: each
    thread's chunk is straight-line code at thread level, under an ``if`` when some threads
    have none (and nothing is reduced), as XLA's loop kernels do. A loop would cost a
    counter, a pointer per access (strength reduction) and a branch for a single trip."""
    chunks = points.count // points.vector
    single = points.step >= chunks
    scope = len(em.scopes) - 1  # a phased kernel's loop over R nests in its loop over results
    if points.unrolled or (single and value_range(points.member)[1] < chunks):
        partials = None
        for k in range(chunks // points.step):
            chunk = add(points.member, k * points.step)
            for j in range(points.vector):
                values = visit(add(scale(chunk, points.vector), j))
                partials = values if partials is None else [
                    em.op(kind, value[0].dtype, partial, value)
                    for kind, partial, value in zip(reducers, partials, values)]
        return [v for v, _ in partials or []]
    if points.minor > 1 and points.step == 1 and value_range(points.member) == (0, 0) \
            and chunks % points.minor == 0 and chunks > points.minor and not reducers:
        _nested_loops(em, points, visit, scope)
        return []
    chunk = Var(points.name, chunks)
    em.open_loop(chunk)
    per_chunk = None
    for j in range(points.vector):
        values = visit(add(scale(chunk, points.vector), j))
        per_chunk = values if per_chunk is None else [
            em.op(kind, value[0].dtype, partial, value)
            for kind, partial, value in zip(reducers, per_chunk, values)]
    if single and not reducers:
        body = em.close_loop()
        em.place(If(points.member, ix(chunks), [IndexLet(chunk, points.member)] + body, "lt"),
                 scope)
        return []
    accumulates = accumulations(em, reducers, [v for v, _ in per_chunk or []])
    em.place(Loop(chunk, points.member, chunks, points.step, em.close_loop(), accumulates), scope)
    return accumulated(em, accumulates, scope)


def _nested_loops(em: Emitter, points: Points, visit, scope: int) -> None:
    """`over_points` of a lone thread (``points.minor``; its member is 0): a loop over rows of
    ``minor`` chunks, and in it a loop over the row's chunks."""
    chunks = points.count // points.vector
    outer = Var(f"{points.name}o", chunks // points.minor)
    inner = Var(f"{points.name}i", points.minor)
    em.open_loop(outer)
    em.open_loop(inner)
    chunk = add(scale(outer, points.minor), inner)
    for j in range(points.vector):
        visit(add(scale(chunk, points.vector), j))
    row = em.close_loop()
    em.place(Loop(inner, ix(0), points.minor, 1, row, []), len(em.scopes) - 1)
    rows = em.close_loop()
    em.place(Loop(outer, ix(0), outer.extent, 1, rows, []), scope)


def stores_at_group(em: Emitter, result: Shape, group: Var, outputs: list,
                    first_output: int) -> list[GlobalStore]:
    """The stores of per-group outputs (as many elements as ``result``, a reduction's result
    shape) at the element of result ``group``."""
    stores = []
    for i, shape, value_name in outputs:
        if first_output + i in em.filled_outputs:
            continue
        index = reshaped(delinearize(ix(group), result), result, shape)
        value, _ = em.value(value_name, index)
        if first_output + i not in em.filled_outputs:  # filled by the value just computed
            stores.append(GlobalStore(first_output + i, linearize(index, shape), value))
    return stores


def packed_outputs(em: Emitter, pattern: Pattern, packed: list, first_output: int,
                   element: Ix, step: int, vector: int, after_reductions: bool,
                   schemes: set[str], unroll: bool = False) -> None:
    """Packed loops: every thread (the first at ``element``, the next ``step`` further)
    strides over the elements of each output size. ``unroll``: the loops `unroll_short`
    takes are unrolled (in runs, `in_runs`): a loop that stores stays a loop in LLVM, one
    load latency per trip (BERT train JAX's 10-phase LayerNorm-backward chain waited 25 of
    its 31 modeled load latencies in its two output loops)."""
    by_size: dict[int, list] = {}
    for out in (o for o in packed if first_output + o[0] not in em.filled_outputs):
        by_size.setdefault(out[1].num_elements, []).append(out)
    if len(by_size) > 1 or (after_reductions and by_size):
        schemes.add("kernel_packing")
    for n, outs in by_size.items():
        def store_element(at_element: Ix, outs=outs) -> list:
            at = delinearize(at_element, outs[0][1])  # the first output is written coalesced
            for i, shape, value_name in outs:
                if first_output + i in em.filled_outputs:  # a value computed once into it
                    continue
                index = reshaped(at, outs[0][1], shape)
                value, _ = em.value(value_name, index)
                if first_output + i not in em.filled_outputs:
                    em.store(first_output + i, shape, linearize(index, shape), value)
            return []
        vector_n = vector if n % vector == 0 else 1
        shape = outs[0][1]
        minor = shape.dims[shape.minor_to_major[0]] // vector_n if shape.rank and step == 1 else 0
        in_runs(em, Points(element, n, step, vector_n,
                           unroll and unroll_short(em, n // vector_n, step), f"e{n}", minor),
                store_element, [], f"qe{n}")
        em.flush_stores(0)
        if len(outs) > 1 and independent(pattern, [v for _, _, v in outs]):
            schemes.add("kernel_packing")


def in_runs(em: Emitter, points: Points, visit, reducers: list[str], runs_name: str,
            always: bool = False) -> list[Value]:
    """``over_points`` for a thread's points of more than UNROLL_FACTOR trips (a multiple of
    it, the same for every thread) as a loop over runs of UNROLL_FACTOR trips, each run
    unrolled when ``points.unrolled`` (its loads issue together) and else a loop LLVM
    unrolls; ``always``: in runs even when not unrolled. Otherwise ``over_points`` itself.
    The runs' partial results are combined in order."""
    trips = points.count // points.vector // points.step
    if trips <= UNROLL_FACTOR or not (points.unrolled or always):
        return over_points(em, points, visit, reducers)
    scope = len(em.scopes) - 1
    runs = Var(runs_name, trips // UNROLL_FACTOR)
    em.open_loop(runs)
    run = dataclasses.replace(points, count=UNROLL_FACTOR * points.step * points.vector)
    partials = over_points(em, run, lambda point: visit(
        add(scale(runs, UNROLL_FACTOR * points.step * points.vector), point)), reducers)
    accumulates = accumulations(em, reducers, partials)
    em.place(Loop(runs, ix(0), trips // UNROLL_FACTOR, 1, em.close_loop(), accumulates), scope)
    return accumulated(em, accumulates, scope)


def accumulations(em: Emitter, reducers: list[str], values: list[Value]) -> list[Accumulate]:
    """The loop-carried combinations of ``values`` (defined in the loop being built, the
    innermost scope), each from its combiner's identity; an f32 sum or product in a wide
    accumulator (kernel_ir.wide_accumulator), each value converted in the loop."""
    accumulates = []
    body = len(em.scopes) - 1
    for kind, value in zip(reducers, values):
        wide = wide_accumulator(kind, value.dtype)
        if wide is not None:
            value, _ = em.op("convert", wide, (value, body))
        init, _ = em.const(identity(kind, value.dtype), value.dtype)
        accumulates.append(Accumulate(em.fresh(value.dtype), kind, init, value))
    return accumulates


def accumulated(em: Emitter, accumulates: list[Accumulate], scope: int) -> list[Value]:
    """The loop's results in ``scope``, after it: a wide accumulator rounded once."""
    results = []
    for a in accumulates:
        if a.value.dtype == "f64":
            results.append(em.op("convert", "f32", (a.dst, scope))[0])
        else:
            results.append(a.dst)
    return results


def unroll_short(em: Emitter, count: int, step: int) -> bool:
    """Whether a thread's loop over ``count`` points, ``step`` apart, is emitted unrolled: in
    the schedule's variant that unrolls loops (``Schedule.unrolled``), those of the same
    trips for every thread, 2 to UNROLL_FACTOR of them or a multiple of UNROLL_FACTOR (then
    in runs, `in_runs`). LLVM keeps a loop of fewer trips with one load in flight per trip,
    one of UNROLL_FACTOR trips too when its body is large (the PTX of BERT train JAX's
    6-phase LayerNorm chain: phases 2-5's 8-trip loops stay loops, 82 loads in 6 barrier
    intervals; unrolled here, 80 loads in 3, since the values of one phase's points stay in
    registers for the next), and a longer one a loop of partly unrolled trips. Unrolled, its
    loads issue together, but their values take registers; the latency-evaluator chooses
    between the two variants."""
    trips = count // step
    unrolls = count % step == 0 and 1 < trips and (trips <= UNROLL_FACTOR or
                                                     trips % UNROLL_FACTOR == 0)
    em.short_loops += unrolls  # either way: a twin without any is refused as the same kernel
    return em.unroll_short and unrolls
