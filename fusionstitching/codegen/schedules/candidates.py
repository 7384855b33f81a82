"""The one-space schedules (paper 4.2): the `Schedule` type and `enumerate_schedules`.

thread: one thread per result, serially (thread composition). warp: a warp per result, a
warp_reduce (warp composition). block: a block per result, a block_reduce. tile: a block owns
``width`` consecutive results (lanes) x ``depth`` threads splitting R, combined through shared
memory, or with sub-warp shuffles in narrow tiles (block composition). loop: no reductions,
grid-stride loops. The phased schedule (phased.py) is a `Schedule` of kind "phases".
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from costmodel.devices import Device

from ..kernel_ir import UNROLL_FACTOR, WARP
from .space import Space

VECTOR = 4  # f32 elements in a 128-bit global access
# Unrolled stages keep each cached producer's points in registers: at most this many per thread
# (16 f32 per value keeps LayerNorm's x, its centered copy and the output under 64 registers).
MAX_CACHED_POINTS = 16
# Narrow tiles (depth < 32) of at most this many warps combine with sub-warp shuffles, then
# one barrier and a serial sum of the warps' totals; more warps would hold that many loads.
SUBWARP_TILE_WARPS = 4


@dataclass(frozen=True)
class Schedule:
    """One way to map a pattern onto threads, with its launch dimensions; frozen, so a
    schedule is its own identity (`excluded` keys, refusals)."""

    kind: str  # loop, thread, warp, block, tile, phases; columns (host kernels only)
    space: Space  # phases: unused (each phase has its own), Space(1, 0)
    groups_per_block: int
    threads_per_group: int
    grid_blocks: int
    # Consecutive elements a thread takes at each step (4: 128-bit global loads and stores).
    vector: int = 1
    # Every reduction stage unrolled: a thread's loads are in flight together, and the values
    # one stage computes at its points stay in registers for the later stages (producer
    # caching: no re-read, no recompute). Phased schedules: short loops unrolled
    # (`unroll_short`).
    unrolled: bool = False
    # Phased schedule: how many phases (reduction spaces in dependency order) the block runs.
    phases: int = 0

    @property
    def grid(self) -> tuple[int, ...]:
        return (self.grid_blocks,)

    @property
    def block(self) -> tuple[int, ...]:
        return (self.groups_per_block * self.threads_per_group,)

    @property
    def subwarp_tile(self) -> bool:
        """A narrow tile whose warps combine their members with sub-warp shuffles."""
        return (self.kind == "tile" and self.groups_per_block < WARP
                and self.threads_per_group < WARP
                and self.block[0] // WARP <= SUBWARP_TILE_WARPS)

    @property
    def scheme(self) -> str | None:
        return {"warp": "warp_composition", "block": "block_composition",
                "tile": "block_composition", "phases": "block_composition"}.get(self.kind)

    @property
    def why(self) -> str:
        unrolled = ", short loops unrolled" if self.kind == "phases" else \
            ", stages unrolled (producers cached in registers)"
        return self._layout + (f", {self.vector} consecutive elements per step" if
                               self.vector > 1 else "") + (unrolled if self.unrolled else "")

    @property
    def _layout(self) -> str:
        o, r, b = self.space.groups, self.space.reduced, self.block[0]
        match self.kind:
            case "loop":
                return f"loop schedule: {self.grid[0]} blocks x {b} threads, grid-stride"
            case "thread":
                return f"[{o}]x[{r}] thread schedule: one thread per result, {b} per block"
            case "warp":
                return f"[{o}]x[{r}] warp schedule: one warp per result, " \
                       f"{self.groups_per_block} per block"
            case "block":
                return f"[{o}]x[{r}] block schedule: one block of {b} threads per result"
            case "columns":
                return f"[{o}]x[{r}] columns schedule (host): {self.grid[0]} blocks of " \
                       f"{self.groups_per_block} results, points outer and results inner"
            case "phases" if self.grid_blocks > 1:
                return f"phased schedule: {self.grid_blocks} blocks of {b} threads, " \
                       f"{self.phases} phases (reductions over different spaces, results in " \
                       f"shared memory; the last phase's results spread over the blocks" + \
                       (f" in tiles of {self.groups_per_block} results x " \
                        f"{self.threads_per_group} threads" if self.threads_per_group > 1
                        else "") + ", the earlier phases computed in every block)"
            case "phases":
                return f"phased schedule: one block of {b} threads, {self.phases} phases " \
                       f"(reductions over different spaces, results in shared memory)"
        return f"[{o}]x[{r}] tile schedule: {self.groups_per_block} results x " \
               f"{self.threads_per_group} threads per block " + \
               ("(sub-warp shuffles, the warps' totals in shared memory)" if self.subwarp_tile
                else "(shared-memory tile)")

    @property
    def points_per_thread(self) -> int:
        return -(-self.space.reduced // self.threads_per_group)


def _divisors_up_to(n: int, options: tuple[int, ...]) -> list[int]:
    return [k for k in options if n % k == 0]


def enumerate_schedules(space: Space, device: Device, sizes: list[int],
                        reuse: bool = False) -> list[Schedule]:
    """Schedules and launch dimensions for a space (paper 4.2: thread/warp/block per sub-root).

    ``sizes``: element counts of the loops a loop schedule runs (its largest sets the grid).
    ``reuse``: a later stage (or the per-element outputs) reads values an earlier reduction
    stage computed, so unrolled stages that keep them in registers are worth enumerating.
    """
    max_threads = device.max_threads_per_block
    if space.reduced == 0:
        n = max(sizes)
        out = []
        vectors = (1, VECTOR) if all(size % VECTOR == 0 for size in sizes) else (1,)
        # Several steps per thread amortize per-thread work outside the loop (scalar
        # prologues such as Adam's bias corrections, which XLA computes in kernels of their own).
        for block, vector, steps in itertools.product((128, 256, 512), vectors, (1, 4, 16)):
            chunks = -(-n // vector)
            # No more warps than the chunks need. Whole warps even for fewer chunks (XLA
            # launches one thread for a scalar kernel): our GPU launcher starts 32 * num_warps
            # threads (runtime/gpu.py), and the idle lanes only evaluate the bounds guard.
            block = min(block, -(-chunks // WARP) * WARP)
            grid = -(-n // (block * vector * steps))
            out.append(Schedule("loop", space, block, 1, grid, vector))
        return list(dict.fromkeys(out))
    o, r = space.groups, space.reduced
    out = [Schedule("thread", space, b, 1, -(-o // b)) for b in (64, 128, 256)
           if b <= max(WARP, -(-o // WARP) * WARP)] or [
        Schedule("thread", space, WARP, 1, -(-o // WARP))]
    out += [Schedule("warp", space, w, WARP, o // w) for w in _divisors_up_to(o, (1, 2, 4, 8))]
    for t in (64, 128, 256, 512, 1024):
        if t <= max_threads and (t == 64 or t // 2 < r):
            out.append(Schedule("block", space, 1, t, o))
    # Where alignment allows, warp and block schedules read rows in 128-bit chunks (as XLA's
    # row reductions do): a quarter of the load instructions, and of the per-thread work
    # around them (the combine, per-row operands), for the same bytes; so no group is wider
    # than a row's chunks.
    aligned = r % VECTOR == 0 and r // VECTOR >= WARP
    out = [s for s in out if not aligned or s.kind not in ("warp", "block")
           or s.threads_per_group <= r // VECTOR]
    variants = []
    for s in out:
        vector = VECTOR if aligned and s.kind in ("warp", "block") else 1
        chunks = r // vector
        variants.append(dataclasses.replace(s, vector=vector))
        # Unrolled stages: the values of a stage stay in registers for the next (producer
        # caching), and a thread's loads are in flight together, where LLVM would keep a loop
        # of fewer than UNROLL_FACTOR trips one load at a time. One chunk per thread is
        # straight-line code already (`over_points`).
        trips = chunks // s.threads_per_group
        if (reuse or trips < UNROLL_FACTOR) and chunks % s.threads_per_group == 0 and \
                trips > 1 and s.points_per_thread <= MAX_CACHED_POINTS:
            variants.append(dataclasses.replace(s, vector=vector, unrolled=True))
    out = variants
    for width in _divisors_up_to(o, (32, 16, 8)):
        for depth in (8, 16, 32):
            if width * depth <= max_threads and depth < 2 * r:
                out.append(Schedule("tile", space, width, depth, o // width))
    return list(dict.fromkeys(out))
