"""Kernel time from bytes alone: memory roofline plus launch cost (modeled, not measured).

The bound every model here keeps: a kernel moving N bytes takes at least N / bandwidth.
latency.py (the paper's latency-evaluator) uses ``kernel_cost`` as its memory term and adds
compute from occupancy, waves and CPI; use it when the kernel's launch and instructions are
known, and this when only its bytes are.
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


def kernel_cost(bytes_moved: int, device: Device) -> KernelCost:
    return KernelCost(memory_us=bytes_moved / device.memory_bandwidth * 1e6, launch_us=LAUNCH_US)


def plan_time_us(kernel_bytes: list[int], device: Device) -> float:
    """Modeled time of a sequence of memory-intensive kernels, each given by its bytes."""
    return sum(kernel_cost(b, device).total_us for b in kernel_bytes)
