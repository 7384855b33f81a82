"""A stitched kernel as the cost model sees it (paper 4.3): instructions, registers, time.

``kernel_profile(spec)`` turns a KernelSpec's kernel IR into a ``costmodel.KernelProfile``:
launch shape, instructions per thread by op class (a loop's body counted once per iteration of
its slowest thread), registers from ``register_model``, shared memory from the kernel's arrays
and global bytes from the spec. ``modeled_kernel_us`` prices it with the latency-evaluator.

``register_model`` follows the code the NVPTX backend produces, because that is what ptxas
allocates registers for (observed in its PTX for the corpus kernels, LLVM O3):

* a loop that runs at most once, or whose body never reads its variable (every iteration
  does the same), is a guarded body; a loop whose trip count is the same for every start
  LLVM can prove (a lane ``tid % 32``; ``tid`` is only known below 1024, ``bid`` not at all)
  and at most 8 (LLVM's unroll-max-upperbound) is fully unrolled when it stores nothing; all
  other loops stay loops (loops that store were seen only partially unrolled);
* in unrolled code, a load of an input buffer at an address loaded before is reused (GVN;
  buffers are noalias and inputs read-only) unless a barrier lies between, and an op repeated
  on the same operands is computed once; what a branch (an ``If``, a loop some threads skip)
  loads or computes does not dominate the code after it, so it is not reused there (seen in
  softmax's three guarded stages: each reloads x);
* outside loops, ptxas issues an input's load at the start of its straight-line block (after
  the last branch, loop or barrier) to hide its latency, so the value is live from there to
  its last use (seen in the unrolled warp schedules: loads after the shuffles are hoisted
  above them), as long as that keeps 32 registers or fewer (full occupancy); beyond, ptxas
  issues loads where they are used and may spill a little to stay at 32;
* a buffer's base address is a kernel parameter that ptxas reads from the constant bank where
  it is needed (no register); a loop steps one 64-bit pointer per distinct access whose index
  is affine in its variable (loop strength reduction) and one counter, and the indices that
  built them die in its preheader; a loop stepping 8 pointers or more steps the kernel
  parameters' base registers themselves, which then live from the kernel's start (seen in
  packed kernels: a later loop's pointers are live during the earlier loops); an access
  whose index is not affine (a remainder, a gathered row) computes its address in the body
  from its buffer's base, which ptxas for sm_90 loads into a register pair before the loop
  (for sm_80 the multiply-add reads it from the constant bank; the model follows sm_90, the
  default target);
  straight-line code keeps one 64-bit address per access pattern and adds constant offsets;
* a multi-instruction op (libdevice, IEEE division and square root) holds temporaries, more
  for the libdevice functions measured to need more (sine, cosine, tan, atan2, power, ...);
* scalar constants are immediates and predicates live in predicate registers: neither takes a
  general register.

The peak of 32-bit registers live at once goes through ``costmodel.estimate_registers``.
Unknown IR node types (the IR grows) are counted in ``costmodel.instructions.GENERIC_CLASS``
and their values enter the lifetimes through ``kernel_ir.defined_values/used_values``.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import numpy as np

import costmodel
from costmodel.instructions import (GENERIC_CLASS, OVERLAPPED_LOAD, add_instructions,
                                    op_instructions)

from . import KernelSpec
from .kernel_ir import (WARP, Barrier, BlockReduce, Compute, Const, GlobalLoad, GlobalStore, If,
                        IndexLet, IndexValue, Ix, Kernel, Loop, Mod, SharedLoad, SharedStore, Value,
                        Var, WarpReduce, defined_values, expand_block_reduce, used_values,
                        value_range)

SHUFFLE_STEPS = WARP.bit_length() - 1  # xor butterfly over 32 lanes: 5 shuffles
MAX_FULL_UNROLL_TRIPS = 8  # LLVM -unroll-max-upperbound: trip counts known only as a bound
MAX_THREADS_PER_BLOCK = 1024  # range LLVM's llvm.nvvm.read.ptx.sreg.tid.x carries
# 32-bit registers per value; default 1 (a 128-bit vector load's value holds 4)
REGISTER_WIDTH = {"s64": 2, "u64": 2, "f64": 2, "pred": 0, "f32x4": 4, "s32x4": 4}
POINTER_WIDTH = 2  # 64-bit addresses
# Registers per thread that keep an SM full (65536 registers / 2048 threads on sm_80, sm_90).
FULL_OCCUPANCY_REGISTERS = 32
# Registers __nv_expf holds besides its operand and result at its widest point (its PTX from
# the NVPTX backend), taken for every multi-instruction op sequence...
SEQUENCE_TEMPORARIES = 2
# ...except the libdevice functions that hold more: ptxas registers (sm_90) of a one-op
# elementwise kernel f32[4096] minus those of the same kernel with negate (unary) or add
# (binary), measured with this backend.
OP_TEMPORARIES = {"tanh": 4, "sine": 9, "cosine": 9, "tan": 8, "exponential-minus-one": 3,
                  "cbrt": 4, "power": 5, "atan2": 8}
# A loop's pointers are born after the preheader has read the indices they replace.
PREHEADER = 0.75
# A loop that steps this many pointers or more steps the buffers' base registers themselves
# (NVPTX PTX of the corpus: every loop with 8 or more, and 3 of the 41 with 6 or 7), and those
# hold the kernel parameters from the kernel's start.
STEPPED_BASES = 8


def trip_count(loop: Loop) -> int:
    """Iterations of the thread that runs the loop longest (its warp waits for it)."""
    lowest_start, _ = value_range(loop.start)
    return max(0, -(-(loop.stop - lowest_start) // loop.step))


# -- instructions ----------------------------------------------------------------------------

def _index_instructions(index: Ix) -> int:
    """Integer instructions to evaluate an index: one (multiply-)add per term, one more per
    division or remainder, recursively."""
    count = 0
    for atom, _ in index.terms:
        count += 1
        if not isinstance(atom, Var):
            count += 1 + _index_instructions(atom.arg)
    return count


def _compute_dtype(s: Compute) -> str:
    # compare and select produce pred / take pred; the arithmetic happens in the data type.
    return s.args[-1].dtype if s.args else s.dst.dtype


def count_instructions(kernel: Kernel, body: list, counts: dict[str, float],
                       times: float = 1.0) -> None:
    """Add the instructions one thread executes for ``body`` to ``counts`` (by op class).

    A loop LLVM unrolls (``unrolled_trips``) issues its iterations' loads back to back: the
    first iteration's loads wait the full latency, the others overlap them."""
    for s in body:
        match s:
            case Const():
                pass  # immediates
            case IndexValue() | IndexLet():
                add_instructions(counts, {"int": _index_instructions(s.index)}, times)
            case Compute():
                add_instructions(counts, op_instructions(s.op, _compute_dtype(s)), times)
            case GlobalLoad():
                add_instructions(counts, {"ld_global": 1, "int": _index_instructions(s.offset)},
                                 times)
            case GlobalStore():
                add_instructions(counts, {"st_global": 1, "int": _index_instructions(s.offset)},
                                 times)
            case SharedLoad():
                add_instructions(counts, {"ld_shared": 1, "int": _index_instructions(s.index)},
                                 times)
            case SharedStore():
                add_instructions(counts, {"st_shared": 1, "int": _index_instructions(s.index)},
                                 times)
            case Loop():
                trips = trip_count(s)
                if unrolled_trips(s, kernel) is not None and trips > 1:
                    count_instructions(kernel, s.body, counts, times)
                    later: dict[str, float] = {}
                    count_instructions(kernel, s.body, later, times * (trips - 1))
                    later[OVERLAPPED_LOAD] = later.pop("ld_global", 0.0)
                    add_instructions(counts, later)
                else:
                    count_instructions(kernel, s.body, counts, times * trips)
                for a in s.accumulates:
                    add_instructions(counts, op_instructions(a.kind, a.dst.dtype), times * trips)
                add_instructions(counts, {"int": 2}, times * trips)  # step, compare-and-branch
            case If():
                add_instructions(counts, {"int": 1}, times)
                count_instructions(kernel, s.body, counts, times)  # if any lane of the warp does
            case WarpReduce():
                _count_warp_reduce(s.kind, s.dst.dtype, counts, times)
            case BlockReduce():  # as expand_block_reduce lowers it
                _count_warp_reduce(s.kind, s.dst.dtype, counts, 2 * times)
                add_instructions(counts, {"st_shared": 1, "barrier": 1, "ld_shared": 1,
                                          "int": 2, "fp32": 1}, times)
            case Barrier():
                add_instructions(counts, {"barrier": 1}, times)
            case _:
                add_instructions(counts, {GENERIC_CLASS: 1}, times)
                count_instructions(kernel, _nested_body(s), counts, times)


def _count_warp_reduce(kind: str, dtype: str, counts: dict[str, float], times: float) -> None:
    add_instructions(counts, {"shfl": SHUFFLE_STEPS}, times)
    add_instructions(counts, op_instructions(kind, dtype), times * SHUFFLE_STEPS)


def _nested_body(stmt) -> list:
    body = getattr(stmt, "body", None)
    return body if isinstance(body, list) else []


# -- registers -------------------------------------------------------------------------------

@dataclasses.dataclass
class _RolledLoop:
    first: int  # position of the loop header
    extend: set  # keys that must survive to the loop's last position
    pointers_born: float  # where its pointers are born: its preheader or the kernel's start
    var: Var  # the loop's variable


class _Lifetimes:
    """Walks the kernel body in program order, recording when each register is born and dies."""

    def __init__(self, kernel: Kernel, hoist_loads: bool = True):
        self.kernel = kernel
        self.hoist_loads = hoist_loads
        self.start: dict = {}
        self.end: dict = {}
        self.width: dict = {}
        self.pos = 0
        self.rolled: list[_RolledLoop] = []
        self.available: list[dict] = [{}]  # CSE tables; a rolled loop body opens a scope
        self.current: dict[Value, object] = {}  # Value -> key of the register holding it
        self.immediates: set[Value] = set()
        self.var_key: dict[Var, object] = {}
        self.unrolled: dict[Var, tuple[Ix, int, int]] = {}  # var -> (start, step, iteration)
        self.iteration: tuple = ()
        self.fresh = itertools.count()
        self.region = 0  # where the current straight-line block begins (loads hoist to it)

    # registers
    def define(self, key, width: int, at: int | None = None) -> None:
        if width <= 0 or key in self.start:
            return
        self.start[key] = self.pos if at is None else at
        self.width[key] = width

    def use(self, key) -> None:
        if key not in self.start:
            return
        self.end[key] = max(self.end.get(key, self.start[key]), self.pos)
        for loop in self.rolled:  # defined before a loop, used in it: needed every iteration
            if self.start[key] < loop.first:
                loop.extend.add(key)

    def use_value(self, v: Value) -> None:
        if v not in self.immediates:
            self.use(self.current.get(v, (v, ())))

    def define_value(self, v: Value, at=None) -> object:
        key = (v, self.iteration)
        self.current[v] = key
        self.define(key, REGISTER_WIDTH.get(v.dtype, 1), at)
        return key

    def use_index(self, index: Ix) -> None:
        for var in index.vars():
            if var in self.unrolled:  # an unrolled loop's variable is its start plus a constant
                self.use_index(self.unrolled[var][0])
                continue
            key = self.var_key.setdefault(var, ("var", var.name))
            self.define(key, 1)
            self.use(key)

    def lookup(self, cse_key):
        return next((scope[cse_key] for scope in reversed(self.available) if cse_key in scope),
                    None)

    def operand(self, v: Value):
        return ("imm", v.dtype) if v in self.immediates else self.current.get(v, (v, ()))

    # addresses
    def access(self, buffer: int, offset: Ix) -> None:
        """The registers that address ``buffer[offset]``, and the index variables it reads."""
        loop = self.rolled[-1] if self.rolled else None
        if loop is not None and _steps_with(offset, loop.var):
            # Loop strength reduction: the preheader turns the indices into a pointer the
            # loop steps; they are read there, not in the loop.
            for var in offset.vars():
                key = self.var_key.get(var, ("var", var.name))
                if key in self.start and self.start[key] < loop.first:
                    self.at_preheader(loop, key)
            pointer = ("pointer", loop.first, buffer, str(offset))
            self.define(pointer, POINTER_WIDTH, at=loop.pointers_born)
            loop.extend.add(pointer)
            self.use(pointer)
            return
        if loop is not None:  # the buffer's base, held across the loop (sm_90)
            base = ("base", loop.first, buffer)
            self.define(base, POINTER_WIDTH, at=loop.first + PREHEADER)
            loop.extend.add(base)
            self.use(base)
        self.use_index(offset)
        pattern = tuple(sorted(self.unrolled_terms(offset)))
        address = ("address", loop and loop.first, buffer, str(offset), pattern)  # in its loop
        self.define(address, POINTER_WIDTH)
        self.use(address)

    def at_preheader(self, loop: _RolledLoop, key) -> None:
        self.end[key] = max(self.end.get(key, self.start[key]), loop.first)

    def unrolled_terms(self, offset: Ix):
        return ((v.name, str(self.unrolled[v][0])) for v in offset.vars() if v in self.unrolled)

    def load_key(self, s: GlobalLoad):
        iterations = tuple(sorted((v.name, str(start), step, k) for v, (start, step, k)
                                  in self.unrolled.items() if v in s.offset.vars()))
        return ("load", s.buffer, str(s.offset), iterations)

    # statements
    def walk(self, body: list) -> None:
        outer_region, self.region = self.region, self.pos + 1
        for s in body:
            self.pos += 1
            self.statement(s)
            if isinstance(s, (Loop, If, Barrier)):
                self.region = self.pos
        self.region = outer_region

    def statement(self, s) -> None:
        match s:
            case Const():
                self.immediates.add(s.dst)
            case IndexValue():
                self.use_index(s.index)
                self.define_value(s.dst)
            case IndexLet():
                self.use_index(s.index)
                key = self.var_key[s.var] = ("var", s.var.name, next(self.fresh))
                self.define(key, 1)
            case Compute():
                for a in s.args:
                    self.use_value(a)
                if s.op in OP_TEMPORARIES and _compute_dtype(s) == "f32":
                    self.define(("sequence", next(self.fresh)), OP_TEMPORARIES[s.op])
                elif sum(op_instructions(s.op, _compute_dtype(s)).values()) > 2:
                    # A multi-instruction sequence (libdevice, IEEE division and square root)
                    # holds intermediate results besides its operands and result.
                    self.define(("sequence", next(self.fresh)), SEQUENCE_TEMPORARIES)
                cse_key = ("compute", s.op, s.attr, tuple(self.operand(a) for a in s.args))
                self.reuse_or_define(s.dst, cse_key)
            case GlobalLoad():
                self.access(s.buffer, s.offset)
                reusable = not self.kernel.buffers[s.buffer].is_output
                self.reuse_or_define(s.dst, self.load_key(s) if reusable else None,
                                     at=self.region if reusable and not self.rolled
                                     and self.hoist_loads else None)
            case GlobalStore():
                self.access(s.buffer, s.offset)
                self.use_value(s.value)
            case SharedStore():
                self.use_index(s.index)
                self.use_value(s.value)
            case SharedLoad():
                self.use_index(s.index)
                self.define_value(s.dst)
            case Loop():
                self.loop(s)
            case If():
                self.use_index(s.lhs)
                self.use_index(s.rhs)
                self.available.append({})  # a branch: its values do not dominate what follows
                self.walk(s.body)
                self.available.pop()
            case WarpReduce() | BlockReduce():
                self.use_value(s.src)
                self.define(("shuffled", next(self.fresh)), 1)  # the partner lane's value
                self.define_value(s.dst)
            case Barrier():
                for scope in self.available:  # memory may have changed under a barrier
                    for key in [k for k in scope if k[0] == "load"]:
                        del scope[key]
            case _:
                self.generic(s)

    def reuse_or_define(self, dst: Value, cse_key, at=None) -> None:
        found = self.lookup(cse_key) if cse_key is not None else None
        if found is not None:
            self.current[dst] = found
            self.use(found)
            return
        key = self.define_value(dst, at)
        if cse_key is not None:
            self.available[-1][cse_key] = key

    def generic(self, s) -> None:
        for field in dataclasses.fields(s) if dataclasses.is_dataclass(s) else ():
            value = getattr(s, field.name)
            if isinstance(value, Ix):
                self.use_index(value)
            elif isinstance(value, Var):  # the node defines an index variable
                key = self.var_key[value] = ("var", value.name, next(self.fresh))
                self.define(key, 1)
        for v in used_values(s):
            self.use_value(v)
        for v in defined_values(s):
            self.define_value(v)
        self.walk(_nested_body(s))

    def loop(self, s: Loop) -> None:
        trips = unrolled_trips(s, self.kernel)
        if trips is None:
            self.rolled_loop(s)
        else:
            self.unroll(s, trips)

    def unroll(self, s: Loop, trips: int) -> None:
        # A body some threads skip is a branch: what it loads or computes does not dominate
        # the code after it, so LLVM cannot reuse it there.
        bounds = _trip_bounds(s, self.kernel)
        guarded = bounds is None or bounds[0] == 0
        if guarded:
            self.available.append({})
        outer_iteration = self.iteration
        partial = {a.dst: a.init for a in s.accumulates}
        for k in range(trips):
            self.unrolled[s.var] = (s.start, s.step, k)
            self.iteration = outer_iteration + ((s.var.name, k),)
            self.walk(s.body)
            self.pos += 1
            for a in s.accumulates:
                self.use_value(partial[a.dst])
                self.use_value(a.value)
                partial[a.dst] = Value(f"{a.dst.name}.{k}", a.dst.dtype)
                self.define_value(partial[a.dst])
        del self.unrolled[s.var]
        if guarded:
            self.available.pop()
        self.iteration = outer_iteration
        for a in s.accumulates:
            self.current[a.dst] = self.current.get(partial[a.dst], (partial[a.dst], ()))
            if partial[a.dst] in self.immediates:  # a loop that never runs
                self.immediates.add(a.dst)

    def rolled_loop(self, s: Loop) -> None:
        self.use_index(s.start)
        stepped = {(x.buffer, str(x.offset)) for x in _flatten(s.body)
                   if isinstance(x, (GlobalLoad, GlobalStore)) and _steps_with(x.offset, s.var)}
        loop = _RolledLoop(first=self.pos, extend=set(), var=s.var, pointers_born=(
            0 if len(stepped) >= STEPPED_BASES else self.pos + PREHEADER))
        counter = self.var_key[s.var] = ("var", s.var.name, next(self.fresh))
        self.define(counter, 1)
        loop.extend.add(counter)
        for a in s.accumulates:
            self.use_value(a.init)
            loop.extend.add(self.define_value(a.dst))
        self.rolled.append(loop)
        self.available.append({})
        self.walk(s.body)
        self.pos += 1
        for a in s.accumulates:
            self.use_value(a.value)
        self.available.pop()
        self.rolled.pop()
        for key in loop.extend:
            self.end[key] = max(self.end.get(key, self.start[key]), self.pos)

    def live_counts(self) -> list[int]:
        events = []
        for key, born in self.start.items():
            events += [(born, self.width[key]), (self.end.get(key, born) + 0.5, -self.width[key])]
        live, counts = 0, []
        for _, change in sorted(events):
            live += change
            counts.append(live)
        return counts


@functools.lru_cache(maxsize=4096)
def _steps_with(index: Ix, var: Var) -> bool:
    """Whether ``index`` is affine in ``var``, so that LLVM's loop strength reduction steps a
    pointer for it. LLVM folds floor divisions and remainders that recombine
    (``32*(e // 32) + (e % 32)`` is ``e``) but steps no other division or remainder, so
    such indices are tried on a sample of their variables' values."""
    if var not in index.vars():
        return False
    if all(isinstance(atom, Var) or var not in atom.arg.vars() for atom, _ in index.terms):
        return True
    names = {v.name: v for v in sorted(index.vars(), key=lambda v: v.name)}
    sample = np.random.default_rng(0)
    env = {name: sample.integers(0, max(v.extent - 1, 1), 16) for name, v in names.items()}
    moves = index.evaluate({**env, var.name: env[var.name] + 1}) - index.evaluate(env)
    return bool(np.all(moves == moves[0]))


def _reads_var(body: list, var: Var) -> bool:
    """Whether any index expression in ``body`` reads ``var``."""
    return any(isinstance(value, Ix) and var in value.vars()
               for s in _flatten(body) if dataclasses.is_dataclass(s)
               for value in (getattr(s, f.name) for f in dataclasses.fields(s)))


def _flatten(body: list):
    for s in body:
        yield s
        yield from _flatten(_nested_body(s))


def _known_range(index: Ix, kernel: Kernel) -> tuple[int, int] | None:
    """The range of an index LLVM can prove: threadIdx.x is below 1024 (the intrinsic's range),
    remainders are below their divisor; other variables are unknown (None)."""
    lo = hi = index.const
    for atom, c in index.terms:
        if isinstance(atom, Var):
            if atom != kernel.tid:
                return None
            alo, ahi = 0, MAX_THREADS_PER_BLOCK - 1
        elif isinstance(atom, Mod):
            alo, ahi = 0, atom.k - 1
        else:
            inner = _known_range(atom.arg, kernel)
            if inner is None:
                return None
            alo, ahi = inner[0] // atom.k, inner[1] // atom.k
        lo, hi = lo + min(c * alo, c * ahi), hi + max(c * alo, c * ahi)
    return lo, hi


def _trip_bounds(loop: Loop, kernel: Kernel) -> tuple[int, int] | None:
    """The fewest and most iterations of any thread, if LLVM can prove them."""
    known = _known_range(loop.start, kernel)
    if known is None:
        return None
    return (max(0, -(-(loop.stop - known[1]) // loop.step)),
            max(0, -(-(loop.stop - known[0]) // loop.step)))


def unrolled_trips(loop: Loop, kernel: Kernel) -> int | None:
    """How often LLVM repeats the body as straight-line code, or None if the loop stays a loop.

    A loop that runs at most once, or whose body never reads its variable (the stores of a
    scalar, seen without a loop in the PTX), is a guarded body. Otherwise LLVM unrolls fully
    only a trip count that is the same for every start it can prove (``tid % 32`` has a
    range, ``tid``'s is too wide), up to unroll-max-upperbound; loops that store were seen
    unrolled only partially, which leaves their values short-lived, so they count as loops."""
    if not loop.accumulates and not _reads_var(loop.body, loop.var):
        return 1
    bounds = _trip_bounds(loop, kernel)
    if bounds is None:
        return None
    least, most = bounds
    if most <= 1:
        return most
    stores = any(isinstance(x, GlobalStore) for x in _flatten(loop.body))
    if most == least and most <= MAX_FULL_UNROLL_TRIPS and not stores:
        return most
    return None


def register_model(spec: KernelSpec) -> int:
    """Registers per thread ptxas is modeled to allocate (see the module docstring)."""
    body = expand_block_reduce(spec.kernel)
    hoisted = _Lifetimes(spec.kernel)
    hoisted.walk(body)
    regs = costmodel.estimate_registers(hoisted.live_counts())
    if regs <= FULL_OCCUPANCY_REGISTERS:
        return regs
    # ptxas hoists loads only while the kernel keeps full occupancy; beyond, it issues them
    # where they are used (seen: 40-89 modeled with hoisting, ptxas 32 with 8 bytes spilled).
    in_place = _Lifetimes(spec.kernel, hoist_loads=False)
    in_place.walk(body)
    return max(FULL_OCCUPANCY_REGISTERS,
               costmodel.estimate_registers(in_place.live_counts()))


# -- the latency-evaluator's view --------------------------------------------------------------

def kernel_profile(spec: KernelSpec) -> costmodel.KernelProfile:
    counts: dict[str, float] = {}
    count_instructions(spec.kernel, spec.kernel.body, counts)
    return costmodel.KernelProfile(
        grid_blocks=math.prod(spec.grid), threads_per_block=math.prod(spec.block),
        regs_per_thread=register_model(spec), smem_bytes=spec.smem_bytes,
        instructions=counts, bytes_read=spec.read_bytes, bytes_written=spec.write_bytes)


def modeled_kernel_us(spec: KernelSpec, device: costmodel.Device) -> float:
    """The latency-evaluator's time for this kernel on ``device`` (modeled, not measured)."""
    return costmodel.kernel_latency_us(kernel_profile(spec), device).total_us

