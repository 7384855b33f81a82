"""Occupancy: how many blocks of a kernel one SM holds at once.

A port of NVIDIA's occupancy calculator (``cudaOccMaxActiveBlocksPerMultiprocessor`` in
``cuda_occupancy.h``, CUDA 13.0) for what the code generator launches: dynamic shared memory
with the per-function opt-in and the maximum carveout. The smallest of four limits wins:
warps, resident blocks, registers (per warp, in units of 256, across the four
sub-partitions) and shared memory (with the driver's reserved bytes per block).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from .devices import Device


@dataclass(frozen=True)
class ArchLimits:
    max_blocks_per_sm: int
    max_warps_per_sm: int
    max_regs_per_thread: int
    reg_alloc_unit: int  # registers, allocated per warp
    sub_partitions: int  # warp schedulers per SM; the register file is split among them
    smem_alloc_unit: int  # bytes
    reserved_smem_per_block: int  # bytes the CUDA driver keeps per block

    @property
    def max_threads_per_sm(self) -> int:
        return self.max_warps_per_sm * 32


# Sources:
#  [guide]  CUDA C++ Programming Guide, "Technical Specifications per Compute Capability":
#           resident blocks / warps per SM, 255 registers per thread, and the 1 KB of shared
#           memory per block "reserved for system use" on 8.x and 9.0.
#  [occ]    cuda_occupancy.h (CUDA 13.0): cudaOccMaxBlocksPerMultiprocessor (32/16/32/32),
#           cudaOccRegAllocationGranularity (256), cudaOccSubPartitionsPerMultiprocessor (4),
#           cudaOccSMemAllocationGranularity (256 on 7.x, 128 on 8.x and 9.x).
#  The reserved bytes reach the calculator as cudaDeviceProp.reservedSharedMemPerBlock; the
#  A100 and H100 target configs show them too: opt-in per block = per SM - 1024.
ARCH_LIMITS: dict[str, ArchLimits] = {
    "sm_70": ArchLimits(max_blocks_per_sm=32, max_warps_per_sm=64, max_regs_per_thread=255,
                        reg_alloc_unit=256, sub_partitions=4, smem_alloc_unit=256,
                        reserved_smem_per_block=0),
    "sm_75": ArchLimits(max_blocks_per_sm=16, max_warps_per_sm=32, max_regs_per_thread=255,
                        reg_alloc_unit=256, sub_partitions=4, smem_alloc_unit=256,
                        reserved_smem_per_block=0),
    "sm_80": ArchLimits(max_blocks_per_sm=32, max_warps_per_sm=64, max_regs_per_thread=255,
                        reg_alloc_unit=256, sub_partitions=4, smem_alloc_unit=128,
                        reserved_smem_per_block=1024),
    "sm_90": ArchLimits(max_blocks_per_sm=32, max_warps_per_sm=64, max_regs_per_thread=255,
                        reg_alloc_unit=256, sub_partitions=4, smem_alloc_unit=128,
                        reserved_smem_per_block=1024),
}

# The order in which tied limiters are named.
_LIMITERS = ("registers", "shared_memory", "warps", "blocks")


@dataclass(frozen=True)
class Occupancy:
    active_blocks_per_sm: int
    active_warps_per_sm: int
    occupancy_fraction: float  # active warps / max warps per SM
    limiter: str  # the binding limit(s), "+"-joined when tied; why a block cannot launch if 0


def arch_limits(device: Device) -> ArchLimits:
    try:
        return ARCH_LIMITS[device.sm_arch]
    except KeyError:
        raise ValueError(f"no occupancy limits for {device.sm_arch}; known: "
                         f"{', '.join(sorted(ARCH_LIMITS))}") from None


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


@lru_cache(maxsize=4096)
def occupancy(device: Device, threads_per_block: int, regs_per_thread: int,
              smem_per_block: int) -> Occupancy:
    """Resident blocks per SM for a launch; ``smem_per_block`` is static + dynamic bytes.

    A pure function of a few small numbers that the explorer and the code generator ask
    about for every kernel they price (a 10^5-node exploration prices 10^5 of XLA's kernels
    with a handful of distinct launches), so answers are cached."""
    arch = arch_limits(device)
    if threads_per_block <= 0 or regs_per_thread < 0 or smem_per_block < 0:
        raise ValueError("threads_per_block must be positive, registers and shared memory "
                         "non-negative")
    warps_per_block = -(-threads_per_block // device.warp_size)

    if threads_per_block > device.max_threads_per_block:
        return Occupancy(0, 0, 0.0, "threads_per_block")
    by_warps = arch.max_warps_per_sm // warps_per_block

    regs_per_warp = _round_up(regs_per_thread * device.warp_size, arch.reg_alloc_unit)
    regs_checked_by_hardware = regs_per_warp * _round_up(warps_per_block, arch.sub_partitions)
    if (regs_per_thread > arch.max_regs_per_thread
            or regs_checked_by_hardware > device.registers_per_block
            or regs_per_warp * warps_per_block > device.registers_per_block):
        by_regs = 0
    elif regs_per_warp == 0:
        by_regs = math.inf
    else:
        warps_per_sub_partition = (device.registers_per_sm // arch.sub_partitions) // regs_per_warp
        by_regs = warps_per_sub_partition * arch.sub_partitions // warps_per_block

    smem = _round_up(smem_per_block + arch.reserved_smem_per_block, arch.smem_alloc_unit)
    # Above the default per-block limit the kernel must opt in (cudaFuncSetAttribute); the
    # code generator does, so the opt-in limit applies. The driver's reserve comes on top.
    per_block_limit = (device.shared_memory_per_block_optin
                       if smem_per_block > device.shared_memory_per_block
                       else device.shared_memory_per_block) + arch.reserved_smem_per_block
    if smem > per_block_limit:
        by_smem = 0
    elif smem == 0:
        by_smem = math.inf
    else:
        # Maximum carveout: all of the SM's unified L1/shared storage that may be shared
        # memory. The calculator aligns the carveout up to a size the architecture offers;
        # shared_memory_per_sm is already one of those sizes on every device here.
        by_smem = device.shared_memory_per_sm // smem

    limits = {"registers": by_regs, "shared_memory": by_smem, "warps": by_warps,
              "blocks": arch.max_blocks_per_sm}
    blocks = min(limits.values())
    limiter = "+".join(name for name in _LIMITERS if limits[name] == blocks)
    warps = blocks * warps_per_block
    return Occupancy(blocks, warps, warps / arch.max_warps_per_sm, limiter)
