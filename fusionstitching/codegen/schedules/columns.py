"""The host's schedule for column reductions: rows outer, a block's results side by side.

Read one result at a time, a reduction whose points are strided in memory (the column sums
of a row-major matrix: bias and LayerNorm-parameter gradients, BatchNorm statistics) touches
a cache line per element. Here a block owns consecutive results; each reduction stage loops
over the points outer and the block's results inner, so every row is read contiguously and
the inner loop vectorizes, each result's partial value in an accumulator array. Later stages
and the stores read a finished reduction from its array at their result.
"""
from __future__ import annotations

from ..errors import CodegenError, Refusal
from ..flatten import Pattern
from ..index_expr import Var, add, ix, linearize, scale
from ..kernel_ir import If, IndexLet, Kernel, Loop, SharedArray, SharedLoad, wide_accumulator
from .candidates import Schedule
from .emitter import Emitter
from .loops import packed_outputs, stores_at_group
from .reduce import (add_to_partial, check_variadic_order, combine_variadic, finish_partials,
                     partial_arrays, start_partials, start_variadic, tag_of)
from .space import Space, reduce_operand_index, reduction_stages, reshaped, result_shape

RESULTS_PER_BLOCK = 256  # at most (blocks are what runs in parts); its accumulators are on the stack
ACCUMULATOR_BYTES = 64 * 1024  # all of a block's accumulator arrays together, at most


def columns_schedule(space: Space, most: int = RESULTS_PER_BLOCK) -> Schedule:
    """Blocks of the most consecutive results up to ``most`` that divide them."""
    per_block = max(k for k in range(1, min(space.groups, most) + 1)
                    if space.groups % k == 0)
    return Schedule("columns", space, per_block, 1, space.groups // per_block)


def build_columns_kernel(pattern: Pattern, sched: Schedule, name: str
                         ) -> tuple[Kernel, set[str]]:
    """The kernel IR of `pattern` under `columns_schedule`; raises CodegenError for what it
    does not take (too many accumulators, outputs of other sizes that read a reduction).
    Outputs of other sizes are written by the first block. A variadic reduction (argmax)
    combines each result's points in XLA:CPU's order through its combiner, as the thread
    schedule does, but the block's results side by side: independent chains that overlap
    (and vectorize), where one result at a time waits on each combine."""
    o, r = sched.space.groups, sched.space.reduced
    width = sched.groups_per_block
    tid, bid = Var("tid", 1), Var("bid", sched.grid_blocks)
    group, lane, point = Var("o", o), Var("c", width), Var("r", r)
    em = Emitter(pattern, group, host=True)  # a host schedule
    first_output = len(pattern.inputs)
    outputs = list(enumerate(zip(pattern.outputs, pattern.output_values)))
    per_point = [(i, s, v) for i, ((_, s), v) in outputs if s.num_elements == o * r]
    per_group = [(i, s, v) for i, ((_, s), v) in outputs
                 if s.num_elements == o and s.num_elements != o * r]
    packed = [(i, s, v) for i, ((_, s), v) in outputs if s.num_elements not in (o, o * r)]
    if any(_reads_a_reduction(pattern, v) for _, _, v in packed):
        raise CodegenError(Refusal.COLUMNS_FORM, "an output of another size reads a reduction")
    stages = reduction_stages(pattern)
    reductions = [red for stage in stages for red in stage]
    ops = pattern.op_map()
    for red in reductions:
        if red.combiner is not None:
            check_variadic_order(em, red)
    dtype_bytes = {red.name: sum(shape.byte_size // o for shape in _result_shapes(red))
                   + (8 if red.combiner is None and wide_accumulator(red.reducer,
                                                                    red.shape.dtype) else 0)
                   for red in reductions}
    if width * sum(dtype_bytes.values()) > ACCUMULATOR_BYTES:
        raise CodegenError(Refusal.COLUMNS_FORM, f"accumulators of {width} results x "
                                                 f"{len(reductions)} reductions")
    # one array per reduction result (a variadic reduction has several)
    accumulators = {red.name: _accumulator_arrays(red, width) for red in reductions}

    def lanes(body) -> None:
        """``body()`` in a loop over the block's results, each at its group (with the
        finished reductions' values there), placed in the current scope."""
        outer = len(em.scopes) - 1
        em.open_loop(lane)
        depth = len(em.scopes) - 1
        em.var_depth[group] = depth
        em.place(IndexLet(group, add(scale(bid, width), lane)), depth)
        for name in finished:
            values = []
            for array in accumulators[name]:
                values.append(em.fresh(array.dtype))
                em.place(SharedLoad(values[-1], array, ix(lane)), depth)
            em.reduced[name] = values[0] if ops[name].combiner is None else values
        body(depth)
        em.place(Loop(lane, ix(0), width, 1, em.close_loop(), []), outer)

    def rows(body) -> None:
        em.open_loop(point)
        lanes(body)
        em.place(Loop(point, ix(0), r, 1, em.close_loop(), []), 0)

    finished: list[str] = []
    wide: list[SharedArray] = []  # the f64 partial values of f32 sums and products
    for stage in stages:
        plain = [red for red in stage if red.combiner is None]
        arrays = [accumulators[red.name][0] for red in plain]
        partials = partial_arrays(plain, arrays)
        wide += [p for p, a in zip(partials, arrays) if p is not a]
        partial_of = {red.name: p for red, p in zip(plain, partials)}

        def start(depth: int) -> None:
            start_partials(em, plain, partials, ix(lane), depth)
            for red in stage:
                if red.combiner is not None:
                    start_variadic(em, red, accumulators[red.name], ix(lane), depth)

        def accumulate(depth: int) -> None:
            for red in stage:
                shape = em.ops[red.operands[0]].shape
                at = reduce_operand_index(red, shape, ix(group), ix(point))
                if red.combiner is not None:
                    combine_variadic(em, red, accumulators[red.name], ix(lane), at, depth)
                    continue
                value, _ = em.value(red.operands[0], at)
                add_to_partial(em, red, value, partial_of[red.name], ix(lane), depth)

        lanes(start)
        rows(accumulate)
        lanes(lambda depth: finish_partials(em, pattern, plain, partials, arrays, ix(lane),
                                            depth))
        finished += [red.name for red in stage]
    ref = stages[0][0]
    ref_shape = em.ops[ref.operands[0]].shape
    if per_point:
        def store_point(depth: int) -> None:
            at = reduce_operand_index(ref, ref_shape, ix(group), ix(point))
            for i, shape, value_name in per_point:
                index = reshaped(at, ref_shape, shape)
                value, _ = em.value(value_name, index)
                em.store(first_output + i, shape, linearize(index, shape), value)

        rows(store_point)
    if per_group:
        lanes(lambda depth: em.scopes[depth].extend(
            stores_at_group(em, result_shape(ref), group, per_group, first_output)))
    schemes = {"thread_composition"}
    if packed:  # the first block writes them alone, in contiguous loops (as one_space's host
        # schedule does); values computed inside the loops above do not reach them
        em.cache.clear()
        em.reduced.clear()
        before = len(em.scopes[0])
        packed_outputs(em, pattern, packed, first_output, ix(0), 1, 1, True, schemes)
        em.scopes[0][before:] = [If(ix(bid), ix(1), em.scopes[0][before:], "lt")]
    # one thread per block: its loops cover the block's results (not sched.block of them)
    shared = [array for results in accumulators.values() for array in results] + wide
    kernel = Kernel(name, pattern.buffers(), sched.grid, (1,), shared, em.scopes[0], tid, bid,
                    list(em.constants.values()), prologue=em.prologue,
                    scratch=list(em.scratch.values()))
    return kernel, schemes


def _result_shapes(red) -> list:
    return list(red.shape.tuple_shapes) if red.shape.is_tuple else [red.shape]


def _accumulator_arrays(red, width: int) -> list[SharedArray]:
    shapes = _result_shapes(red)
    if len(shapes) == 1:
        return [SharedArray(f"acc_{tag_of(red)}", shapes[0].dtype, width)]
    return [SharedArray(f"acc_{tag_of(red)}_{k}", shape.dtype, width)
            for k, shape in enumerate(shapes)]


def _reads_a_reduction(pattern: Pattern, name: str) -> bool:
    """Whether value ``name`` of ``pattern`` is computed from a reduction's result."""
    ops = pattern.op_map()
    seen, stack = set(), [name]
    while stack:
        op = ops.get(stack.pop())
        if op is None or op.name in seen:
            continue  # an input
        seen.add(op.name)
        if op.opcode == "reduce":
            return True
        stack += op.operands
    return False
