"""The delta-evaluator (paper section 5.4): what fusing a candidate pattern gains, in us.

    f = T_reduced_mem + T_reduced_calls - T_penalty

T_reduced_mem prices the intermediates kept on chip by a line latency + bytes / bandwidth per
memory level (published numbers, data/cpi.json); T_reduced_calls is 1 us per kernel removed;
T_penalty is the fused kernel's time above its memory floor by the simplified
latency-evaluator (16 registers, the pattern's largest shared-memory use). It runs inside
the explorer's search: plain float arithmetic, per-device constants and occupancy cached.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from .devices import Device
from .kernel_time import LAUNCH_US
from .latency import CPI_FILE, compute_cycles, op_costs, overlap_us
from .occupancy import Occupancy, occupancy

PENALTY_REGISTERS = 16  # paper 5.4: "we use a fixed number (16) as registers number"


@dataclass(frozen=True)
class PatternSummary:
    """A candidate fusion pattern as plain data.

    ``register_bytes`` / ``shared_bytes``: global-memory traffic the unfused kernels spent on
    the intermediates the pattern keeps in registers / shared memory, every access counted (a
    tensor written once and read once counts twice its size)."""
    register_bytes: int
    shared_bytes: int
    kernels_merged: int  # kernels the pattern replaces by one
    grid_blocks: int
    threads_per_block: int
    max_shared_memory: int  # bytes per block, largest use in and between the pattern's ops
    instructions: Mapping[str, float]  # per thread of the fused kernel, by op class
    global_bytes: int  # what the fused kernel still reads and writes in global memory


@dataclass(frozen=True)
class DeltaBreakdown:
    reduced_mem_us: float
    reduced_calls_us: float
    penalty_us: float

    @property
    def score(self) -> float:
        return self.reduced_mem_us + self.reduced_calls_us - self.penalty_us


@dataclass(frozen=True)
class MemoryLevel:
    latency_us: float
    us_per_byte: float

    def time_us(self, nbytes: float) -> float:
        return self.latency_us + nbytes * self.us_per_byte if nbytes > 0 else 0.0


def memory_levels(device: Device) -> dict[str, MemoryLevel]:
    arch = json.loads(CPI_FILE.read_text())["arch"][device.sm_arch]
    cycles_to_us = 1.0 / (device.clock_ghz * 1e3)
    shared_bandwidth = (arch["shared_memory_bytes_per_clock_per_sm"][0] * device.sm_count
                        * device.clock_ghz * 1e9)  # bytes/s over all SMs
    return {
        "global": MemoryLevel(arch["latency_cycles"]["ld_global"][0] * cycles_to_us,
                              1e6 / device.memory_bandwidth),
        "shared": MemoryLevel(arch["latency_cycles"]["ld_shared"][0] * cycles_to_us,
                              1e6 / shared_bandwidth),
    }


class DeltaEvaluator:
    """Scores patterns for one device."""

    def __init__(self, device: Device):
        self.device = device
        levels = memory_levels(device)
        self._global, self._shared = levels["global"], levels["shared"]
        self._costs = op_costs(device.sm_arch)
        self._us_per_cycle = 1.0 / (device.clock_ghz * 1e3)
        self._occupancy: dict[tuple[int, int], Occupancy] = {}

    def evaluate(self, p: PatternSummary) -> DeltaBreakdown:
        return DeltaBreakdown(
            self.reduced_mem_us(p.register_bytes, p.shared_bytes),
            (p.kernels_merged - 1) * LAUNCH_US,
            self.penalty_us(p.grid_blocks, p.threads_per_block, p.max_shared_memory,
                            p.instructions, p.global_bytes))

    # The two terms separately, from plain numbers: the explorer bounds f by the first
    # before it builds anything for the second (see PatternSummary for the arguments).

    def reduced_mem_us(self, register_bytes: int, shared_bytes: int) -> float:
        # Registers cost nothing to keep a value in (see the module docstring).
        return (self._global.time_us(register_bytes) + self._global.time_us(shared_bytes)
                - self._shared.time_us(shared_bytes))

    def penalty_us(self, grid_blocks: int, threads_per_block: int, max_shared_memory: int,
                   instructions: Mapping[str, float], global_bytes: int) -> float:
        key = (threads_per_block, max_shared_memory)
        occ = self._occupancy.get(key)
        if occ is None:
            occ = self._occupancy[key] = occupancy(self.device, threads_per_block,
                                                   PENALTY_REGISTERS, max_shared_memory)
        if occ.active_blocks_per_sm == 0:  # the fused kernel cannot launch: never fuse
            return float("inf")
        _, _, cycles = compute_cycles(self.device, grid_blocks, threads_per_block, occ,
                                      instructions, self._costs)
        memory_us = global_bytes * self._global.us_per_byte
        return overlap_us(cycles * self._us_per_cycle, memory_us) - memory_us

    def score(self, p: PatternSummary) -> float:
        return self.evaluate(p).score


@lru_cache(maxsize=None)
def delta_evaluator(device: Device) -> DeltaEvaluator:
    return DeltaEvaluator(device)


def delta_evaluate(pattern: PatternSummary, device: Device) -> DeltaBreakdown:
    return delta_evaluator(device).evaluate(pattern)
