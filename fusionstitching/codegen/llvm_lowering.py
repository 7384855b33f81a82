"""What both backends share: lowering kernel-IR statements of one thread to LLVM IR.

`ThreadLowering` emits index arithmetic, arithmetic, global and shared memory accesses,
column loops and conditionals. The targets differ only in where thread/block indices and
buffer pointers come from, how transcendental functions are called, how collectives run and
where shared memory lives; those are the abstract hooks that host.py and nvptx.py fill in.
"""
from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from .errors import CodegenError, Refusal
from .index_expr import FloorDiv, Ix, Var, value_range
from .kernel_ir import (LANE_TYPES, VECTOR_LANES, Accumulate, Barrier, BlockReduce, Compute,
                        Const, ConstArray, ConstLoad, DynamicIndex, GlobalLoad, GlobalStore, If,
                        IndexLet, IndexValue, Kernel, Loop, SharedArray, SharedLoad, SharedStore,
                        Value, VectorExtract, VectorPack, WarpReduce)
from .ops import MATH_OPS

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F32, F16, F64 = ir.FloatType(), ir.HalfType(), ir.DoubleType()
PTR = ir.PointerType()

# Register types of values; bf16 is kept as its 16 bits and converted through f32.
VALUE_TYPES = {"f32": F32, "f16": F16, "bf16": I16, "s32": I32, "s64": I64, "u32": I32,
               "u64": I64, "pred": I1, "f64": F64,
               "f32x4": ir.VectorType(F32, VECTOR_LANES), "s32x4": ir.VectorType(I32, VECTOR_LANES)}
INT_TYPES = {"s32": I32, "s64": I64, "u32": I32, "u64": I64}
UNSIGNED = {"u32", "u64"}  # same registers as s32/s64; compare, divide, convert differ

_ROUNDING = {"floor": "llvm.floor.f32", "ceil": "llvm.ceil.f32",
             "round-nearest-even": "llvm.roundeven.f32", "round-nearest-afz": "llvm.round.f32"}
STORAGE_TYPES = {**VALUE_TYPES, "pred": I8}

_FCMP = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}


def two_complement(value: int, width: int) -> int:
    """An integer of any signedness as the signed value of its `width` bits (LLVM's iN
    constants; u32/u64 values above the signed range)."""
    return (value + (1 << (width - 1))) % (1 << width) - (1 << (width - 1))


class ThreadLowering:
    """Lowers the statements of one thread's program into `self.builder`."""

    def __init__(self, kernel: Kernel, module: ir.Module, function: ir.Function):
        self.kernel = kernel
        self.module = module
        self.function = function
        entry = function.append_basic_block("entry")
        self.allocas = ir.IRBuilder(entry)  # allocas go first so that mem2reg promotes them
        self.builder = ir.IRBuilder(function.append_basic_block("start"))
        self.values: dict[Value, ir.Value] = {}
        self.vars: dict[Var, ir.Value] = {}

    # -- hooks -----------------------------------------------------------------------------
    def buffer_pointer(self, i: int) -> ir.Value:
        raise NotImplementedError

    def shared_pointer(self, array: SharedArray) -> ir.Value:
        raise NotImplementedError

    def math_call(self, op: str, args: list[ir.Value]) -> ir.Value:
        """One of MATH_OPS on f32."""
        raise NotImplementedError

    def constant_pointer(self, array: ConstArray) -> ir.Value:
        """A generic pointer to a non-scalar constant's elements."""
        raise NotImplementedError

    def root(self, op: str, x: ir.Value) -> ir.Value:
        """sqrt or rsqrt of an f32, correctly rounded (as XLA:CPU computes them)."""
        root = self.intrinsic("llvm.sqrt.f32", F32, [x])
        return root if op == "sqrt" else self.builder.fdiv(ir.Constant(F32, 1.0), root)

    def constant_global(self, array: ConstArray, addrspace: int = 0) -> ir.GlobalVariable:
        ty = STORAGE_TYPES[array.dtype]
        values = array.values.reshape(-1)
        if array.dtype == "bf16":  # bf16 is stored as its 16 bits
            values = (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        elems = [ir.Constant(ty, float(v) if isinstance(ty, (ir.FloatType, ir.HalfType))
                             else two_complement(int(v), ty.width)) for v in values]
        g = ir.GlobalVariable(self.module, ir.ArrayType(ty, len(elems)), array.name,
                              addrspace=addrspace)
        g.global_constant = True
        g.linkage = "internal"
        g.align = 16
        g.initializer = ir.Constant(ir.ArrayType(ty, len(elems)), elems)
        return g

    def collective(self, stmt: WarpReduce | Barrier) -> None:
        raise NotImplementedError

    def wide_rounded(self, x: ir.Value) -> ir.Value:
        """A wide accumulator's f32 value (a target may need to keep it from being folded
        into a later rounding)."""
        return x

    # Alignment the target can assume for a 16-byte-aligned group of a buffer's elements.
    vector_align = 16

    def align(self, dtype: str) -> int | None:
        return self.vector_align if dtype in LANE_TYPES else None

    def global_access(self, buffer: int, offset: Ix, dtype: str, store: bool) -> None:
        """Called at every global load and store (the instrumented host build counts them)."""

    def loop_bounds(self, s: Loop) -> tuple[ir.Value, ir.Value]:
        """The first and the end value of ``s.var`` (a fast host kernel runs a share of one
        loop per part)."""
        return self.index(s.start), ir.Constant(I32, s.stop)

    # -- helpers ---------------------------------------------------------------------------
    def finish(self) -> None:
        self.allocas.position_at_end(self.allocas.block)
        self.allocas.branch(self.function.blocks[1])
        self.builder.ret_void()

    def alloca(self, ty: ir.Type, count: int = 1) -> ir.Value:
        if self.allocas.block.instructions:
            self.allocas.position_before(self.allocas.block.instructions[0])
        return self.allocas.alloca(ty, size=count if count > 1 else None)

    def intrinsic(self, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, [a.type for a in args]), name)
        return self.builder.call(fn, args)

    def counted_loop(self, start: ir.Value, stop: ir.Value, step: int, body) -> None:
        """for (i = start; i < stop; i += step) body(i), with i32 i."""
        b = self.builder
        pre = b.block
        head = b.append_basic_block("loop")
        work = b.append_basic_block("body")
        done = b.append_basic_block("after")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I32)
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", i, stop), work, done)
        b.position_at_end(work)
        body(i)
        i.add_incoming(b.add(i, ir.Constant(I32, step)), b.block)
        b.branch(head)
        b.position_at_end(done)

    def index(self, e: Ix, typ: ir.IntType = I32) -> ir.Value:
        """``e`` as a ``typ`` integer (the loop variables are i32; indices are never
        negative, so an i64 index zero-extends them)."""
        b = self.builder
        total = ir.Constant(typ, e.const)
        for atom, c in e.terms:
            if isinstance(atom, Var):
                v = self.vars[atom] if typ == I32 else b.zext(self.vars[atom], typ)
            elif value_range(atom.arg)[0] >= 0:  # unsigned division is floor division
                arg, k = self.index(atom.arg, typ), ir.Constant(typ, atom.k)
                v = b.udiv(arg, k) if isinstance(atom, FloorDiv) else b.urem(arg, k)
            else:
                # An index is never negative, but a part of one can be: (d - 5*o + 155) // 160
                # of ``160 * ((d - 5*o + 155) // 160) + ...`` (index_expr.div splits off the
                # terms that divide). Floor, not the truncation of sdiv and srem.
                v = self.floor_div_mod(self.index(atom.arg, typ), atom.k, typ,
                                       isinstance(atom, FloorDiv))
            total = b.add(total, v if c == 1 else b.mul(v, ir.Constant(typ, c)))
        return total

    def floor_div_mod(self, a: ir.Value, k: int, typ: ir.IntType, quotient: bool) -> ir.Value:
        """floor(a / k), or a - k * floor(a / k), for a signed ``a`` and ``k`` > 0."""
        b = self.builder
        q, r = b.sdiv(a, ir.Constant(typ, k)), b.srem(a, ir.Constant(typ, k))
        below = b.icmp_signed("<", r, ir.Constant(typ, 0))
        if quotient:
            return b.sub(q, b.zext(below, typ))
        return b.select(below, b.add(r, ir.Constant(typ, k)), r)

    def element_pointer(self, base: ir.Value, dtype: str, offset: Ix) -> ir.Value:
        return self.builder.gep(base, [self.builder.sext(self.index(offset), I64)],
                                inbounds=True, source_etype=STORAGE_TYPES[dtype])

    def load(self, pointer: ir.Value, dtype: str, buffer: int | None = None) -> ir.Value:
        """``buffer``: the kernel buffer ``pointer`` points into, if any."""
        v = self.builder.load(pointer, typ=STORAGE_TYPES[dtype], align=self.align(dtype))
        if buffer is not None:
            self.buffer_access(v, buffer)
        return self.builder.trunc(v, I1) if dtype == "pred" else v

    def store(self, pointer: ir.Value, value: ir.Value, dtype: str,
              buffer: int | None = None) -> None:
        stored = self.builder.store(self.builder.zext(value, I8) if dtype == "pred" else value,
                                    pointer, align=self.align(dtype))
        if buffer is not None:
            self.buffer_access(stored, buffer)

    def buffer_access(self, instruction: ir.Instruction, buffer: int) -> None:
        """Annotates a load or store of kernel buffer ``buffer`` (a target's hook)."""

    # -- statements ------------------------------------------------------------------------
    def lower(self, body: list) -> None:
        for s in body:
            self.statement(s)

    def statement(self, s) -> None:
        b = self.builder
        match s:
            case Const():
                ty = VALUE_TYPES[s.dst.dtype]
                self.values[s.dst] = ir.Constant(ty, two_complement(int(s.value), ty.width)
                                                 if isinstance(ty, ir.IntType)
                                                 else float(s.value))
            case IndexValue():
                self.values[s.dst] = self.index(s.index)
            case IndexLet():
                self.vars[s.var] = self.index(s.index)
            case DynamicIndex():
                self.vars[s.var] = self.values[s.value]
            case ConstLoad():
                self.values[s.dst] = self.load(self.element_pointer(
                    self.constant_pointer(s.array), s.array.dtype, s.offset), s.array.dtype)
            case Compute():
                self.values[s.dst] = self.compute(s.op, [self.values[a] for a in s.args],
                                                  [a.dtype for a in s.args], s.dst.dtype, s.attr)
            case GlobalLoad():
                dtype = s.dst.dtype
                self.global_access(s.buffer, s.offset, dtype, False)
                self.values[s.dst] = self.load(self.element_pointer(
                    self.buffer_pointer(s.buffer), LANE_TYPES.get(dtype, dtype), s.offset), dtype,
                    s.buffer)
            case GlobalStore():
                dtype = s.value.dtype
                self.global_access(s.buffer, s.offset, dtype, True)
                self.store(self.element_pointer(self.buffer_pointer(s.buffer),
                                                LANE_TYPES.get(dtype, dtype), s.offset),
                           self.values[s.value], dtype, s.buffer)
            case VectorExtract():
                self.values[s.dst] = b.extract_element(self.values[s.src], ir.Constant(I32, s.lane))
            case VectorPack():
                vector = ir.Constant(VALUE_TYPES[s.dst.dtype], ir.Undefined)
                for k, lane in enumerate(s.lanes):
                    vector = b.insert_element(vector, self.values[lane], ir.Constant(I32, k))
                self.values[s.dst] = vector
            case SharedStore():
                self.store(self.element_pointer(self.shared_pointer(s.array), s.array.dtype,
                                                s.index), self.values[s.value], s.array.dtype)
            case SharedLoad():
                self.values[s.dst] = self.load(self.element_pointer(
                    self.shared_pointer(s.array), s.array.dtype, s.index), s.array.dtype)
            case Loop():
                self.loop(s)
            case If():
                cmp = "==" if s.cmp == "eq" else "<"
                with b.if_then(b.icmp_signed(cmp, self.index(s.lhs), self.index(s.rhs))):
                    self.lower(s.body)
            case WarpReduce() | Barrier():
                self.collective(s)
            case BlockReduce():
                raise AssertionError("expand_block_reduce runs before lowering")
            case _:
                raise TypeError(s)

    def loop(self, s: Loop) -> None:
        slots = []
        for a in s.accumulates:
            slot = self.alloca(VALUE_TYPES[a.dst.dtype])
            self.builder.store(self.values[a.init], slot)
            slots.append(slot)

        def body(i: ir.Value) -> None:
            self.vars[s.var] = i
            for a, slot in zip(s.accumulates, slots):
                if a.carried is not None:
                    self.values[a.carried] = self.builder.load(slot, typ=slot.allocated_type)
            self.lower(s.body)
            for a, slot in zip(s.accumulates, slots):
                self.builder.store(self.values[a.value] if a.carried is not None else self.combine(
                    a, self.builder.load(slot, typ=slot.allocated_type), self.values[a.value]),
                    slot)

        self.counted_loop(*self.loop_bounds(s), s.step, body)
        for a, slot in zip(s.accumulates, slots):
            self.values[a.dst] = self.builder.load(slot, typ=slot.allocated_type)

    def combine(self, a: Accumulate | WarpReduce, x: ir.Value, y: ir.Value) -> ir.Value:
        dtype = a.dst.dtype
        return self.compute(a.kind, [x, y], [dtype, dtype], dtype, None)

    def compute(self, op: str, args: list[ir.Value], arg_types: list[str], dtype: str,
                attr: str | None) -> ir.Value:
        """One elementwise HLO op in f32, s32, s64, u32, u64 or pred (16-bit floats are widened to f32 by
        the schedule, as XLA:GPU does); add and multiply also in f64 (wide accumulators)."""
        b = self.builder
        if arg_types and arg_types[-1] == "f64" and op not in ("add", "multiply", "convert"):
            raise CodegenError(Refusal.NO_LOWERING, f"{op} of f64: only wide sums and products")
        is_float = bool(arg_types) and arg_types[-1] in ("f32", "f64")
        ty = args[-1].type if args else None
        icmp = b.icmp_unsigned if arg_types and arg_types[-1] in UNSIGNED else b.icmp_signed
        match op:
            case "add":
                return b.fadd(*args) if is_float else b.add(*args)
            case "subtract":
                return b.fsub(*args) if is_float else b.sub(*args)
            case "multiply":
                return b.fmul(*args) if is_float else b.mul(*args)
            case "divide" if is_float:
                return b.fdiv(*args)
            case "remainder" if is_float:
                return b.frem(*args)
            case "divide" | "remainder" if arg_types[-1] in UNSIGNED:
                return self.unsigned_division(op, *args)
            case "divide" | "remainder":
                return self.integer_division(op, *args)
            case "maximum" | "minimum" if is_float:  # NaN-propagating, as in XLA
                return self.intrinsic(f"llvm.{op}.f32", F32, args)
            case "maximum":
                return b.select(icmp(">", *args), *args)
            case "minimum":
                return b.select(icmp("<", *args), *args)
            case "clamp":  # clamp(lo, x, hi) = min(max(x, lo), hi)
                lo, x, hi = args
                return self.compute("minimum", [self.compute("maximum", [x, lo], arg_types[:2],
                                                             dtype, None), hi],
                                    arg_types[:2], dtype, None)
            case "negate":
                return b.fneg(args[0]) if is_float else b.neg(args[0])
            case "abs" if is_float:
                return self.intrinsic("llvm.fabs.f32", F32, args)
            case "abs":
                zero = ir.Constant(ty, 0)
                return b.select(icmp("<", args[0], zero), b.neg(args[0]), args[0])
            case "sign" if is_float:  # -1, +1, or x itself for +-0 and NaN
                x = args[0]
                one = ir.Constant(F32, 1.0)
                signed = self.intrinsic("llvm.copysign.f32", F32, [one, x])
                return b.select(b.fcmp_unordered("uno", x, x), x,
                                b.select(b.fcmp_ordered("==", x, ir.Constant(F32, 0.0)), x,
                                         signed))
            case "sign":
                x, zero = args[0], ir.Constant(ty, 0)
                return b.sub(b.zext(icmp(">", x, zero), ty), b.zext(icmp("<", x, zero), ty))
            case "sqrt" | "rsqrt":
                return self.root(op, args[0])
            case "logistic":  # 1 / (1 + exp(-x))
                e = self.math_call("exponential", [b.fneg(args[0])])
                return b.fdiv(ir.Constant(F32, 1.0), b.fadd(ir.Constant(F32, 1.0), e))
            case "is-finite":
                return b.fcmp_ordered("!=", self.intrinsic("llvm.fabs.f32", F32, args),
                                      ir.Constant(F32, float("inf")))
            case _ if op in _ROUNDING:
                return self.intrinsic(_ROUNDING[op], F32, args)
            case _ if op in MATH_OPS and is_float:
                return self.math_call(op, args)
            case "compare":
                if is_float:  # NE is unordered (true for NaN), the others ordered, as in XLA
                    return (b.fcmp_unordered if attr == "NE" else b.fcmp_ordered)(
                        _FCMP[attr], *args)
                return icmp(_FCMP[attr], *args)
            case "select":
                return b.select(*args)
            case "and":
                return b.and_(*args)
            case "or":
                return b.or_(*args)
            case "xor":
                return b.xor(*args)
            case "not":
                return b.not_(args[0])
            case "shift-left" | "shift-right-logical" | "shift-right-arithmetic":
                return self.shift(op, *args)
            case "popcnt":
                return self.intrinsic(f"llvm.ctpop.i{ty.width}", ty, args)
            case "convert":
                return self.convert(args[0], arg_types[0], dtype)
            case "bitcast-convert":
                return b.bitcast(args[0], VALUE_TYPES[dtype])
        raise CodegenError(Refusal.NO_LOWERING, f"{op}: no lowering for this op")

    def integer_division(self, op: str, a: ir.Value, d: ir.Value) -> ir.Value:
        """XLA's integer divide/remainder: x/0 = -1, x%0 = x, INT_MIN/-1 = INT_MIN (no trap)."""
        b = self.builder
        ty = a.type
        by_zero = b.icmp_signed("==", d, ir.Constant(ty, 0))
        overflow = b.and_(b.icmp_signed("==", d, ir.Constant(ty, -1)),
                          b.icmp_signed("==", a, ir.Constant(ty, -(1 << (ty.width - 1)))))
        safe = b.select(b.or_(by_zero, overflow), ir.Constant(ty, 1), d)
        if op == "divide":
            return b.select(by_zero, ir.Constant(ty, -1), b.sdiv(a, safe))
        return b.select(by_zero, a, b.srem(a, safe))

    def unsigned_division(self, op: str, a: ir.Value, d: ir.Value) -> ir.Value:
        """XLA's unsigned divide/remainder: x/0 = all ones, x%0 = x (no trap)."""
        b = self.builder
        ty = a.type
        by_zero = b.icmp_unsigned("==", d, ir.Constant(ty, 0))
        safe = b.select(by_zero, ir.Constant(ty, 1), d)
        if op == "divide":
            return b.select(by_zero, ir.Constant(ty, -1), b.udiv(a, safe))
        return b.select(by_zero, a, b.urem(a, safe))

    def shift(self, op: str, a: ir.Value, n: ir.Value) -> ir.Value:
        """Shifts by >= the bit width give 0 (or the sign for arithmetic), as in XLA."""
        b = self.builder
        ty = a.type
        too_far = b.icmp_unsigned(">=", n, ir.Constant(ty, ty.width))
        safe = b.select(too_far, ir.Constant(ty, 0), n)
        if op == "shift-left":
            return b.select(too_far, ir.Constant(ty, 0), b.shl(a, safe))
        if op == "shift-right-logical":
            return b.select(too_far, ir.Constant(ty, 0), b.lshr(a, safe))
        return b.ashr(a, b.select(too_far, ir.Constant(ty, ty.width - 1), n))

    def convert(self, x: ir.Value, src: str, dst: str) -> ir.Value:
        """XLA convert; 16-bit floats go through f32 (exact), bf16 rounds to nearest even."""
        b = self.builder
        if src == dst:
            return x
        if src in ("f16", "bf16") and dst != "f32":
            return self.convert(self.convert(x, src, "f32"), "f32", dst)
        if dst in ("f16", "bf16") and src != "f32":
            return self.convert(self.convert(x, src, "f32"), "f32", dst)
        match src, dst:
            case "f32", "f64":
                return b.fpext(x, F64)
            case "f64", "f32":
                return self.wide_rounded(b.fptrunc(x, F32))
            case "f16", "f32":
                return b.fpext(x, F32)
            case "f32", "f16":
                return b.fptrunc(x, F16)
            case "bf16", "f32":
                return b.bitcast(b.shl(b.zext(x, I32), ir.Constant(I32, 16)), F32)
            case "f32", "bf16":
                bits = b.bitcast(x, I32)
                lsb = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
                rounded = b.add(bits, b.add(ir.Constant(I32, 0x7FFF), lsb))
                high = b.trunc(b.lshr(bits, ir.Constant(I32, 16)), I16)
                quiet_nan = b.or_(high, ir.Constant(I16, 0x40))
                return b.select(b.fcmp_unordered("uno", x, x), quiet_nan,
                                b.trunc(b.lshr(rounded, ir.Constant(I32, 16)), I16))
            case _ if src in INT_TYPES and dst == "f32":
                return (b.uitofp if src in UNSIGNED else b.sitofp)(x, F32)
            case "f32", _ if dst in INT_TYPES:  # saturating, NaN -> 0, as XLA's convert
                kind = "fptoui" if dst in UNSIGNED else "fptosi"
                return self.intrinsic(f"llvm.{kind}.sat.i{INT_TYPES[dst].width}.f32",
                                      INT_TYPES[dst], [x])
            case _ if src in INT_TYPES and dst in INT_TYPES:
                # Widening extends by the source's signedness; narrowing keeps the low bits.
                width, target = INT_TYPES[src].width, INT_TYPES[dst]
                if width == target.width:
                    return x
                if width > target.width:
                    return b.trunc(x, target)
                return (b.zext if src in UNSIGNED else b.sext)(x, target)
            case "pred", "f32":
                return b.uitofp(x, F32)
            case "pred", _ if dst in INT_TYPES:
                return b.zext(x, INT_TYPES[dst])
            case "f32", "pred":
                return b.fcmp_unordered("!=", x, ir.Constant(F32, 0.0))
            case _, "pred" if src in INT_TYPES:
                return b.icmp_signed("!=", x, ir.Constant(INT_TYPES[src], 0))
        raise CodegenError(Refusal.NO_LOWERING,
                           f"convert {src} -> {dst}: no lowering for this conversion")


def optimize(module, target_machine, unroll_and_vectorize: bool = True) -> None:
    """Run LLVM's O3 pipeline (mem2reg, LICM, GVN, unrolling, ...) on a parsed module."""
    options = llvm.create_pipeline_tuning_options(speed_level=3)
    options.loop_unrolling = options.loop_vectorization = options.slp_vectorization = \
        unroll_and_vectorize
    builder = llvm.create_pass_builder(target_machine, options)
    builder.getModulePassManager().run(module, builder)
