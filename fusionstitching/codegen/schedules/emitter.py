"""The emitter: ops computed at symbolic indices of the current thread, with CSE (paper 4.5).

Indices propagate from sub-roots to producers through per-op index maps, so every op is
computed at an index of the current thread: producers of several consumers are recomputed
(thread composition), with value CSE per scope. Data-dependent indices (gather,
dynamic-slice) and clamped positions (pad, concatenate) become `DynamicIndex` variables
clamped into their operand; the maps of those ops are in index_maps.py.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from ...hlo.attrs import parse_literal, parse_slice
from ...hlo.ir import Shape
from ..errors import CodegenError, Refusal
from ..flatten import FlatOp, Pattern
from ..index_expr import Ix, Var, add, delinearize, ix, linearize, row_major, scale
from ..kernel_ir import (DTYPE_BYTES, VECTOR_LANES, VECTOR_TYPES, Compute, Const, ConstArray,
                         ConstLoad, DynamicIndex, GlobalLoad, GlobalStore, IndexValue,
                         SharedArray, Value, VectorExtract, VectorPack, vector_group)
from ..ops import DTYPES, ELEMENTWISE, FLOAT_ONLY, INT_ONLY, INTS, NARROW_FLOATS
from .index_maps import IndexMaps, producing_reductions
from .space import result_shape


# Each pad, concatenate or dynamic index can ask its operand at another index: a log-depth
# scan (cummax's gradient) asks 2^depth of them. Past this the kernel is left to XLA.
MAX_VALUES = 20_000
_values_built = 0  # by every emitter of this process
_statements_placed = 0  # likewise


def values_built() -> int:
    """(op, index) pairs every emitter of this process has computed: the code generator's
    work, by which the planner bounds its own (pipeline.py)."""
    return _values_built


def statements_placed() -> int:
    """Kernel IR statements every emitter of this process has placed: the work of pricing
    the kernels, which a value can multiply (a reduce-window's positions combined in
    straight-line code place several statements per value)."""
    return _statements_placed


def scalar_value(op: FlatOp) -> float | int | bool:
    value = parse_literal(op.literal or "", op.shape).reshape(-1)[0]
    return bool(value) if op.shape.dtype == "pred" else (
        int(value) if op.shape.dtype in INTS else float(value))


class Emitter(IndexMaps):
    """Emits ops at symbolic indices into nested scopes, with value CSE per scope (paper 4.5).

    Scope 0 is the thread level (once per thread); each loop opens a deeper scope. A value is
    placed in the outermost scope where everything it depends on is defined, so per-group work
    (a reduction result times a constant) is hoisted out of the loops.
    """

    def __init__(self, pattern: Pattern, group: Var, host: bool = False,
                 one_thread: bool = False):
        self.pattern = pattern
        self.ops = pattern.op_map()
        self.group = group
        self.scopes: list[list] = [[]]
        self.unroll_short = False  # phased schedules: see unroll_short
        self.short_loops = 0
        self.var_depth: dict[Var, int] = {}
        self.cache: dict[tuple, tuple[Value, int]] = {}
        self.values_computed = 0  # (op, index) pairs computed: bounded by MAX_VALUES
        self.reduced: dict[str, Value | list[Value]] = {}  # a list: a variadic reduce's results
        # Phased schedule: reductions finished in an earlier phase, readable at any index
        # (a shared array of the results, or the value every thread holds for one result).
        self.staged: dict[str, SharedArray | Value] = {}
        self.constants: dict[str, ConstArray] = {}
        # elementwise's checks passed, by op and operand types: computes in f32?
        self.elementwise_narrow: dict[tuple, bool] = {}
        self.names = itertools.count()
        # Stores of one scope waiting for the other lanes of their 16-byte group:
        # (buffer, group offset, depth) -> {lane: (offset, value)}.
        self.pending: dict[tuple[int, Ix, int], dict[int, tuple[Ix, Value]]] = {}
        # Host kernels compute each scatter once per call into a scratch array (in the
        # prologue, or at its first use where ``one_thread``: `IndexMaps.scattered`); GPU
        # kernels compute scatters in the gather form.
        self.host, self.one_thread = host, one_thread
        self.prologue: list = []
        self.building_prologue = False  # the prologue runs first: nothing computed once yet
        self.scratch: dict[str, SharedArray] = {}
        self.once_in_output: dict[str, int] = {}  # value computed once -> the output holding it
        # One-thread host kernels: values several ops read, computed once into scratch
        # (`computed_once`) instead of again in every phase and output that reads them.
        self.once = reused_values(pattern) if one_thread else set()
        self.computing_once: set[str] = set()

    def fresh(self, dtype: str) -> Value:
        return Value(f"v{next(self.names)}", dtype)

    def index_depth(self, *exprs: Ix) -> int:
        depth, var_depth = 0, self.var_depth
        for e in exprs:
            for v in e.vars():
                d = var_depth.get(v, 0)
                if d > depth:
                    depth = d
        return depth

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
        global _statements_placed
        _statements_placed += 1
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
        values = [a for a, _ in args]
        key = ("#op", code, dtype, attr, tuple(values))
        cached = self.cache.get(key)
        if cached is None:
            dst, depth = self.fresh(dtype), max([d for _, d in args], default=0)
            self.place(Compute(dst, code, values, attr), depth)
            cached = self.cache[key] = (dst, depth)
        return cached

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
        global _values_built
        key = (name, index)
        cached = self.cache.get(key)
        if cached is None:
            _values_built += 1
            self.values_computed += 1
            if self.values_computed > MAX_VALUES:
                raise CodegenError(Refusal.EXPRESSION_TOO_LARGE,
                                   f"more than {MAX_VALUES:,} values at distinct indices (the "
                                   f"index maps of {name} and its operands multiply)")
            cached = self.cache[key] = self._compute(self.ops[name], index)
        return cached

    def _compute(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        code, dtype = op.opcode, op.shape.dtype
        if dtype not in DTYPES:
            raise CodegenError(Refusal.UNSUPPORTED_TYPE,
                               f"{code} {op.name}: element type {dtype} is not supported")
        if code in ELEMENTWISE:  # most ops: tested before the other opcodes one by one
            if op.name in self.once and op.name not in self.computing_once:
                once = self.computed_once(op, index)
                if once is not None:
                    return once
            return self.elementwise(op, [self.value(o, index) for o in op.operands])
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
                source_shape = self.ops[op.operands[0]].shape
                return self.value(op.operands[0], delinearize(flat, row_major(source_shape)))
            case "bitcast":
                source_shape = self.ops[op.operands[0]].shape
                source = self.value(op.operands[0],
                                    delinearize(linearize(index, op.shape), source_shape))
                if source_shape.dtype == dtype:
                    return source
                return self.bitcast_convert(op, source_shape.dtype, source)
            case "copy":
                return self.value(op.operands[0], index)
            case "transpose":
                source = [None] * len(index)
                for out_dim, in_dim in enumerate(op.dimensions):
                    source[in_dim] = index[out_dim]
                return self.value(op.operands[0], tuple(source))
            case "slice":
                return self.value(op.operands[0], tuple(
                    add(scale(i, d.stride), d.start)
                    for i, d in zip(index, parse_slice(op.attrs.get("slice")))))
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
                if self.host:
                    return self.scattered(op, index)
                return self.scatter(op, index)
            case "reduce-window":
                return self.reduce_window(op, index)
            case "reduce":
                if op.name in self.staged:
                    return self.staged_result(op, index)
                self.check_locality(op, index)
                return self.reduced[op.name], self.index_depth(ix(self.group))
            case "get-tuple-element":  # a result of a variadic reduce
                self.check_locality(self.ops[op.operands[0]], index)
                return self.reduced[op.operands[0]][int(op.attrs["index"])], \
                    self.index_depth(ix(self.group))
        raise CodegenError(Refusal.UNSUPPORTED_OP,
                           f"{code} {op.name}: op not supported by the code generator")

    def elementwise(self, op: FlatOp, args: list[tuple[Value, int]]) -> tuple[Value, int]:
        code, dtype = op.opcode, op.shape.dtype
        if code == "convert":
            return self.convert(args[0], dtype)
        if code == "bitcast-convert":
            return self.bitcast_convert(op, args[0][0].dtype, args[0])
        # The checks read the op and its operands' types only: once per op and types.
        key = (op.name, *(a.dtype for a, _ in args))
        narrow = self.elementwise_narrow.get(key)
        if narrow is None:
            narrow = self.elementwise_narrow[key] = self.check_elementwise(op, args)
        attr = op.attrs.get("direction") if code == "compare" else None
        if not narrow:
            return self.op(code, dtype, *args, attr=attr)
        # f16/bf16 arithmetic: widen to f32, compute, round back once (XLA:GPU's upcast).
        wide = [self.convert(a, "f32") if a[0].dtype in NARROW_FLOATS else a for a in args]
        result = self.op(code, "pred" if dtype == "pred" else "f32", *wide, attr=attr)
        return result if dtype == "pred" else self.convert(result, dtype)

    @staticmethod
    def check_elementwise(op: FlatOp, args: list[tuple[Value, int]]) -> bool:
        """Refuses an elementwise op the code generator does not build for these operand
        types; else whether it computes in f32 for f16/bf16 operands."""
        code = op.opcode
        types = {a.dtype for a, _ in args[1:]} if code == "select" else {a.dtype for a, _ in args}
        if code == "compare" and op.attrs.get("type") in ("TOTALORDER",):
            raise CodegenError(Refusal.UNSUPPORTED_OP,
                               f"compare {op.name}: total-order comparisons are not supported")
        floats = bool(types & ({"f32"} | NARROW_FLOATS))
        if code in FLOAT_ONLY and not floats:
            raise CodegenError(Refusal.UNSUPPORTED_TYPE,
                               f"{code} {op.name}: only floating-point {code} is supported")
        if code in INT_ONLY and not types <= INTS:
            raise CodegenError(Refusal.UNSUPPORTED_TYPE,
                               f"{code} {op.name}: only integer {code} is supported")
        if code in ("and", "or", "not") and floats:
            raise CodegenError(Refusal.UNSUPPORTED_TYPE, f"{code} {op.name}: logical op on floats")
        if code == "power" and not floats:
            raise CodegenError(Refusal.UNSUPPORTED_OP,
                               f"power {op.name}: integer power is not supported")
        return not (code == "select" or not types & NARROW_FLOATS)

    def convert(self, v: tuple[Value, int], dtype: str) -> tuple[Value, int]:
        return v if v[0].dtype == dtype else self.op("convert", dtype, v)

    def bitcast_convert(self, op: FlatOp, source: str, v: tuple[Value, int]):
        if DTYPE_BYTES[source] != DTYPE_BYTES[op.shape.dtype] or \
                {source, op.shape.dtype} & (NARROW_FLOATS | {"pred"}):
            raise CodegenError(Refusal.UNSUPPORTED_TYPE,
                               f"{op.opcode} {op.name}: {source} -> {op.shape.dtype} bit "
                               f"reinterpretation is not supported")
        return self.op("bitcast-convert", op.shape.dtype, v)

    def constant(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        dtype = op.shape.dtype
        if not op.shape.dims:
            value = scalar_value(op)
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

    def computed_once(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int] | None:
        """Element ``index`` of ``op`` from a scratch array filled before the loop that first
        reads it (None where a reduction it needs is not staged yet, or in the prologue: it
        runs before the loops that fill those arrays, so it computes its values itself)."""
        if self.building_prologue:
            return None
        array = self.scratch.get(op.name, self.once_in_output.get(op.name))
        if array is None:
            if not producing_reductions(self.ops, op) <= self.staged.keys():
                return None
            array = self.output_holding(op)
            if array is None:
                # named by the emitter's counter: filling it may create another array first
                array = SharedArray(f"once{next(self.names)}", op.shape.dtype,
                                    op.shape.num_elements)
                self.scratch[op.name] = array
            else:
                self.once_in_output[op.name] = array
            self.computing_once.add(op.name)
            self.scopes[0] += self.isolated(
                lambda: self.store_every_element(array, op.shape, op.name))
            self.computing_once.discard(op.name)
        return self.array_element(array, op.shape, index)

    @property
    def filled_outputs(self) -> set[int]:
        """Output buffers holding a value computed once: the output loops do not store them."""
        return set(self.once_in_output.values())

    def output_holding(self, op: FlatOp) -> int | None:
        """The output buffer a value computed once is written into, when the kernel outputs it
        as it is (same shape and layout): its array costs no copy to the output and no scratch.
        Buffers are distinct (no custom-call aliasing), so nothing else writes it first."""
        if op.shape.dtype == "pred":
            return None
        first_output = len(self.pattern.inputs)
        return next((first_output + i for i, ((_, shape), name) in enumerate(
            zip(self.pattern.outputs, self.pattern.output_values))
            if name == op.name and shape == op.shape), None)

    def staged_result(self, op: FlatOp, index: tuple[Ix, ...]) -> tuple[Value, int]:
        staged = self.staged[op.name]
        if isinstance(staged, Value):
            return staged, 0
        return self.array_element(staged, op.shape, index)

    def check_locality(self, op: FlatOp, index: tuple[Ix, ...]) -> None:
        """A reduction's value is only available at the result its thread group reduced."""
        if op.name not in self.reduced:
            raise CodegenError(Refusal.READ_BEFORE_COMPUTED,
                               f"reduction {op.name} is read before it is computed")
        read = linearize(index, result_shape(op))
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
        raise CodegenError(Refusal.CROSS_BLOCK,
                           f"reduction {op.name} is read at element {read} by the thread group "
                           f"of result {self.group}: needs cross-block communication")


# A value is computed once (`Emitter.computed_once`) when at least this many elementwise ops
# produce it (itself included), counted back to the first non-elementwise op: below, reading
# it back costs about what computing it again does.
ONCE_MIN_OPS = 4


def reused_values(pattern: Pattern) -> set[str]:
    """Elementwise ops of ``pattern`` that two or more ops or outputs read and that take
    ONCE_MIN_OPS elementwise ops to compute."""
    readers: dict[str, int] = {}
    for op in pattern.ops:
        for o in set(op.operands):
            readers[o] = readers.get(o, 0) + 1
    for name in pattern.output_values:
        readers[name] = readers.get(name, 0) + 1
    ops, cone = pattern.op_map(), {}

    def size(name: str) -> int:
        if name not in cone:
            op = ops.get(name)
            cone[name] = 0 if op is None or op.opcode not in ELEMENTWISE else \
                1 + sum(size(o) for o in set(op.operands))
        return cone[name]

    return {op.name for op in pattern.ops
            if readers.get(op.name, 0) >= 2 and size(op.name) >= ONCE_MIN_OPS}
