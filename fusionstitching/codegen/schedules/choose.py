"""The choice among candidate schedules: each built, refused ones kept with why, the fastest
modeled by the latency-evaluator taken (`schedule_pattern`); and the host's schedule.

The phased schedule is enumerated only where every one-space schedule is refused (reductions
over different spaces, or cross-block communication), so patterns that build with one space
keep their kernel.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from costmodel import KernelProfile, kernel_latency_us
from costmodel.devices import Device

from ..cost.kernel_profile import kernel_profile
from ..errors import CodegenError, Refusal
from ..flatten import Pattern
from ..index_expr import strides as _element_strides
from ..kernel_ir import Kernel
from .candidates import Schedule, enumerate_schedules
from .one_space import build_one_space_kernel
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


def build_kernel(pattern: Pattern, sched: Schedule, name: str) -> tuple[Kernel, set[str]]:
    """The kernel IR of `pattern` under one schedule; raises CodegenError (e.g. locality)."""
    if sched.kind == "phases":
        return build_phased_kernel(pattern, sched, name)
    return build_one_space_kernel(pattern, sched, name)


def host_schedule(pattern: Pattern, chosen: Schedule | None = None) -> Schedule:
    """The schedule a CPU runs fastest: one thread per block, so every loop is a plain serial
    loop (vectorizable) and per-group or per-kernel values are computed once, not per element.
    A phased kernel (``chosen``) stays phased, with one thread and its loops rolled."""
    if chosen is not None and chosen.kind == "phases":
        return dataclasses.replace(chosen, groups_per_block=1, threads_per_group=1, vector=1,
                                   grid_blocks=1, unrolled=False)
    space = reduction_space(pattern)
    if space.reduced == 0:
        return Schedule("loop", space, 1, 1, 1)
    return Schedule("thread", space, 1, 1, space.groups)


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
                     chosen: dict | None = None) -> ScheduledKernel:
    """Build every enumerated schedule, drop those failing locality or the device's limits
    or ``excluded`` (a schedule -> why the caller excludes it), and keep the one the
    latency-evaluator models fastest.

    Candidates are priced by `kernel_profile`, the same model the pipeline prices the chosen
    kernel with (and XLA's kernels against), so the choice and the report agree.

    ``chosen``: the schedules chosen so far, by the pattern's canonical form; a pattern equal
    up to names to an earlier one (a model's repeated layers) gets its schedule, built alone."""
    excluded = excluded or {}
    read = sum(s.byte_size for _, s in pattern.inputs)
    written = sum(s.byte_size for _, s in pattern.outputs)
    key = _memo_key(pattern, device, excluded) if chosen is not None else None
    if key is not None and key in chosen:
        earlier = _chosen_before(pattern, chosen[key], name, device, read, written)
        if earlier is not None:
            return earlier
    built, refused, candidates = [], [], []
    strided = _strided_points(pattern)

    def schedules():
        """The one-space schedules; the phased ones only where all of those are refused for
        reductions over different spaces or for locality, so every pattern that builds with
        one space keeps its kernel."""
        try:
            space = reduction_space(pattern)
        except CodegenError as e:
            if e.kind is not Refusal.DIFFERENT_SPACES:
                raise
            refused.append(Refused(None, e.kind, e.detail))
        else:
            reuse = space.reduced > 0 and (len(reduction_stages(pattern)) > 1 or any(
                s.num_elements == space.groups * space.reduced for _, s in pattern.outputs))
            sizes = [s.num_elements for _, s in pattern.outputs]
            yield from enumerate_schedules(space, device, sizes, reuse)
        if not built and any(r.kind in (Refusal.DIFFERENT_SPACES, Refusal.CROSS_BLOCK)
                             for r in refused):
            yield from enumerate_phased_schedules(pattern, device)

    for sched in schedules():
        if sched in excluded:
            refused.append(Refused(sched, Refusal.EXCLUDED, excluded[sched]))
            continue
        if strided and sched.kind in ("warp", "block"):
            # The latency-evaluator does not price uncoalesced access; thread and tile
            # schedules read these reductions coalesced (consecutive results in lanes).
            refused.append(Refused(sched, Refusal.UNCOALESCED,
                                   f"lanes would read points {strided} elements apart "
                                   f"(uncoalesced)"))
            continue
        outcome = _build_and_price(pattern, sched, name, device, read, written)
        if isinstance(outcome, Refused):
            refused.append(outcome)
            continue
        kernel, schemes, no_reuse, profile, modeled = outcome
        candidates.append((_description(sched, kernel, profile), modeled))
        built.append((modeled, len(built), sched, kernel, schemes, no_reuse, profile))
    if not built:
        # Unsupported ops fail every schedule alike: the first refusal speaks for all; a
        # pattern only the phased schedule could build says why that failed too.
        first = refused[0]
        phased = [r.detail for r in refused if r.schedule is not None
                  and r.schedule.kind == "phases"]
        raise CodegenError(first.kind, first.detail + (
            f"; phased schedule: {phased[0]}" if phased and phased[0] != first.detail else ""))
    modeled, _, sched, kernel, schemes, no_reuse, profile = min(built, key=lambda b: b[:2])
    if key is not None:
        chosen[key] = sched
    return ScheduledKernel(kernel, sched, _in_order(schemes), modeled, no_reuse,
                           candidates + [(f"{r.what}; refused: {r.detail}", math.inf)
                                         for r in refused], profile, refused)


def _memo_key(pattern: Pattern, device: Device, excluded: Mapping[Schedule, str]):
    form = pattern.canonical_form()
    return None if form is None else (form, device.name, frozenset(excluded))


def _chosen_before(pattern: Pattern, sched: Schedule, name: str, device: Device, read: int,
                   written: int) -> ScheduledKernel | None:
    """The kernel of the schedule chosen for a pattern equal up to names, built alone (None
    if it does not build here after all: then every schedule is tried)."""
    outcome = _build_and_price(pattern, sched, name, device, read, written)
    if isinstance(outcome, Refused):
        return None
    kernel, schemes, no_reuse, profile, modeled = outcome
    description = _description(sched, kernel, profile) + \
        "; chosen for an earlier pattern equal up to names"
    return ScheduledKernel(kernel, sched, _in_order(schemes), modeled, no_reuse,
                           [(description, modeled)], profile, [])


def _build_and_price(pattern: Pattern, sched: Schedule, name: str, device: Device, read: int,
                     written: int) -> tuple | Refused:
    """(kernel, schemes, shared memory before reuse, profile, modeled us) of one schedule,
    or why it is refused."""
    try:
        kernel, schemes = build_kernel(pattern, sched, name)
    except CodegenError as e:
        return Refused(sched, e.kind, e.detail)
    no_reuse = reuse_shared_memory(kernel)
    if math.prod(kernel.grid) <= device.sm_count:
        kernel.min_blocks_per_sm = 1  # the grid is one wave of one block per SM
    if kernel.smem_bytes > device.shared_memory_per_block:
        return Refused(sched, Refusal.SHARED_MEMORY, f"{kernel.smem_bytes} B shared memory "
                                                     f"exceeds {device.shared_memory_per_block} B")
    profile = kernel_profile(kernel, read, written)
    try:
        modeled = kernel_latency_us(profile, device).total_us
    except ValueError as e:  # cannot launch (occupancy 0)
        return Refused(sched, Refusal.CANNOT_LAUNCH, str(e))
    return kernel, schemes, no_reuse, profile, modeled


def _description(sched: Schedule, kernel: Kernel, profile: KernelProfile) -> str:
    return f"{sched.why}; grid {kernel.grid[0]} x {kernel.block[0]}, " \
           f"~{profile.regs_per_thread} regs, {kernel.smem_bytes} B smem"


def _in_order(schemes: set[str]) -> list[str]:
    order = ["kernel_packing", "thread_composition", "warp_composition", "block_composition"]
    return [s for s in order if s in schemes]
