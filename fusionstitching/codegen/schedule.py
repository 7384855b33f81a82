"""Schedule a flattened pattern onto threads and emit its kernel IR (paper 4.2).

Ops are grouped by *sub-roots*: every reduction is a sub-root, and the pattern's outputs form
the root group. All sub-roots and outputs live in one *row space* of `rows` x `cols`: a
reduction reduces one row (its reduced dimensions, which must be the most minor ones in its
operand's layout) to one value, and every output has either rows*cols elements (computed per
row and column) or rows elements (one value per row). A thread group owns one row:

* WarpComposition: one warp per row, several rows per block; the warp's lanes split the
  columns and combine their partial values with a warp_reduce (xor butterfly), after which
  every lane holds the row's value and its consumers read it from a register.
* BlockComposition: one block per row; partial values are combined with a block_reduce
  (butterfly per warp, shared memory across warps).
* ThreadComposition: everything else passes through registers of the thread that computes
  it; producers of several consumers (including expensive ones) are recomputed.

Rule (until the latency-evaluator picks among enumerated schedules): rows longer than 1024
columns use BlockComposition (a warp would otherwise loop more than 32 times per row and few
rows would fill few SMs), with ~4 columns per thread; shorter rows use WarpComposition with 4
warps per block (2 or 1 when rows is not a multiple of 4, so that no warp is idle).

Indices propagate from sub-roots to producers through per-op index maps (elementwise,
broadcast, reshape, bitcast, transpose, slice, iota, constants), so every op is computed at a
symbolic multi-dimensional index of the current thread. The locality requirement of warp and
block composition is checked where a consumer reads a reduction: the index it reads must be
the row its own thread group reduced, for every thread; otherwise the pattern would need
cross-block communication and is rejected.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

import numpy as np

from ..hlo.ir import Shape
from .flatten import CodegenError, FlatOp, Pattern
from .kernel_ir import (IDENTITY, WARP, Accumulate, BlockReduce, Compute, Const, GlobalLoad,
                        GlobalStore, If, IndexLet, IndexValue, Ix, Kernel, Loop, SharedArray,
                        Value, Var, WarpReduce, Buffer, add, delinearize, div, ix, linearize, mod,
                        row_major, scale)

DEFAULT_DEVICE = {"name": "h100", "max_threads_per_block": 1024}

WARP_ROWS_MAX_COLS = 1024  # longer rows get a whole block (see module docstring)
COLS_PER_THREAD = 4  # BlockComposition: columns per thread before the block grows
WARPS_PER_BLOCK = 4  # WarpComposition: rows per block

ELEMENTWISE = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs",
               "exponential", "log", "sqrt", "rsqrt", "tanh", "power", "compare", "select",
               "convert", "and", "or", "not"}
ARITH_DTYPES = {"f32", "s32", "pred"}  # dtypes ops compute in
STORAGE_DTYPES = ARITH_DTYPES | {"f16", "bf16"}  # dtypes loads, stores and converts handle
REDUCIBLE = {("f32", k) for k in ("add", "maximum", "minimum", "multiply")} | {
    ("s32", "add"), ("s32", "multiply"), ("pred", "and"), ("pred", "or")}
FLOAT_ONLY = {"divide", "exponential", "log", "sqrt", "rsqrt", "tanh", "power"}


@dataclass
class Schedule:
    scheme: str  # "warp_composition" or "block_composition" (thread groups per row)
    rows: int
    cols: int
    rows_per_block: int
    threads_per_row: int
    why: str

    @property
    def grid(self) -> tuple[int, ...]:
        return (self.rows // self.rows_per_block,)

    @property
    def block(self) -> tuple[int, ...]:
        return (self.rows_per_block * self.threads_per_row,)


def choose_schedule(rows: int, cols: int, device: dict) -> Schedule:
    if cols > WARP_ROWS_MAX_COLS:
        threads = -(-cols // COLS_PER_THREAD)
        threads = min(device["max_threads_per_block"], -(-threads // WARP) * WARP)
        return Schedule("block_composition", rows, cols, 1, threads,
                        f"[{rows}]x[{cols}] rows longer than {WARP_ROWS_MAX_COLS}: "
                        f"one block of {threads} threads per row")
    per_block = next(w for w in (WARPS_PER_BLOCK, 2, 1) if rows % w == 0)
    return Schedule("warp_composition", rows, cols, per_block, WARP,
                    f"[{rows}]x[{cols}] rows of at most {WARP_ROWS_MAX_COLS}: one warp per row, "
                    f"{per_block} rows per block")


def row_space(pattern: Pattern) -> tuple[int, int]:
    """(rows, cols) shared by every reduction, or taken from the largest output if none."""
    spaces = set()
    for op in pattern.ops:
        if op.opcode != "reduce":
            continue
        operand = _operand_shape(pattern, op, 0)
        reduced = set(op.dimensions)
        if set(operand.minor_to_major[:len(reduced)]) != reduced:
            raise CodegenError(f"reduce {op.name} over dimensions {sorted(reduced)} of "
                               f"{operand.dims} is a column reduction (reduced dimensions are "
                               f"not the most minor in the layout): no column schedule yet")
        if len(op.operands) != 2 or op.shape.is_tuple:
            raise CodegenError(f"reduce {op.name}: variadic reductions are not supported")
        if (op.shape.dtype, op.reducer) not in REDUCIBLE:
            raise CodegenError(f"reduce {op.name}: {op.reducer} over {op.shape.dtype} "
                               f"is not supported")
        cols = math.prod(operand.dims[d] for d in reduced)
        spaces.add((op.shape.num_elements, cols))
    if len(spaces) > 1:
        raise CodegenError(f"reductions over different row spaces {sorted(spaces)}: "
                           f"one kernel needs one rows x cols mapping")
    if spaces:
        rows, cols = spaces.pop()
    else:
        biggest = max((s for _, s in pattern.outputs), key=lambda s: s.num_elements)
        cols = biggest.dims[biggest.minor_to_major[0]] if biggest.rank else 1
        rows = biggest.num_elements // cols
    for name, shape in pattern.outputs:
        if shape.num_elements not in (rows, rows * cols):
            raise CodegenError(f"output {name} has {shape.num_elements} elements; the kernel's "
                               f"thread groups own rows of [{rows}]x[{cols}]")
    return rows, cols


def _operand_shape(pattern: Pattern, op: FlatOp, i: int) -> Shape:
    return pattern.op_map()[op.operands[i]].shape


def _parse_scalar(op: FlatOp) -> float | int | bool:
    if op.shape.dims:
        raise CodegenError(f"constant {op.name}: non-scalar constants are not supported")
    text = (op.literal or "").strip()
    if op.shape.dtype == "pred":
        return text == "true"
    return int(text) if op.shape.dtype in ("s32",) else float(text)


def _slice_starts_strides(op: FlatOp) -> list[tuple[int, int]]:
    ranges = re.findall(r"\[(-?\d+):(-?\d+)(?::(\d+))?\]", op.attrs.get("slice", ""))
    return [(int(a), int(s or 1)) for a, _, s in ranges]


class _Emitter:
    """Emits ops at symbolic indices into nested scopes, with value CSE per scope (paper 4.5).

    Scope 0 is the block level (once per thread); each column loop opens a deeper scope. A value
    is placed in the outermost scope where everything it depends on is defined, so per-row work
    (a reduction result times a constant) is hoisted out of the column loops.
    """

    def __init__(self, pattern: Pattern, row: Var):
        self.pattern = pattern
        self.ops = pattern.op_map()
        self.row = row
        self.scopes: list[list] = [[]]
        self.var_depth: dict[Var, int] = {}
        self.cache: dict[tuple, tuple[Value, int]] = {}
        self.reduced: dict[str, Value] = {}
        self.names = itertools.count()

    def fresh(self, dtype: str) -> Value:
        return Value(f"v{next(self.names)}", dtype)

    def index_depth(self, *exprs: Ix) -> int:
        return max((self.var_depth.get(v, 0) for e in exprs for v in e.vars()), default=0)

    def open_loop(self, var: Var) -> None:
        self.scopes.append([])
        self.var_depth[var] = len(self.scopes) - 1

    def close_loop(self) -> list:
        depth = len(self.scopes) - 1
        self.cache = {k: v for k, v in self.cache.items() if v[1] < depth}
        return self.scopes.pop()

    def place(self, stmt, depth: int) -> None:
        self.scopes[depth].append(stmt)

    def value(self, name: str, index: tuple[Ix, ...]) -> tuple[Value, int]:
        key = (name, index)
        if key not in self.cache:
            self.cache[key] = self._compute(self.ops[name], index)
        return self.cache[key]

    def _compute(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        code, dtype = op.opcode, op.shape.dtype
        if dtype not in STORAGE_DTYPES:
            raise CodegenError(f"{code} {op.name}: element type {dtype} is not supported")
        operand = lambda i: self.ops[op.operands[i]]
        match code:
            case "parameter":
                offset = linearize(index, op.shape)
                dst, depth = self.fresh(dtype), self.index_depth(offset)
                self.place(GlobalLoad(dst, op.parameter_number, offset), depth)
                return dst, depth
            case "constant":
                dst = self.fresh(dtype)
                self.place(Const(dst, _parse_scalar(op)), 0)
                return dst, 0
            case "iota":
                dim = int(op.attrs["iota_dimension"])
                raw, depth = self.fresh("s32"), self.index_depth(index[dim])
                self.place(IndexValue(raw, index[dim]), depth)
                if dtype == "s32":
                    return raw, depth
                dst = self.fresh(dtype)
                self.place(Compute(dst, "convert", [raw]), depth)
                return dst, depth
            case "broadcast":
                return self.value(op.operands[0], tuple(index[d] for d in op.dimensions))
            case "reshape":
                flat = linearize(index, row_major(op.shape))
                return self.value(op.operands[0], delinearize(flat, row_major(operand(0).shape)))
            case "bitcast":
                if operand(0).shape.dtype != dtype:
                    raise CodegenError(f"bitcast {op.name} changes the element type")
                return self.value(op.operands[0],
                                  delinearize(linearize(index, op.shape), operand(0).shape))
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
                    for i, (start, stride) in zip(index, _slice_starts_strides(op))))
            case "reduce":
                self.check_locality(op, index)
                return self.reduced[op.name], 0
        if code not in ELEMENTWISE:
            raise CodegenError(f"{code} {op.name}: op not supported by the code generator")
        if code != "convert" and dtype not in ARITH_DTYPES | {"pred"}:
            raise CodegenError(f"{code} {op.name}: arithmetic in {dtype} is not supported "
                               f"(only converts to/from f16/bf16)")
        if code in FLOAT_ONLY and dtype != "f32":
            raise CodegenError(f"{code} {op.name}: only f32 is supported")
        args = [self.value(o, index) for o in op.operands]
        if code != "convert" and any(a.dtype not in ARITH_DTYPES for a, _ in args):
            raise CodegenError(f"{code} {op.name}: operands in f16/bf16 must be converted first")
        dst, depth = self.fresh(dtype), max((d for _, d in args), default=0)
        attr = op.attrs.get("direction") if code == "compare" else None
        self.place(Compute(dst, code, [a for a, _ in args], attr), depth)
        return dst, depth

    def check_locality(self, op: FlatOp, index: tuple[Ix, ...]) -> None:
        """A reduction's value is only available at the row the current thread group reduced."""
        if op.name not in self.reduced:
            raise CodegenError(f"reduction {op.name} is read before it is computed")
        read = linearize(index, op.shape)
        if read == ix(self.row):
            return
        # Not syntactically the row: compare at every point of the index space (exact).
        variables = sorted(read.vars() | {self.row}, key=lambda v: v.name)
        points = math.prod(v.extent for v in variables)
        if points <= 1 << 22:
            grids = np.meshgrid(*(np.arange(v.extent) for v in variables), indexing="ij")
            env = {v.name: g for v, g in zip(variables, grids)}
            if np.array_equal(read.evaluate(env) + np.zeros_like(env[self.row.name]),
                              env[self.row.name]):
                return
        raise CodegenError(f"reduction {op.name} is read at element {read} by the thread group "
                           f"of row {self.row}: needs cross-block communication")


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
    ancestors: dict[str, set[str]] = {}
    for op in pattern.ops:
        ancestors[op.name] = set().union(*({o} | ancestors[o] for o in op.operands)) \
            if op.operands else set()
    distinct = list(dict.fromkeys(names))
    return any(a not in ancestors[b] and b not in ancestors[a]
               for a, b in itertools.combinations(distinct, 2))


@dataclass
class ScheduledKernel:
    kernel: Kernel
    schedule: Schedule
    schemes: list[str]


def schedule_pattern(pattern: Pattern, name: str, device: dict | None = None) -> ScheduledKernel:
    device = {**DEFAULT_DEVICE, **(device or {})}
    rows, cols = row_space(pattern)
    sched = choose_schedule(rows, cols, device)
    tid, bid = Var("tid", sched.block[0]), Var("bid", sched.grid[0])
    row, col = Var("row", rows), Var("col", cols)
    # The lane (warp scheme) or thread (block scheme) index within the row's thread group.
    member = mod(tid, WARP) if sched.scheme == "warp_composition" else ix(tid)
    em = _Emitter(pattern, row)
    em.place(IndexLet(row, add(scale(bid, sched.rows_per_block), div(tid, WARP))
                      if sched.scheme == "warp_composition" else ix(bid)), 0)

    schemes = {"thread_composition"}
    shared: list[SharedArray] = []
    for stage in _reduction_stages(pattern):
        if len(stage) > 1 and _independent(pattern, [r.name for r in stage]):
            schemes.add("kernel_packing")
        em.open_loop(col)
        accumulates = []
        for r in stage:
            operand = _operand_shape(pattern, r, 0)
            index = _reduce_operand_index(r, operand, row, col)
            value, _ = em.value(r.operands[0], index)
            init = em.fresh(value.dtype)
            em.place(Const(init, IDENTITY[r.reducer]), 0)
            accumulates.append(Accumulate(em.fresh(value.dtype), r.reducer, init, value))
        em.place(Loop(col, member, cols, sched.threads_per_row, em.close_loop(), accumulates), 0)
        for r, acc in zip(stage, accumulates):
            total = em.fresh(acc.dst.dtype)
            if sched.scheme == "warp_composition":
                em.place(WarpReduce(total, acc.dst, r.reducer), 0)
                schemes.add("warp_composition")
            else:
                scratch = SharedArray(f"smem_{r.name.replace('/', '_')}", total.dtype, WARP)
                shared.append(scratch)
                em.place(BlockReduce(total, acc.dst, r.reducer, scratch), 0)
                schemes.add("block_composition")
            em.reduced[r.name] = _apply_init(em, pattern, r, total)

    buffers = [Buffer(n, s, False) for n, s in pattern.inputs] + \
              [Buffer(n, s, True) for n, s in pattern.outputs]
    first_output = len(pattern.inputs)
    per_element = [(i, s, v) for i, ((_, s), v) in
                   enumerate(zip(pattern.outputs, pattern.output_values))
                   if s.num_elements == rows * cols]
    per_row = [(i, s, v) for i, ((_, s), v) in
               enumerate(zip(pattern.outputs, pattern.output_values))
               if s.num_elements != rows * cols]
    if len(per_element) > 1 and _independent(pattern, [v for _, _, v in per_element]):
        schemes.add("kernel_packing")
    if per_element:
        em.open_loop(col)
        for i, shape, value_name in per_element:
            index = delinearize(add(scale(row, cols), col), shape)
            value, _ = em.value(value_name, index)
            em.place(GlobalStore(first_output + i, linearize(index, shape), value), 1)
        em.place(Loop(col, member, cols, sched.threads_per_row, em.close_loop()), 0)
    stores = []
    for i, shape, value_name in per_row:
        index = delinearize(ix(row), shape)
        value, _ = em.value(value_name, index)
        stores.append(GlobalStore(first_output + i, linearize(index, shape), value))
    if stores:
        em.place(If(member, ix(0), stores), 0)

    kernel = Kernel(name, buffers, sched.grid, sched.block, shared, em.scopes[0], tid, bid)
    order = ["kernel_packing", "thread_composition", "warp_composition", "block_composition"]
    return ScheduledKernel(kernel, sched, [s for s in order if s in schemes])


def _reduce_operand_index(r: FlatOp, operand: Shape, row: Var, col: Var) -> tuple[Ix, ...]:
    """The operand element that column `col` of row `row` of reduction r reads."""
    reduced = set(r.dimensions)
    kept = [d for d in range(operand.rank) if d not in reduced]
    index: list[Ix] = [ix(0)] * operand.rank
    for d, i in zip(kept, delinearize(ix(row), r.shape)):
        index[d] = i
    stride = 1
    for d in operand.minor_to_major:  # reduced dims come first: they are the most minor
        if d in reduced:
            index[d] = mod(div(col, stride), operand.dims[d])
            stride *= operand.dims[d]
    return tuple(index)


def _apply_init(em: _Emitter, pattern: Pattern, r: FlatOp, total: Value) -> Value:
    """Partial results start at the identity; a different init value is combined in once."""
    init_op = pattern.op_map()[r.operands[1]]
    if init_op.opcode != "constant":
        raise CodegenError(f"reduce {r.name}: init value {init_op.name} is not a constant")
    init = _parse_scalar(init_op)
    if init == IDENTITY[r.reducer]:
        return total
    init_value, result = em.fresh(total.dtype), em.fresh(total.dtype)
    em.place(Const(init_value, init), 0)
    em.place(Compute(result, r.reducer, [total, init_value]), 0)
    return result
