"""Host backend: the kernel IR as native CPU code (llvmlite MCJIT), so every kernel runs here.

The generated C function is ``void kernel(void** buffers)`` (inputs then outputs, physical
layout). It emulates the GPU launch: a loop over blocks; the block body is split at
collectives (warp_reduce, barrier) into *phases*, and each phase is a loop over the block's
threads. A value that one phase defines and a later phase (or a collective) uses lives in a
per-thread array. warp_reduce runs on the per-warp slices of those arrays with the same
xor-butterfly steps and operand order as the GPU's shfl.sync.bfly, so host and GPU combine
partial values identically. A fast build also has ``kernel_parts(buffers, part, parts)``:
one of ``parts`` shares of its `split_loop` (threads run them side by side: runtime/ffi.py).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from ..hlo.ir import Shape
from .index_expr import Ix, add, ix
from . import host_math
from .kernel_ir import DTYPE_BYTES, LANE_TYPES, VECTOR_LANES, WARP, Accumulate, Barrier, \
    ConstArray, DynamicIndex, GlobalStore, If, IndexLet, Kernel, Loop, SharedArray, \
    SharedStore, Value, WarpReduce, defined_values, expand_block_reduce, used_values
from .llvm_lowering import F32, I8, I32, I64, PTR, STORAGE_TYPES, VALUE_TYPES, ThreadLowering, \
    optimize

# LLVM intrinsics where the host target lowers them, else the C library's float functions
# (the JIT resolves them in this process, which has libm loaded).
_MATH = {"exponential": "llvm.exp.f32", "log": "llvm.log.f32", "tanh": "llvm.tanh.f32",
         "power": "llvm.pow.f32", "sine": "llvm.sin.f32", "cosine": "llvm.cos.f32",
         "tan": "tanf", "atan2": "atan2f", "exponential-minus-one": "expm1f",
         "log-plus-one": "log1pf", "cbrt": "cbrtf", "erf": "erff"}


# f32 reductions a fast host kernel lets LLVM reorder (and so vectorize)
_REASSOCIABLE = {"add": ir.IRBuilder.fadd, "multiply": ir.IRBuilder.fmul}
# The symbol of a fast kernel's share of its split loop: ``void (void**, i32 part, i32 parts)``.
PARTS_SUFFIX = "_parts"
# Statements that may sit beside the split loop of a one-block kernel: each part computes
# them again (values, index lets); a store or a loop there would run once per part.
_NOT_BESIDE_SPLIT = (GlobalStore, SharedStore, If, Loop, WarpReduce, Barrier)


def split_loop(kernel: Kernel) -> Loop | str | None:
    """The loop a fast host kernel shares out among parts: "blocks" (the block loop) when the
    grid has several blocks, else the kernel's one top-level loop when it accumulates nothing
    and only values sit beside it (a loop schedule's rows); None when there is none, or when
    a prologue must run before all of it."""
    if kernel.prologue:
        return None
    if kernel.grid[0] > 1:
        return "blocks"
    if kernel.block[0] != 1:
        return None
    loops = [s for s in kernel.body if isinstance(s, Loop)]
    if len(loops) != 1 or loops[0].accumulates or loops[0].step != 1 \
            or loops[0].start != ix(0):
        return None
    beside = [s for s in kernel.body if s is not loops[0]]
    return None if any(isinstance(s, _NOT_BESIDE_SPLIT) for s in beside) else loops[0]


# A kernel is shared out in parts of at least this many bytes (inputs and outputs): waking a
# pool thread costs microseconds, a few times what a smaller part saves.
PART_BYTES = 256 * 1024


def max_parts(split_extent: int, kernel_bytes: int) -> int:
    """Parts a kernel may run in: one per PART_BYTES of its buffers, at most one per
    iteration of its split loop (``split_extent``, 0: none)."""
    return max(1, min(split_extent, kernel_bytes // PART_BYTES))


def split_extent(kernel: Kernel) -> int:
    """How many iterations `split_loop` has (0: none, the kernel runs as one part)."""
    loop = split_loop(kernel)
    return kernel.grid[0] if loop == "blocks" else loop.stop if loop is not None else 0


class HostLowering(ThreadLowering):
    """``instrument``: the ``buffers`` argument continues with one byte array per buffer (an
    element's byte is set when it is accessed) and an i64[2] of raw load and store bytes.
    ``fast``: exp, log, tanh and erf as vectorizable arithmetic (`host_math`) and f32 sums and
    products reassociable, so LLVM vectorizes their loops (XLA:CPU's reductions reassociate
    too); otherwise the C library's functions and reductions in the kernel's own order."""

    def __init__(self, kernel: Kernel, module: ir.Module, instrument: bool = False,
                 fast: bool = False):
        # fast: the parts function; `finish` adds ``kernel(buffers)``, all of it as one part
        function = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I32, I32] if fast
                                                       else [PTR]),
                               kernel.name + PARTS_SUFFIX if fast else kernel.name)
        super().__init__(kernel, module, function)
        self.fast = fast
        self.split = split_loop(kernel) if fast else None
        self.shared = {a.name: self.alloca(STORAGE_TYPES[a.dtype], a.size) for a in kernel.shared}
        self.constants = {c.name: self.constant_global(c) for c in kernel.constants}
        count = 2 * len(kernel.buffers) + 1 if instrument else len(kernel.buffers)
        pointers = [self.builder.load(self.builder.gep(
            function.args[0], [ir.Constant(I32, i)], source_etype=PTR), typ=PTR)
            for i in range(count)]
        self.buffers = pointers[:len(kernel.buffers)]
        self.storage = {output: source for source, output in kernel.in_place}
        self.scopes = _buffer_scopes(module, kernel) if fast else None
        self.marks = pointers[len(kernel.buffers):-1] if instrument else None
        self.counters = pointers[-1] if instrument else None
        self.arrays: dict[Value, ir.Value] = {}  # per-thread arrays of values crossing phases

    vector_align = 4  # x86 vector loads need no alignment; numpy guarantees only the element's

    def global_access(self, buffer: int, offset: Ix, dtype: str, store: bool) -> None:
        if self.marks is None:
            return
        b = self.builder
        counter = b.gep(self.counters, [ir.Constant(I32, int(store))], source_etype=I64)
        b.store(b.add(b.load(counter, typ=I64), ir.Constant(I64, DTYPE_BYTES[dtype])), counter)
        for lane in range(VECTOR_LANES if dtype in LANE_TYPES else 1):  # every element touched
            b.store(ir.Constant(I8, 1), self.element_pointer(self.marks[buffer], "pred",
                                                             add(offset, lane)))

    def element_pointer(self, base: ir.Value, dtype: str, offset: Ix) -> ir.Value:
        # Offsets in i64: LLVM 22's loop vectorizer loaded
        # `sext(i32 (i % 8) + 8 + 16 * o)` as 16 consecutive floats (keras_hub Mistral's and
        # transformers Llama's rotary embeddings, tests/test_vectorizer_check.py); from i64
        # arithmetic it gathers what the index says.
        return self.builder.gep(base, [self.index(offset, I64)], inbounds=True,
                                source_etype=STORAGE_TYPES[dtype])

    def buffer_pointer(self, i: int) -> ir.Value:
        return self.buffers[self.storage.get(i, i)]

    def buffer_access(self, instruction: ir.Instruction, buffer: int) -> None:
        if self.scopes is not None:  # the buffers never overlap: LLVM may vectorize across
            scope, others = self.scopes[self.storage.get(buffer, buffer)]
            instruction.set_metadata("alias.scope", scope)
            instruction.set_metadata("noalias", others)

    def shared_pointer(self, array: SharedArray) -> ir.Value:
        return self.shared[array.name]

    def math_call(self, op: str, args: list[ir.Value]) -> ir.Value:
        if self.fast and op in host_math.FUNCTIONS:
            return host_math.FUNCTIONS[op](self.builder, args[0])
        return self.intrinsic(_MATH[op], F32, args)

    def combine(self, a: Accumulate | WarpReduce, x: ir.Value, y: ir.Value) -> ir.Value:
        if self.fast and isinstance(a, Accumulate) and not a.ordered \
                and a.dst.dtype in ("f32", "f64") and a.kind in _REASSOCIABLE:
            return _REASSOCIABLE[a.kind](self.builder, x, y, flags=("reassoc",))
        return super().combine(a, x, y)

    def constant_pointer(self, array: ConstArray) -> ir.Value:
        return self.constants[array.name]

    def wide_rounded(self, x: ir.Value) -> ir.Value:
        # x86's instruction selection folds f64 -> f32 -> f16 into one rounding, a call to
        # compiler-rt's __truncdfhf2, which the JIT cannot resolve (a kernel summing f16
        # values called address 0); the fence keeps the two roundings XLA's convert means.
        return self.intrinsic("llvm.arithmetic.fence.f32", F32, [x])

    def loop_bounds(self, s: Loop) -> tuple[ir.Value, ir.Value]:
        if s is self.split:
            return self.part_bounds(s.stop)
        return super().loop_bounds(s)

    def part_bounds(self, extent: int) -> tuple[ir.Value, ir.Value]:
        """[extent * part / parts, extent * (part + 1) / parts): this part's share."""
        b = self.builder
        part, parts = (b.sext(a, I64) for a in self.function.args[1:])
        bound = lambda k: b.trunc(b.sdiv(b.mul(ir.Constant(I64, extent), k), parts), I32)  # noqa: E731
        return bound(part), bound(b.add(part, ir.Constant(I64, 1)))

    def finish(self) -> None:
        super().finish()
        if self.fast:  # the whole kernel: its one part
            whole = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR]),
                                self.kernel.name)
            b = ir.IRBuilder(whole.append_basic_block("entry"))
            b.call(self.function, [whole.args[0], ir.Constant(I32, 0), ir.Constant(I32, 1)])
            b.ret_void()

    def slot(self, v: Value, thread: ir.Value) -> ir.Value:
        return self.builder.gep(self.arrays[v], [thread], source_etype=VALUE_TYPES[v.dtype])

    def build(self) -> None:
        kernel = self.kernel
        threads = kernel.block[0]
        phases: list[list | WarpReduce | Barrier] = [[]]
        for s in expand_block_reduce(kernel):
            if isinstance(s, (WarpReduce, Barrier)):
                phases += [s, []]
            else:
                phases[-1].append(s)
        defined_in, used_in = {}, {}
        for p, phase in enumerate(phases):
            for s in phase if isinstance(phase, list) else [phase]:
                for v in defined_values(s):
                    defined_in[v] = p
                # Index definitions are replayed in every later phase (see `lets` below).
                later = range(p, len(phases)) if isinstance(s, (IndexLet, DynamicIndex)) else [p]
                for v in used_values(s):
                    used_in.setdefault(v, set()).update(later)
        for v, p in defined_in.items():
            if used_in.get(v, set()) - {p} or not isinstance(phases[p], list):
                self.arrays[v] = self.alloca(VALUE_TYPES[v.dtype], threads)

        def block(bid: ir.Value) -> None:
            self.vars[kernel.bid] = bid
            lets: list[IndexLet] = []  # pure functions of tid/bid: recomputed in every phase
            for p, phase in enumerate(phases):
                if not isinstance(phase, list):
                    self.collective(phase)
                    continue
                self.counted_loop(ir.Constant(I32, 0), ir.Constant(I32, threads), 1,
                                  lambda tid: self.thread(tid, p, phase, lets, defined_in, used_in))
                lets += [s for s in phase if isinstance(s, (IndexLet, DynamicIndex))]

        blocks = self.part_bounds(kernel.grid[0]) if self.split == "blocks" else (
            ir.Constant(I32, 0), ir.Constant(I32, kernel.grid[0]))
        scratch = self.allocate_scratch()
        self.lower(kernel.part_prologue)
        self.lower(kernel.prologue)
        self.counted_loop(*blocks, 1, block)
        for pointer in scratch:
            self.intrinsic("free", ir.VoidType(), [pointer])
        self.finish()

    def allocate_scratch(self) -> list[ir.Value]:
        """Heap memory for each scratch array, for this call (an array may be far larger than
        a thread's stack: a scatter's embedding table)."""
        pointers = []
        for array in self.kernel.scratch:
            size = ir.Constant(I64, max(array.size, 1) * DTYPE_BYTES[array.dtype])
            pointers.append(self.intrinsic("malloc", PTR, [size]))
            self.shared[array.name] = pointers[-1]
        return pointers

    def thread(self, tid, p: int, phase: list, lets: list, defined_in: dict, used_in: dict
               ) -> None:
        self.vars[self.kernel.tid] = tid
        for v in self.arrays:
            # Only what this phase reads: loading every earlier value in every phase left
            # LLVM a dead load per value and phase to delete (an 11-phase kernel of GPT
            # train: 63,000 loads, 39 s of O3).
            if defined_in[v] < p and p in used_in.get(v, ()):
                self.values[v] = self.builder.load(self.slot(v, tid), typ=VALUE_TYPES[v.dtype])
        self.lower(lets)
        self.lower(phase)
        for v in self.arrays:
            if defined_in[v] == p:
                self.builder.store(self.values[v], self.slot(v, tid))

    def collective(self, s: WarpReduce | Barrier) -> None:
        """Barriers are phase boundaries; warp_reduce is the butterfly on each warp's slice,
        its 32 lanes straight-line code in a loop over the warps (a loop per lane and step
        made a kernel of 70 block reductions 2,000 loops, which LLVM's loop passes took
        tens of seconds over)."""
        if isinstance(s, Barrier):
            return
        b = self.builder
        ty = VALUE_TYPES[s.dst.dtype]
        at = lambda array, i: b.gep(array, [i], source_etype=ty)

        def warp(w: ir.Value) -> None:
            base = b.mul(w, ir.Constant(I32, WARP))
            lane = [b.add(base, ir.Constant(I32, k)) for k in range(WARP)]
            values = [b.load(at(self.arrays[s.src], i), typ=ty) for i in lane]
            for offset in s.offsets():  # lane l combines its own value with lane l^offset
                values = [self.combine(s, values[k], values[k ^ offset]) for k in range(WARP)]
            for i, value in zip(lane, values):
                b.store(value, at(self.arrays[s.dst], i))

        self.counted_loop(ir.Constant(I32, 0), ir.Constant(I32, self.kernel.block[0] // WARP),
                          1, warp)


def to_physical(x: np.ndarray, shape: Shape) -> np.ndarray:
    """A logical-order array as the contiguous buffer of `shape`'s layout."""
    x = np.asarray(x, dtype=shape.numpy_dtype)
    if x.shape != tuple(shape.dims):
        raise ValueError(f"expected {shape.dims}, got {x.shape}")
    return np.ascontiguousarray(np.transpose(x, shape.minor_to_major[::-1]))


def from_physical(buf: np.ndarray, shape: Shape) -> np.ndarray:
    return np.transpose(buf, np.argsort(shape.minor_to_major[::-1]))


@dataclass
class HostKernel:
    """A kernel compiled for the CPU. `address` is ``void kernel(void** buffers)``; a fast
    build's `parts_address` is ``kernel_parts(buffers, part, parts)``, which shares out
    `split_extent` iterations (0: none to share; 0 as the address: no such function).
    `in_place`: its kernel's (input, output) pairs, each output stored over its input."""

    spec: object
    llvm_ir: str
    address: int
    _engine: object = field(repr=False)
    parts_address: int = 0
    split_extent: int = 0
    in_place: tuple[tuple[int, int], ...] = ()

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        spec = self.spec
        if len(inputs) != len(spec.inputs):
            raise ValueError(f"{spec.name} takes {len(spec.inputs)} inputs, got {len(inputs)}")
        ins = [to_physical(x, s) for x, (_, s) in zip(inputs, spec.inputs)]
        outs = [np.empty([s.dims[d] for d in s.minor_to_major[::-1]], s.numpy_dtype)
                for _, s in spec.outputs]
        arrays = ins + outs
        for source, output in self.in_place:  # a copy: the caller's input stays as it was
            own = ins[source].copy().reshape(outs[output - len(ins)].shape)  # a scalar: 0-d
            outs[output - len(ins)] = arrays[source] = arrays[output] = own
        pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self.address)(pointers)
        return [from_physical(o, s) for o, (_, s) in zip(outs, spec.outputs)]


def _buffer_scopes(module: ir.Module, kernel: Kernel) -> list[tuple]:
    """Per buffer, (the alias scope list of its accesses, the list of every other buffer's
    scope). The pointers come out of an array, so LLVM cannot know they never overlap (XLA
    gives a custom call's results buffers of their own); without these, a loop storing to
    several outputs stays scalar (the vectorizer's run-time overlap checks run out)."""
    domain = module.add_metadata([ir.MetaDataString(module, f"{kernel.name}.buffers")])
    scopes = [module.add_metadata([ir.MetaDataString(module, f"{kernel.name}.buffer{i}"),
                                   domain]) for i in range(len(kernel.buffers))]
    return [(module.add_metadata([scope]),
             module.add_metadata([s for s in scopes if s is not scope]))
            for scope in scopes]


def _host_machine():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    # The host's own CPU and features: F16C converts f16 in hardware (otherwise LLVM calls
    # compiler-rt helpers the JIT cannot resolve) and AVX widens the vectorized thread loops.
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
        opt=3, jit=True)


def compile_host(spec, fast: bool = False) -> HostKernel:
    """The spec's kernel as native code. By default the GPU schedule itself (``spec.kernel``,
    emulated thread by thread: what verification checks); ``fast=True`` compiles
    ``spec.host_kernel``, the same pattern scheduled for the CPU, with LLVM's loop unrolling
    and vectorization (the runtime's choice when the host kernel competes with XLA:CPU)."""
    return _compile(spec, spec.host_kernel if fast else spec.kernel, fast)


def host_ir(kernel: Kernel, fast: bool, instrument: bool = False) -> str:
    """The kernel's LLVM IR for this host (``fast``: as `HostLowering` says)."""
    module = ir.Module(name=kernel.name)
    module.triple = llvm.get_process_triple()
    HostLowering(kernel, module, instrument, fast).build()
    return str(module)


def _compile(spec, kernel: Kernel, fast: bool, instrument: bool = False) -> HostKernel:
    text = host_ir(kernel, fast, instrument)
    machine = _host_machine()
    parsed = llvm.parse_assembly(text)
    parsed.verify()
    # Emulated GPU schedules exist to be checked: unrolling and vectorizing their thread and
    # lane loops would double the compile time for nothing.
    optimize(parsed, machine, unroll_and_vectorize=fast)
    engine = llvm.create_mcjit_compiler(parsed, machine)
    engine.finalize_object()
    parts = parts_of(engine, kernel) if fast else (0, 0)
    return HostKernel(spec, text, engine.get_function_address(kernel.name), engine, *parts,
                      in_place=kernel.in_place)


def parts_of(engine, kernel: Kernel) -> tuple[int, int]:
    """(address of the fast kernel's parts function, its split extent) in ``engine``."""
    return engine.get_function_address(kernel.name + PARTS_SUFFIX), split_extent(kernel)


@dataclass
class Traffic:
    """Global memory a kernel run touched, counted by the instrumented host build."""

    read_bytes: int  # distinct input bytes loaded
    write_bytes: int  # distinct output bytes stored
    raw_read_bytes: int  # bytes of every load executed (re-reads included)
    raw_write_bytes: int


def count_traffic(spec, *inputs: np.ndarray) -> Traffic:
    """Runs the GPU schedule (``spec.kernel``, emulated) instrumented at every global access."""
    kernel = spec.kernel
    host = _compile(spec, kernel, fast=False, instrument=True)
    ins = [to_physical(x, s) for x, (_, s) in zip(inputs, spec.inputs)]
    outs = [np.empty(s.num_elements, s.numpy_dtype) for _, s in spec.outputs]
    marks = [np.zeros(max(b.shape.num_elements, 1), np.uint8) for b in kernel.buffers]
    counters = np.zeros(2, np.int64)
    arrays = ins + outs + marks + [counters]
    pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(host.address)(pointers)
    touched = [int(m.sum()) * DTYPE_BYTES[b.shape.dtype] for m, b in zip(marks, kernel.buffers)]
    first_output = len(spec.inputs)
    return Traffic(sum(touched[:first_output]), sum(touched[first_output:]),
                   int(counters[0]), int(counters[1]))
