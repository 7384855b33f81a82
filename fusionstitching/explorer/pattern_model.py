"""Kernel profiles of candidate patterns, from the graph alone (the explorer's own estimate).

Scheduling every candidate in the code generator is too slow, so a pattern's kernel is
modeled simply: a launch (a thread per element, or a warp or block per reduced row) that every
op of the pattern runs on, instructions per thread from each kernel's mix, shared memory for
block-composed reductions, registers from a few live values, and ``GraphIndex.traffic``'s
bytes. The pipeline's ``profile_of`` prices the plans compared at the end; the
delta-evaluator's penalty keeps using this model.
"""
from __future__ import annotations

from operator import add

from costmodel import KernelProfile, estimate_registers

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
    """Profiles of patterns of one graph, from facts gathered over their kernels."""

    def __init__(self, index: GraphIndex):
        self.index = index
        # The op classes of the graph's kernels in one fixed order: work is a vector over
        # them, and instructions are listed (and their cycles summed) in that order whatever
        # the order the pattern's kernels are visited in.
        self.classes = tuple(sorted({cls for n in index.participants for cls in index.mix[n]}))
        # Per kernel: (elements, rows or 0, instructions per element times elements), so a
        # pattern's facts are sums and maxima over its kernels.
        self._facts = {n: (index.elements[n], index.rows.get(n, 0),
                           tuple(index.mix[n].get(cls, 0.0) * index.elements[n]
                                 for cls in self.classes))
                       for n in index.participants}
        self._nothing = (0, 0, 0, (0.0,) * len(self.classes))

    def gather(self, nodes: frozenset[str], base: frozenset[str] = frozenset(),
               base_facts: tuple | None = None) -> tuple:
        """(largest iteration space, most reduction rows, reductions, summed work by class) of
        ``nodes``; when ``base``, a subset, has ``base_facts``, only the other kernels are
        added. Work is a sum of whole numbers (counts times elements), exact in floating
        point in any order, so the facts do not depend on how the pattern was grown."""
        facts = self._facts
        elements, rows, reductions, work = base_facts if base else self._nothing
        for n in (nodes - base if base else nodes):
            e, r, w = facts[n]
            if e > elements:
                elements = e
            if r:
                reductions += 1
                if r > rows:
                    rows = r
            work = tuple(map(add, work, w))
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

    def launch(self, facts: tuple, reads: int, writes: int
               ) -> tuple[int, int, int, dict[str, float]]:
        """(grid blocks, threads per block, shared bytes per block, instructions per thread)
        of the kernel with gathered ``facts`` that reads and writes these global bytes."""
        elements, rows, reductions, work = facts
        grid, block, block_composition = self._launch(elements, rows, reductions)
        threads = grid * block
        instructions = {cls: w / threads for cls, w in zip(self.classes, work) if w}
        if reductions:
            shuffles = WARP_REDUCE_SHUFFLES * reductions
            instructions["shfl"] = instructions.get("shfl", 0.0) + shuffles
            if block_composition:
                for cls in ("st_shared", "barrier", "ld_shared"):
                    instructions[cls] = instructions.get(cls, 0.0) + float(reductions)
        instructions["ld_global"] = reads / ELEMENT_BYTES / threads
        instructions["st_global"] = writes / ELEMENT_BYTES / threads
        smem = REDUCTION_SMEM_BYTES * reductions if block_composition else 0
        return grid, block, smem, instructions

    def profile(self, nodes: frozenset[str], traffic=None, facts=None) -> KernelProfile:
        reads, writes, _, _ = traffic or self.index.traffic(nodes)
        grid, block, smem, instructions = self.launch(facts or self.gather(nodes), reads, writes)
        return KernelProfile(
            grid_blocks=grid, threads_per_block=block,
            regs_per_thread=estimate_registers([min(2 * len(nodes), MAX_LIVE_VALUES)]),
            smem_bytes=smem, instructions=instructions, bytes_read=reads, bytes_written=writes)

