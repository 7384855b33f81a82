"""What the planner asks of a cost model: a kernel's time, a pack's time, a launch's cost.

``GpuPricing`` answers with the latency-evaluator of one GPU; ``host.HostPricing`` with the
host CPU's model. Both price XLA's kernels and ours alike, from a ``KernelProfile``.
"""
from __future__ import annotations

from .devices import Device
from .kernel_time import LAUNCH_US
from .latency import KernelProfile, kernel_latency_us


def packed_profile(parts: list[KernelProfile]) -> KernelProfile:
    """Kernel packing (remote fusion) on a GPU: the parts' blocks run side by side in one
    launch, so the grid is the sum; each block needs the largest part's resources, and a wave
    lasts as long as its slowest part (the per-class maximum of instructions)."""
    instructions: dict[str, float] = {}
    for p in parts:
        for cls, count in p.instructions.items():
            instructions[cls] = max(instructions.get(cls, 0.0), count)
    return KernelProfile(
        grid_blocks=sum(p.grid_blocks for p in parts),
        threads_per_block=max(p.threads_per_block for p in parts),
        regs_per_thread=max(p.regs_per_thread for p in parts),
        smem_bytes=max(p.smem_bytes for p in parts), instructions=instructions,
        bytes_read=sum(p.bytes_read for p in parts),
        bytes_written=sum(p.bytes_written for p in parts))


class GpuPricing:
    """Kernels priced by the latency-evaluator (paper 4.3) for ``device``."""

    launch_us = LAUNCH_US

    def __init__(self, device: Device):
        self.device = device
        self.name = device.name

    def kernel_us(self, profile: KernelProfile) -> float:
        return kernel_latency_us(profile, self.device).total_us

    def packed_us(self, parts: list[KernelProfile]) -> float:
        return self.kernel_us(packed_profile(parts))
