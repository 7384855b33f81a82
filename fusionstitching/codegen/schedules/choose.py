"""The choice among candidate schedules: each built, refused ones kept with why, the fastest
modeled by the latency-evaluator taken (`schedule_pattern`); and the host's schedule.

The phased schedule is enumerated only where every one-space schedule is refused (reductions
over different spaces, or cross-block communication), so patterns that build with one space
keep their kernel.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
from collections.abc import Mapping, MutableMapping
from operator import itemgetter
from dataclasses import dataclass

from costmodel import LAUNCH_US, KernelProfile, kernel_cost, kernel_latency_us
from costmodel.devices import Device

from ..cost.kernel_profile import (kernel_profile, latency_lower_bound_us,
                                   unbounded_instructions)
from ..cost.lowered import used_lanes
from ..errors import CodegenError, NotFaster, Refusal
from ..flatten import Pattern
from ..index_expr import strides as _element_strides
from ..kernel_ir import Kernel
from .candidates import Schedule, enumerate_schedules
from .columns import build_columns_kernel, columns_schedule
from .host_reuse import reuse_across_loops
from .tables import tabulate_small_inputs
from .one_space import build_one_space_kernel, launch_free, relaunched
from .phased import build_phased_kernel, enumerate_phased_schedules
from .shared_memory import reuse_shared_memory
from .space import reduction_space, reduction_stages


@dataclass(frozen=True)
class Refused:
    """A schedule the choice refused (None: the one-space schedules as a whole), and why."""

    schedule: Schedule | None
    kind: Refusal
    detail: str

    @property
    def what(self) -> str:
        return "one-space schedules" if self.schedule is None else self.schedule.why


@dataclass(frozen=True)
class ScheduledKernel:
    """The chosen schedule's kernel, with every candidate and refusal."""

    kernel: Kernel
    schedule: Schedule
    schemes: list[str]
    modeled_us: float
    smem_bytes_no_reuse: int
    candidates: list[tuple[str, float]]
    profile: KernelProfile  # what modeled_us was priced from
    refused: list[Refused]
    fastest: bool = True  # False: the first schedule that built (others left untried)
    # True: the kernel of an earlier pattern equal up to names, with this one's buffers but
    # the earlier one's shared arrays and loop variables (`_chosen_before`): priced the same,
    # to be built under its own names before it is compiled.
    borrowed: bool = False
    # Schedules not priced (or not built) because their least time was not below the fastest's
    # (branch and bound), each with that least time.
    pruned: list[tuple[Schedule, float]] = dataclasses.field(default_factory=list)


def build_kernel(pattern: Pattern, sched: Schedule, name: str, host: bool = False
                 ) -> tuple[Kernel, set[str]]:
    """The kernel IR of `pattern` under one schedule; raises CodegenError (e.g. locality).
    ``host``: for the CPU (scatters computed once, in XLA's form, by the kernel's prologue)."""
    if sched.kind == "phases":
        return build_phased_kernel(pattern, sched, name, host)
    if sched.kind == "columns":
        return build_columns_kernel(pattern, sched, name)
    return build_one_space_kernel(pattern, sched, name, host)


# A variadic reduction's results per columns block: two vectors of 8 lanes (AVX2) whose
# combine chains overlap, and blocks left over for the thread pool's parts.
VARIADIC_RESULTS_PER_BLOCK = 16


def host_schedule(pattern: Pattern, chosen: Schedule | None = None) -> Schedule:
    """The schedule a CPU runs fastest: one thread per block, so every loop is a plain serial
    loop (vectorizable) and per-group or per-kernel values are computed once, not per element.
    Reductions whose points are strided in memory take the columns schedule (points outer,
    results inner). A phased kernel (``chosen``) stays phased, with one thread and its loops
    rolled. A variadic reduction (argmax) takes the columns schedule too: its combines are a
    serial chain per result, so a block's results side by side run as independent chains."""
    if chosen is not None and chosen.kind == "phases":
        return dataclasses.replace(chosen, groups_per_block=1, threads_per_group=1, vector=1,
                                   grid_blocks=1, unrolled=False)
    space = reduction_space(pattern)
    if space.reduced == 0:
        return Schedule("loop", space, 1, 1, 1)
    if _strided_points(pattern):
        return columns_schedule(space)
    if any(op.opcode == "reduce" and op.combiner is not None for op in pattern.ops):
        return columns_schedule(space, VARIADIC_RESULTS_PER_BLOCK)
    return _thread_host_schedule(space)


def _thread_host_schedule(space) -> Schedule:
    return Schedule("thread", space, 1, 1, space.groups)


def build_host_kernel(pattern: Pattern, chosen: Schedule | None, name: str) -> Kernel:
    """The kernel of `host_schedule`, with values later loops would recompute kept
    (`reuse_across_loops`) and expensive ops of small inputs tabulated
    (`tabulate_small_inputs`); a pattern the columns schedule does not take gets the thread
    schedule (one result per block)."""
    sched = host_schedule(pattern, chosen)
    if sched.kind == "columns":
        try:
            return tabulate_small_inputs(build_columns_kernel(pattern, sched, name)[0])
        except CodegenError as err:
            if err.kind is not Refusal.COLUMNS_FORM:
                raise
            sched = _thread_host_schedule(sched.space)
    return tabulate_small_inputs(reuse_across_loops(
        build_kernel(pattern, sched, name, host=True)[0]))


def _strided_points(pattern: Pattern) -> int:
    """Element distance in memory between consecutive points of the first reduction (0 when
    they are adjacent: the reduced dimensions include the operand's minor one)."""
    ops = pattern.op_map()
    first = next((op for op in pattern.ops if op.opcode == "reduce"), None)
    if first is None:
        return 0
    operand = ops[first.operands[0]].shape
    if not operand.rank or operand.minor_to_major[0] in first.dimensions:
        return 0
    strides = {d: s for d, s in zip(range(operand.rank), _element_strides(operand))}
    return min(strides[d] for d in first.dimensions)


def schedule_pattern(pattern: Pattern, name: str, device: Device,
                     excluded: Mapping[Schedule, str] | None = None,
                     chosen: MutableMapping[str, Schedule] | None = None,
                     fastest: bool = True, below_us: float | None = None,
                     kept: MutableMapping[str, ScheduledKernel] | None = None,
                     not_faster: MutableMapping[tuple, float] | None = None,
                     priced: bool = True) -> ScheduledKernel:
    """Build every enumerated schedule, drop those failing locality or the device's limits
    or ``excluded`` (a schedule -> why the caller excludes it), and keep the one the
    latency-evaluator models fastest.

    Candidates are priced by `kernel_profile`, the same model the pipeline prices the chosen
    kernel with (and XLA's kernels against), so the choice and the report agree. They are
    priced in order of the least time the latency-evaluator could give them before their
    registers are modeled (`latency_lower_bound_us`); one whose least time is not below the
    fastest priced so far cannot win and is not priced (branch and bound: the same choice).

    ``chosen``: the schedules chosen so far (any mutable mapping, also one kept across
    processes), by a digest of the pattern's canonical form; a pattern equal up to names to
    an earlier one (a model's repeated layers) gets its schedule, built alone.
    ``fastest=False``: the first schedule that builds is enough (a capability query); the
    result says whether it is known to be the fastest (``ScheduledKernel.fastest``).
    ``below_us``: the caller takes the kernel only if it is modeled faster than this (XLA's
    kernels' time): a schedule whose least time is not below it is neither built (once one
    schedule has built) nor priced, and when no schedule is faster, ``NotFaster`` is raised
    (the same answer as choosing the fastest and comparing, with fewer schedules built).
    ``kept``: the chosen kernels by the same digest (`_keep`): an equal pattern's kernel is
    then that one with its own buffers, unbuilt and not priced again (``borrowed`` where it
    holds the earlier pattern's other names: only for the caller's questions, never to be
    compiled). ``not_faster``: the ``NotFaster`` answers by the same digest and ``below_us``
    (the search is the same for an equal pattern: so is its answer, which holds no name).
    ``priced=False`` (with ``fastest=False``): the first schedule that builds is not priced
    either (a pattern priced for the host CPU, whose GPU schedule is only emulated): its
    ``profile`` is None and its ``modeled_us`` NaN."""
    if not priced and fastest:
        raise ValueError("only a capability query (fastest=False) may leave its kernel unpriced")
    excluded = excluded or {}
    read = sum(s.byte_size for _, s in pattern.inputs)
    written = sum(s.byte_size for _, s in pattern.outputs)
    key = _memo_key(pattern, device, excluded) if chosen is not None else None
    before = chosen.get(key) if key is not None else None
    if before is not None:
        earlier = _chosen_before(pattern, before, name, device, read, written,
                                 kept.get(key) if kept is not None else None)
        if earlier is not None:
            if kept is not None:
                _keep(kept, key, earlier)
            return earlier
    verdict = (key, below_us, fastest)
    if key is not None and not_faster is not None and verdict in not_faster:
        raise NotFaster(not_faster[verdict], below_us)
    built, refused, candidates, pruned = [], [], [], []
    # (least us, schedule) of kernels built but not priced: not below ``below_us``
    not_below: list[tuple[float, Schedule]] = []
    stopped = False  # schedules left unbuilt (``fastest=False``)
    cutoff = (math.inf if below_us is None else below_us, -1)  # ties go to the caller
    strided = _strided_points(pattern)
    numbers = itertools.count()  # enumeration order: ties go to the first
    same_width: dict[int, tuple[Kernel, set[str]]] = {}  # `build_launched`'s

    def try_all(schedules: list[Schedule]) -> None:
        """Build ``schedules`` and price them, into ``built``, ``refused`` and ``pruned``.
        Those moving their bytes fastest first (`memory_bound_us`); the first kernel built
        is priced at once where another schedule's memory time alone could be above its time,
        and a schedule whose memory time is not below the fastest priced is not built. The
        other kernels are priced in order of their least time."""
        nonlocal stopped
        numbered = [(next(numbers), sched) for sched in schedules]
        memory = {sched: memory_bound_us(sched, read + written, device) for _, sched in numbered}
        most_memory = max(memory.values(), default=0.0)
        kernels = []  # (least us, number, schedule, kernel, schemes, no_reuse, counts, lanes)
        # A one-space schedule refused for cross-block communication: the reduction is read
        # at another thread group's result under any one-space schedule (all partition the
        # same reduction space into the same groups), so the others are refused unbuilt.
        cross_block: Refused | None = None
        too_large: Refused | None = None

        def any_built() -> bool:  # a kernel built, priced or not
            return bool(built or not_below or kernels)

        for number, sched in sorted(numbered, key=lambda n: (memory[n[1]], n[0])):
            if built and not fastest:
                stopped = True
                break
            if any_built() and _bound(built, cutoff) < (memory[sched], number):
                pruned.append((sched, memory[sched]))
                continue
            if sched in excluded:
                refused.append((number, Refused(sched, Refusal.EXCLUDED, excluded[sched])))
                continue
            if strided and sched.kind in ("warp", "block"):
                # The latency-evaluator does not price uncoalesced access; thread and tile
                # schedules read these reductions coalesced (consecutive results in lanes).
                refused.append((number, Refused(
                    sched, Refusal.UNCOALESCED, f"lanes would read points {strided} elements "
                                                f"apart (uncoalesced)")))
                continue
            if cross_block is not None and sched.kind != "phases" and not any_built():
                refused.append((number, Refused(sched, Refusal.CROSS_BLOCK, cross_block.detail)))
                continue
            if too_large is not None:
                # The values a kernel computes come from the pattern's index maps; another
                # schedule only runs more points per thread.
                refused.append((number, Refused(sched, Refusal.EXPRESSION_TOO_LARGE,
                                                too_large.detail)))
                continue
            outcome = build_launched(pattern, sched, name, device, same_width)
            if isinstance(outcome, Refused):
                refused.append((number, outcome))
                if outcome.kind is Refusal.CROSS_BLOCK and sched.kind != "phases":
                    cross_block = outcome
                if outcome.kind is Refusal.EXPRESSION_TOO_LARGE:
                    too_large = outcome
                continue
            kernel, schemes, no_reuse = outcome
            if not priced:
                # 0.0 orders it (the only one built); its modeled_us is NaN below
                built.append((0.0, number, sched, kernel, schemes, no_reuse, None))
                candidates.append((f"{sched.why}; not priced (the GPU schedule of a "
                                   f"host-priced pattern)", math.nan))
                continue
            lanes = used_lanes(kernel.body)  # both counts read them
            counts = unbounded_instructions(kernel, lanes)
            least = latency_lower_bound_us(kernel, counts, read + written, device)
            entry = (least, number, sched, kernel, schemes, no_reuse, counts, lanes)
            if cutoff < (least, number):
                not_below.append((least, sched))  # the caller would not take it
            elif not built and (not fastest or most_memory > least):
                # Its time bounds the fastest from above, and some schedule's memory time
                # may be above that: priced at once, it may spare those builds.
                price(entry)
            else:
                kernels.append(entry)
        for entry in sorted(kernels, key=lambda k: k[:2]):
            if _bound(built, cutoff) < entry[:2]:
                pruned.append((entry[2], entry[0]))
                continue
            price(entry)

    def price(entry) -> None:
        least, number, sched, kernel, schemes, no_reuse, counts, lanes = entry
        outcome = _priced(kernel, sched, read, written, device, counts, lanes)
        if isinstance(outcome, Refused):
            refused.append((number, outcome))
            return
        profile, modeled = outcome
        candidates.append((_description(sched, kernel, profile), modeled))
        built.append((modeled, number, sched, kernel, schemes, no_reuse, profile))

    # The phased schedules only where all one-space ones are refused for reductions over
    # different spaces or for locality, so every pattern that builds with one space keeps
    # its kernel.
    try:
        space = reduction_space(pattern)
    except CodegenError as e:
        if e.kind is not Refusal.DIFFERENT_SPACES:
            raise
        refused.append((-1, Refused(None, e.kind, e.detail)))
    else:
        reuse = space.reduced > 0 and (len(reduction_stages(pattern)) > 1 or any(
            s.num_elements == space.groups * space.reduced for _, s in pattern.outputs))
        sizes = [s.num_elements for _, s in pattern.outputs]
        try_all(enumerate_schedules(space, device, sizes, reuse))
    if not built and not not_below and any(
            r.kind in (Refusal.DIFFERENT_SPACES, Refusal.CROSS_BLOCK) for _, r in refused):
        try_all(enumerate_phased_schedules(pattern, device))
    refused = [r for _, r in sorted(refused, key=lambda n: n[0])]  # in enumeration order
    if (built or not_below) and not (built and _best(built) < cutoff):
        # every time priced or bounded: the least of them bounds the fastest from below
        least = min([b[0] for b in built] + [t for t, _ in not_below] + [t for _, t in pruned])
        if key is not None and not_faster is not None:
            not_faster[verdict] = least
        raise NotFaster(least, below_us)
    if not built:
        # Unsupported ops fail every schedule alike: the first refusal speaks for all; a
        # pattern only the phased schedule could build says why that failed too.
        first = refused[0]
        phased = [r.detail for r in refused if r.schedule is not None
                  and r.schedule.kind == "phases"]
        raise CodegenError(first.kind, first.detail + (
            f"; phased schedule: {phased[0]}" if phased and phased[0] != first.detail else ""))
    modeled, _, sched, kernel, schemes, no_reuse, profile = min(built, key=itemgetter(0, 1))
    if not priced:
        modeled = math.nan
    result = ScheduledKernel(kernel, sched, _in_order(schemes), modeled, no_reuse,
                             candidates + [(f"{s.why}; not priced: at least {least:.3f} us, "
                                            f"not below the fastest (modeled)", math.inf)
                                           for s, least in pruned]
                             + [(f"{r.what}; refused: {r.detail}", math.inf)
                                for r in refused],
                             profile, refused, fastest=not stopped, pruned=pruned)
    if key is not None and fastest:
        chosen[key] = sched
        if kept is not None:
            _keep(kept, key, result)
    return result


def memory_bound_us(sched: Schedule, bytes_moved: int, device: Device) -> float:
    """A time no kernel of ``sched`` is modeled below, before it is built: its bytes over
    the bandwidth its grid reaches, plus the launch (the latency-evaluator adds compute time,
    overlapped at most fully: ``overlap_us`` >= the memory time)."""
    return kernel_cost(bytes_moved, device, sched.grid_blocks).memory_us + LAUNCH_US


def _best(built: list[tuple]) -> tuple[float, int]:
    """(modeled us, enumeration number) of the fastest schedule priced so far."""
    return min(b[:2] for b in built)


def _bound(built: list[tuple], cutoff: tuple[float, int]) -> tuple[float, int]:
    """What a schedule's (least us, number) must be below to matter: the fastest priced
    so far, or the caller's ``below_us`` (number -1: a tie goes to the caller)."""
    return min(_best(built), cutoff) if built else cutoff


def _memo_key(pattern: Pattern, device: Device, excluded: Mapping[Schedule, str]
              ) -> str | None:
    """The pattern's canonical form, device and exclusions as a sha256 (a key a cache kept
    across processes can hold), None without a form."""
    form = pattern.canonical_form()
    if form is None:
        return None
    return hashlib.sha256(repr((form, device.name, sorted(map(repr, excluded)))).encode()
                          ).hexdigest()


def _keep(kept: MutableMapping[str, ScheduledKernel], key: str, result: ScheduledKernel
          ) -> None:
    """Keep the chosen kernel for patterns equal up to names: their kernel is this one with
    their own buffers (`_chosen_before`)."""
    if key not in kept:
        kept[key] = result


def _holds_names(result: ScheduledKernel) -> bool:
    """Whether a kernel holds names of its pattern besides its buffers': shared arrays (named
    after reductions), a phased schedule's (its loop variables too)."""
    return bool(result.kernel.shared) or result.schedule.kind == "phases"


def _chosen_before(pattern: Pattern, sched: Schedule, name: str, device: Device, read: int,
                   written: int, kept: ScheduledKernel | None = None) -> ScheduledKernel | None:
    """The kernel of the schedule chosen for a pattern equal up to names, built alone (None
    if it does not build here after all: then every schedule is tried); ``kept``'s kernel
    with this pattern's buffers when it is the one of that schedule, unbuilt and priced as
    it was (``borrowed`` where it holds that pattern's other names: `_holds_names`)."""
    borrowed = False
    if kept is not None and kept.schedule == sched:
        kernel = dataclasses.replace(kept.kernel, name=name, buffers=pattern.buffers())
        outcome = (kernel, set(kept.schemes), kept.smem_bytes_no_reuse, kept.profile,
                   kept.modeled_us)
        borrowed = _holds_names(kept)
    else:
        outcome = _build_and_price(pattern, sched, name, device, read, written)
    if isinstance(outcome, Refused):
        return None
    kernel, schemes, no_reuse, profile, modeled = outcome
    description = _description(sched, kernel, profile) + \
        "; chosen for an earlier pattern equal up to names"
    return ScheduledKernel(kernel, sched, _in_order(schemes), modeled, no_reuse,
                           [(description, modeled)], profile, [], fastest=True,
                           borrowed=borrowed)


def _build_and_price(pattern: Pattern, sched: Schedule, name: str, device: Device, read: int,
                     written: int) -> tuple | Refused:
    """(kernel, schemes, shared memory before reuse, profile, modeled us) of one schedule,
    or why it is refused."""
    outcome = build_launched(pattern, sched, name, device)
    if isinstance(outcome, Refused):
        return outcome
    kernel, schemes, no_reuse = outcome
    priced = _priced(kernel, sched, read, written, device)
    return priced if isinstance(priced, Refused) else (kernel, schemes, no_reuse, *priced)


def _priced(kernel: Kernel, sched: Schedule, read: int, written: int, device: Device,
            unbounded_counts: dict[str, float] | None = None, lanes: dict | None = None
            ) -> tuple[KernelProfile, float] | Refused:
    """(profile, modeled us) of a built kernel, or why it cannot launch."""
    profile = kernel_profile(kernel, read, written, unbounded_counts, lanes)
    try:
        return profile, kernel_latency_us(profile, device).total_us
    except ValueError as e:  # cannot launch (occupancy 0)
        return Refused(sched, Refusal.CANNOT_LAUNCH, str(e))


def build_launched(pattern: Pattern, sched: Schedule, name: str, device: Device,
                   same_width: dict[int, tuple[Kernel, set[str]]] | None = None
                   ) -> tuple | Refused:
    """(kernel, schemes, shared memory before reuse) of one schedule, with its launch bounds,
    or why it is refused.
    ``same_width``: kernels of `launch_free` loop schedules built so far for this pattern,
    by vector width; a loop schedule of a width built before is `relaunched` from it (the
    same kernel, without building it again)."""
    width = sched.vector if same_width is not None and sched.kind == "loop" and \
        launch_free(pattern, sched) else None
    if width is not None and width in same_width:
        earlier, schemes = same_width[width]
        return _launched(relaunched(earlier, sched), sched, set(schemes), device)
    try:
        kernel, schemes = build_kernel(pattern, sched, name)
    except CodegenError as e:
        return Refused(sched, e.kind, e.detail)
    if width is not None:
        same_width[width] = (kernel, set(schemes))
    return _launched(kernel, sched, schemes, device)


def _launched(kernel: Kernel, sched: Schedule, schemes: set[str], device: Device
              ) -> tuple | Refused:
    """A built kernel with its shared memory reused and its launch bounds, or why the
    device cannot launch it."""
    no_reuse = reuse_shared_memory(kernel)
    if math.prod(kernel.grid) <= device.sm_count:
        kernel.min_blocks_per_sm = 1  # the grid is one wave of one block per SM
    if kernel.smem_bytes > device.shared_memory_per_block:
        return Refused(sched, Refusal.SHARED_MEMORY, f"{kernel.smem_bytes} B shared memory "
                                                     f"exceeds {device.shared_memory_per_block} B")
    return kernel, schemes, no_reuse


def _description(sched: Schedule, kernel: Kernel, profile: KernelProfile) -> str:
    return f"{sched.why}; grid {kernel.grid[0]} x {kernel.block[0]}, " \
           f"~{profile.regs_per_thread} regs, {kernel.smem_bytes} B smem"


def _in_order(schemes: set[str]) -> list[str]:
    order = ["kernel_packing", "thread_composition", "warp_composition", "block_composition"]
    return [s for s in order if s in schemes]
