"""A kernel's ``costmodel.KernelProfile``: what the latency-evaluator prices it from."""
from __future__ import annotations

import math

import costmodel

from ..kernel_ir import Kernel
from .instructions import count_instructions
from .registers import registers_and_load_window


def kernel_profile(kernel: Kernel, bytes_read: int, bytes_written: int
                   ) -> costmodel.KernelProfile:
    """Launch shape, instructions per thread by op class, registers, shared memory, and the
    kernel's distinct global bytes (``bytes_read``: each input once)."""
    regs, load_window = registers_and_load_window(kernel)
    counts: dict[str, float] = {}
    count_instructions(kernel, counts, load_window)
    return costmodel.KernelProfile(
        grid_blocks=math.prod(kernel.grid), threads_per_block=math.prod(kernel.block),
        regs_per_thread=regs, smem_bytes=kernel.smem_bytes,
        instructions=counts, bytes_read=bytes_read, bytes_written=bytes_written)
