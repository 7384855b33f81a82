"""Kernel profiles and delta-evaluator summaries of candidate patterns, from the graph alone.

The code generator knows the real launch of a pattern only after scheduling it, which is
too slow to run per candidate, so the explorer models a pattern's kernel simply:

- Launch. Without a reduction: one thread per element of the largest iteration space,
  ``LOOP_THREADS`` per block. With row reductions (R rows of C columns, R = the largest
  reduction's output elements): a warp per row, ``ROWS_PER_BLOCK`` rows per block, when a row
  has at most ``WARP_ROW_COLUMNS`` columns; otherwise a block of ``ROW_BLOCK_THREADS`` per row
  (block composition). Every op of the pattern then runs on that launch: a reduction's
  consumers inside the pattern are confined to its R-row grid, which is what makes fusing
  them costly when rows are few and long.
- Instructions per thread: each kernel's per-element mix (``GraphIndex.mix``) times its
  elements over the launch's threads; a row reduction adds a warp reduction (log2(32) = 5
  shuffles) and, under block composition, one shared-memory store, barrier and load.
- Shared memory: block composition leaves one float per warp per reduction
  (``REDUCTION_SMEM_BYTES``, a warp's worth of floats); warp composition needs none.
- Registers: ``costmodel.estimate_registers`` over two live values per kernel in the pattern
  (its result and one operand), capped at ``MAX_LIVE_VALUES``.
- Bytes: ``GraphIndex.traffic`` (the same counting as ``graph.traffic.pattern_traffic``).

A code generator that can report a real ``KernelProfile`` plugs in through the explorer's
``profile_of`` parameter; the delta-evaluator summary keeps using this model.
"""
from __future__ import annotations

from collections.abc import Iterable

from costmodel import KernelProfile, PatternSummary, estimate_registers

from .index import GraphIndex

LOOP_THREADS = 256
WARP_ROW_COLUMNS = 1024  # 32 lanes x 32 elements each
ROWS_PER_BLOCK = 4
ROW_BLOCK_THREADS = 512
REDUCTION_SMEM_BYTES = 32 * 4
WARP_REDUCE_SHUFFLES = 5
ELEMENT_BYTES = 4  # global loads/stores are counted in 4-byte lanes
MAX_LIVE_VALUES = 64


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class PatternModel:
    """Profiles and summaries of patterns of one graph."""

    def __init__(self, index: GraphIndex):
        self.index = index
        # Per kernel: (elements, rows or 0, instructions per element times elements), so a
        # pattern's profile is one pass of sums and maxima over its kernels.
        self._facts = {n: (index.elements[n], index.rows.get(n, 0),
                           tuple((cls, count * index.elements[n])
                                 for cls, count in index.mix[n].items()))
                       for n in index.participants}

    def _gather(self, nodes: Iterable[str]):
        """(largest iteration space, most reduction rows, reductions, summed work by class)."""
        facts = self._facts
        elements = rows = reductions = 0
        work: dict[str, float] = {}
        for n in nodes:
            e, r, mix = facts[n]
            if e > elements:
                elements = e
            if r:
                reductions += 1
                if r > rows:
                    rows = r
            for cls, w in mix:
                work[cls] = work.get(cls, 0.0) + w
        return elements, rows, reductions, work

    @staticmethod
    def _launch(elements: int, rows: int, reductions: int) -> tuple[int, int, bool]:
        """(grid blocks, threads per block, block composition?)."""
        if not reductions:
            return _ceil_div(elements, LOOP_THREADS), LOOP_THREADS, False
        columns = _ceil_div(elements, rows)
        if columns <= WARP_ROW_COLUMNS:
            return _ceil_div(rows, ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK, False
        return rows, ROW_BLOCK_THREADS, True

    def profile(self, nodes: frozenset[str], traffic=None) -> KernelProfile:
        reads, writes, _, _ = traffic or self.index.traffic(nodes)
        elements, rows, reductions, work = self._gather(nodes)
        grid, block, block_composition = self._launch(elements, rows, reductions)
        threads = grid * block
        instructions = {cls: w / threads for cls, w in work.items()}
        if reductions:
            shuffles = WARP_REDUCE_SHUFFLES * reductions
            instructions["shfl"] = instructions.get("shfl", 0.0) + shuffles
            if block_composition:
                for cls in ("st_shared", "barrier", "ld_shared"):
                    instructions[cls] = instructions.get(cls, 0.0) + float(reductions)
        instructions["ld_global"] = reads / ELEMENT_BYTES / threads
        instructions["st_global"] = writes / ELEMENT_BYTES / threads
        return KernelProfile(
            grid_blocks=grid, threads_per_block=block,
            regs_per_thread=estimate_registers([min(2 * len(nodes), MAX_LIVE_VALUES)]),
            smem_bytes=REDUCTION_SMEM_BYTES * reductions if block_composition else 0,
            instructions=instructions, bytes_read=reads, bytes_written=writes)

    def summary(self, nodes: frozenset[str], traffic=None) -> PatternSummary:
        traffic = traffic or self.index.traffic(nodes)
        p = self.profile(nodes, traffic)
        return PatternSummary(
            register_bytes=traffic[2], shared_bytes=traffic[3], kernels_merged=len(nodes),
            grid_blocks=p.grid_blocks, threads_per_block=p.threads_per_block,
            max_shared_memory=p.smem_bytes, instructions=p.instructions,
            global_bytes=p.bytes_read + p.bytes_written)


def packed_profile(parts: list[KernelProfile]) -> KernelProfile:
    """Kernel packing (remote fusion): the parts' blocks run side by side in one launch, so
    the grid is the sum; each block needs the largest part's resources, and a wave lasts as
    long as its slowest part (the per-class maximum of instructions)."""
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

