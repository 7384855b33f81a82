"""Schedule a flattened pattern onto threads and emit its kernel IR (paper 4.2).

Sub-roots. Every reduction is a sub-root. All reductions of a kernel share one *reduction
space* of O x R: a reduction turns R operand elements into each of its O results (the
reduced dimensions may be any dimensions, in any layout). A *thread group* owns one result
index ``o`` of that space and runs through its R elements; the pattern's outputs are the
root group: outputs with O*R elements are written per (o, r) point, outputs with O elements
once per group, and outputs of any other size are *packed* into the same kernel as
independent grid-stride loops (kernel packing). A pattern without reductions gets the
*loop schedule*: one grid-stride loop per distinct output size, one element per thread.

Schedules of the thread groups (the paper's thread / warp / block schedules, plus tiles):

* thread: one thread per result, reducing its R elements serially (thread composition);
  coalesced when the reduced dimensions are the major ones.
* warp: one warp per result, lanes split R, combined with a warp_reduce (xor butterfly);
  every lane holds the result afterwards (warp composition).
* block: one block per result, combined with a block_reduce (butterfly per warp, shared
  memory across warps) (block composition).
* tile: a block owns ``width`` consecutive results (lanes, minor in the thread index so that
  column reductions read coalesced rows) times ``depth`` threads splitting R; partial values
  go through a shared-memory tile [depth][width], whose columns a 32-deep tile combines with
  a warp each (the tile padded to width + 1 columns, shuffles); in a narrower tile of up to
  SUBWARP_TILE_WARPS warps each warp first combines the members it holds with sub-warp
  shuffles (lanes congruent modulo width hold one result), then every thread adds the warps'
  totals from shared memory; wider ones halve the depth through the tile (block composition;
  column reductions such as BatchNorm statistics and bias gradients).

Phased schedule (block composition across spaces). Reductions over different spaces (a
LayerNorm backward's row statistics and its column sums dgamma/dbeta, a column sum of rows
centered by their row means) cannot share one thread-group mapping, and a grid of several
blocks could hand a finished reduction to another mapping only through a grid-wide barrier.
So, only where every one-space schedule is refused (different spaces, or locality), the
pattern may run on one block: phases in dependency order, each reducing one space's results
into a shared array (a thread, some lanes or a warp per result; all threads and a
block_reduce for a full reduction), a barrier after each stage, then the outputs as packed
loops reading any result at any index. It is for small regions (MAX_PHASED_POINTS), where
launches dominate.

`enumerate_schedules` lists the schedules and launch dimensions that fit the space; each is
built, those failing the locality check (a consumer reads a reduction at an index its own
group did not reduce: cross-block communication) are dropped, and the latency-evaluator
(costmodel) picks the fastest. Every candidate stays in `ScheduledKernel.candidates` with its
modeled time.

Indices propagate from sub-roots to producers through per-op index maps (elementwise,
broadcast, reshape, bitcast, transpose, copy, slice, reverse, pad, concatenate, dynamic-slice,
dynamic-update-slice, gather, iota, constants), so every op is computed at a symbolic index of
the current thread: producers of several consumers are recomputed (thread composition), with
value CSE per scope (paper 4.5). Data-dependent indices (gather, dynamic-slice) and clamped
positions (pad, concatenate) become `DynamicIndex` variables clamped into their operand.

Variadic reductions (argmax/argmin) run their combiner computation inlined, serially from
the init values in XLA:CPU's order, under the thread schedule only (`_reduce_variadic`).

Scatter (XLA's embedding gradients: a scatter-add of token rows into a zero or parameter
table) is computed in the *gather form*: element ``o`` of the result is a loop over the update
windows in order, starting from the operand's element at ``o`` and combining each window's
element that lands on ``o`` (windows that do not fit the operand are skipped, as XLA does). So
a scatter is one more op computable at any index: its operand (a broadcast zero), its updates'
producers and its consumers (the optimizer's update of the table) stitch into the same kernel,
and nothing needs a grid-wide order. XLA:GPU instead scatters in place with atomics; that needs
the result buffer initialised with the operand before any update lands (a second launch, or
an operand that is a kernel input aliased to the output) and ends the kernel at the scatter,
because no thread knows when the last atomic on an element happened. The gather form combines
every element in the order XLA:CPU does (update windows in row-major order of the scatter
dims), on both backends, so it is exact and deterministic; its price is windows x output
elements, so it is refused beyond MAX_SCATTER_WINDOWS windows.

Reduce-window (pooling, cumulative sums) is computable at any index the same way: element ``o``
starts at the init value and combines, in row-major order of the window positions ``k``, the
operand element at ``o*stride - pad_low + k*window_dilation`` of the padded, base-dilated
operand; positions in the padding or in a base-dilation hole are skipped, as XLA:CPU does
(not combined as the init value). That is XLA:CPU's order for the reduce-windows of its
optimized HLO; it rewrites longer scans into two levels before (visible in that HLO). Up to
UNROLLED_WINDOW_POSITIONS positions as straight-line code, a loop up to MAX_WINDOW_POSITIONS.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import re
from dataclasses import dataclass
from types import SimpleNamespace

import networkx as nx
import numpy as np

from costmodel import KernelProfile, kernel_latency_us, load_device
from costmodel.devices import Device

from ..hlo.evaluator import _Window as Window
from ..hlo.evaluator import parse_literal
from ..hlo.ir import Shape
from .flatten import CodegenError, FlatOp, Pattern
from .index_maps import iota_starts, known_index, slice_starts_strides
from .kernel_ir import strides as _element_strides
from .kernel_ir import (DTYPE_BYTES, WARP, Accumulate, Barrier, BlockReduce, Buffer, Compute,
                        Const, ConstArray, ConstLoad, DynamicIndex, GlobalLoad, GlobalStore, If,
                        IndexLet, IndexValue, Ix, Kernel, Loop, SharedArray, SharedLoad,
                        SharedStore, UNROLL_FACTOR, Value, Var, VECTOR_LANES, VECTOR_TYPES,
                        VectorExtract, VectorPack, WarpReduce, add, delinearize, div, ix,
                        linearize, mod, row_major, scale, value_range, vector_group)
from .llvm_lowering import MATH_OPS

DEFAULT_DEVICE = {"name": "h100"}
VECTOR = 4  # f32 elements in a 128-bit global access
# Unrolled stages keep each cached producer's points in registers: at most this many per thread
# (16 f32 per value keeps LayerNorm's x, its centered copy and the output under 64 registers).
MAX_CACHED_POINTS = 16
# Narrow tiles (depth < 32) of at most this many warps combine with sub-warp shuffles, then
# one barrier and a serial sum of the warps' totals; more warps would hold that many loads.
SUBWARP_TILE_WARPS = 4
# A scatter in the gather form costs (update windows) x (output elements): this bounds the
# code and the work per element; below it the latency-evaluator (and the pipeline's cost guard
# against XLA's in-place scatter) decides.
MAX_SCATTER_WINDOWS = 1024
# Up to this many windows a scatter is straight-line code, beyond it a loop over the windows.
UNROLLED_SCATTER_WINDOWS = 32
# Up to this many elements per result a variadic reduction (argmax) is straight-line code,
# beyond it a loop.
UNROLLED_VARIADIC = 32
# A reduce-window costs (window positions) x (output elements), bounded alike; XLA:CPU's own
# optimized HLO has small windows (it rewrites scans longer than 16 into two levels).
MAX_WINDOW_POSITIONS = 1024
UNROLLED_WINDOW_POSITIONS = 32

UNARY = {"abs", "negate", "exponential", "exponential-minus-one", "log", "log-plus-one", "sqrt",
         "rsqrt", "cbrt", "tanh", "logistic", "sine", "cosine", "tan", "floor", "ceil",
         "round-nearest-afz", "round-nearest-even", "sign", "not", "is-finite", "erf",
         "popcnt", "convert", "bitcast-convert"}
BINARY = {"add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power",
          "atan2", "and", "or", "xor", "compare", "shift-left", "shift-right-logical",
          "shift-right-arithmetic"}
TERNARY = {"select", "clamp"}
ELEMENTWISE = UNARY | BINARY | TERNARY
FLOAT_ONLY = MATH_OPS | {"sqrt", "rsqrt", "logistic", "is-finite", "floor", "ceil",
                         "round-nearest-afz", "round-nearest-even"}
INT_ONLY = {"popcnt", "xor", "shift-left", "shift-right-logical", "shift-right-arithmetic"}
NARROW_FLOATS = {"f16", "bf16"}  # stored as such, computed in f32 and rounded, as XLA:GPU does
INTS = {"s32", "s64", "u32", "u64"}
DTYPES = {"f32", "pred"} | INTS | NARROW_FLOATS
REDUCIBLE = {("f32", k) for k in ("add", "maximum", "minimum", "multiply")} | {
    (t, k) for t in ("s32", "s64") for k in ("add", "multiply", "maximum", "minimum")} | {
    ("pred", "and"), ("pred", "or")}
# Ops costing a special-function-unit instruction plus a polynomial (libdevice) on a GPU.
SFU_OPS = MATH_OPS | {"sqrt", "rsqrt", "logistic", "divide"}


def identity(kind: str, dtype: str) -> float | int | bool:
    """The value a combiner leaves unchanged (partial results start here)."""
    if dtype == "pred":
        return kind == "and"
    if dtype in ("s32", "s64"):
        bits = 8 * DTYPE_BYTES[dtype] - 1
        return {"add": 0, "multiply": 1, "maximum": -(1 << bits), "minimum": (1 << bits) - 1}[kind]
    return {"add": 0.0, "multiply": 1.0, "maximum": -math.inf, "minimum": math.inf}[kind]


# ---------------------------------------------------------------------------------------------
# Reduction space and schedules
# ---------------------------------------------------------------------------------------------
class DifferentSpaces(CodegenError):
    """The reductions do not share one space: no one-space schedule; the phased one may fit."""


@dataclass(frozen=True)
class Space:
    groups: int  # O: results of each reduction (1 for the loop schedule)
    reduced: int  # R: operand elements per result (0: no reductions, loop schedule)


def reduction_space(pattern: Pattern) -> Space:
    spaces = set()
    for op in pattern.ops:
        if op.opcode != "reduce":
            continue
        if op.combiner is None and (op.shape.dtype, op.reducer) not in REDUCIBLE:
            raise CodegenError(f"reduce {op.name}: {op.reducer} over {op.shape.dtype} "
                               f"is not supported")
        operand = pattern.op_map()[op.operands[0]].shape
        result = _result_shape(op)
        spaces.add((result.num_elements, operand.num_elements // max(result.num_elements, 1)))
    if len(spaces) > 1:
        raise DifferentSpaces(f"reductions over different spaces (results x reduced) "
                              f"{sorted(spaces)}: one kernel needs one thread-group mapping")
    if not spaces:
        return Space(1, 0)
    groups, reduced = spaces.pop()
    return Space(groups, reduced)


def outside_main_space(pattern: Pattern) -> list[str]:
    """Entry nodes holding reductions outside the pattern's main reduction space (the one
    with the most operand elements): a pattern refused for reductions over different spaces
    may build without them (a loss summed over rows beside the rows' own reductions)."""
    by_space: dict[Space, list[str]] = {}
    for op in pattern.ops:
        if op.opcode == "reduce":
            by_space.setdefault(_space_of(pattern, op), []).append(op.name)
    if len(by_space) < 2:
        return []
    main = max(by_space, key=lambda s: (s.groups * s.reduced, s.groups))
    # a FlatOp inside a fusion is named "<fusion>/<name>"
    return sorted({name.split("/")[0] for space, names in by_space.items() if space != main
                   for name in names})


def _result_shape(op: FlatOp) -> Shape:
    """The shape of a reduction's result (of each result of a variadic one: the same dims)."""
    return op.shape.tuple_shapes[0] if op.shape.is_tuple else op.shape


@dataclass(frozen=True)
class Schedule:
    kind: str  # loop, thread, warp, block, tile, phases
    space: Space  # phases: unused (each phase has its own), Space(1, 0)
    groups_per_block: int
    threads_per_group: int
    grid_blocks: int
    # Consecutive elements a thread takes at each step (4: 128-bit global loads and stores).
    vector: int = 1
    # Every reduction stage unrolled: a thread's loads are in flight together, and the values
    # one stage computes at its points stay in registers for the later stages (producer
    # caching: no re-read, no recompute). Phased schedules: short loops unrolled
    # (`_unroll_short`).
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
           if b <= max(WARP, -(-o // WARP) * WARP)] or [Schedule("thread", space, WARP, 1, -(-o // WARP))]
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
        # straight-line code already (`_over_points`).
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


# ---------------------------------------------------------------------------------------------
# Index maps and code emission
# ---------------------------------------------------------------------------------------------
def _scalar(op: FlatOp) -> float | int | bool:
    value = parse_literal(op.literal or "", op.shape).reshape(-1)[0]
    return bool(value) if op.shape.dtype == "pred" else (
        int(value) if op.shape.dtype in INTS else float(value))


def _padding(op: FlatOp) -> list[tuple[int, int, int]]:
    config = [tuple(int(v) for v in d.split("_")) for d in op.attrs.get("padding", "").split("x")
              if d]
    return [c if len(c) == 3 else (*c, 0) for c in config]


def _int_list(op: FlatOp, key: str) -> tuple[int, ...]:
    text = op.attrs.get(key, "{}")
    return tuple(int(v) for v in re.findall(r"-?\d+", text))


class _Emitter:
    """Emits ops at symbolic indices into nested scopes, with value CSE per scope (paper 4.5).

    Scope 0 is the thread level (once per thread); each loop opens a deeper scope. A value is
    placed in the outermost scope where everything it depends on is defined, so per-group work
    (a reduction result times a constant) is hoisted out of the loops.
    """

    def __init__(self, pattern: Pattern, group: Var):
        self.pattern = pattern
        self.ops = pattern.op_map()
        self.group = group
        self.scopes: list[list] = [[]]
        self.unroll_short = False  # phased schedules: see _unroll_short
        self.short_loops = 0
        self.var_depth: dict[Var, int] = {}
        self.cache: dict[tuple, tuple[Value, int]] = {}
        self.reduced: dict[str, Value | list[Value]] = {}  # a list: a variadic reduce's results
        # Phased schedule: reductions finished in an earlier phase, readable at any index
        # (a shared array of the results, or the value every thread holds for one result).
        self.staged: dict[str, SharedArray | Value] = {}
        self.constants: dict[str, ConstArray] = {}
        self.names = itertools.count()
        # Stores of one scope waiting for the other lanes of their 16-byte group:
        # (buffer, group offset, depth) -> {lane: (offset, value)}.
        self.pending: dict[tuple[int, Ix, int], dict[int, tuple[Ix, Value]]] = {}

    def fresh(self, dtype: str) -> Value:
        return Value(f"v{next(self.names)}", dtype)

    def index_depth(self, *exprs: Ix) -> int:
        return max((self.var_depth.get(v, 0) for e in exprs for v in e.vars()), default=0)

    def open_loop(self, var: Var) -> None:
        self.scopes.append([])
        self.var_depth[var] = len(self.scopes) - 1

    def close_loop(self) -> list:
        depth = len(self.scopes) - 1
        self.flush_stores(depth)
        self.cache = {k: v for k, v in self.cache.items() if v[1] < depth}
        return self.scopes.pop()

    # -- global memory ---------------------------------------------------------------------
    def load(self, buffer: int, shape: Shape, offset: Ix) -> tuple[Value, int]:
        """buffer[offset]; an element of a 16-byte group is a lane of one 128-bit load of the
        group, shared by the other lanes of the scope (whose extracts are emitted with it, so
        that the vector itself dies at once)."""
        dtype, depth = shape.dtype, self.index_depth(offset)
        group = vector_group(shape, offset, dtype)
        if group is None:
            dst = self.fresh(dtype)
            self.place(GlobalLoad(dst, buffer, offset), depth)
            return dst, depth
        base, lane = group
        key = ("#lane", buffer, base)
        if (*key, lane) not in self.cache:
            vector = self.fresh(VECTOR_TYPES[dtype])
            self.place(GlobalLoad(vector, buffer, base), depth)
            for k in range(VECTOR_LANES):
                dst = self.fresh(dtype)
                self.place(VectorExtract(dst, vector, k), depth)
                self.cache[(*key, k)] = (dst, depth)
        return self.cache[(*key, lane)]

    def store(self, buffer: int, shape: Shape, offset: Ix, value: Value) -> None:
        """buffer[offset] = value in the innermost scope; the lanes of a 16-byte group go out
        as one 128-bit store when the scope has stored all four (else one by one when the
        scope closes, `flush_stores`)."""
        depth = len(self.scopes) - 1
        group = vector_group(shape, offset, value.dtype)
        if group is None:
            self.place(GlobalStore(buffer, offset, value), depth)
            return
        base, lane = group
        lanes = self.pending.setdefault((buffer, base, depth), {})
        lanes[lane] = (offset, value)
        if len(lanes) == VECTOR_LANES:
            vector = self.fresh(VECTOR_TYPES[value.dtype])
            self.place(VectorPack(vector, [lanes[k][1] for k in range(VECTOR_LANES)]), depth)
            self.place(GlobalStore(buffer, base, vector), depth)
            del self.pending[buffer, base, depth]

    def flush_stores(self, depth: int) -> None:
        for key in [k for k in self.pending if k[2] == depth]:
            for offset, value in self.pending.pop(key).values():
                self.place(GlobalStore(key[0], offset, value), depth)

    def place(self, stmt, depth: int) -> None:
        self.scopes[depth].append(stmt)

    # -- small value builders --------------------------------------------------------------
    def const(self, value, dtype: str) -> tuple[Value, int]:
        key = ("#const", dtype, repr(value))  # repr: -0.0 == 0.0 but is another constant
        if key not in self.cache:
            dst = self.fresh(dtype)
            self.place(Const(dst, value), 0)
            self.cache[key] = (dst, 0)
        return self.cache[key]

    def op(self, code: str, dtype: str, *args: tuple[Value, int], attr: str | None = None):
        key = ("#op", code, dtype, attr, tuple(a for a, _ in args))
        if key not in self.cache:
            dst, depth = self.fresh(dtype), max((d for _, d in args), default=0)
            self.place(Compute(dst, code, [a for a, _ in args], attr), depth)
            self.cache[key] = (dst, depth)
        return self.cache[key]

    def index_value(self, index: Ix) -> tuple[Value, int]:
        key = ("#index", index)
        if key not in self.cache:
            dst, depth = self.fresh("s32"), self.index_depth(index)
            self.place(IndexValue(dst, index), depth)
            self.cache[key] = (dst, depth)
        return self.cache[key]

    def to_s32(self, v: tuple[Value, int]) -> tuple[Value, int]:
        return v if v[0].dtype == "s32" else self.op("convert", "s32", v)

    def dynamic(self, v: tuple[Value, int], extent: int) -> Ix:
        """An index variable from an s32 value, clamped into 0 .. extent-1."""
        key = ("#dyn", v[0], extent)
        if key not in self.cache:
            clamped, depth = self.op("clamp", "s32", self.const(0, "s32"), v,
                                     self.const(extent - 1, "s32"))
            var = Var(f"d{next(self.names)}", extent)
            self.place(DynamicIndex(var, clamped), depth)
            self.var_depth[var] = depth
            self.cache[key] = (var, depth)
        return ix(self.cache[key][0])

    def compare(self, a, b, direction: str):
        return self.op("compare", "pred", a, b, attr=direction)

    # -- ops at an index -------------------------------------------------------------------
    def value(self, name: str, index: tuple[Ix, ...]) -> tuple[Value, int]:
        key = (name, index)
        if key not in self.cache:
            self.cache[key] = self._compute(self.ops[name], index)
        return self.cache[key]

    def _compute(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        code, dtype = op.opcode, op.shape.dtype
        if dtype not in DTYPES:
            raise CodegenError(f"{code} {op.name}: element type {dtype} is not supported")
        operand = lambda i: self.ops[op.operands[i]]
        match code:
            case "parameter":
                return self.load(op.parameter_number, op.shape, linearize(index, op.shape))
            case "constant":
                return self.constant(op, index)
            case "iota":
                raw = self.index_value(index[int(op.attrs["iota_dimension"])])
                return raw if dtype == "s32" else self.convert(raw, dtype)
            case "broadcast":
                return self.value(op.operands[0], tuple(index[d] for d in op.dimensions))
            case "reshape":
                flat = linearize(index, row_major(op.shape))
                return self.value(op.operands[0], delinearize(flat, row_major(operand(0).shape)))
            case "bitcast":
                source = self.value(op.operands[0],
                                    delinearize(linearize(index, op.shape), operand(0).shape))
                if operand(0).shape.dtype == dtype:
                    return source
                return self.bitcast_convert(op, operand(0).shape.dtype, source)
            case "copy":
                return self.value(op.operands[0], index)
            case "transpose":
                source = [None] * len(index)
                for out_dim, in_dim in enumerate(op.dimensions):
                    source[in_dim] = index[out_dim]
                return self.value(op.operands[0], tuple(source))
            case "slice":
                return self.value(op.operands[0], tuple(
                    add(scale(i, stride), start)
                    for i, (start, stride) in zip(index, slice_starts_strides(op))))
            case "reverse":
                dims = set(op.dimensions)
                return self.value(op.operands[0], tuple(
                    add(n - 1, scale(i, -1)) if d in dims else i
                    for d, (i, n) in enumerate(zip(index, op.shape.dims))))
            case "pad":
                return self.pad(op, index)
            case "concatenate":
                return self.concatenate(op, index)
            case "dynamic-slice":
                return self.dynamic_slice(op, index)
            case "dynamic-update-slice":
                return self.dynamic_update_slice(op, index)
            case "gather":
                return self.gather(op, index)
            case "scatter":
                return self.scatter(op, index)
            case "reduce-window":
                return self.reduce_window(op, index)
            case "reduce":
                if op.name in self.staged:
                    return self.staged_result(op, index)
                self.check_locality(op, index)
                return self.reduced[op.name], self.index_depth(ix(self.group))
            case "get-tuple-element":  # a result of a variadic reduce
                self.check_locality(operand(0), index)
                return self.reduced[op.operands[0]][int(op.attrs["index"])], \
                    self.index_depth(ix(self.group))
        if code not in ELEMENTWISE:
            raise CodegenError(f"{code} {op.name}: op not supported by the code generator")
        return self.elementwise(op, [self.value(o, index) for o in op.operands])

    def elementwise(self, op: FlatOp, args: list[tuple[Value, int]]) -> tuple[Value, int]:
        code, dtype = op.opcode, op.shape.dtype
        attr = op.attrs.get("direction") if code == "compare" else None
        if code == "convert":
            return self.convert(args[0], dtype)
        if code == "bitcast-convert":
            return self.bitcast_convert(op, args[0][0].dtype, args[0])
        types = {a.dtype for a, _ in args[1:]} if code == "select" else {a.dtype for a, _ in args}
        if code == "compare" and op.attrs.get("type") in ("TOTALORDER",):
            raise CodegenError(f"compare {op.name}: total-order comparisons are not supported")
        floats = bool(types & ({"f32"} | NARROW_FLOATS))
        if code in FLOAT_ONLY and not floats:
            raise CodegenError(f"{code} {op.name}: only floating-point {code} is supported")
        if code in INT_ONLY and not types <= INTS:
            raise CodegenError(f"{code} {op.name}: only integer {code} is supported")
        if code in ("and", "or", "not") and floats:
            raise CodegenError(f"{code} {op.name}: logical op on floats")
        if code == "power" and not floats:
            raise CodegenError(f"power {op.name}: integer power is not supported")
        if code == "select" or not types & NARROW_FLOATS:
            return self.op(code, dtype, *args, attr=attr)
        # f16/bf16 arithmetic: widen to f32, compute, round back once (XLA:GPU's upcast).
        wide = [self.convert(a, "f32") if a[0].dtype in NARROW_FLOATS else a for a in args]
        result = self.op(code, "pred" if dtype == "pred" else "f32", *wide, attr=attr)
        return result if dtype == "pred" else self.convert(result, dtype)

    def convert(self, v: tuple[Value, int], dtype: str) -> tuple[Value, int]:
        return v if v[0].dtype == dtype else self.op("convert", dtype, v)

    def bitcast_convert(self, op: FlatOp, source: str, v: tuple[Value, int]):
        if DTYPE_BYTES[source] != DTYPE_BYTES[op.shape.dtype] or \
                {source, op.shape.dtype} & (NARROW_FLOATS | {"pred"}):
            raise CodegenError(f"{op.opcode} {op.name}: {source} -> {op.shape.dtype} bit "
                               f"reinterpretation is not supported")
        return self.op("bitcast-convert", op.shape.dtype, v)

    def constant(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        dtype = op.shape.dtype
        if not op.shape.dims:
            value = _scalar(op)
            if dtype in NARROW_FLOATS:  # exact: the literal is a value of its type
                return self.convert(self.const(value, "f32"), dtype)
            return self.const(value, dtype)
        if op.name not in self.constants:
            values = parse_literal(op.literal or "", op.shape)
            physical = np.transpose(values, op.shape.minor_to_major[::-1]).reshape(-1)
            self.constants[op.name] = ConstArray(f"const{len(self.constants)}", dtype, physical)
        offset = linearize(index, op.shape)
        dst, depth = self.fresh(dtype), self.index_depth(offset)
        self.place(ConstLoad(dst, self.constants[op.name], offset), depth)
        return dst, depth

    def in_range(self, position: tuple[Value, int], lo: int, hi: int):
        """pred: lo <= position < hi (s32 values)."""
        return self.op("and", "pred", self.compare(position, self.const(lo, "s32"), "GE"),
                       self.compare(position, self.const(hi, "s32"), "LT"))

    def all_of(self, preds: list) -> tuple[Value, int] | None:
        result = None
        for p in preds:
            result = p if result is None else self.op("and", "pred", result, p)
        return result

    def undilate(self, position: Ix, n: int, interior: int) -> tuple[Ix, list]:
        """The index into a dimension of ``n`` elements of ``position`` in its padded form
        (``interior`` holes after each element, padding before and after), and the predicates
        under which that position is an element rather than padding or a hole (pad, and the
        window positions of reduce-window)."""
        lo, hi = value_range(position)
        if interior == 0 and lo >= 0 and hi < n:
            return position, []
        p, valid = self.index_value(position), []
        if interior:
            step = self.const(interior + 1, "s32")
            valid.append(self.compare(self.op("remainder", "s32", p, step),
                                      self.const(0, "s32"), "EQ"))
            p = self.op("divide", "s32", p, step)
            valid.append(self.compare(self.index_value(position), self.const(0, "s32"), "GE"))
            valid.append(self.compare(p, self.const(n, "s32"), "LT"))
        else:
            valid.append(self.in_range(p, 0, n))
        return self.dynamic(p, n), valid

    def pad(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        source_shape = self.ops[op.operands[0]].shape
        source, valid = [], []
        for i, n, (low, _, interior) in zip(index, source_shape.dims, _padding(op)):
            position, inside = self.undilate(add(i, -low), n, interior)
            source.append(position)
            valid += inside
        inner = self.value(op.operands[0], tuple(source))
        if not valid:
            return inner
        return self.op("select", op.shape.dtype, self.all_of(valid), inner,
                       self.value(op.operands[1], ()))

    def concatenate(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        dim = op.dimensions[0]
        offsets = list(itertools.accumulate(
            (self.ops[o].shape.dims[dim] for o in op.operands), initial=0))
        position = self.index_value(index[dim])
        result = None
        for k in reversed(range(len(op.operands))):
            n = offsets[k + 1] - offsets[k]
            local = add(index[dim], -offsets[k])
            lo, hi = value_range(local)
            local = local if 0 <= lo and hi < n else self.dynamic(
                self.index_value(local), n)
            piece = self.value(op.operands[k], index[:dim] + (local,) + index[dim + 1:])
            result = piece if result is None else self.op(
                "select", op.shape.dtype,
                self.compare(position, self.const(offsets[k + 1], "s32"), "LT"), piece, result)
        return result

    def starts(self, op: FlatOp, first: int, source: Shape, sizes: tuple[int, ...]) -> list[Ix]:
        """Clamped start per dim of a dynamic-slice/update (XLA clamps into the operand)."""
        return [self.dynamic(self.to_s32(self.value(op.operands[first + d], ())), n - s + 1)
                for d, (n, s) in enumerate(zip(source.dims, sizes))]

    def dynamic_slice(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        source = self.ops[op.operands[0]].shape
        starts = self.starts(op, 1, source, op.shape.dims)
        return self.value(op.operands[0], tuple(add(s, i) for s, i in zip(starts, index)))

    def dynamic_update_slice(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        update = self.ops[op.operands[1]].shape
        starts = self.starts(op, 2, op.shape, update.dims)
        local, inside = [], []
        for i, s, n in zip(index, starts, update.dims):
            p = self.op("subtract", "s32", self.index_value(i), self.index_value(s))
            inside.append(self.in_range(p, 0, n))
            local.append(self.dynamic(p, n))
        return self.op("select", op.shape.dtype, self.all_of(inside),
                       self.value(op.operands[1], tuple(local)),
                       self.value(op.operands[0], index))

    def gather(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        if _int_list(op, "operand_batching_dims"):
            raise CodegenError(f"gather {op.name}: batching dims are not supported")
        source, indices = (self.ops[o].shape for o in op.operands)
        offset_dims, collapsed = _int_list(op, "offset_dims"), _int_list(op, "collapsed_slice_dims")
        start_map, sizes = _int_list(op, "start_index_map"), _int_list(op, "slice_sizes")
        vector_dim = int(op.attrs["index_vector_dim"])
        batch = [index[d] for d in range(op.shape.rank) if d not in offset_dims]
        operand_index: list[Ix] = [ix(0)] * source.rank
        for k, d in enumerate(start_map):
            at = batch[:vector_dim] + [ix(k)] + batch[vector_dim:] \
                if vector_dim < indices.rank else batch
            known = known_index(self.ops, op.operands[1], tuple(at))
            if known is not None and 0 <= value_range(known)[0] and \
                    value_range(known)[1] <= source.dims[d] - sizes[d]:
                # an iota's row (take_along_axis): the element's own row, in this thread group
                operand_index[d] = known
                continue
            start = self.to_s32(self.value(op.operands[1], tuple(at)))
            operand_index[d] = self.dynamic(start, source.dims[d] - sizes[d] + 1)
        windowed = [d for d in range(source.rank) if d not in collapsed]
        for d, out_dim in zip(windowed, offset_dims):
            operand_index[d] = add(operand_index[d], index[out_dim])
        return self.value(op.operands[0], tuple(operand_index))

    def scatter(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        """Element ``index`` of scatter(operand, indices, updates) in the gather form (module
        docstring): the operand's element combined, in update-window order, with the element of
        every update window that covers it; windows that do not fit the operand are skipped."""
        if len(op.operands) != 3:
            raise CodegenError(f"scatter {op.name}: variadic scatters are not supported")
        if _int_list(op, "input_batching_dims"):
            raise CodegenError(f"scatter {op.name}: batching dims are not supported")
        operand, indices, updates = (self.ops[o].shape for o in op.operands)
        dtype = op.shape.dtype
        if (dtype, op.reducer) not in REDUCIBLE:
            raise CodegenError(f"scatter {op.name}: combiner {op.reducer} over {dtype} "
                               f"is not supported")
        if indices.dtype != "s32":
            # A wider index narrowed to s32 could wrap into range instead of being skipped.
            raise CodegenError(f"scatter {op.name}: {indices.dtype} indices are not supported "
                               f"(s32 only)")
        window_dims = _int_list(op, "update_window_dims")
        to_operand = _int_list(op, "scatter_dims_to_operand_dims")
        vector_dim = int(op.attrs["index_vector_dim"])
        scatter_dims = [d for d in range(updates.rank) if d not in window_dims]
        extents = tuple(updates.dims[d] for d in scatter_dims)
        windowed = [d for d in range(operand.rank) if d not in _int_list(op, "inserted_window_dims")]
        size = [1] * operand.rank
        for d, u in zip(windowed, window_dims):
            size[d] = updates.dims[u]
        # Operand dim -> scatter dim whose window coordinate *is* the start there (an iota in
        # the indices): only the window at index[d] on that scatter dim can land.
        fixed = iota_starts(self.ops, op, to_operand, vector_dim, extents, size, operand)
        free = [s for s in range(len(extents)) if s not in fixed.values()]
        windows = math.prod(extents[s] for s in free)
        if windows > MAX_SCATTER_WINDOWS:
            raise CodegenError(f"scatter {op.name}: {windows} update windows; every output "
                               f"element would scan them all (at most {MAX_SCATTER_WINDOWS})")
        init = self.value(op.operands[0], index)
        # Elements no window covers combine with the combiner's identity; -0.0 for a float
        # sum, since x + -0.0 is x for every x (+0.0 would turn an operand's -0.0 into +0.0).
        neutral = self.const(-0.0 if (op.reducer, dtype) == ("add", "f32") else
                             identity(op.reducer, dtype), dtype)
        free_shape = row_major(Shape("s32", tuple(extents[s] for s in free), ()))

        def window_value(window: Ix) -> tuple[Value, int]:
            """The element of update window ``window`` landing on ``index``, else neutral."""
            batch: list[Ix] = [ix(0)] * len(extents)
            for s, coordinate in zip(free, delinearize(window, free_shape)):
                batch[s] = coordinate
            for d, s in fixed.items():
                batch[s] = index[d]
            starts: list[tuple[Value, int] | None] = [None] * operand.rank
            for k, d in enumerate(to_operand):
                if d in fixed:
                    continue
                at = batch[:vector_dim] + [ix(k)] + batch[vector_dim:] \
                    if vector_dim < indices.rank else batch
                starts[d] = self.value(op.operands[1], tuple(at))
            valid, offset = [], [ix(0)] * operand.rank
            for d, (i, n, start) in enumerate(zip(index, operand.dims, starts)):
                if d in fixed:  # start == index[d] by construction; size 1, so it fits
                    continue
                if start is None and size[d] == n:  # the window spans the dimension
                    offset[d] = i
                    continue
                position = self.index_value(i)
                if start is not None and size[d] == 1:
                    # start == i: the window fits, since 0 <= i < n.
                    valid.append(self.compare(position, start, "EQ"))
                    continue
                if start is not None:
                    # XLA skips a window that does not fit the operand (no clamping).
                    valid.append(self.in_range(start, 0, n - size[d] + 1))
                    position = self.op("subtract", "s32", position, start)
                valid.append(self.in_range(position, 0, size[d]))
                if size[d] > 1:
                    offset[d] = self.dynamic(position, size[d])
            at: list[Ix] = [ix(0)] * updates.rank
            for k, u in enumerate(scatter_dims):
                at[u] = batch[k]
            for d, u in zip(windowed, window_dims):
                at[u] = offset[d]
            update = self.value(op.operands[2], tuple(at))
            lands = self.all_of(valid)
            return update if lands is None else self.op("select", dtype, lands, update, neutral)

        # Unrolled, the indices (the same for every element) are loaded once per thread
        # instead of once per element.
        return self.combine_in_order(op.reducer, dtype, init, windows, window_value,
                                     self.index_depth(*index), UNROLLED_SCATTER_WINDOWS)

    def combine_in_order(self, kind: str, dtype: str, init: tuple[Value, int], count: int,
                         term, depth: int, unrolled: int) -> tuple[Value, int]:
        """``init`` combined (``kind``) with term(k) for k = 0 .. count-1 in this order
        (scatter's update windows, reduce-window's window positions). Up to ``unrolled`` terms
        as straight-line code, whose loads are independent and so all in flight at once;
        beyond it a Loop with an Accumulate, placed at ``depth`` (where the terms' index is
        defined)."""
        if count <= unrolled:
            result = init
            for k in range(count):
                result = self.op(kind, dtype, result, term(ix(k)))
            return result
        depth = max(depth, init[1])
        var = Var(f"w{next(self.names)}", count)
        self.open_loop(var)
        value = term(ix(var))
        body = self.close_loop()
        result = self.fresh(dtype)
        self.place(Loop(var, ix(0), count, 1, body, [Accumulate(result, kind, init[0], value[0])]),
                   depth)
        return result, depth

    def reduce_window(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        """Element ``index`` of reduce-window(operand, init) (module docstring): the init
        value combined, in row-major order of the window positions, with the operand element
        at each position; positions in the padding or in a base-dilation hole are skipped."""
        dtype = op.shape.dtype
        if (dtype, op.reducer) not in REDUCIBLE:
            raise CodegenError(f"reduce-window {op.name}: combiner {op.reducer} over {dtype} "
                               f"is not supported")
        source = self.ops[op.operands[0]].shape
        window = Window.parse(op.attrs.get("window"), source.rank)
        positions = math.prod(window.size)
        if positions > MAX_WINDOW_POSITIONS:
            raise CodegenError(f"reduce-window {op.name}: {positions} positions per window; "
                               f"every output element would combine them all (at most "
                               f"{MAX_WINDOW_POSITIONS})")
        # A skipped position combines with the identity (-0.0 for a float sum, as in scatter).
        neutral = self.const(-0.0 if (op.reducer, dtype) == ("add", "f32") else
                             identity(op.reducer, dtype), dtype)
        offsets_shape = row_major(Shape("s32", tuple(window.size), ()))

        def term(k: Ix) -> tuple[Value, int]:
            at, valid = [], []
            for d, offset in enumerate(delinearize(k, offsets_shape)):
                position = add(scale(index[d], window.stride[d]),
                               scale(offset, window.window_dilation[d]), -window.padding[d][0])
                i, inside = self.undilate(position, source.dims[d], window.base_dilation[d] - 1)
                at.append(i)
                valid += inside
            element = self.value(op.operands[0], tuple(at))
            lands = self.all_of(valid)
            return element if lands is None else self.op("select", dtype, lands, element, neutral)

        return self.combine_in_order(op.reducer, dtype, self.value(op.operands[1], ()), positions,
                                     term, self.index_depth(*index), UNROLLED_WINDOW_POSITIONS)

    def staged_result(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        staged = self.staged[op.name]
        if isinstance(staged, Value):
            return staged, 0
        offset = linearize(index, op.shape)
        dst, depth = self.fresh(staged.dtype), self.index_depth(offset)
        self.place(SharedLoad(dst, staged, offset), depth)
        return dst, depth

    def check_locality(self, op: FlatOp, index: tuple[Ix, ...]) -> None:
        """A reduction's value is only available at the result its thread group reduced."""
        if op.name not in self.reduced:
            raise CodegenError(f"reduction {op.name} is read before it is computed")
        read = linearize(index, _result_shape(op))
        if read == ix(self.group):
            return
        # Not syntactically the group: compare at every point of the index space (exact).
        variables = sorted(read.vars() | {self.group}, key=lambda v: v.name)
        points = math.prod(v.extent for v in variables)
        if points <= 1 << 22 and not any(v.name.startswith("d") for v in variables):
            grids = np.meshgrid(*(np.arange(v.extent) for v in variables), indexing="ij")
            env = {v.name: g for v, g in zip(variables, grids)}
            if np.array_equal(read.evaluate(env) + np.zeros_like(env[self.group.name]),
                              env[self.group.name]):
                return
        raise CodegenError(f"reduction {op.name} is read at element {read} by the thread group "
                           f"of result {self.group}: needs cross-block communication")


def _reduction_stages(pattern: Pattern) -> list[list[FlatOp]]:
    """Reductions grouped by how many reductions precede them on any path (one loop each)."""
    depth: dict[str, int] = {}
    for op in pattern.ops:
        below = max((depth[o] for o in op.operands), default=0)
        depth[op.name] = below + (1 if op.opcode == "reduce" else 0)
    stages: dict[int, list[FlatOp]] = {}
    for op in pattern.ops:
        if op.opcode == "reduce":
            stages.setdefault(depth[op.name], []).append(op)
    return [stages[k] for k in sorted(stages)]


def _independent(pattern: Pattern, names: list[str]) -> bool:
    """Whether some two of these values do not depend on each other (kernel packing)."""
    by_name = pattern.op_map()

    def ancestors(name: str) -> set[str]:
        # Only these values' ancestors: a closure over every op of a large pattern was a
        # fifth of the explorer's capability queries.
        seen, stack = set(), list(by_name[name].operands)
        while stack:
            operand = stack.pop()
            if operand not in seen:
                seen.add(operand)
                stack.extend(by_name[operand].operands)
        return seen

    distinct = list(dict.fromkeys(names))
    above = {name: ancestors(name) for name in distinct}
    return any(a not in above[b] and b not in above[a]
               for a, b in itertools.combinations(distinct, 2))


def _reduce_operand_index(r: FlatOp, operand: Shape, group: Ix, point: Ix) -> tuple[Ix, ...]:
    """The operand element that point ``point`` (0..R-1) of result ``group`` of r reads.

    Kept dimensions come from the result's physical index, reduced ones from ``point`` taken
    minor-first in the operand's layout (so consecutive points are consecutive in memory when
    the reduced dimensions are the minor ones).
    """
    reduced = set(r.dimensions)
    kept = [d for d in range(operand.rank) if d not in reduced]
    index: list[Ix] = [ix(0)] * operand.rank
    for d, i in zip(kept, delinearize(group, _result_shape(r))):
        index[d] = i
    stride = 1
    for d in operand.minor_to_major:
        if d in reduced:
            index[d] = mod(div(point, stride), operand.dims[d])
            stride *= operand.dims[d]
    return tuple(index)


def _reshaped(index: tuple[Ix, ...], source: Shape, target: Shape) -> tuple[Ix, ...]:
    """The index of `target` holding the same row-major position as `index` of `source`."""
    return delinearize(linearize(index, row_major(source)), row_major(target))


@dataclass
class ScheduledKernel:
    kernel: Kernel
    schedule: Schedule
    schemes: list[str]
    modeled_us: float
    smem_bytes_no_reuse: int
    candidates: list[tuple[str, float]]
    profile: KernelProfile  # what modeled_us was priced from


@dataclass(frozen=True)
class Points:
    """The points 0..count-1 a thread visits: chunks of ``vector`` consecutive points, chunk
    ``member`` first and every ``step``-th after it; a loop, or unrolled into straight-line
    code (then the values computed at the points stay at thread level, cached for later
    stages by the emitter)."""

    member: Ix
    count: int
    step: int
    vector: int = 1
    unrolled: bool = False
    name: str = "r"


def _over_points(em: _Emitter, points: Points, visit, reducers: list[str]) -> list[Value]:
    """Calls ``visit(point)`` at each of the thread's points; ``visit`` returns one value per
    reducer, combined in point order into the thread's partial results (starting from the
    identity), which are returned.

    When the threads cover the chunks in one pass (step >= chunks), there is no loop: each
    thread's chunk is straight-line code at thread level, under an ``if`` when some threads
    have none (and nothing is reduced), as XLA's loop kernels do. A loop would cost a
    counter, a pointer per access (strength reduction) and a branch for a single trip."""
    chunks = points.count // points.vector
    single = points.step >= chunks
    scope = len(em.scopes) - 1  # a phased kernel's loop over R nests in its loop over results
    if points.unrolled or (single and value_range(points.member)[1] < chunks):
        partials = None
        for k in range(chunks // points.step):
            chunk = add(points.member, k * points.step)
            for j in range(points.vector):
                values = visit(add(scale(chunk, points.vector), j))
                partials = values if partials is None else [
                    em.op(kind, value[0].dtype, partial, value)
                    for kind, partial, value in zip(reducers, partials, values)]
        return [v for v, _ in partials or []]
    chunk = Var(points.name, chunks)
    em.open_loop(chunk)
    per_chunk = None
    for j in range(points.vector):
        values = visit(add(scale(chunk, points.vector), j))
        per_chunk = values if per_chunk is None else [
            em.op(kind, value[0].dtype, partial, value)
            for kind, partial, value in zip(reducers, per_chunk, values)]
    if single and not reducers:
        body = em.close_loop()
        em.place(If(points.member, ix(chunks), [IndexLet(chunk, points.member)] + body, "lt"),
                 scope)
        return []
    accumulates = []
    for kind, (value, _) in zip(reducers, per_chunk or []):
        init, _ = em.const(identity(kind, value.dtype), value.dtype)
        accumulates.append(Accumulate(em.fresh(value.dtype), kind, init, value))
    em.place(Loop(chunk, points.member, chunks, points.step, em.close_loop(), accumulates), scope)
    return [a.dst for a in accumulates]


def build_kernel(pattern: Pattern, sched: Schedule, name: str) -> tuple[Kernel, set[str]]:
    """The kernel IR of `pattern` under one schedule; raises CodegenError (e.g. locality)."""
    if sched.kind == "phases":
        return build_phased_kernel(pattern, sched, name)
    space = sched.space
    threads = sched.block[0]
    tid, bid = Var("tid", threads), Var("bid", sched.grid_blocks)
    group = Var("o", max(space.groups, 1))
    em = _Emitter(pattern, group)
    schemes = {"thread_composition"}
    shared: list[SharedArray] = []
    buffers = [Buffer(n, s, False) for n, s in pattern.inputs] + \
              [Buffer(n, s, True) for n, s in pattern.outputs]
    first_output = len(pattern.inputs)
    outputs = list(enumerate(zip(pattern.outputs, pattern.output_values)))
    o, r = space.groups, space.reduced
    per_point = [(i, s, v) for i, ((_, s), v) in outputs if r and s.num_elements == o * r]
    per_group = [(i, s, v) for i, ((_, s), v) in outputs
                 if r and s.num_elements == o and s.num_elements != o * r]
    packed = [(i, s, v) for i, ((_, s), v) in outputs
              if not r or s.num_elements not in (o, o * r)]

    guarded = None  # thread schedule: threads past the last result do nothing
    if r:
        lane = mod(tid, sched.groups_per_block) if sched.kind == "tile" else None
        member = {"thread": ix(0), "warp": mod(tid, WARP), "block": ix(tid),
                  "tile": div(tid, sched.groups_per_block)}[sched.kind]
        first = add(scale(bid, sched.groups_per_block),
                    {"thread": ix(tid), "warp": div(tid, WARP), "block": ix(0),
                     "tile": lane}[sched.kind])
        em.place(IndexLet(group, first), 0)
        if sched.kind == "thread" and o % sched.groups_per_block:
            guarded = first
        stages = _reduction_stages(pattern)
        for stage in stages:
            if len(stage) > 1 and _independent(pattern, [x.name for x in stage]):
                schemes.add("kernel_packing")
            for red in stage:
                if red.combiner is not None:
                    em.reduced[red.name] = _reduce_variadic(em, sched, red)
            stage = [red for red in stage if red.combiner is None]
            operands = [(red, pattern.op_map()[red.operands[0]].shape) for red in stage]
            partials = _over_points(
                em, Points(member, r, sched.threads_per_group, sched.vector, sched.unrolled),
                lambda point: [em.value(red.operands[0],
                                        _reduce_operand_index(red, shape, ix(group), point))
                               for red, shape in operands],
                [red.reducer for red in stage]) if stage else []
            for red, partial in zip(stage, partials):
                total = _combine(em, sched, red, partial, shared, tid, lane)
                em.reduced[red.name] = _apply_init(em, pattern, red, total)
            if sched.scheme:
                schemes.add(sched.scheme)
        ref = stages[0][0]
        ref_shape = pattern.op_map()[ref.operands[0]].shape
        if per_point:
            def store_point(point: Ix) -> list:
                at = _reduce_operand_index(ref, ref_shape, ix(group), point)
                for i, shape, value_name in per_point:
                    index = _reshaped(at, ref_shape, shape)
                    value, _ = em.value(value_name, index)
                    em.store(first_output + i, shape, linearize(index, shape), value)
                return []
            _over_points(em, Points(member, r, sched.threads_per_group, sched.vector,
                                    sched.unrolled), store_point, [])
            em.flush_stores(0)
        stores = _stores_at_group(em, _result_shape(ref), group, per_group, first_output)
        if stores and sched.kind == "thread":
            em.scopes[0] += stores
        elif stores:
            em.place(If(member, ix(0), stores), 0)
        if len(per_point) > 1 and _independent(pattern, [v for _, _, v in per_point]):
            schemes.add("kernel_packing")
    if guarded is not None:
        em.scopes[0] = [em.scopes[0][0], If(guarded, ix(o), em.scopes[0][1:], "lt")]
        # What was emitted so far now lives inside that `if`: the packed loops below must
        # not reuse it (it would not dominate them).
        em.cache.clear()
        em.reduced.clear()
    _packed_outputs(em, pattern, packed, first_output, add(scale(bid, threads), tid),
                    threads * sched.grid_blocks, sched.vector, bool(r), schemes)
    kernel = Kernel(name, buffers, sched.grid, sched.block, shared, em.scopes[0], tid, bid,
                    list(em.constants.values()))
    return kernel, schemes


def _stores_at_group(em: _Emitter, result: Shape, group: Var, outputs: list,
                     first_output: int) -> list[GlobalStore]:
    """The stores of per-group outputs (as many elements as ``result``, a reduction's result
    shape) at the element of result ``group``."""
    stores = []
    for i, shape, value_name in outputs:
        index = _reshaped(delinearize(ix(group), result), result, shape)
        value, _ = em.value(value_name, index)
        stores.append(GlobalStore(first_output + i, linearize(index, shape), value))
    return stores


def _packed_outputs(em: _Emitter, pattern: Pattern, packed: list, first_output: int,
                    element: Ix, step: int, vector: int, after_reductions: bool,
                    schemes: set[str], unroll: bool = False) -> None:
    """Packed loops: every thread (the first at ``element``, the next ``step`` further)
    strides over the elements of each output size. ``unroll``: the loops `_unroll_short`
    takes are unrolled (in runs, `_in_runs`): a loop that stores stays a loop in LLVM, one
    load latency per trip (BERT train JAX's 10-phase LayerNorm-backward chain waited 25 of
    its 31 modeled load latencies in its two output loops)."""
    by_size: dict[int, list] = {}
    for out in packed:
        by_size.setdefault(out[1].num_elements, []).append(out)
    if len(by_size) > 1 or (after_reductions and by_size):
        schemes.add("kernel_packing")
    for n, outs in by_size.items():
        def store_element(at_element: Ix, outs=outs) -> list:
            at = delinearize(at_element, outs[0][1])  # the first output is written coalesced
            for i, shape, value_name in outs:
                index = _reshaped(at, outs[0][1], shape)
                value, _ = em.value(value_name, index)
                em.store(first_output + i, shape, linearize(index, shape), value)
            return []
        vector_n = vector if n % vector == 0 else 1
        _in_runs(em, Points(element, n, step, vector_n,
                            unroll and _unroll_short(em, n // vector_n, step), f"e{n}"),
                 store_element, [], f"qe{n}")
        em.flush_stores(0)
        if len(outs) > 1 and _independent(pattern, [v for _, _, v in outs]):
            schemes.add("kernel_packing")


def _in_runs(em: _Emitter, points: Points, visit, reducers: list[str], runs_name: str,
             always: bool = False) -> list[Value]:
    """``_over_points`` for a thread's points of more than UNROLL_FACTOR trips (a multiple of
    it, the same for every thread) as a loop over runs of UNROLL_FACTOR trips, each run
    unrolled when ``points.unrolled`` (its loads issue together) and else a loop LLVM
    unrolls; ``always``: in runs even when not unrolled. Otherwise ``_over_points`` itself.
    The runs' partial results are combined in order."""
    trips = points.count // points.vector // points.step
    if trips <= UNROLL_FACTOR or not (points.unrolled or always):
        return _over_points(em, points, visit, reducers)
    scope = len(em.scopes) - 1
    runs = Var(runs_name, trips // UNROLL_FACTOR)
    em.open_loop(runs)
    run = dataclasses.replace(points, count=UNROLL_FACTOR * points.step * points.vector)
    partials = _over_points(em, run, lambda point: visit(
        add(scale(runs, UNROLL_FACTOR * points.step * points.vector), point)), reducers)
    accumulates = []
    for kind, value in zip(reducers, partials):
        init, _ = em.const(identity(kind, value.dtype), value.dtype)
        accumulates.append(Accumulate(em.fresh(value.dtype), kind, init, value))
    em.place(Loop(runs, ix(0), trips // UNROLL_FACTOR, 1, em.close_loop(), accumulates), scope)
    return [a.dst for a in accumulates]


def _combine(em: _Emitter, sched: Schedule, red: FlatOp, partial: Value,
             shared: list[SharedArray], tid: Var, lane: Ix | None) -> Value:
    """Combine a group's partial values across its threads (warp, block or tile)."""
    if sched.kind == "thread":
        return partial
    total = em.fresh(partial.dtype)
    if sched.kind == "warp":
        em.place(WarpReduce(total, partial, red.reducer), 0)
        return total
    tag = _tag(red)
    if sched.kind == "block":
        scratch = SharedArray(f"smem_{tag}", partial.dtype, WARP)
        shared.append(scratch)
        em.place(BlockReduce(total, partial, red.reducer, scratch), 0)
        return total
    depth, width = sched.threads_per_group, sched.groups_per_block
    member = div(tid, width)
    if depth == WARP:
        # A warp per result (XLA's column reductions): the [depth][width] partials go through
        # a tile padded to width + 1 columns, so that a warp reading one column down its 32
        # rows hits 32 banks; each warp combines its column with shuffles and one lane
        # writes the total, which every thread reads back at its own column: two barriers,
        # where the tree below takes log2(depth).
        pitch = width + 1
        tile = SharedArray(f"tile_{tag}", partial.dtype, depth * pitch)
        totals = SharedArray(f"totals_{tag}", partial.dtype, width)
        shared += [tile, totals]
        warp, warp_lane = div(tid, WARP), mod(tid, WARP)
        column, combined = em.fresh(partial.dtype), em.fresh(partial.dtype)
        em.place(SharedStore(tile, add(scale(member, pitch), lane), partial), 0)
        em.place(Barrier(), 0)
        em.place(SharedLoad(column, tile, add(scale(warp_lane, pitch), warp)), 0)
        em.place(WarpReduce(combined, column, red.reducer), 0)
        em.place(If(warp_lane, ix(0), [SharedStore(totals, warp, combined)]), 0)
        em.place(Barrier(), 0)
        em.place(SharedLoad(total, totals, lane), 0)
        return total
    if sched.subwarp_tile:
        # The members of a result are width lanes apart, so a butterfly over the xor
        # distances from 16 down to width combines the ones a warp holds; lanes below width
        # write the warp's totals, and after one barrier every thread adds its result's.
        per_warp = em.fresh(partial.dtype)
        em.place(WarpReduce(per_warp, partial, red.reducer, lowest=width), 0)
        warps = sched.block[0] // WARP
        totals = SharedArray(f"totals_{tag}", partial.dtype, warps * width)
        shared.append(totals)
        em.place(If(mod(tid, WARP), ix(width), [
            SharedStore(totals, add(scale(div(tid, WARP), width), lane), per_warp)], "lt"), 0)
        em.place(Barrier(), 0)
        em.place(SharedLoad(total, totals, lane), 0)
        for w in range(1, warps):
            other, combined = em.fresh(partial.dtype), em.fresh(partial.dtype)
            em.place(SharedLoad(other, totals, add(lane, w * width)), 0)
            em.place(Compute(combined, red.reducer, [total, other]), 0)
            total = combined
        return total
    # Wider tiles: combined by halving the depth (a tree: log2(depth) steps with a barrier
    # each; a serial combine of the column by every thread was fully unrolled by LLVM and
    # held all its loads in registers).
    tile = SharedArray(f"tile_{tag}", partial.dtype, sched.block[0])
    shared.append(tile)
    em.place(SharedStore(tile, ix(tid), partial), 0)
    em.place(Barrier(), 0)
    half = depth // 2
    while half:
        mine, other, combined = (em.fresh(partial.dtype) for _ in range(3))
        em.place(If(member, ix(half), [
            SharedLoad(mine, tile, ix(tid)),
            SharedLoad(other, tile, add(tid, half * width)),
            Compute(combined, red.reducer, [mine, other]),
            SharedStore(tile, ix(tid), combined)], "lt"), 0)
        em.place(Barrier(), 0)
        half //= 2
    em.place(SharedLoad(total, tile, lane), 0)
    return total


def _reduce_variadic(em: _Emitter, sched: Schedule, red: FlatOp) -> list[Value]:
    """A variadic reduce's results at the thread's group: its combiner computation inlined
    on the accumulators (starting at the init values) and each element in turn, serially in
    row-major order of the reduced dimensions, as XLA:CPU combines them, so that any combiner
    (argmax's tie-breaking and NaNs, or a non-associative one) gives XLA:CPU's result.

    Only the thread schedule: warp, block and tile schedules would need shuffles and
    shared-memory combines of tuples through a general combiner, in an order other than
    XLA:CPU's (which matters for combiners that are not associative). Up to
    UNROLLED_VARIADIC elements straight-line code, beyond it a loop carrying the tuple."""
    if sched.kind != "thread":
        raise CodegenError(f"reduce {red.name}: a variadic reduction is combined by one thread "
                           f"per result only (a {sched.kind} schedule would combine tuples "
                           f"across threads)")
    r = sched.space.reduced
    n = len(red.operands) // 2
    shape = em.ops[red.operands[0]].shape
    if [d for d in shape.minor_to_major if d in red.dimensions] != \
            sorted(red.dimensions, reverse=True):
        # Points are visited in the layout's order (_reduce_operand_index); XLA:CPU as jaxlib
        # runs it combines them in row-major order: the two agree only in this case.
        raise CodegenError(f"reduce {red.name}: reduced dimensions {list(red.dimensions)} are "
                           f"not row-major in the operand's layout {shape.minor_to_major}; "
                           f"the combining order would depend on the layout")
    inits = [em.value(init, ()) for init in red.operands[n:]]

    def combine(accumulators: list[tuple[Value, int]], point: Ix) -> list[tuple[Value, int]]:
        index = _reduce_operand_index(red, shape, ix(em.group), point)
        return _inline_combiner(em, red, accumulators + [em.value(operand, index)
                                                         for operand in red.operands[:n]])

    if r <= UNROLLED_VARIADIC:
        accumulators = inits
        for point in range(r):
            accumulators = combine(accumulators, ix(point))
        return [v for v, _ in accumulators]
    point = Var(f"r{next(em.names)}", r)
    em.open_loop(point)
    depth = len(em.scopes) - 1
    carried = [em.fresh(v.dtype) for v, _ in inits]
    following = combine([(c, depth) for c in carried], ix(point))
    body = em.close_loop()
    results = [em.fresh(v.dtype) for v, _ in inits]
    em.place(Loop(point, ix(0), r, 1, body, [
        Accumulate(dst, "next", init, value, carried=c)
        for dst, (init, _), (value, _), c in zip(results, inits, following, carried)]), 0)
    return results


def _inline_combiner(em: _Emitter, red: FlatOp, args: list[tuple[Value, int]]
                     ) -> list[tuple[Value, int]]:
    """The combiner computation's results on these arguments, computed by the emitter."""
    combiner = red.combiner
    env = dict(zip(combiner.params, args))
    for op in combiner.ops:
        if op.shape.dtype not in DTYPES:
            raise CodegenError(f"reduce {red.name}: {op.opcode} {op.name} of its combiner: "
                               f"element type {op.shape.dtype} is not supported")
        if op.opcode == "constant":
            env[op.name] = em.constant(op, ())
        elif op.opcode in ELEMENTWISE:
            env[op.name] = em.elementwise(op, [env[o] for o in op.operands])
        else:
            raise CodegenError(f"reduce {red.name}: {op.opcode} {op.name} of its combiner is "
                               f"not supported")
    return [env[name] for name in combiner.results]


def _apply_init(em: _Emitter, pattern: Pattern, r: FlatOp, total: Value, depth: int = 0) -> Value:
    """Partial results start at the identity; a different init value is combined in once
    (``depth``: the scope where ``total`` is defined)."""
    init_op = pattern.op_map()[r.operands[1]]
    if init_op.opcode != "constant":
        raise CodegenError(f"reduce {r.name}: init value {init_op.name} is not a constant")
    init = _scalar(init_op)
    if init == identity(r.reducer, total.dtype):
        return total
    value, _ = em.op(r.reducer, total.dtype, (total, depth), em.const(init, total.dtype))
    return value


# ---------------------------------------------------------------------------------------------
# Phased schedule: reductions over different spaces (block composition across spaces)
# ---------------------------------------------------------------------------------------------
# A kernel of several blocks cannot hand a finished reduction to a consumer in another thread
# mapping without a grid-wide barrier (our launcher has no cooperative launch); one block can,
# through shared memory and __syncthreads. The last phase's results are read by no reduction,
# so they can be spread over several blocks, each block computing the earlier phases itself
# (cheap when they are small: LayerNorm's row statistics before a weight gradient's columns).
# One block streams at most about one SM's share of the device's bandwidth (costmodel:
# ~25 GB/s on an H100), so it is worth it only for small regions, where the launches of the
# XLA kernels it replaces dominate: beyond this many points per block (reduction operand
# elements plus output elements; 1 MB of f32) the block would stream for ~40 us, the time of
# some 20 launches, and the pattern is better cut into one-space kernels.
MAX_PHASED_POINTS = 1 << 18
# A thread reduces a result's points in runs of this many, a constant-trip loop LLVM unrolls:
# the run's loads are in flight together instead of one full latency each (as the
# latency-evaluator prices unrolled loops).
SERIAL_RUN = UNROLL_FACTOR
PHASED_THREADS = 128  # see enumerate_phased_schedules
# A phase of at most this many results per warp runs a warp per result (`_warp_per_result`)
# when its results have more points than one serial run: up to SERIAL_RUN points a thread
# per result waits for one batch of loads, less than a warp's five shuffles after it.
MAX_RESULTS_PER_WARP = 4


def _unroll_short(em: _Emitter, count: int, step: int) -> bool:
    """Whether a thread's loop over ``count`` points, ``step`` apart, is emitted unrolled: in
    the schedule's variant that unrolls loops (``Schedule.unrolled``), those of the same
    trips for every thread, 2 to UNROLL_FACTOR of them or a multiple of UNROLL_FACTOR (then
    in runs, `_in_runs`). LLVM keeps a loop of fewer trips with one load in flight per trip,
    one of UNROLL_FACTOR trips too when its body is large (the PTX of BERT train JAX's
    6-phase LayerNorm chain: phases 2-5's 8-trip loops stay loops, 82 loads in 6 barrier
    intervals; unrolled here, 80 loads in 3, since the values of one phase's points stay in
    registers for the next), and a longer one a loop of partly unrolled trips. Unrolled, its
    loads issue together, but their values take registers; the latency-evaluator chooses
    between the two variants."""
    trips = count // step
    unrolls = count % step == 0 and 1 < trips and (trips <= UNROLL_FACTOR or
                                                     trips % UNROLL_FACTOR == 0)
    em.short_loops += unrolls  # either way: a twin without any is refused as the same kernel
    return em.unroll_short and unrolls


def _space_of(pattern: Pattern, red: FlatOp) -> Space:
    operand = pattern.op_map()[red.operands[0]].shape
    result = _result_shape(red)
    return Space(result.num_elements, operand.num_elements // max(result.num_elements, 1))


def _phase_plan(pattern: Pattern) -> list[list[list[FlatOp]]]:
    """Reduction stages in dependency order (`_reduction_stages`), each split by space into
    phases: a phase's reductions share one loop over their points."""
    plan = []
    for stage in _reduction_stages(pattern):
        by_space: dict[Space, list[FlatOp]] = {}
        for red in stage:
            by_space.setdefault(_space_of(pattern, red), []).append(red)
        plan.append(list(by_space.values()))
    return plan


def _spread_phase(pattern: Pattern, plan: list[list[list[FlatOp]]]) -> tuple[int, int] | None:
    """(stage, phase) of the phase whose results can be spread over blocks: the last stage's
    phase with the most results (no reduction reads them), if it has several."""
    last = len(plan) - 1
    j = max(range(len(plan[last])), key=lambda j: _space_of(pattern, plan[last][j][0]).groups)
    return (last, j) if _space_of(pattern, plan[last][j][0]).groups > 1 else None


def enumerate_phased_schedules(pattern: Pattern, device: Device) -> list[Schedule]:
    """One block of PHASED_THREADS threads (fewer when the widest phase or output needs fewer
    warps), scalar steps; and the last phase spread over several such blocks: one per
    PHASED_THREADS of its results (a thread per result) when it has more, and one per warp
    of its results (a tile: each result split over the block's warps). Each candidate
    builds and profiles the whole region, and the explorer asks about many large regions:
    enumerating 128-1024 threads and 128-bit steps (8 candidates) made BERT train JAX H100
    plan in 76 s CPU instead of 30 s, for the same kernels and 1% of modeled time."""
    plan = _phase_plan(pattern)
    spaces = [phase for stage in plan for phase in stage]
    widest = max([sp.groups if sp.groups > 1 else sp.reduced
                  for sp in (_space_of(pattern, phase[0]) for phase in spaces)] +
                 [s.num_elements for _, s in pattern.outputs])
    threads = min(PHASED_THREADS, device.max_threads_per_block, -(-widest // WARP) * WARP)
    one_block = Schedule("phases", Space(1, 0), threads, 1, 1, 1, phases=len(spaces))
    spread = _spread_phase(pattern, plan)
    results = _space_of(pattern, plan[spread[0]][spread[1]][0]).groups if spread else 0
    out = [one_block]
    if results > threads:
        out.append(dataclasses.replace(one_block, grid_blocks=-(-results // threads)))
    if results > WARP and results % WARP == 0 and threads > WARP:
        # A warp of results per block, each split over the block's warps (a tile).
        out.append(dataclasses.replace(one_block, groups_per_block=WARP,
                                       threads_per_group=threads // WARP,
                                       grid_blocks=results // WARP))
    return out + [dataclasses.replace(s, unrolled=True) for s in out]


def build_phased_kernel(pattern: Pattern, sched: Schedule, name: str
                        ) -> tuple[Kernel, set[str]]:
    """The phased schedule: phases in dependency order, then the outputs.

    In a phase, the block's threads stride over its results, one thread per result reducing
    its R points serially (thread composition), and store them to a shared array of the
    results; a phase with one result (a full reduction) is split over all threads and combined
    with a block_reduce, leaving the result in every thread. A barrier ends each stage, after
    which any thread reads any result (no locality check). The outputs are packed loops over
    the block's threads. With one thread (the host schedule) every phase is serial.

    A phase of few results with more than SERIAL_RUN points each runs a warp per result
    (`_warp_per_result`), one of more results but at most half the threads 2-16 lanes per
    result (`_lanes_per_result`). With several blocks, the last phase (``_spread_phase``) is spread
    over the grid instead (`_spread_results`: a thread per result, or tiles) and the outputs
    that read it are computed at its results; every block computes the earlier phases, and
    the other outputs are packed loops over the grid's threads."""
    threads, blocks = sched.block[0], sched.grid_blocks
    tid, bid = Var("tid", threads), Var("bid", blocks)
    em = _Emitter(pattern, Var("o", 1))  # reductions are staged, never read at "the" group
    em.unroll_short = sched.unrolled
    schemes = {"thread_composition", "block_composition"}
    shared: list[SharedArray] = []
    plan = _phase_plan(pattern)
    variadic = [red.name for stage in plan for phase in stage for red in phase
                if red.combiner is not None]
    if variadic:
        raise CodegenError(f"reduce {variadic[0]}: a variadic reduction in a phased schedule "
                           f"is not supported")
    spread = _spread_phase(pattern, plan) if blocks > 1 else None
    outputs = [(i, s, v) for i, ((_, s), v) in enumerate(zip(pattern.outputs,
                                                                pattern.output_values))]
    reads_spread = _downstream(pattern, plan[spread[0]][spread[1]]) if spread else set()
    spread_outputs = [out for out in outputs if out[2] in reads_spread]
    packed = [out for out in outputs if out[2] not in reads_spread]
    points_of = {(k, j): _space_of(pattern, phase[0]).groups *
                 _space_of(pattern, phase[0]).reduced
                 for k, stage in enumerate(plan) for j, phase in enumerate(stage)}
    # Every block runs the phases not spread; the spread phase and the outputs are shared out.
    shared_points = sum(p for at, p in points_of.items() if at != spread)
    spread_points = points_of.get(spread, 0) + sum(s.num_elements for _, s, _ in outputs)
    points = shared_points + -(-spread_points // blocks)
    if points > MAX_PHASED_POINTS:
        raise CodegenError(f"{points} points (reduction operands and outputs) are too many "
                           f"for {'one block' if blocks == 1 else f'each of {blocks} blocks'} "
                           f"(at most {MAX_PHASED_POINTS})")
    first_output = len(pattern.inputs)
    for k, stage in enumerate(plan):
        if len(stage) > 1 or any(len(phase) > 1 and _independent(
                pattern, [red.name for red in phase]) for phase in stage):
            schemes.add("kernel_packing")
        stored = False
        for j, phase in enumerate(stage):
            space = _space_of(pattern, phase[0])
            operands = [(red, pattern.op_map()[red.operands[0]].shape) for red in phase]

            def values_at(result: Ix, operands=operands):
                return lambda point: [em.value(red.operands[0],
                                               _reduce_operand_index(red, shape, result, point))
                                      for red, shape in operands]

            reducers = [red.reducer for red in phase]
            if (k, j) == spread:
                _spread_results(em, pattern, sched, phase, space, values_at, spread_outputs,
                                first_output, shared, tid, bid)
                continue
            if space.groups == 1 and threads >= WARP:
                partials = _in_runs(em, Points(ix(tid), space.reduced, threads, 1,
                                               _unroll_short(em, space.reduced, threads),
                                               f"r{k}_{j}"), values_at(ix(0)), reducers,
                                    f"q{k}_{j}")
                for red, partial in zip(phase, partials):
                    total = em.fresh(partial.dtype)
                    scratch = SharedArray(f"smem_{_tag(red)}", partial.dtype, WARP)
                    shared.append(scratch)
                    em.place(BlockReduce(total, partial, red.reducer, scratch), 0)
                    em.staged[red.name] = _apply_init(em, pattern, red, total)
                continue
            arrays = [SharedArray(f"res_{_tag(red)}", red.shape.dtype, space.groups)
                      for red in phase]
            if space.groups <= MAX_RESULTS_PER_WARP * (threads // WARP) and \
                    space.reduced > SERIAL_RUN:
                _warp_per_result(em, pattern, phase, space, values_at, arrays, tid, f"{k}_{j}")
                schemes.add("warp_composition")
            elif space.reduced > SERIAL_RUN and threads // space.groups >= 2:
                _lanes_per_result(em, pattern, phase, space, values_at, arrays, tid, f"{k}_{j}")
                schemes.add("warp_composition")
            else:
                def per_result(result: Ix, phase=phase, arrays=arrays, values_at=values_at,
                               reducers=reducers, space=space, tag=f"{k}_{j}") -> list:
                    depth = len(em.scopes) - 1
                    serial = _serial_reduce(em, space.reduced, values_at(result), reducers, tag)
                    for red, partial, array in zip(phase, serial, arrays):
                        em.place(SharedStore(array, result,
                                             _apply_init(em, pattern, red, partial, depth)),
                                 depth)
                    return []

                _over_points(em, Points(ix(tid), space.groups, threads, 1, False, f"o{k}_{j}"),
                             per_result, [])
            shared += arrays
            em.staged.update((red.name, array) for red, array in zip(phase, arrays))
            stored = True
        if stored:
            em.place(Barrier(), 0)
    element = ix(tid) if blocks == 1 else add(scale(bid, threads), tid)
    _packed_outputs(em, pattern, packed, first_output, element, threads * blocks, sched.vector,
                    True, schemes, sched.unrolled)
    if sched.unrolled and not em.short_loops:
        raise CodegenError("no short loop to unroll (the same kernel as without)")
    buffers = [Buffer(n, s, False) for n, s in pattern.inputs] + \
              [Buffer(n, s, True) for n, s in pattern.outputs]
    kernel = Kernel(name, buffers, sched.grid, sched.block, shared, em.scopes[0], tid, bid,
                    list(em.constants.values()))
    return kernel, schemes


def _warp_per_result(em: _Emitter, pattern: Pattern, phase: list[FlatOp], space: Space,
                     values_at, arrays: list[SharedArray], tid: Var, tag: str) -> None:
    """A phase with few results: a warp per result, its lanes splitting the points and a
    warp_reduce combining them (one thread per result would leave most threads idle and
    each result a serial chain of R points). Warp w takes results w, w + warps, ...,
    unrolled so that the warp_reduces stay at top level (the host backend splits a block
    there); a warp past the last result reduces a copy of another (a shuffle needs every
    lane) and stores nothing."""
    warps = tid.extent // WARP
    lane, warp = mod(tid, WARP), div(tid, WARP)
    # The stores follow the last result, so that every result's loads are in one straight-
    # line block (a store under `if` ends one) and issue together.
    stores = [_lanes_to_shared(em, pattern, phase, space, values_at, arrays,
                               add(warp, u * warps), lane, WARP,
                               (u + 1) * warps <= space.groups, f"w{tag}_{u}")
              for u in range(-(-space.groups // warps))]
    for store in stores:
        em.place(store, 0)


def _lanes_per_result(em: _Emitter, pattern: Pattern, phase: list[FlatOp], space: Space,
                      values_at, arrays: list[SharedArray], tid: Var, tag: str) -> None:
    """A phase of more results than `_warp_per_result` takes but at most half the block's
    threads: ``members`` (2-16) threads per result, each warp holding ``WARP // members``
    results side by side in its lanes (a result's members are lanes congruent modulo that
    width), combined by a sub-warp butterfly (xor 16 down to the width). A thread per result
    would run its R points serially; here each member runs R / members of them, and a warp
    load reads each result at ``members`` consecutive points (column sums stay coalesced;
    rows read ``members`` times fewer sectors than a thread per row). Threads past the last
    result reduce a copy of another (every lane takes part in a shuffle) and store nothing."""
    members = min(1 << ((tid.extent // space.groups).bit_length() - 1), WARP // 2)
    width = WARP // members
    lane = mod(tid, WARP)
    em.place(_lanes_to_shared(em, pattern, phase, space, values_at, arrays,
                              add(scale(div(tid, WARP), width), mod(lane, width)),
                              div(lane, width), members, tid.extent // members == space.groups,
                              f"m{tag}"), 0)


def _lanes_to_shared(em: _Emitter, pattern: Pattern, phase: list[FlatOp], space: Space,
                     values_at, arrays: list[SharedArray], result: Ix, member: Ix, members: int,
                     every_result: bool, tag: str) -> If:
    """``members`` lanes of a warp (``member`` of them; congruent modulo 32 / members) reduce
    ``result``'s points between them, a butterfly (xor 16 down to 32 / members) combines them,
    and member 0 stores the result into the phase's shared arrays (the returned statement,
    for the caller to place). Lanes past the last result (unless ``every_result``) reduce a
    copy of another, since every lane takes part in a shuffle, and store nothing."""
    at = mod(result, space.groups)
    partials = _in_runs(em, Points(member, space.reduced, members, 1,
                                   _unroll_short(em, space.reduced, members), tag),
                        values_at(at), [red.reducer for red in phase], f"q{tag}")
    stores = []
    for red, partial, array in zip(phase, partials, arrays):
        total = em.fresh(partial.dtype)
        em.place(WarpReduce(total, partial, red.reducer, WARP // members), 0)
        stores.append(SharedStore(array, at, _apply_init(em, pattern, red, total)))
    store = If(member, ix(0), stores)
    return store if every_result else If(result, ix(space.groups), [store], "lt")


def _downstream(pattern: Pattern, reductions: list[FlatOp]) -> set[str]:
    """The ops that read these reductions' results, directly or through other ops."""
    reached = {red.name for red in reductions}
    for op in pattern.ops:  # topological order
        if any(o in reached for o in op.operands):
            reached.add(op.name)
    return reached


def _spread_results(em: _Emitter, pattern: Pattern, sched: Schedule, phase: list[FlatOp],
                    space: Space, values_at, outputs: list, first_output: int,
                    shared: list[SharedArray], tid: Var, bid: Var) -> None:
    """A phase spread over the grid, and the outputs that read it computed at its results
    (locality: an output read elsewhere needs another block's result, and is refused).

    ``sched.threads_per_group`` 1: a thread per result reducing its points serially, the
    grid's threads striding over the results. More: a tile, ``groups_per_block`` results per
    block side by side in the lanes (coalesced, as for column sums), each split over that
    many threads and combined in shared memory (`_combine`); its first thread stores."""
    width, depth = sched.groups_per_block, sched.threads_per_group
    reducers = [red.reducer for red in phase]
    for _, shape, value_name in outputs:
        if shape.num_elements != space.groups:
            raise CodegenError(f"output {value_name} ({shape.num_elements} elements) reads "
                               f"results spread over blocks ({space.groups}): needs "
                               f"cross-block communication")

    def output_stores(group: Var) -> list[GlobalStore]:
        return _stores_at_group(em, _result_shape(phase[0]), group, outputs, first_output)

    outer_group = em.group
    if depth > 1:
        group = Var("o_s", space.groups)
        em.place(IndexLet(group, add(scale(bid, width), mod(tid, width))), 0)
        em.group = group
        partials = _in_runs(em, Points(div(tid, width), space.reduced, depth, 1,
                                       _unroll_short(em, space.reduced, depth), "r_s"),
                            values_at(ix(group)), reducers, "q_s")
        tile = Schedule("tile", space, width, depth, sched.grid_blocks)
        for red, partial in zip(phase, partials):
            total = _combine(em, tile, red, partial, shared, tid, mod(tid, width))
            em.reduced[red.name] = _apply_init(em, pattern, red, total)
        em.place(If(div(tid, width), ix(0), output_stores(group)), 0)
    else:
        def per_result(result: Ix) -> list:
            at = len(em.scopes) - 1
            group = Var("o_s", space.groups)
            em.place(IndexLet(group, result), at)
            em.var_depth[group] = at
            em.group = group
            serial = _serial_reduce(em, space.reduced, values_at(ix(group)), reducers,
                                    f"s_{_tag(phase[0])}")
            for red, partial in zip(phase, serial):
                em.reduced[red.name] = _apply_init(em, pattern, red, partial, at)
            for store in output_stores(group):
                em.place(store, at)
            return []

        threads = sched.block[0]
        _over_points(em, Points(add(scale(bid, threads), tid), space.groups,
                                threads * sched.grid_blocks, 1, False, "o_spread"),
                     per_result, [])
    for red in phase:
        del em.reduced[red.name]
    em.group = outer_group


def _serial_reduce(em: _Emitter, count: int, visit, reducers: list[str], tag: str
                   ) -> list[Value]:
    """One thread's reduction of points 0..count-1 in the current scope: runs of SERIAL_RUN
    points (an inner loop LLVM unrolls, or unrolled here), combined in order."""
    points = Points(ix(0), count, 1, 1, _unroll_short(em, count, 1), f"r{tag}")
    return _in_runs(em, points, visit, reducers, f"q{tag}", always=count % SERIAL_RUN == 0)


def _tag(red: FlatOp) -> str:
    return red.name.replace("/", "_").replace(".", "_")


# ---------------------------------------------------------------------------------------------
# Shared-memory reuse (paper 4.4)
# ---------------------------------------------------------------------------------------------
def _touches(stmt, array: SharedArray) -> bool:
    match stmt:
        case SharedStore() | SharedLoad():
            return stmt.array is array
        case BlockReduce():
            return stmt.scratch is array
        case Loop() | If():
            return any(_touches(s, array) for s in stmt.body)
    return False


def reuse_shared_memory(kernel: Kernel) -> int:
    """Let shared arrays share buffers when one's last use dominates the other's first use.

    The dominance tree is built over the kernel's top-level statements (networkx
    immediate_dominators); an array takes over the buffer of an earlier array whose last use
    dominates its first use, with a barrier between so that no thread still reads the old
    contents. Returns the bytes without reuse; `kernel.shared` holds the reused buffers.
    """
    before = kernel.smem_bytes
    if len(kernel.shared) < 2:
        return before
    body = kernel.body
    graph = nx.DiGraph([(i, i + 1) for i in range(len(body))])
    idom = nx.immediate_dominators(graph, 0)

    def dominates(a: int, b: int) -> bool:
        while b != a and idom[b] != b:
            b = idom[b]
        return a == b

    spans = {a.name: [i for i, s in enumerate(body) if _touches(s, a)] for a in kernel.shared}
    slots: list[tuple[SharedArray, int]] = []  # buffer, last statement using it
    rename: dict[str, SharedArray] = {}
    barriers: list[int] = []
    for array in kernel.shared:
        first, last = spans[array.name][0], spans[array.name][-1]
        for k, (slot, busy_until) in enumerate(slots):
            if slot.dtype == array.dtype and busy_until < first and dominates(busy_until, first):
                slot.size = max(slot.size, array.size)
                slots[k] = (slot, last)
                rename[array.name] = slot
                barriers.append(first)
                break
        else:
            slot = SharedArray(array.name, array.dtype, array.size)
            slots.append((slot, last))
            rename[array.name] = slot
    _rename_shared(body, rename)
    for at in sorted(set(barriers), reverse=True):
        body.insert(at, Barrier())
    kernel.shared = [s for s, _ in slots]
    return before


def _rename_shared(body: list, rename: dict[str, SharedArray]) -> None:
    for s in body:
        if isinstance(s, (SharedStore, SharedLoad)):
            s.array = rename[s.array.name]
        elif isinstance(s, BlockReduce):
            s.scratch = rename[s.scratch.name]
        elif isinstance(s, (Loop, If)):
            _rename_shared(s.body, rename)


# ---------------------------------------------------------------------------------------------
# The choice among candidates
# ---------------------------------------------------------------------------------------------
def host_schedule(pattern: Pattern, chosen: Schedule | None = None) -> Schedule:
    """The schedule a CPU runs fastest: one thread per block, so every loop is a plain serial
    loop (vectorizable) and per-group or per-kernel values are computed once, not per element.
    A phased kernel (``chosen``) stays phased, with one thread and its loops rolled."""
    if chosen is not None and chosen.kind == "phases":
        return dataclasses.replace(chosen, groups_per_block=1, threads_per_group=1, vector=1,
                                   grid_blocks=1, unrolled=False)
    space = reduction_space(pattern)
    if space.reduced == 0:
        return Schedule("loop", space, 1, 1, 1)
    return Schedule("thread", space, 1, 1, space.groups)


def resolve_device(device: dict | Device | None) -> Device:
    if isinstance(device, Device):
        return device
    return load_device({**DEFAULT_DEVICE, **(device or {})}["name"])


def _strided_points(pattern: Pattern) -> int:
    """Element distance in memory between consecutive points of the first reduction (0 when
    they are adjacent: the reduced dimensions include the operand's minor one)."""
    ops = pattern.op_map()
    first = next((op for op in pattern.ops if op.opcode == "reduce"), None)
    if first is None:
        return 0
    operand = ops[first.operands[0]].shape
    if not operand.rank or operand.minor_to_major[0] in first.dimensions:
        return 0
    strides = {d: s for d, s in zip(range(operand.rank), _element_strides(operand))}
    return min(strides[d] for d in first.dimensions)


def schedule_pattern(pattern: Pattern, name: str, device: dict | Device | None = None,
                     excluded: dict[str, str] | None = None) -> ScheduledKernel:
    """Build every enumerated schedule, drop those failing locality or the device's limits
    or ``excluded`` (a schedule's ``why`` -> the reason), and keep the one the
    latency-evaluator models fastest.

    Candidates are priced by codegen/profile.py, the same model the pipeline prices the chosen
    kernel with (and XLA's kernels against), so the choice and the report agree."""
    from .profile import kernel_profile  # profile.py imports KernelSpec from this package

    dev = resolve_device(device)
    excluded = excluded or {}
    read = sum(s.byte_size for _, s in pattern.inputs)
    written = sum(s.byte_size for _, s in pattern.outputs)
    built, refusals, candidates = [], [], []
    strided = _strided_points(pattern)

    def schedules():
        """The one-space schedules; the phased ones only where all of those are refused for
        reductions over different spaces or for locality, so every pattern that builds with
        one space keeps its kernel."""
        try:
            space = reduction_space(pattern)
        except DifferentSpaces as e:
            refusals.append(("one-space schedules", str(e)))
        else:
            reuse = space.reduced > 0 and (len(_reduction_stages(pattern)) > 1 or any(
                s.num_elements == space.groups * space.reduced for _, s in pattern.outputs))
            yield from enumerate_schedules(space, dev, [s.num_elements for _, s in pattern.outputs],
                                           reuse)
        if not built and any(reason.startswith("reductions over different spaces") or
                             reason.endswith("needs cross-block communication")
                             for _, reason in refusals):
            yield from enumerate_phased_schedules(pattern, dev)

    for sched in schedules():
        if sched.why in excluded:
            refusals.append((sched.why, excluded[sched.why]))
            continue
        if strided and sched.kind in ("warp", "block"):
            # The latency-evaluator does not price uncoalesced access; thread and tile
            # schedules read these reductions coalesced (consecutive results in lanes).
            refusals.append((sched.why, f"lanes would read points {strided} elements apart "
                                        f"(uncoalesced)"))
            continue
        try:
            kernel, schemes = build_kernel(pattern, sched, name)
        except CodegenError as e:
            refusals.append((sched.why, str(e)))
            continue
        no_reuse = reuse_shared_memory(kernel)
        if math.prod(kernel.grid) <= dev.sm_count:
            kernel.min_blocks_per_sm = 1  # the grid is one wave of one block per SM
        if kernel.smem_bytes > dev.shared_memory_per_block:
            refusals.append((sched.why, f"{kernel.smem_bytes} B shared memory exceeds "
                                        f"{dev.shared_memory_per_block} B"))
            continue
        # What kernel_profile reads of a KernelSpec, for a kernel that is not one yet.
        profile = kernel_profile(SimpleNamespace(
            kernel=kernel, grid=kernel.grid, block=kernel.block, smem_bytes=kernel.smem_bytes,
            read_bytes=read, write_bytes=written))
        try:
            modeled = kernel_latency_us(profile, dev).total_us
        except ValueError as e:  # cannot launch (occupancy 0)
            refusals.append((sched.why, str(e)))
            continue
        description = f"{sched.why}; grid {kernel.grid[0]} x {kernel.block[0]}, " \
                      f"~{profile.regs_per_thread} regs, {kernel.smem_bytes} B smem"
        candidates.append((description, modeled))
        built.append((modeled, len(built), sched, kernel, schemes, no_reuse, profile))
    if not built:
        # Unsupported ops fail every schedule alike: the first reason speaks for all; a
        # pattern only the phased schedule could build says why that failed too.
        phased = [reason for why, reason in refusals if why.startswith("phased schedule")]
        raise CodegenError(refusals[0][1] + (f"; phased schedule: {phased[0]}" if phased
                                              and phased[0] != refusals[0][1] else ""))
    modeled, _, sched, kernel, schemes, no_reuse, profile = min(built, key=lambda b: b[:2])
    order = ["kernel_packing", "thread_composition", "warp_composition", "block_composition"]
    return ScheduledKernel(kernel, sched, [s for s in order if s in schemes], modeled, no_reuse,
                           candidates + [(f"{why}; refused: {reason}", math.inf)
                                         for why, reason in refusals], profile)
