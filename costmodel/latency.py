"""The latency-evaluator (paper section 4.3): modeled time of one kernel from a plain profile.

    L = N_wave * L_warp,  N_wave = ceil(grid / (blocks per SM * SMs)),
    L_warp = sum over op classes of N_instruction * CPI

CPI per op class comes from published microbenchmarks (data/cpi.json), throughput-bound when
many warps share a scheduler; memory is bounded below by kernel_time.kernel_cost; compute C
and memory M overlap as in XLA's GPU performance model, max(C, M) + 0.05 min(C, M), plus a
1 us launch.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .devices import Device
from .instructions import overlapped
from .kernel_time import LAUNCH_US, kernel_cost
from .occupancy import ARCH_LIMITS, Occupancy, arch_limits, occupancy

CPI_FILE = Path(__file__).parent / "data" / "cpi.json"

# XLA GPU performance model: fraction of the shorter of compute and memory time hidden under
# the longer one (priority-fusion option memory_compute_parallelism, "chosen empirically").
MEMORY_COMPUTE_OVERLAP = 0.95

# Registers a kernel needs besides its live values: thread/block indices, the linear element
# index, a loop counter and 64-bit base addresses. Measured with ptxas 13.0 for sm_80 on PTX
# kernels that keep K loaded f32 values live until one final combine: K + 8 registers for
# K = 4, 8, 16, 32 (sm_90: K + 8 to K + 12); a one-element copy kernel uses 8.
REGISTER_OVERHEAD = 8
MAX_REGISTERS_PER_THREAD = 255  # CUDA Programming Guide; ptxas spills beyond it


@dataclass(frozen=True)
class KernelProfile:
    """A kernel as the latency-evaluator sees it, independent of any code generator."""
    grid_blocks: int
    threads_per_block: int
    regs_per_thread: int
    smem_bytes: int  # static + dynamic shared memory per block
    instructions: Mapping[str, float]  # per thread, by op class (cpi.json "classes")
    bytes_read: int  # global memory
    bytes_written: int


@dataclass(frozen=True)
class LatencyBreakdown:
    waves: int
    occupancy: Occupancy
    warp_cycles: float  # L_warp
    compute_us: float  # N_wave * L_warp / clock
    memory_us: float  # global bytes / bandwidth of the SMs the grid runs on
    launch_us: float
    total_us: float


@dataclass(frozen=True)
class OpCost:
    latency: float  # cycles a warp waits for a dependent result
    issue: float  # cycles one warp instruction occupies its scheduler's units


@lru_cache(maxsize=None)
def op_costs(sm_arch: str) -> dict[str, OpCost]:
    arch = json.loads(CPI_FILE.read_text())["arch"][sm_arch]
    # Each scheduler issues at most one 32-lane warp instruction per clock, so a class with
    # R results per clock per SM keeps a scheduler busy 32 * schedulers / R cycles.
    lanes_per_sm_clock = 32 * ARCH_LIMITS[sm_arch].sub_partitions
    costs = {op: OpCost(latency=arch["latency_cycles"][op][0],
                        issue=lanes_per_sm_clock / arch["per_sm_per_clock"][op][0])
             for op in arch["latency_cycles"]}
    # An instruction independent of those before it (another copy of an unrolled loop's
    # body) issues without waiting for them: only its issue cycles, as for loads in flight.
    costs.update({overlapped(op): OpCost(latency=cost.issue, issue=cost.issue)
                  for op, cost in list(costs.items()) if overlapped(op) not in costs})
    return costs


# The latencies that rank dependency chains (which one is longest) in both views of a kernel,
# the stitched IR (codegen/cost/) and XLA's fused computations (graph/xla_kernel_model.py); the
# device's own costs then price the instructions. The default target's: sm_80's rank alike.
CHAIN_ARCH = "sm_90"


def chain_latency(instructions: Mapping[str, float]) -> float:
    """Cycles a chain of these instructions (by op class) waits at CHAIN_ARCH's latencies."""
    costs = op_costs(CHAIN_ARCH)
    return sum(n * costs[op].latency for op, n in instructions.items())


def warp_cycles(instructions: Mapping[str, float], costs: Mapping[str, OpCost],
                warps_per_scheduler: int) -> float:
    """L_warp: cycles for each warp of a wave to run its instructions."""
    cycles = 0.0
    for op, count in instructions.items():
        cost = costs.get(op)
        if cost is None:
            raise KeyError(f"unknown op class {op!r}; known: {', '.join(costs)}")
        cycles += count * max(cost.latency, warps_per_scheduler * cost.issue)
    return cycles


def compute_cycles(device: Device, grid_blocks: int, threads_per_block: int, occ: Occupancy,
                   instructions: Mapping[str, float],
                   costs: Mapping[str, OpCost]) -> tuple[int, float, float]:
    """(N_wave, L_warp, N_wave * L_warp) for a launch whose occupancy is ``occ``."""
    if occ.active_blocks_per_sm == 0:
        raise ValueError(f"kernel cannot launch on {device.name}: {occ.limiter} exceeded")
    return _cycles(device, grid_blocks, threads_per_block, occ.active_blocks_per_sm,
                   instructions, costs)


def _cycles(device: Device, grid_blocks: int, threads_per_block: int, active_blocks: int,
            instructions: Mapping[str, float],
            costs: Mapping[str, OpCost]) -> tuple[int, float, float]:
    waves = -(-grid_blocks // (active_blocks * device.sm_count))
    warps_per_block = -(-threads_per_block // device.warp_size)
    # Warps resident per SM in a full wave, or fewer when the grid does not fill one.
    blocks_per_sm = min(active_blocks, -(-grid_blocks // device.sm_count))
    schedulers = arch_limits(device).sub_partitions
    per_scheduler = -(-blocks_per_sm * warps_per_block // schedulers)
    l_warp = warp_cycles(instructions, costs, per_scheduler)
    return waves, l_warp, waves * l_warp


def overlap_us(compute_us: float, memory_us: float) -> float:
    return compute_us + memory_us - MEMORY_COMPUTE_OVERLAP * min(compute_us, memory_us)


def kernel_latency_us(profile: KernelProfile, device: Device) -> LatencyBreakdown:
    occ = occupancy(device, profile.threads_per_block, profile.regs_per_thread,
                    profile.smem_bytes)
    waves, l_warp, cycles = compute_cycles(device, profile.grid_blocks,
                                           profile.threads_per_block, occ,
                                           profile.instructions, op_costs(device.sm_arch))
    compute_us = cycles / (device.clock_ghz * 1e3)
    memory_us = kernel_cost(profile.bytes_read + profile.bytes_written, device,
                            profile.grid_blocks).memory_us
    return LatencyBreakdown(waves=waves, occupancy=occ, warp_cycles=l_warp,
                            compute_us=compute_us, memory_us=memory_us, launch_us=LAUNCH_US,
                            total_us=overlap_us(compute_us, memory_us) + LAUNCH_US)


def kernel_latency_lower_bound_us(grid_blocks: int, threads_per_block: int, smem_bytes: int,
                                  instructions: Mapping[str, float], bytes_moved: int,
                                  device: Device) -> float:
    """The least ``kernel_latency_us`` of a launch whatever its registers per thread: the
    minimum over every occupancy those could give (at most the one of no registers), so
    a schedule's kernel is priced in full only when it could be the fastest. With
    ``instructions`` counted as few as they can be (loads all in flight), it bounds the
    kernel's time from below (inf: it cannot launch)."""
    most = occupancy(device, threads_per_block, 0, smem_bytes).active_blocks_per_sm
    costs = op_costs(device.sm_arch)
    memory_us = kernel_cost(bytes_moved, device, grid_blocks).memory_us
    least = min((_cycles(device, grid_blocks, threads_per_block, active, instructions, costs)[2]
                 for active in range(1, most + 1)), default=None)
    if least is None:
        return float("inf")
    return overlap_us(least / (device.clock_ghz * 1e3), memory_us) + LAUNCH_US


def estimate_registers(live_value_counts: Iterable[int]) -> int:
    """Registers per thread from the number of 32-bit values live at each program point
    (a 64-bit value counts 2): the peak plus REGISTER_OVERHEAD, capped where ptxas spills."""
    return min(max(live_value_counts, default=0) + REGISTER_OVERHEAD, MAX_REGISTERS_PER_THREAD)
