"""The kernel of a one-space schedule: every reduction stage over the thread group's points.

The pattern's outputs are the root group: outputs with O*R elements are written per (o, r)
point, outputs with O elements once per group, and outputs of any other size are packed into
the same kernel as grid-stride loops (kernel packing). A pattern without reductions gets the
loop schedule: one grid-stride loop per distinct output size.
"""
from __future__ import annotations

from ..flatten import Pattern
from ..index_expr import Ix, Var, add, div, ix, linearize, mod, scale
from ..kernel_ir import WARP, If, IndexLet, Kernel, Loop, SharedArray
from .candidates import Schedule
from .emitter import Emitter
from .loops import Points, over_points, packed_outputs, stores_at_group
from .reduce import apply_init, combine_across_threads, reduce_variadic
from .space import independent, reduce_operand_index, reduction_stages, reshaped, result_shape


def build_one_space_kernel(pattern: Pattern, sched: Schedule, name: str, host: bool = False
                           ) -> tuple[Kernel, set[str]]:
    """The kernel IR of `pattern` under a one-space schedule; raises CodegenError (e.g.
    locality: a consumer reads a reduction at an index its own group did not reduce).
    ``host``: a host kernel's (scatters in its prologue, `Emitter.scatter_in_prologue`)."""
    space = sched.space
    threads = sched.block[0]
    tid, bid = Var("tid", threads), Var("bid", sched.grid_blocks)
    group = Var("o", max(space.groups, 1))
    em = Emitter(pattern, group, host=host)
    schemes = {"thread_composition"}
    shared: list[SharedArray] = []
    buffers = pattern.buffers()
    first_output = len(pattern.inputs)
    outputs = list(enumerate(zip(pattern.outputs, pattern.output_values)))
    o, r = space.groups, space.reduced
    per_point = [(i, s, v) for i, ((_, s), v) in outputs if r and s.num_elements == o * r]
    per_group = [(i, s, v) for i, ((_, s), v) in outputs
                 if r and s.num_elements == o and s.num_elements != o * r]
    packed = [(i, s, v) for i, ((_, s), v) in outputs
              if not r or s.num_elements not in (o, o * r)]

    guarded = None  # thread schedule: threads past the last result do nothing
    if r:
        lane = mod(tid, sched.groups_per_block) if sched.kind == "tile" else None
        member = {"thread": ix(0), "warp": mod(tid, WARP), "block": ix(tid),
                  "tile": div(tid, sched.groups_per_block)}[sched.kind]
        first = add(scale(bid, sched.groups_per_block),
                    {"thread": ix(tid), "warp": div(tid, WARP), "block": ix(0),
                     "tile": lane}[sched.kind])
        em.place(IndexLet(group, first), 0)
        if sched.kind == "thread" and o % sched.groups_per_block:
            guarded = first
        stages = reduction_stages(pattern)
        for stage in stages:
            if len(stage) > 1 and independent(pattern, [x.name for x in stage]):
                schemes.add("kernel_packing")
            for red in stage:
                if red.combiner is not None:
                    em.reduced[red.name] = reduce_variadic(em, sched, red)
            stage = [red for red in stage if red.combiner is None]
            operands = [(red, pattern.op_map()[red.operands[0]].shape) for red in stage]
            partials = over_points(
                em, Points(member, r, sched.threads_per_group, sched.vector, sched.unrolled),
                lambda point: [em.value(red.operands[0],
                                        reduce_operand_index(red, shape, ix(group), point))
                               for red, shape in operands],
                [red.reducer for red in stage]) if stage else []
            for red, partial in zip(stage, partials):
                total = combine_across_threads(em, sched, red, partial, shared, tid, lane)
                em.reduced[red.name] = apply_init(em, pattern, red, total)
            if sched.scheme:
                schemes.add(sched.scheme)
        ref = stages[0][0]
        ref_shape = pattern.op_map()[ref.operands[0]].shape
        if per_point:
            def store_point(point: Ix) -> list:
                at = reduce_operand_index(ref, ref_shape, ix(group), point)
                for i, shape, value_name in per_point:
                    index = reshaped(at, ref_shape, shape)
                    value, _ = em.value(value_name, index)
                    em.store(first_output + i, shape, linearize(index, shape), value)
                return []
            over_points(em, Points(member, r, sched.threads_per_group, sched.vector,
                                   sched.unrolled), store_point, [])
            em.flush_stores(0)
        stores = stores_at_group(em, result_shape(ref), group, per_group, first_output)
        if stores and sched.kind == "thread":
            em.scopes[0] += stores
        elif stores:
            em.place(If(member, ix(0), stores), 0)
        if len(per_point) > 1 and independent(pattern, [v for _, _, v in per_point]):
            schemes.add("kernel_packing")
    if guarded is not None:
        em.scopes[0] = [em.scopes[0][0], If(guarded, ix(o), em.scopes[0][1:], "lt")]
        # What was emitted so far now lives inside that `if`: the packed loops below must
        # not reuse it (it would not dominate them).
        em.cache.clear()
        em.reduced.clear()
    if threads == 1 and sched.grid_blocks > 1 and packed:
        # The host schedule (blocks of one thread, `host_schedule`): the first block writes
        # the packed outputs alone, in contiguous loops LLVM vectorizes, instead of every
        # block taking each grid_blocks-th element.
        before = len(em.scopes[0])
        packed_outputs(em, pattern, packed, first_output, ix(0), 1, 1, bool(r), schemes)
        em.scopes[0][before:] = [If(ix(bid), ix(1), em.scopes[0][before:], "lt")]
    else:
        packed_outputs(em, pattern, packed, first_output, add(scale(bid, threads), tid),
                       threads * sched.grid_blocks, sched.vector, bool(r), schemes)
    kernel = Kernel(name, buffers, sched.grid, sched.block, shared, em.scopes[0], tid, bid,
                    list(em.constants.values()), prologue=em.prologue,
                    scratch=list(em.scratch.values()))
    return kernel, schemes


def launch_free(pattern: Pattern, sched: Schedule) -> bool:
    """Whether the kernel of loop schedule ``sched`` reads its launch only in the first chunk
    and the step of each grid-stride loop (`relaunched`): every output size has a loop
    variable, unless its threads take exactly one chunk each (then straight-line code at
    the thread's own index, `over_points`)."""
    total = sched.block[0] * sched.grid_blocks
    for _, shape in pattern.outputs:
        n = shape.num_elements
        if total == n // (sched.vector if n % sched.vector == 0 else 1):
            return False
    return True


def relaunched(kernel: Kernel, sched: Schedule) -> Kernel:
    """The kernel `build_one_space_kernel` builds for loop schedule ``sched``, from the kernel
    of another loop schedule of the same pattern and vector width, both `launch_free`. Their
    statements are the same but for each grid-stride loop over the chunks of an output size
    (a loop, or an ``if`` where every thread takes at most one chunk), whose body reads only
    its chunk variable: so the schedules of one width are built once."""
    threads = sched.block[0]
    tid, bid = Var("tid", threads), Var("bid", sched.grid_blocks)
    member, step = add(scale(bid, threads), tid), threads * sched.grid_blocks
    body = []
    for s in kernel.body:
        if isinstance(s, Loop) and _is_chunk(s.var):
            chunk, inner = s.var, s.body
        elif isinstance(s, If) and s.body and isinstance(s.body[0], IndexLet) and \
                _is_chunk(s.body[0].var):
            chunk, inner = s.body[0].var, s.body[1:]
        else:
            body.append(s)
            continue
        if step >= chunk.extent:
            body.append(If(member, ix(chunk.extent), [IndexLet(chunk, member)] + inner, "lt"))
        else:
            body.append(Loop(chunk, member, chunk.extent, step, inner, []))
    return Kernel(kernel.name, kernel.buffers, sched.grid, sched.block, kernel.shared, body,
                  tid, bid, kernel.constants)


def _is_chunk(var: Var) -> bool:
    """A packed loop's chunk variable (``e<size>``, `packed_outputs`)."""
    return var.name[:1] == "e" and var.name[1:].isdigit()
