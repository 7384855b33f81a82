"""The phased schedule: reductions over different spaces in one block (block composition
across spaces; LayerNorm/softmax backward's row statistics beside column sums).

Only where every one-space schedule is refused: one block runs the phases in dependency order,
each reducing one space's results into a shared array (a thread, some lanes or a warp per
result; all threads and a block_reduce for a full reduction), a barrier after each stage,
then the outputs as packed loops reading any result at any index. The last phase, read by no
reduction, may be spread over several blocks that each compute the earlier phases.
"""
from __future__ import annotations

import dataclasses

from costmodel.devices import Device

from ..errors import CodegenError, Refusal
from ..flatten import FlatOp, Pattern
from ..index_expr import Ix, Var, add, div, ix, mod, scale
from ..kernel_ir import (UNROLL_FACTOR, WARP, Barrier, BlockReduce, GlobalStore, If,
                         IndexLet, Kernel, Loop, SharedArray, SharedStore, Value, WarpReduce)
from ..ops import NARROW_FLOATS
from .candidates import Schedule
from .emitter import Emitter
from .loops import Points, in_runs, over_points, packed_outputs, stores_at_group, unroll_short
from .reduce import (add_to_partial, apply_init, combine_across_threads, finish_partials,
                     partial_arrays, start_partials, tag_of)
from .space import (Space, independent, reduce_operand_index, reduction_stages, result_shape,
                    space_of)

# One block streams about one SM's share of the device's bandwidth, so the phased schedule is
# worth it only for small regions, where launches dominate: at most this many points per block
# (reduction operands plus outputs: 1 MB of f32, ~40 us of streaming on an H100).
MAX_PHASED_POINTS = 1 << 18
# A thread reduces a result's points in runs of this many, a constant-trip loop LLVM unrolls:
# the run's loads are in flight together instead of one full latency each (as the
# latency-evaluator prices unrolled loops).
SERIAL_RUN = UNROLL_FACTOR
PHASED_THREADS = 128  # see enumerate_phased_schedules
# A phase of at most this many results per warp runs a warp per result (`_warp_per_result`)
# when its results have more points than one serial run: up to SERIAL_RUN points a thread
# per result waits for one batch of loads, less than a warp's five shuffles after it.
MAX_RESULTS_PER_WARP = 4
# A one-thread host phase of at least this many strided results reads its points row by row
# (`_points_outer`): one vector of results per row.
MIN_COLUMNS = 8


def _phase_plan(pattern: Pattern) -> list[list[list[FlatOp]]]:
    """Reduction stages in dependency order (`reduction_stages`), each split by space into
    phases: a phase's reductions share one loop over their points."""
    plan = []
    for stage in reduction_stages(pattern):
        by_space: dict[Space, list[FlatOp]] = {}
        for red in stage:
            by_space.setdefault(space_of(pattern, red), []).append(red)
        plan.append(list(by_space.values()))
    return plan


def _spread_phase(pattern: Pattern, plan: list[list[list[FlatOp]]]) -> tuple[int, int] | None:
    """(stage, phase) of the phase whose results can be spread over blocks: the last stage's
    phase with the most results (no reduction reads them), if it has several."""
    last = len(plan) - 1
    j = max(range(len(plan[last])), key=lambda j: space_of(pattern, plan[last][j][0]).groups)
    return (last, j) if space_of(pattern, plan[last][j][0]).groups > 1 else None


def enumerate_phased_schedules(pattern: Pattern, device: Device) -> list[Schedule]:
    """One block of PHASED_THREADS threads (fewer when the widest phase or output needs fewer
    warps), scalar steps; and the last phase spread over several such blocks: one per
    PHASED_THREADS of its results (a thread per result) when it has more, and one per warp
    of its results (a tile: each result split over the block's warps). Each candidate
    builds and profiles the whole region, and the explorer asks about many large regions:
    enumerating 128-1024 threads and 128-bit steps (8 candidates) made BERT train JAX H100
    plan in 76 s CPU instead of 30 s, for the same kernels and 1% of modeled time."""
    plan = _phase_plan(pattern)
    spaces = [phase for stage in plan for phase in stage]
    widest = max([sp.groups if sp.groups > 1 else sp.reduced
                  for sp in (space_of(pattern, phase[0]) for phase in spaces)] +
                 [s.num_elements for _, s in pattern.outputs])
    threads = min(PHASED_THREADS, device.max_threads_per_block, -(-widest // WARP) * WARP)
    one_block = Schedule("phases", Space(1, 0), threads, 1, 1, 1, phases=len(spaces))
    spread = _spread_phase(pattern, plan)
    results = space_of(pattern, plan[spread[0]][spread[1]][0]).groups if spread else 0
    out = [one_block]
    if results > threads:
        out.append(dataclasses.replace(one_block, grid_blocks=-(-results // threads)))
    if results > WARP and results % WARP == 0 and threads > WARP:
        # A warp of results per block, each split over the block's warps (a tile).
        out.append(dataclasses.replace(one_block, groups_per_block=WARP,
                                       threads_per_group=threads // WARP,
                                       grid_blocks=results // WARP))
    return out + [dataclasses.replace(s, unrolled=True) for s in out]


def build_phased_kernel(pattern: Pattern, sched: Schedule, name: str, host: bool = False
                        ) -> tuple[Kernel, set[str]]:
    """The phased schedule: phases in dependency order, then the outputs.

    In a phase, the block's threads stride over its results, one thread per result reducing
    its R points serially (thread composition), and store them to a shared array of the
    results; a phase with one result (a full reduction) is split over all threads and combined
    with a block_reduce, leaving the result in every thread. A barrier ends each stage, after
    which any thread reads any result (no locality check). The outputs are packed loops over
    the block's threads. With one thread (the host schedule) every phase is serial.

    A phase of few results with more than SERIAL_RUN points each runs a warp per result
    (`_warp_per_result`), one of more results but at most half the threads 2-16 lanes per
    result (`_lanes_per_result`). With several blocks, the last phase (``_spread_phase``) is spread
    over the grid instead (`_spread_results`: a thread per result, or tiles) and the outputs
    that read it are computed at its results; every block computes the earlier phases, and
    the other outputs are packed loops over the grid's threads."""
    threads, blocks = sched.block[0], sched.grid_blocks
    tid, bid = Var("tid", threads), Var("bid", blocks)
    # Reductions are staged, never read at "the" group. ``host``: as build_one_space_kernel;
    # a host phased schedule is one thread (`host_schedule`).
    em = Emitter(pattern, Var("o", 1), host=host,
                 one_thread=host and sched.grid_blocks == 1 and sched.block[0] == 1)
    em.unroll_short = sched.unrolled
    schemes = {"thread_composition", "block_composition"}
    shared: list[SharedArray] = []
    plan = _phase_plan(pattern)
    variadic = [red.name for stage in plan for phase in stage for red in phase
                if red.combiner is not None]
    if variadic:
        raise CodegenError(Refusal.VARIADIC_ACROSS_THREADS,
                           f"reduce {variadic[0]}: a variadic reduction in a phased schedule "
                           f"is not supported")
    spread = _spread_phase(pattern, plan) if blocks > 1 else None
    outputs = [(i, s, v) for i, ((_, s), v) in enumerate(zip(pattern.outputs,
                                                                pattern.output_values))]
    reads_spread = _downstream(pattern, plan[spread[0]][spread[1]]) if spread else set()
    spread_outputs = [out for out in outputs if out[2] in reads_spread]
    packed = [out for out in outputs if out[2] not in reads_spread]
    points_of = {(k, j): space_of(pattern, phase[0]).groups *
                 space_of(pattern, phase[0]).reduced
                 for k, stage in enumerate(plan) for j, phase in enumerate(stage)}
    # Every block runs the phases not spread; the spread phase and the outputs are shared out.
    shared_points = sum(p for at, p in points_of.items() if at != spread)
    spread_points = points_of.get(spread, 0) + sum(s.num_elements for _, s, _ in outputs)
    points = shared_points + -(-spread_points // blocks)
    if points > MAX_PHASED_POINTS:
        raise CodegenError(Refusal.TOO_LARGE_FOR_BLOCK,
                           f"{points} points (reduction operands and outputs) are too many "
                           f"for {'one block' if blocks == 1 else f'each of {blocks} blocks'} "
                           f"(at most {MAX_PHASED_POINTS})")
    first_output = len(pattern.inputs)
    for k, stage in enumerate(plan):
        if len(stage) > 1 or any(len(phase) > 1 and independent(
                pattern, [red.name for red in phase]) for phase in stage):
            schemes.add("kernel_packing")
        stored = False
        for j, phase in enumerate(stage):
            space = space_of(pattern, phase[0])
            operands = [(red, pattern.op_map()[red.operands[0]].shape) for red in phase]

            def values_at(result: Ix, operands=operands):
                return lambda point: [em.value(red.operands[0],
                                               reduce_operand_index(red, shape, result, point))
                                      for red, shape in operands]

            reducers = [red.reducer for red in phase]
            if (k, j) == spread:
                _spread_results(em, pattern, sched, phase, space, values_at, spread_outputs,
                                first_output, shared, tid, bid)
                continue
            if space.groups == 1 and threads >= WARP:
                partials = in_runs(em, Points(ix(tid), space.reduced, threads, 1,
                                              unroll_short(em, space.reduced, threads),
                                              f"r{k}_{j}"), values_at(ix(0)), reducers,
                                   f"q{k}_{j}")
                for red, partial in zip(phase, partials):
                    total = em.fresh(partial.dtype)
                    scratch = SharedArray(f"smem_{tag_of(red)}", partial.dtype, WARP)
                    shared.append(scratch)
                    em.place(BlockReduce(total, partial, red.reducer, scratch), 0)
                    em.staged[red.name] = apply_init(em, pattern, red, total)
                continue
            arrays = [SharedArray(f"res_{tag_of(red)}", red.shape.dtype, space.groups)
                      for red in phase]
            if space.groups <= MAX_RESULTS_PER_WARP * (threads // WARP) and \
                    space.reduced > SERIAL_RUN:
                _warp_per_result(em, pattern, phase, space, values_at, arrays, tid, f"{k}_{j}")
                schemes.add("warp_composition")
            elif space.reduced > SERIAL_RUN and threads // space.groups >= 2:
                _lanes_per_result(em, pattern, phase, space, values_at, arrays, tid, f"{k}_{j}")
                schemes.add("warp_composition")
            elif em.one_thread and _strided(pattern, phase, space):
                _points_outer(em, pattern, phase, space, values_at, arrays, shared, f"{k}_{j}")
            else:
                def per_result(result: Ix, phase=phase, arrays=arrays, values_at=values_at,
                               reducers=reducers, space=space, tag=f"{k}_{j}") -> list:
                    depth = len(em.scopes) - 1
                    serial = _serial_reduce(em, space.reduced, values_at(result), reducers, tag)
                    for red, partial, array in zip(phase, serial, arrays):
                        em.place(SharedStore(array, result,
                                             apply_init(em, pattern, red, partial, depth)),
                                 depth)
                    return []

                over_points(em, Points(ix(tid), space.groups, threads, 1, False, f"o{k}_{j}"),
                            per_result, [])
            shared += arrays
            em.staged.update((red.name, array) for red, array in zip(phase, arrays))
            stored = True
        if stored:
            em.place(Barrier(), 0)
    element = ix(tid) if blocks == 1 else add(scale(bid, threads), tid)
    packed_outputs(em, pattern, packed, first_output, element, threads * blocks, sched.vector,
                   True, schemes, sched.unrolled)
    if sched.unrolled and not em.short_loops:
        raise CodegenError(Refusal.SAME_KERNEL,
                           "no short loop to unroll (the same kernel as without)")
    buffers = pattern.buffers()
    kernel = Kernel(name, buffers, sched.grid, sched.block, shared, em.scopes[0], tid, bid,
                    list(em.constants.values()), prologue=em.prologue,
                    scratch=list(em.scratch.values()))
    return kernel, schemes


def _warp_per_result(em: Emitter, pattern: Pattern, phase: list[FlatOp], space: Space,
                     values_at, arrays: list[SharedArray], tid: Var, tag: str) -> None:
    """A phase with few results: a warp per result, its lanes splitting the points and a
    warp_reduce combining them (one thread per result would leave most threads idle and
    each result a serial chain of R points). Warp w takes results w, w + warps, ...,
    unrolled so that the warp_reduces stay at top level (the host backend splits a block
    there); a warp past the last result reduces a copy of another (a shuffle needs every
    lane) and stores nothing."""
    warps = tid.extent // WARP
    lane, warp = mod(tid, WARP), div(tid, WARP)
    # The stores follow the last result, so that every result's loads are in one straight-
    # line block (a store under `if` ends one) and issue together.
    stores = [_lanes_to_shared(em, pattern, phase, space, values_at, arrays,
                               add(warp, u * warps), lane, WARP,
                               (u + 1) * warps <= space.groups, f"w{tag}_{u}")
              for u in range(-(-space.groups // warps))]
    for store in stores:
        em.place(store, 0)


def _lanes_per_result(em: Emitter, pattern: Pattern, phase: list[FlatOp], space: Space,
                      values_at, arrays: list[SharedArray], tid: Var, tag: str) -> None:
    """A phase of more results than `_warp_per_result` takes but at most half the block's
    threads: ``members`` (2-16) threads per result, each warp holding ``WARP // members``
    results side by side in its lanes (a result's members are lanes congruent modulo that
    width), combined by a sub-warp butterfly (xor 16 down to the width). A thread per result
    would run its R points serially; here each member runs R / members of them, and a warp
    load reads each result at ``members`` consecutive points (column sums stay coalesced;
    rows read ``members`` times fewer sectors than a thread per row). Threads past the last
    result reduce a copy of another (every lane takes part in a shuffle) and store nothing."""
    members = min(1 << ((tid.extent // space.groups).bit_length() - 1), WARP // 2)
    width = WARP // members
    lane = mod(tid, WARP)
    em.place(_lanes_to_shared(em, pattern, phase, space, values_at, arrays,
                              add(scale(div(tid, WARP), width), mod(lane, width)),
                              div(lane, width), members, tid.extent // members == space.groups,
                              f"m{tag}"), 0)


def _lanes_to_shared(em: Emitter, pattern: Pattern, phase: list[FlatOp], space: Space,
                     values_at, arrays: list[SharedArray], result: Ix, member: Ix, members: int,
                     every_result: bool, tag: str) -> If:
    """``members`` lanes of a warp (``member`` of them; congruent modulo 32 / members) reduce
    ``result``'s points between them, a butterfly (xor 16 down to 32 / members) combines them,
    and member 0 stores the result into the phase's shared arrays (the returned statement,
    for the caller to place). Lanes past the last result (unless ``every_result``) reduce a
    copy of another, since every lane takes part in a shuffle, and store nothing."""
    at = mod(result, space.groups)
    partials = in_runs(em, Points(member, space.reduced, members, 1,
                                  unroll_short(em, space.reduced, members), tag),
                       values_at(at), [red.reducer for red in phase], f"q{tag}")
    stores = []
    for red, partial, array in zip(phase, partials, arrays):
        total = em.fresh(partial.dtype)
        em.place(WarpReduce(total, partial, red.reducer, WARP // members), 0)
        stores.append(SharedStore(array, at, apply_init(em, pattern, red, total)))
    store = If(member, ix(0), stores)
    return store if every_result else If(result, ix(space.groups), [store], "lt")


def _downstream(pattern: Pattern, reductions: list[FlatOp]) -> set[str]:
    """The ops that read these reductions' results, directly or through other ops."""
    reached = {red.name for red in reductions}
    for op in pattern.ops:  # topological order
        if any(o in reached for o in op.operands):
            reached.add(op.name)
    return reached


def _spread_results(em: Emitter, pattern: Pattern, sched: Schedule, phase: list[FlatOp],
                    space: Space, values_at, outputs: list, first_output: int,
                    shared: list[SharedArray], tid: Var, bid: Var) -> None:
    """A phase spread over the grid, and the outputs that read it computed at its results
    (locality: an output read elsewhere needs another block's result, and is refused).

    ``sched.threads_per_group`` 1: a thread per result reducing its points serially, the
    grid's threads striding over the results. More: a tile, ``groups_per_block`` results per
    block side by side in the lanes (coalesced, as for column sums), each split over that
    many threads and combined in shared memory (`combine_across_threads`); its first thread
    stores."""
    width, depth = sched.groups_per_block, sched.threads_per_group
    reducers = [red.reducer for red in phase]
    for _, shape, value_name in outputs:
        if shape.num_elements != space.groups:
            raise CodegenError(Refusal.CROSS_BLOCK,
                               f"output {value_name} ({shape.num_elements} elements) reads "
                               f"results spread over blocks ({space.groups}): needs "
                               f"cross-block communication")

    def output_stores(group: Var) -> list[GlobalStore]:
        return stores_at_group(em, result_shape(phase[0]), group, outputs, first_output)

    outer_group = em.group
    if depth > 1:
        group = Var("o_s", space.groups)
        em.place(IndexLet(group, add(scale(bid, width), mod(tid, width))), 0)
        em.group = group
        partials = in_runs(em, Points(div(tid, width), space.reduced, depth, 1,
                                      unroll_short(em, space.reduced, depth), "r_s"),
                           values_at(ix(group)), reducers, "q_s")
        tile = Schedule("tile", space, width, depth, sched.grid_blocks)
        for red, partial in zip(phase, partials):
            total = combine_across_threads(em, tile, red, partial, shared, tid, mod(tid, width))
            em.reduced[red.name] = apply_init(em, pattern, red, total)
        em.place(If(div(tid, width), ix(0), output_stores(group)), 0)
    else:
        def per_result(result: Ix) -> list:
            at = len(em.scopes) - 1
            group = Var("o_s", space.groups)
            em.place(IndexLet(group, result), at)
            em.var_depth[group] = at
            em.group = group
            serial = _serial_reduce(em, space.reduced, values_at(ix(group)), reducers,
                                    f"s_{tag_of(phase[0])}")
            for red, partial in zip(phase, serial):
                em.reduced[red.name] = apply_init(em, pattern, red, partial, at)
            for store in output_stores(group):
                em.place(store, at)
            return []

        threads = sched.block[0]
        over_points(em, Points(add(scale(bid, threads), tid), space.groups,
                               threads * sched.grid_blocks, 1, False, "o_spread"),
                    per_result, [])
    for red in phase:
        del em.reduced[red.name]
    em.group = outer_group


def _strided(pattern: Pattern, phase: list[FlatOp], space: Space) -> bool:
    """A phase of several results whose points are strided in memory (the reduced dimensions
    leave out the operand's minor one: column sums), none of them variadic or narrow (their
    arrays hold the partial values in the result's type)."""
    operand = pattern.op_map()[phase[0].operands[0]].shape
    return space.groups >= MIN_COLUMNS and operand.rank > 0 and \
        operand.minor_to_major[0] not in phase[0].dimensions and \
        all(red.combiner is None and red.shape.dtype not in NARROW_FLOATS | {"pred"}
            for red in phase)


def _points_outer(em: Emitter, pattern: Pattern, phase: list[FlatOp], space: Space, values_at,
                  arrays: list[SharedArray], shared: list[SharedArray], tag: str) -> None:
    """One CPU thread's column sums, as columns.py orders them: the points outer and the
    results inner, each result's partial value in its array, so a row is read contiguously
    (the inner loop vectorizes) and values of the point alone (a row's statistics) are
    computed once per point, not once per element."""
    result, point = Var(f"o{tag}", space.groups), Var(f"r{tag}", space.reduced)

    def over_results(body, outer: int) -> None:
        em.open_loop(result)
        body(len(em.scopes) - 1)
        em.place(Loop(result, ix(0), space.groups, 1, em.close_loop(), []), outer)

    partials = partial_arrays(phase, arrays)
    shared += [p for p, a in zip(partials, arrays) if p is not a]

    def accumulate(depth: int) -> None:
        for red, (value, _), array in zip(phase, values_at(ix(result))(ix(point)), partials):
            add_to_partial(em, red, value, array, ix(result), depth)

    over_results(lambda depth: start_partials(em, phase, partials, ix(result), depth), 0)
    em.open_loop(point)
    over_results(accumulate, 1)
    em.place(Loop(point, ix(0), space.reduced, 1, em.close_loop(), []), 0)
    over_results(lambda depth: finish_partials(em, pattern, phase, partials, arrays, ix(result),
                                               depth), 0)


def _serial_reduce(em: Emitter, count: int, visit, reducers: list[str], tag: str
                   ) -> list[Value]:
    """One thread's reduction of points 0..count-1 in the current scope: runs of SERIAL_RUN
    points (an inner loop LLVM unrolls, or unrolled here), combined in order."""
    points = Points(ix(0), count, 1, 1, unroll_short(em, count, 1), f"r{tag}")
    return in_runs(em, points, visit, reducers, f"q{tag}", always=count % SERIAL_RUN == 0)
