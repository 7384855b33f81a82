"""Reductions: a group's partial values combined across its threads (warp, block or tile),
variadic reductions (argmax) by one thread in XLA:CPU's order, and init values.

A variadic reduction runs its combiner computation inlined on the accumulators, serially
from the init values in row-major order of the reduced dimensions, as XLA:CPU combines them,
so that any combiner (argmax's ties and NaNs) gives XLA:CPU's result.
"""
from __future__ import annotations

from ..errors import CodegenError, Refusal
from ..flatten import FlatOp, Pattern
from ..index_expr import Ix, Var, add, div, ix, mod, scale
from ..kernel_ir import (WARP, Accumulate, Barrier, BlockReduce, Compute, If, Loop, SharedArray,
                         SharedLoad, SharedStore, Value, WarpReduce, wide_accumulator)
from ..ops import DTYPES, ELEMENTWISE, identity
from .candidates import Schedule
from .emitter import Emitter, scalar_value
from .space import reduce_operand_index

# Up to this many elements per result a variadic reduction (argmax) is straight-line code,
# beyond it a loop.
UNROLLED_VARIADIC = 32


def combine_across_threads(em: Emitter, sched: Schedule, red: FlatOp, partial: Value,
                           shared: list[SharedArray], tid: Var, lane: Ix | None) -> Value:
    """Combine a group's partial values across its threads (warp, block or tile)."""
    if sched.kind == "thread":
        return partial
    total = em.fresh(partial.dtype)
    if sched.kind == "warp":
        em.place(WarpReduce(total, partial, red.reducer), 0)
        return total
    tag = tag_of(red)
    if sched.kind == "block":
        scratch = SharedArray(f"smem_{tag}", partial.dtype, WARP)
        shared.append(scratch)
        em.place(BlockReduce(total, partial, red.reducer, scratch), 0)
        return total
    depth, width = sched.threads_per_group, sched.groups_per_block
    member = div(tid, width)
    if depth == WARP:
        # A warp per result (XLA's column reductions): the [depth][width] partials go through
        # a tile padded to width + 1 columns, so that a warp reading one column down its 32
        # rows hits 32 banks; each warp combines its column with shuffles and one lane
        # writes the total, which every thread reads back at its own column: two barriers,
        # where the tree below takes log2(depth).
        pitch = width + 1
        tile = SharedArray(f"tile_{tag}", partial.dtype, depth * pitch)
        totals = SharedArray(f"totals_{tag}", partial.dtype, width)
        shared += [tile, totals]
        warp, warp_lane = div(tid, WARP), mod(tid, WARP)
        column, combined = em.fresh(partial.dtype), em.fresh(partial.dtype)
        em.place(SharedStore(tile, add(scale(member, pitch), lane), partial), 0)
        em.place(Barrier(), 0)
        em.place(SharedLoad(column, tile, add(scale(warp_lane, pitch), warp)), 0)
        em.place(WarpReduce(combined, column, red.reducer), 0)
        em.place(If(warp_lane, ix(0), [SharedStore(totals, warp, combined)]), 0)
        em.place(Barrier(), 0)
        em.place(SharedLoad(total, totals, lane), 0)
        return total
    if sched.subwarp_tile:
        # The members of a result are width lanes apart, so a butterfly over the xor
        # distances from 16 down to width combines the ones a warp holds; lanes below width
        # write the warp's totals, and after one barrier every thread adds its result's.
        per_warp = em.fresh(partial.dtype)
        em.place(WarpReduce(per_warp, partial, red.reducer, lowest=width), 0)
        warps = sched.block[0] // WARP
        totals = SharedArray(f"totals_{tag}", partial.dtype, warps * width)
        shared.append(totals)
        em.place(If(mod(tid, WARP), ix(width), [
            SharedStore(totals, add(scale(div(tid, WARP), width), lane), per_warp)], "lt"), 0)
        em.place(Barrier(), 0)
        em.place(SharedLoad(total, totals, lane), 0)
        for w in range(1, warps):
            other, combined = em.fresh(partial.dtype), em.fresh(partial.dtype)
            em.place(SharedLoad(other, totals, add(lane, w * width)), 0)
            em.place(Compute(combined, red.reducer, [total, other]), 0)
            total = combined
        return total
    # Wider tiles: combined by halving the depth (a tree: log2(depth) steps with a barrier
    # each; a serial combine of the column by every thread was fully unrolled by LLVM and
    # held all its loads in registers).
    tile = SharedArray(f"tile_{tag}", partial.dtype, sched.block[0])
    shared.append(tile)
    em.place(SharedStore(tile, ix(tid), partial), 0)
    em.place(Barrier(), 0)
    half = depth // 2
    while half:
        mine, other, combined = (em.fresh(partial.dtype) for _ in range(3))
        em.place(If(member, ix(half), [
            SharedLoad(mine, tile, ix(tid)),
            SharedLoad(other, tile, add(tid, half * width)),
            Compute(combined, red.reducer, [mine, other]),
            SharedStore(tile, ix(tid), combined)], "lt"), 0)
        em.place(Barrier(), 0)
        half //= 2
    em.place(SharedLoad(total, tile, lane), 0)
    return total


def reduce_variadic(em: Emitter, sched: Schedule, red: FlatOp) -> list[Value]:
    """A variadic reduce's results at the thread's group: its combiner computation inlined
    on the accumulators (starting at the init values) and each element in turn, serially in
    row-major order of the reduced dimensions, as XLA:CPU combines them, so that any combiner
    (argmax's tie-breaking and NaNs, or a non-associative one) gives XLA:CPU's result.

    Only the thread schedule: warp, block and tile schedules would need shuffles and
    shared-memory combines of tuples through a general combiner, in an order other than
    XLA:CPU's (which matters for combiners that are not associative). Up to
    UNROLLED_VARIADIC elements straight-line code, beyond it a loop carrying the tuple."""
    if sched.kind != "thread":
        raise CodegenError(Refusal.VARIADIC_ACROSS_THREADS,
                           f"reduce {red.name}: a variadic reduction is combined by one thread "
                           f"per result only (a {sched.kind} schedule would combine tuples "
                           f"across threads)")
    r = sched.space.reduced
    n = len(red.operands) // 2
    shape = em.ops[red.operands[0]].shape
    check_variadic_order(em, red)
    inits = [em.value(init, ()) for init in red.operands[n:]]

    def combine(accumulators: list[tuple[Value, int]], point: Ix) -> list[tuple[Value, int]]:
        index = reduce_operand_index(red, shape, ix(em.group), point)
        return _inline_combiner(em, red, accumulators + [em.value(operand, index)
                                                         for operand in red.operands[:n]])

    if r <= UNROLLED_VARIADIC:
        accumulators = inits
        for point in range(r):
            accumulators = combine(accumulators, ix(point))
        return [v for v, _ in accumulators]
    point = Var(f"r{next(em.names)}", r)
    em.open_loop(point)
    depth = len(em.scopes) - 1
    carried = [em.fresh(v.dtype) for v, _ in inits]
    following = combine([(c, depth) for c in carried], ix(point))
    body = em.close_loop()
    results = [em.fresh(v.dtype) for v, _ in inits]
    em.place(Loop(point, ix(0), r, 1, body, [
        Accumulate(dst, "next", init, value, carried=c)
        for dst, (init, _), (value, _), c in zip(results, inits, following, carried)]), 0)
    return results


def check_variadic_order(em: Emitter, red: FlatOp) -> None:
    """Raises VARIADIC_ORDER unless visiting ``red``'s points in the layout's order
    (``reduce_operand_index``) is XLA:CPU's order: row-major over the reduced dimensions."""
    shape = em.ops[red.operands[0]].shape
    if [d for d in shape.minor_to_major if d in red.dimensions] != \
            sorted(red.dimensions, reverse=True):
        raise CodegenError(Refusal.VARIADIC_ORDER,
                           f"reduce {red.name}: reduced dimensions {list(red.dimensions)} are "
                           f"not row-major in the operand's layout {shape.minor_to_major}; "
                           f"the combining order would depend on the layout")


def start_variadic(em: Emitter, red: FlatOp, arrays: list[SharedArray], at: Ix,
                   depth: int) -> None:
    """A variadic reduction's accumulators at ``at`` of its arrays (one per result) start at
    its init values, as XLA:CPU's do."""
    n = len(red.operands) // 2
    for init, array in zip(red.operands[n:], arrays):
        value, _ = em.value(init, ())
        em.place(SharedStore(array, at, value), depth)


def combine_variadic(em: Emitter, red: FlatOp, arrays: list[SharedArray], at: Ix,
                     operand_index: Ix, depth: int) -> None:
    """A variadic reduction's accumulators at ``at`` combined with its operands at
    ``operand_index`` (the next point in XLA:CPU's order) through its combiner, inlined."""
    n = len(red.operands) // 2
    accumulators = []
    for array in arrays:
        value = em.fresh(array.dtype)
        em.place(SharedLoad(value, array, at), depth)
        accumulators.append((value, depth))
    results = _inline_combiner(em, red, accumulators + [em.value(operand, operand_index)
                                                        for operand in red.operands[:n]])
    for (value, _), array in zip(results, arrays):
        em.place(SharedStore(array, at, value), depth)


def _inline_combiner(em: Emitter, red: FlatOp, args: list[tuple[Value, int]]
                     ) -> list[tuple[Value, int]]:
    """The combiner computation's results on these arguments, computed by the emitter."""
    combiner = red.combiner
    env = dict(zip(combiner.params, args))
    for op in combiner.ops:
        if op.shape.dtype not in DTYPES:
            raise CodegenError(Refusal.UNSUPPORTED_TYPE,
                               f"reduce {red.name}: {op.opcode} {op.name} of its combiner: "
                               f"element type {op.shape.dtype} is not supported")
        if op.opcode == "constant":
            env[op.name] = em.constant(op, ())
        elif op.opcode in ELEMENTWISE:
            env[op.name] = em.elementwise(op, [env[o] for o in op.operands])
        else:
            raise CodegenError(Refusal.UNSUPPORTED_COMBINER,
                               f"reduce {red.name}: {op.opcode} {op.name} of its combiner is "
                               f"not supported")
    return [env[name] for name in combiner.results]


def apply_init(em: Emitter, pattern: Pattern, r: FlatOp, total: Value, depth: int = 0) -> Value:
    """Partial results start at the identity; a different init value is combined in once
    (``depth``: the scope where ``total`` is defined)."""
    init_op = pattern.op_map()[r.operands[1]]
    if init_op.opcode != "constant":
        raise CodegenError(Refusal.NON_CONSTANT_INIT,
                           f"reduce {r.name}: init value {init_op.name} is not a constant")
    init = scalar_value(init_op)
    if init == identity(r.reducer, total.dtype):
        return total
    value, _ = em.op(r.reducer, total.dtype, (total, depth), em.const(init, total.dtype))
    return value


def partial_arrays(reds: list[FlatOp], arrays: list[SharedArray]) -> list[SharedArray]:
    """The arrays each reduction's partial values accumulate in: an f64 twin of the array
    of an f32 sum or product (kernel_ir.wide_accumulator), else the array itself."""
    return [SharedArray(f"{array.name}_wide", wide, array.size)
            if (wide := wide_accumulator(red.reducer, array.dtype)) else array
            for red, array in zip(reds, arrays)]


def start_partials(em: Emitter, reds: list[FlatOp], partials: list[SharedArray], at: Ix,
                   depth: int) -> None:
    """Each reduction's partial value at ``at`` of its array (`partial_arrays`) starts at the
    identity (one CPU thread's accumulator arrays: results side by side, the points outer)."""
    for red, array in zip(reds, partials):
        init, _ = em.const(identity(red.reducer, array.dtype), array.dtype)
        em.place(SharedStore(array, at, init), depth)


def add_to_partial(em: Emitter, red: FlatOp, value: Value, partial_array: SharedArray, at: Ix,
                   depth: int) -> None:
    """partial_array[at] = partial_array[at] (reducer) value, in the array's type."""
    if partial_array.dtype != value.dtype:
        value, _ = em.op("convert", partial_array.dtype, (value, depth))
    partial, total = em.fresh(value.dtype), em.fresh(value.dtype)
    em.place(SharedLoad(partial, partial_array, at), depth)
    em.place(Compute(total, red.reducer, [partial, value]), depth)
    em.place(SharedStore(partial_array, at, total), depth)


def finish_partials(em: Emitter, pattern: Pattern, reds: list[FlatOp],
                    partials: list[SharedArray], arrays: list[SharedArray], at: Ix,
                    depth: int) -> None:
    """Each reduction's partial value at ``at`` (rounded to the result's type once) combined
    with its init value (`apply_init`), in its array."""
    for red, partial_array, array in zip(reds, partials, arrays):
        partial = em.fresh(partial_array.dtype)
        em.place(SharedLoad(partial, partial_array, at), depth)
        if partial_array is not array:
            partial, _ = em.op("convert", array.dtype, (partial, depth))
        total = apply_init(em, pattern, red, partial, depth)
        if total is not partial or partial_array is not array:
            em.place(SharedStore(array, at, total), depth)


def tag_of(red: FlatOp) -> str:
    return red.name.replace("/", "_").replace(".", "_")
