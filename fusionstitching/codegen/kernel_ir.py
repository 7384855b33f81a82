"""Target-independent kernel IR: what one GPU thread does, with composition primitives first class.

A `Kernel` is a per-thread program (like CUDA C) over SSA `Value`s; integer index arithmetic
is kept apart from data values as `Ix` expressions (index_expr.py). Both backends (host.py,
nvptx.py) lower exactly this IR; the composition primitives (`WarpReduce`, `BlockReduce`,
`SharedStore/Load`, `Barrier`) are what lets values cross threads (paper section 4.1).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from costmodel import WARP

from ..hlo.ir import Shape
from .index_expr import Ix, Var, div, ix, mod

# NVPTX's LLVM unrolls loops by 8 (runtime unrolling): a loop of exactly 8 trips becomes
# straight-line code; fewer trips stay a loop (measured: tid, tid % 32 and tid // k starts,
# 2-7 trips one load in a loop, 8 trips eight loads and no loop). Only small bodies: the
# 8-trip loops of a 6-phase LayerNorm chain with 6-10 loads per trip stay loops.
UNROLL_FACTOR = 8


class Value(NamedTuple):
    """An SSA value of one thread. dtype: f32, f16, bf16, s32, s64, u32, u64 or pred (or a
    128-bit vector: f32x4, s32x4; or f64, only as a sum's wide accumulator). A named tuple: values key every cache of the code
    generator, and a tuple's hash and equality run in C (a frozen dataclass's ran in Python,
    13% of planning bert_train_small_jax_cpu)."""

    name: str
    dtype: str

    def __str__(self) -> str:
        return f"%{self.name}"


@dataclass
class Const:
    dst: Value
    value: float | int | bool


@dataclass
class IndexValue:
    """The s32 value of an index expression (iota, comparisons against thread indices)."""

    dst: Value
    index: Ix


@dataclass
class Compute:
    """Elementwise op named by its HLO opcode; `attr` is the comparison direction for compare."""

    dst: Value
    op: str
    args: list[Value]
    attr: str | None = None


@dataclass
class DynamicIndex:
    """Defines an index variable from a data value (dynamic-slice starts, gather indices,
    clamped positions of concatenate/pad operands). The schedule clamps the value into
    0 .. var.extent-1 first, so every address built from it stays inside its buffer."""

    var: Var
    value: Value


@dataclass
class ConstArray:
    """A non-scalar constant, emitted once into the kernel's module (read-only global)."""

    name: str
    dtype: str
    values: np.ndarray  # flattened in the constant's physical layout


@dataclass
class ConstLoad:
    dst: Value
    array: ConstArray
    offset: Ix


@dataclass
class IndexLet:
    """Defines an index variable (e.g. the row a thread group works on) from tid/bid."""

    var: Var
    index: Ix


@dataclass
class GlobalLoad:
    """dst = buffer[offset]; a vector dst (f32x4, s32x4) loads the 16-byte group that starts
    at offset in one 128-bit access (see `vector_group`)."""

    dst: Value
    buffer: int
    offset: Ix


@dataclass
class GlobalStore:
    """buffer[offset] = value; a vector value stores 16 bytes starting at offset at once."""

    buffer: int
    offset: Ix
    value: Value


@dataclass
class VectorExtract:
    """dst = lane `lane` of a vector value (a register rename on both targets)."""

    dst: Value
    src: Value
    lane: int


@dataclass
class VectorPack:
    """dst = the vector whose lanes are `lanes` (for a 128-bit store)."""

    dst: Value
    lanes: list[Value]


@dataclass
class Accumulate:
    """Loop-carried reduction: dst starts at `init` and is combined with `value` each iteration.

    A general combiner (a variadic reduce's) is computed in the body instead: there `carried`
    is dst's value before the iteration, `value` the next one, and kind is "next"."""

    dst: Value
    kind: str  # HLO opcode of the combiner: add, maximum, minimum, multiply, and, or; or next
    init: Value
    value: Value
    carried: Value | None = None
    # Combined in the loop's order as XLA defines it (scatter's update windows, reduce-window's
    # positions), so a fast host kernel does not reorder it as it does reductions.
    ordered: bool = False


@dataclass
class Loop:
    """for var = start; var < stop; var += step: one thread's share of a row's columns."""

    var: Var
    start: Ix
    stop: int
    step: int
    body: list
    accumulates: list[Accumulate] = field(default_factory=list)


@dataclass
class If:
    """Executes body when ``lhs == rhs`` (or ``lhs < rhs`` with cmp="lt") on index expressions:
    the one lane that stores a row value, or the threads of the last block that have work."""

    lhs: Ix
    rhs: Ix
    body: list
    cmp: str = "eq"


@dataclass
class WarpReduce:
    """xor-shuffle butterfly over the 32 lanes of a warp: every lane gets the combined value.
    With ``lowest`` > 1 the butterfly stops there (xor distances 16 down to ``lowest``): lane l
    gets the value combined over the lanes congruent to l modulo ``lowest``."""

    dst: Value
    src: Value
    kind: str
    lowest: int = 1  # a power of two up to 16

    def offsets(self) -> tuple[int, ...]:
        return tuple(1 << k for k in range(4, self.lowest.bit_length() - 2, -1))


@dataclass
class SharedArray:
    name: str
    dtype: str
    size: int


@dataclass
class SharedStore:
    array: SharedArray
    index: Ix
    value: Value


@dataclass
class SharedLoad:
    dst: Value
    array: SharedArray
    index: Ix


@dataclass
class Barrier:
    pass


@dataclass
class BlockReduce:
    """Combine a value over all threads of the block (every thread gets the result).

    Lowered by `expand_block_reduce` into warp_reduce -> shared memory -> barrier -> warp_reduce,
    so that both backends combine partial values in exactly the same order.
    """

    dst: Value
    src: Value
    kind: str
    scratch: SharedArray


@dataclass
class Buffer:
    name: str
    shape: Shape
    is_output: bool


@dataclass
class Kernel:
    name: str
    buffers: list[Buffer]  # inputs then outputs: the order of the `void** buffers` argument
    grid: tuple[int, ...]
    block: tuple[int, ...]
    shared: list[SharedArray]
    body: list
    tid: Var  # threadIdx.x
    bid: Var  # blockIdx.x
    constants: list[ConstArray] = field(default_factory=list)
    # CUDA's __launch_bounds__ minBlocksPerMultiprocessor. 0: ptxas keeps the occupancy the
    # block size allows (it reads .maxntid so); 1: the grid runs one block per SM on the
    # schedule's device, so no register costs occupancy (.minnctapersm 1).
    min_blocks_per_sm: int = 0
    # Host kernels only: statements run once per call before the blocks (a scatter computed
    # in XLA's form, `IndexMaps.scatter_into_scratch`), and the scratch arrays (heap memory of
    # the call, read like shared arrays) that they or the body fill: scatters, and in a
    # one-thread kernel the values several loops read (`Emitter.computed_once`).
    prologue: list = field(default_factory=list)
    scratch: list[SharedArray] = field(default_factory=list)
    # Host kernels only: statements each part runs before its share, and before `prologue`
    # (tables of small inputs' expensive ops, `tabulate_small_inputs`, into scratch arrays):
    # cheap enough to run again per part, so the kernel keeps its parts.
    part_prologue: list = field(default_factory=list)
    # Host kernels only: (input, output) buffer pairs whose output XLA places in the input's
    # buffer (output_to_operand_aliasing; in_place.py proves it safe): the output is stored
    # through the input's pointer, so LLVM sees one array and vectorizes without overlap checks.
    in_place: tuple[tuple[int, int], ...] = ()

    @property
    def smem_bytes(self) -> int:
        return sum(a.size * DTYPE_BYTES[a.dtype] for a in self.shared)

    def __str__(self) -> str:
        head = [f"kernel {self.name} grid={self.grid} block={self.block}"]
        head += [f"  buffer {i} {'out' if b.is_output else 'in '} {b.name}: {format_shape(b.shape)}"
                 for i, b in enumerate(self.buffers)]
        head += [f"  shared {a.name}: {a.dtype}[{a.size}]" for a in self.shared]
        head += [f"  constant {c.name}: {c.dtype}[{c.values.size}]" for c in self.constants]
        head += [f"  scratch {a.name}: {a.dtype}[{a.size}]" for a in self.scratch]
        prologue = ["  prologue:"] + _format_body(self.prologue, 2) if self.prologue else []
        per_part = ["  each part's prologue:"] + _format_body(self.part_prologue, 2) \
            if self.part_prologue else []
        return "\n".join(head + per_part + prologue + _format_body(self.body, 1))


DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "s32": 4, "s64": 8, "u32": 4, "u64": 8,
               "pred": 1, "f64": 8,
               "f32x4": 16, "s32x4": 16}
VECTOR_LANES = 4  # 32-bit lanes of a 128-bit global access
# The vector type of a 128-bit access to elements of each 32-bit type, and back.
VECTOR_TYPES = {"f32": "f32x4", "s32": "s32x4"}
LANE_TYPES = {v: k for k, v in VECTOR_TYPES.items()}

# The value every reduction combiner leaves unchanged (partial results start here).
IDENTITY = {"add": 0, "multiply": 1, "maximum": -math.inf, "minimum": math.inf,
            "and": True, "or": False}


def wide_accumulator(kind: str, dtype: str) -> str | None:
    """The type a loop-carried combination of ``dtype`` values accumulates in: f64 for f32
    sums and products, whose error grows with the number of terms (a thread walking a long
    row would be less accurate than XLA's tree of partial sums); None where it stays."""
    return "f64" if dtype == "f32" and kind in ("add", "multiply") else None


def format_shape(shape: Shape) -> str:
    return f"{shape.dtype}[{','.join(map(str, shape.dims))}]{{{','.join(map(str, shape.minor_to_major))}}}"


def _format_body(body: list, depth: int) -> list[str]:
    pad = "  " * depth
    out = []
    for s in body:
        match s:
            case Const():
                out.append(f"{pad}{s.dst}:{s.dst.dtype} = constant {s.value}")
            case IndexValue():
                out.append(f"{pad}{s.dst}:s32 = index {s.index}")
            case Compute():
                attr = f" {s.attr}" if s.attr else ""
                out.append(f"{pad}{s.dst}:{s.dst.dtype} = {s.op}{attr} {', '.join(map(str, s.args))}")
            case IndexLet():
                out.append(f"{pad}let {s.var} = {s.index}")
            case DynamicIndex():
                out.append(f"{pad}let {s.var} = index_of {s.value}")
            case ConstLoad():
                out.append(f"{pad}{s.dst}:{s.dst.dtype} = constant_load {s.array.name}[{s.offset}]")
            case GlobalLoad():
                out.append(f"{pad}{s.dst}:{s.dst.dtype} = global_load buffer{s.buffer}[{s.offset}]")
            case GlobalStore():
                out.append(f"{pad}global_store buffer{s.buffer}[{s.offset}] = {s.value}")
            case VectorExtract():
                out.append(f"{pad}{s.dst}:{s.dst.dtype} = extract {s.src}[{s.lane}]")
            case VectorPack():
                out.append(f"{pad}{s.dst}:{s.dst.dtype} = pack {', '.join(map(str, s.lanes))}")
            case Loop():
                out.append(f"{pad}for {s.var} = {s.start}; {s.var} < {s.stop}; {s.var} += {s.step}:")
                out += _format_body(s.body, depth + 1)
                out += [f"{pad}  {a.dst} = {a.kind}({a.dst} [init {a.init}], {a.value})"
                        if a.carried is None else
                        f"{pad}  {a.dst} = next({a.value}) [init {a.init}, read as {a.carried}]"
                        for a in s.accumulates]
            case If():
                out.append(f"{pad}if {s.lhs} {'==' if s.cmp == 'eq' else '<'} {s.rhs}:")
                out += _format_body(s.body, depth + 1)
            case WarpReduce():
                over = f" (lanes mod {s.lowest})" if s.lowest > 1 else ""
                out.append(f"{pad}{s.dst}:{s.dst.dtype} = warp_reduce.{s.kind} {s.src}{over}")
            case BlockReduce():
                out.append(f"{pad}{s.dst}:{s.dst.dtype} = block_reduce.{s.kind} {s.src} "
                           f"via {s.scratch.name}")
            case SharedStore():
                out.append(f"{pad}shared_store {s.array.name}[{s.index}] = {s.value}")
            case SharedLoad():
                out.append(f"{pad}{s.dst}:{s.dst.dtype} = shared_load {s.array.name}[{s.index}]")
            case Barrier():
                out.append(f"{pad}barrier")
            case _:
                raise TypeError(s)
    return out


def expand_block_reduce(kernel: Kernel) -> list:
    """The body with every BlockReduce replaced by the primitives both backends implement.

    Each warp reduces its threads by butterfly; lane 0 writes the warp's value to
    scratch[warp]; after a barrier every warp reads the per-warp values (lanes beyond the
    number of warps use the identity) and reduces them by butterfly again.
    """
    counter = itertools.count()
    nwarps = kernel.block[0] // WARP
    lane, warp = mod(kernel.tid, WARP), div(kernel.tid, WARP)
    out = []
    for s in kernel.body:
        if not isinstance(s, BlockReduce):
            out.append(s)
            continue
        dt = s.src.dtype
        fresh = lambda tag, dtype=dt: Value(f"{s.dst.name}.{tag}{next(counter)}", dtype)
        per_warp, loaded, lane_v, nw, valid, ident, masked = (
            fresh("warp"), fresh("smem"), fresh("lane", "s32"), fresh("nw", "s32"),
            fresh("valid", "pred"), fresh("id"), fresh("masked"))
        out += [WarpReduce(per_warp, s.src, s.kind),
                If(lane, ix(0), [SharedStore(s.scratch, warp, per_warp)]),
                Barrier(),
                SharedLoad(loaded, s.scratch, lane),
                IndexValue(lane_v, lane), Const(nw, nwarps),
                Compute(valid, "compare", [lane_v, nw], "LT"),
                Const(ident, IDENTITY[s.kind]),
                Compute(masked, "select", [valid, loaded, ident]),
                WarpReduce(s.dst, masked, s.kind)]
    return out


def nested_body(stmt) -> list:
    body = getattr(stmt, "body", None)
    return body if isinstance(body, list) else []


def all_statements(body: list):
    """Every statement of ``body``, those inside loops and ifs included, in program order."""
    for s in body:
        yield s
        yield from all_statements(nested_body(s))


def defined_values(stmt) -> list[Value]:
    match stmt:
        case Const() | IndexValue() | Compute() | GlobalLoad() | WarpReduce() | BlockReduce() \
                | SharedLoad() | ConstLoad() | VectorExtract() | VectorPack():
            return [stmt.dst]
        case Loop():
            return [a.dst for a in stmt.accumulates]
        case If():  # values an If defines are used only inside it (stores, guarded work)
            return [v for s in stmt.body for v in defined_values(s)]
    return []


def used_values(stmt) -> list[Value]:
    """Values a statement reads, including (for Loop/If) everything its body reads."""
    match stmt:
        case Compute():
            return list(stmt.args)
        case GlobalStore() | SharedStore():
            return [stmt.value]
        case WarpReduce() | BlockReduce() | VectorExtract():
            return [stmt.src]
        case VectorPack():
            return list(stmt.lanes)
        case DynamicIndex():
            return [stmt.value]
        case Loop():
            inner = [v for s in stmt.body for v in used_values(s)]
            return inner + [v for a in stmt.accumulates for v in (a.init, a.value)]
        case If():
            return [v for s in stmt.body for v in used_values(s)]
    return []


def vector_group(shape: Shape, offset: Ix, dtype: str) -> tuple[Ix, int] | None:
    """(offset of its 16-byte group, lane) when element `offset` of a buffer of `shape` may be
    accessed as one lane of a 4 x 32-bit vector: the group starts at a multiple of 4 elements
    for every value of the index variables (all coefficients are multiples of 4), and the
    buffer's size is a multiple of 4, so the whole group lies inside it. Buffers start 16-byte
    aligned (XLA's allocations; on the host, numpy's arrays, where x86 does not require it)."""
    if dtype not in VECTOR_TYPES or shape.num_elements % VECTOR_LANES:
        return None
    if any(c % VECTOR_LANES for _, c in offset.terms):
        return None
    lane = offset.const % VECTOR_LANES
    return Ix(offset.terms, offset.const - lane), lane
