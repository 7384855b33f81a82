"""A kernel's ``costmodel.KernelProfile``: what the latency-evaluator prices it from."""
from __future__ import annotations

import math

import costmodel

from ..kernel_ir import Kernel, Value
from .instructions import count_instructions
from .lowered import used_lanes
from .registers import registers_and_load_window


def kernel_profile(kernel: Kernel, bytes_read: int, bytes_written: int,
                   unbounded_counts: dict[str, float] | None = None,
                   lanes: dict[Value, int] | None = None) -> costmodel.KernelProfile:
    """Launch shape, instructions per thread by op class, registers, shared memory, and the
    kernel's distinct global bytes (``bytes_read``: each input once). ``unbounded_counts``:
    the kernel's `unbounded_instructions`, when the caller has them (used where the
    registers leave every load in flight). ``lanes``: its `used_lanes`, likewise."""
    lanes = used_lanes(kernel.body) if lanes is None else lanes
    regs, load_window = registers_and_load_window(kernel, lanes)
    if unbounded_counts is not None and load_window == math.inf:
        counts = dict(unbounded_counts)
    else:
        counts = {}
        count_instructions(kernel, counts, load_window, lanes)
    return costmodel.KernelProfile(
        grid_blocks=math.prod(kernel.grid), threads_per_block=math.prod(kernel.block),
        regs_per_thread=regs, smem_bytes=kernel.smem_bytes,
        instructions=counts, bytes_read=bytes_read, bytes_written=bytes_written)


def host_kernel_profile(kernel: Kernel, bytes_read: int, bytes_written: int
                        ) -> costmodel.KernelProfile:
    """A CPU schedule's kernel (one thread per block) as the host model prices it: its
    instructions by op class, loops counted by their trips; no registers or shared memory."""
    counts: dict[str, float] = {}
    count_instructions(kernel, counts)
    return costmodel.KernelProfile(
        grid_blocks=math.prod(kernel.grid), threads_per_block=math.prod(kernel.block),
        regs_per_thread=0, smem_bytes=0, instructions=counts, bytes_read=bytes_read,
        bytes_written=bytes_written)


def unbounded_instructions(kernel: Kernel, lanes: dict[Value, int] | None = None
                           ) -> dict[str, float]:
    """Instructions per thread with every load in flight at once (no register window): as
    few as the kernel can execute, whatever registers it gets."""
    counts: dict[str, float] = {}
    count_instructions(kernel, counts, lanes=lanes)
    return counts


def latency_lower_bound_us(kernel: Kernel, counts: dict[str, float], bytes_moved: int,
                           device) -> float:
    """The least time the latency-evaluator can give ``kernel`` (``counts``: its
    `unbounded_instructions`), before its registers are modeled."""
    return costmodel.kernel_latency_lower_bound_us(
        math.prod(kernel.grid), math.prod(kernel.block), kernel.smem_bytes, counts, bytes_moved,
        device)
