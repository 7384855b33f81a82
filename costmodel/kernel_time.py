"""Kernel time from bytes alone: memory roofline plus launch cost (modeled, not measured).

A kernel moving N bytes takes at least N / bandwidth, where a grid of B blocks runs on
min(B, SMs) SMs, each drawing its fair share bandwidth / SMs (conservative for small grids).
latency.py uses ``kernel_cost`` as its memory term where a kernel's launch and instructions
are known; this alone prices a kernel known only by its bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

from .devices import Device

# XLA:GPU's performance model charges 1 us per kernel launch
# (xla/service/gpu/model/gpu_performance_model_base.h, kKernelLaunchOverhead).
LAUNCH_US = 1.0


@dataclass(frozen=True)
class KernelCost:
    memory_us: float
    launch_us: float

    @property
    def total_us(self) -> float:
        return self.memory_us + self.launch_us


def kernel_cost(bytes_moved: int, device: Device, grid_blocks: int | None = None) -> KernelCost:
    """``grid_blocks``: the launch's blocks (None: a grid that fills the device)."""
    sms = device.sm_count if grid_blocks is None else min(grid_blocks, device.sm_count)
    bandwidth = device.memory_bandwidth * sms / device.sm_count
    return KernelCost(memory_us=bytes_moved / bandwidth * 1e6, launch_us=LAUNCH_US)


def plan_time_us(kernel_bytes: list[int], device: Device) -> float:
    """Modeled time of a sequence of memory-intensive kernels, each given by its bytes."""
    return sum(kernel_cost(b, device).total_us for b in kernel_bytes)
