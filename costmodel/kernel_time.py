"""A first kernel-time model: memory roofline plus launch cost (modeled, not measured).

This is the placeholder the cost-model issue replaces with the paper's latency-evaluator
(occupancy, waves, CPI). It already keeps the one bound every later model must keep: a
kernel moving N bytes takes at least N / bandwidth.
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
