"""Registers per thread of a stitched kernel, as ptxas is modeled to allocate them.

`register_model` follows the code the NVPTX backend produces (LLVM O3), because that is what
ptxas allocates registers for: which loops are unrolled, what GVN reuses, where ptxas issues
loads and reads store addresses, which values take no register. The peak of 32-bit
registers live at once goes through ``costmodel.estimate_registers``; the rules and the
kernels they were read from are in docs/ARCHITECTURE.md.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import numpy as np

import costmodel
from costmodel.instructions import op_instructions
from costmodel.occupancy import ARCH_LIMITS

from ..index_expr import Ix, Var
from ..kernel_ir import (Barrier, BlockReduce, Compute, Const, ConstLoad, GlobalLoad,
                         GlobalStore, If, IndexLet, IndexValue, Kernel, Loop, SharedLoad,
                         SharedStore, Value, VectorExtract, WarpReduce, all_statements,
                         defined_values, expand_block_reduce, nested_body, used_values)
from .lowered import (REGISTER_WIDTH, compute_dtype, statement_fields, trip_bounds,
                      unrolled_trips, used_lanes)

POINTER_WIDTH = 2  # 64-bit addresses
REGISTERS_PER_SM = 65536  # sm_80, sm_90
# The architecture whose occupancy ptxas keeps (sm_80's limits are the same).
OCCUPANCY_ARCH = ARCH_LIMITS["sm_90"]
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
# Store addresses of one straight-line block that REGISTER_OVERHEAD already holds: only
# those beyond are counted from the block's start (a guarded pair of scalar stores takes
# ptxas's minimum of 8 registers; a block of 15 such stores 42).
STORE_ADDRESSES_IN_OVERHEAD = 2
# A loop that steps this many pointers or more steps the buffers' base registers themselves
# (NVPTX PTX of the corpus: every loop with 8 or more, and 3 of the 41 with 6 or 7), and those
# hold the kernel parameters from the kernel's start.
STEPPED_BASES = 8


@dataclasses.dataclass
class _RolledLoop:
    first: int  # position of the loop header
    extend: set  # keys that must survive to the loop's last position
    pointers_born: float  # where its pointers are born: its preheader or the kernel's start
    var: Var  # the loop's variable


class _Lifetimes:
    """Walks the kernel body in program order, recording when each register is born and dies."""

    def __init__(self, kernel: Kernel, lanes: dict[Value, int], hoist_loads: bool = True,
                 hoist_stores: bool = True):
        self.kernel = kernel
        self.hoist_loads = hoist_loads
        self.hoist_stores = hoist_loads and hoist_stores
        self.start: dict = {}
        self.end: dict = {}
        self.width: dict = {}
        self.pos = 0
        self.rolled: list[_RolledLoop] = []
        self.available: list[dict] = [{}]  # CSE tables; a rolled loop body opens a scope
        self.current: dict[Value, object] = {}  # Value -> key of the register holding it
        self.immediates: set[Value] = set()
        self.known: dict[Value, int | float] = {}  # immediates' values (shift amounts)
        self.narrow: set[Value] = set()  # 64-bit integers whose upper half is known zero
        self.remat: dict[Value, Value] = {}  # register + immediate: recomputed at each use
        self.lanes = lanes  # the kernel's `used_lanes`
        self.lets: dict = {}  # index variables let but not read yet -> (position, index)
        self.var_key: dict[Var, object] = {}
        self.unrolled: dict[Var, tuple[Ix, int, int]] = {}  # var -> (start, step, iteration)
        self.iteration: tuple = ()
        self.fresh = itertools.count()
        self.region = 0  # where the current straight-line block begins (loads hoist to it)
        self.first_reduce = None  # its first warp reduction: later loads hoist only to it
        self.stores_in_block: dict[int, int] = {}  # distinct store addresses per block
        self.shared_stored = 0  # the last shared store: shared loads hoist only below it
        self.loaded_bools: set[Value] = set()  # bytes in registers (LDG.E.U8), not predicates

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

    def use_value(self, v: Value, half: str | None = None) -> None:
        """Read ``v``; ``half`` "lo" or "hi" reads one register of a 64-bit integer."""
        if v in self.remat:  # one add at the use: the operand lives, the sum only here
            self.use_value(self.remat[v])
            self.define(("sum", next(self.fresh)), 1)
        elif v not in self.immediates:
            key = self.current.get(v, (v, ()))
            if half != "hi":
                self.use(key)
            if half != "lo":
                self.use(("hi", key))

    def define_value(self, v: Value, at=None) -> object:
        key = (v, self.iteration)
        self.current[v] = key
        if v in self.narrow or v in self.loaded_bools:
            width = 1
        elif v.dtype in ("u64", "s64"):
            # Its halves are two 32-bit registers that die apart: a truncation reads the low
            # one, a shift right by 32 the high one (mul.wide.u32's result in the Philox
            # rounds: the high half feeds the next round, the low half a later one).
            width = 1
            self.define(("hi", key), 1, at)
        elif v in self.lanes:
            width = self.lanes[v]
        else:
            width = REGISTER_WIDTH.get(v.dtype, 1)
        self.define(key, width, at)
        return key

    def use_index(self, index: Ix) -> None:
        for var in index.vars():
            if var in self.unrolled:  # an unrolled loop's variable is its start plus a constant
                self.use_index(self.unrolled[var][0])
                continue
            key = self.var_key.setdefault(var, ("var", var.name))
            if key in self.lets:
                self.compute_let(key)
            self.define(key, 1)
            self.use(key)

    def compute_let(self, key) -> None:
        """A let's first read: the let reads its index at its own position, then holds it."""
        at, index = self.lets.pop(key)
        here, rolled = self.pos, self.rolled
        self.pos, self.rolled = at, [loop for loop in rolled if loop.first < at]
        self.use_index(index)
        self.define(key, 1)
        self.pos, self.rolled = here, rolled

    def lookup(self, cse_key):
        for scope in reversed(self.available):
            if cse_key in scope:
                return scope[cse_key]
        return None

    def operand(self, v: Value):
        if v in self.immediates:  # equal immediates are equal operands, whichever Value
            return ("imm", v.dtype, self.known.get(v, v))
        return self.current.get(v, (v, ()))

    # addresses
    def access(self, buffer: int, offset: Ix, store: bool = False) -> None:
        """The registers that address ``buffer[offset]``, and the index variables it reads."""
        loop = self.rolled[-1] if self.rolled else None
        if loop is not None and _steps_with(offset, loop.var):
            # Loop strength reduction: the preheader turns the indices into a pointer the
            # loop steps; they are read there, not in the loop.
            for var in offset.vars():
                key = self.var_key.get(var, ("var", var.name))
                if key in self.start and self.start[key] < loop.first:
                    self.at_preheader(loop, key)
            # Accesses at constant distances share one pointer ([reg+imm] in the SASS).
            pointer = ("pointer", loop.first, buffer, str(Ix(offset.terms)))
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
        # Stores that differ by a constant share one 64-bit address, [reg+imm] in the SASS.
        where = str(Ix(offset.terms)) if store else str(offset)
        address = ("address", loop and loop.first, buffer, where, pattern)  # in its loop
        # A store's base is read at the start of its block (docs/ARCHITECTURE.md).
        hoisted = loop is None and self.hoist_stores and store and address not in self.start
        if hoisted:
            self.stores_in_block[self.region] = self.stores_in_block.get(self.region, 0) + 1
        self.define(address, POINTER_WIDTH, at=self.region if hoisted and
                    self.stores_in_block[self.region] > STORE_ADDRESSES_IN_OVERHEAD else None)
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
        outer_reduce, self.first_reduce = self.first_reduce, None
        for s in body:
            self.pos += 1
            self.statement(s)
            if isinstance(s, (Loop, If, Barrier)):
                self.region, self.first_reduce = self.pos, None
            elif isinstance(s, (WarpReduce, BlockReduce)) and self.first_reduce is None:
                self.first_reduce = self.pos
        self.region, self.first_reduce = outer_region, outer_reduce

    def statement(self, s) -> None:
        match s:  # the most frequent first: Compute, then VectorExtract
            case Compute():
                self.compute(s)
            case VectorExtract():  # a rename of one lane (`generic`, without its search)
                self.use_value(s.src)
                self.define_value(s.dst)
            case Const():
                self.immediates.add(s.dst)
                self.known[s.dst] = s.value
            case ConstLoad() if not s.offset.terms:
                # A constant array is an LLVM constant global with an initializer: a load at
                # a known index folds to the element (the Philox keys and multipliers of the
                # random-bit kernels are immediates in their PTX).
                self.immediates.add(s.dst)
                self.known[s.dst] = s.array.values.reshape(-1)[s.offset.const].item()
            case ConstLoad():
                # At a varying index: a load from the array's global (LDG.E.CONSTANT in the
                # SASS of Llama's rotary kernels), addressed and hoisted as an input's.
                cse_key = ("load", s.array.name, str(s.offset), ())
                if not self.reuse(s.dst, cse_key):
                    self.access(s.array.name, s.offset)
                    self.define_reusable(s.dst, cse_key, at=self.hoist_to())
            case IndexValue():
                self.use_index(s.index)
                var = _bare_var(s.index)
                if var is not None and var not in self.unrolled:
                    self.current[s.dst] = self.var_key[var]  # the variable's own register
                else:
                    self.define_value(s.dst)
            case IndexLet():
                # Computed where the let stands, but only if something reads it (LLVM deletes
                # a dead let: a guarded store of a scalar to a constant address).
                key = self.var_key[s.var] = ("var", s.var.name, next(self.fresh))
                self.lets[key] = (self.pos, s.index)
            case GlobalLoad():
                reusable = not self.kernel.buffers[s.buffer].is_output
                cse_key = self.load_key(s) if reusable else None
                if self.reuse(s.dst, cse_key):
                    return
                self.access(s.buffer, s.offset)
                if s.dst.dtype == "pred":
                    self.loaded_bools.add(s.dst)
                self.define_reusable(s.dst, cse_key, at=self.hoist_to() if reusable else None)
            case GlobalStore():
                self.access(s.buffer, s.offset, store=True)
                self.use_value(s.value)
            case SharedStore():
                self.use_index(s.index)
                self.use_value(s.value)
                self.shared_stored = self.pos
            case SharedLoad():
                self.use_index(s.index)
                hoist_to = self.hoist_to()  # not above a shared store it may read
                self.define_value(s.dst, at=None if hoist_to is None else
                                  max(hoist_to, self.shared_stored + 1))
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

    def compute(self, s: Compute) -> None:
        """An elementwise op's registers: none where GVN finds it computed before, or where
        ptxas recomputes it at each use."""
        cse_key = ("compute", s.op, s.attr, tuple(map(self.operand, s.args)))
        if self.reuse(s.dst, cse_key):
            return
        if self.rematerialized(s):
            return
        for i, a in enumerate(s.args):
            self.use_value(a, self.half_read(s, i))
        if s.op in OP_TEMPORARIES and compute_dtype(s) == "f32":
            self.define(("sequence", next(self.fresh)), OP_TEMPORARIES[s.op])
        elif sum(op_instructions(s.op, compute_dtype(s)).values()) > 2:
            # A multi-instruction sequence (libdevice, IEEE division and square root)
            # holds intermediate results besides its operands and result.
            self.define(("sequence", next(self.fresh)), SEQUENCE_TEMPORARIES)
        if self.upper_half_zero(s):
            self.narrow.add(s.dst)
        self.define_reusable(s.dst, cse_key)

    def hoist_to(self) -> int | None:
        """Where a load is issued in the hoisted view: its block's start, or the block's first
        warp reduction (None: where it stands)."""
        if not self.hoist_loads:
            return None
        return self.region if self.first_reduce is None else self.first_reduce

    def rematerialized(self, s: Compute) -> bool:
        """An integer add of a register and an immediate is not held: ptxas recomputes it
        (one IADD3/VIADD) right before each use, from the register (seen in the Philox
        kernels' SASS: the round keys key + k * 0x9E3779B9 are added where each round reads
        them, not kept live across the four streams)."""
        if s.op != "add" or s.dst.dtype not in ("s32", "u32"):
            return False
        registers = [a for a in s.args if a not in self.immediates]
        if len(registers) != 1 or registers[0] in self.remat:
            return False
        self.remat[s.dst] = registers[0]
        return True

    def half_read(self, s: Compute, i: int) -> str | None:
        """Which register of a 64-bit integer operand ``i`` of ``s`` reads, if only one."""
        if s.op == "convert" and s.dst.dtype in ("s32", "u32"):
            return "lo"
        if s.op == "shift-right-logical" and i == 0:
            shift = self.known.get(s.args[1])
            return "hi" if isinstance(shift, int) and shift >= 32 else None
        return None

    def upper_half_zero(self, s: Compute) -> bool:
        """Whether a 64-bit integer result is known below 2**32, so that its upper register
        is the constant zero and only the lower one is allocated: a zero extension of a 32-bit
        value, a logical shift right by 32 or more (instcombine turns the pair into
        mul.wide.u32 / mul.hi.u32 on 32-bit registers, seen in the Philox kernels' PTX), or
        a bitwise and with such a value."""
        if REGISTER_WIDTH.get(s.dst.dtype) != 2 or s.dst.dtype[0] != "u":
            return False
        if s.op == "convert":
            return REGISTER_WIDTH.get(s.args[0].dtype, 1) <= 1 and s.args[0].dtype[0] in "up"
        if s.op == "shift-right-logical":
            shift = self.known.get(s.args[1])
            return self.narrow_value(s.args[0]) or (isinstance(shift, int) and shift >= 32)
        if s.op == "and":
            return any(self.narrow_value(a) for a in s.args)
        return False

    def narrow_value(self, v: Value) -> bool:
        return v in self.narrow or (v in self.immediates
                                    and 0 <= self.known.get(v, -1) < 2 ** 32)

    def reuse(self, dst: Value, cse_key) -> bool:
        """Whether ``dst`` is a value computed before (GVN): then it names that register, and
        the eliminated instruction reads nothing (a repeated chain costs only its result)."""
        found = self.lookup(cse_key) if cse_key is not None else None
        if found is not None:
            self.current[dst] = found
        return found is not None

    def define_reusable(self, dst: Value, cse_key, at=None) -> None:
        key = self.define_value(dst, at)
        if cse_key is not None:
            self.available[-1][cse_key] = key

    def generic(self, s) -> None:
        for name in statement_fields(type(s)):
            value = getattr(s, name)
            if isinstance(value, Ix):
                self.use_index(value)
            elif isinstance(value, Var):  # the node defines an index variable
                key = self.var_key[value] = ("var", value.name, next(self.fresh))
                self.define(key, 1)
        for v in used_values(s):
            self.use_value(v)
        for v in defined_values(s):
            self.define_value(v)
        inner = nested_body(s)
        if inner:
            self.walk(inner)

    def loop(self, s: Loop) -> None:
        trips = unrolled_trips(s, self.kernel)
        if trips is None:
            self.rolled_loop(s)
        else:
            self.unroll(s, trips)

    def unroll(self, s: Loop, trips: int) -> None:
        # A body some threads skip is a branch: what it loads or computes does not dominate
        # the code after it, so LLVM cannot reuse it there.
        bounds = trip_bounds(s, self.kernel)
        guarded = bounds is None or bounds[0] == 0
        if guarded:
            self.available.append({})
        outer_iteration = self.iteration
        partial = {a.dst: a.init for a in s.accumulates}
        for k in range(trips):
            self.unrolled[s.var] = (s.start, s.step, k)
            self.iteration = outer_iteration + ((s.var.name, k),)
            for a in s.accumulates:
                if a.carried is not None:  # the body reads the previous iteration's value
                    self.alias(a.carried, partial[a.dst])
            self.walk(s.body)
            self.pos += 1
            for a in s.accumulates:
                if a.carried is not None:  # no combine: the body's value is the next one
                    partial[a.dst] = a.value
                    continue
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

    def alias(self, v: Value, to: Value) -> None:
        """``v`` is another name of ``to``'s register (or immediate)."""
        self.current[v] = self.current.get(to, (to, ()))
        if to in self.immediates:
            self.immediates.add(v)
        else:
            self.immediates.discard(v)

    def rolled_loop(self, s: Loop) -> None:
        self.use_index(s.start)
        stepped = {(x.buffer, str(x.offset)) for x in all_statements(s.body)
                   if isinstance(x, (GlobalLoad, GlobalStore)) and _steps_with(x.offset, s.var)}
        loop = _RolledLoop(first=self.pos, extend=set(), var=s.var, pointers_born=(
            0 if len(stepped) >= STEPPED_BASES else self.pos + PREHEADER))
        counter = self.var_key[s.var] = ("var", s.var.name, next(self.fresh))
        self.define(counter, 1)
        loop.extend.add(counter)
        for a in s.accumulates:
            self.use_value(a.init)
            key = self.define_value(a.dst)
            if a.carried is not None:
                self.current[a.carried] = key
            loop.extend.update(k for k in (key, ("hi", key)) if k in self.start)
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

    def peak_live(self) -> int:
        """The most registers live at once: each register's width from its birth to just
        after its last use, a death before a birth at the same point."""
        if not self.start:
            return 0
        n = len(self.start)
        born = np.fromiter(self.start.values(), np.float64, n)
        width = np.fromiter((self.width[key] for key in self.start), np.int64, n)
        died = np.fromiter((self.end.get(key, at) for key, at in self.start.items()),
                           np.float64, n) + 0.5
        times, changes = np.concatenate([born, died]), np.concatenate([width, -width])
        live = np.cumsum(changes[np.lexsort((changes, times))])  # by time, then change
        return int(live.max())


def _bare_var(index: Ix) -> Var | None:
    """The variable an index is, if it is one variable as is (no instruction computes it)."""
    if index.const == 0 and len(index.terms) == 1:
        atom, coefficient = index.terms[0]
        if isinstance(atom, Var) and coefficient == 1:
            return atom
    return None


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


def occupancy_registers(threads_per_block: int, min_blocks_per_sm: int = 0) -> int:
    """Registers per thread that still let an SM hold as many blocks of this size as its
    block and thread limits allow: 32 for blocks of 64 threads or more (2048 threads), 64 for
    one-warp blocks (32 blocks of 32 threads: the SM can never be full). A kernel that needs
    only ``min_blocks_per_sm`` blocks per SM (`Kernel.min_blocks_per_sm`) may take what
    those leave (255 for one block of 128 threads)."""
    blocks = min(OCCUPANCY_ARCH.max_blocks_per_sm,
                 OCCUPANCY_ARCH.max_threads_per_sm // max(threads_per_block, 1))
    if min_blocks_per_sm:
        blocks = min(blocks, min_blocks_per_sm)
    per_thread = REGISTERS_PER_SM // max(blocks * threads_per_block, 1)
    return min(per_thread - per_thread % 8, OCCUPANCY_ARCH.max_regs_per_thread)


def registers_and_load_window(kernel: Kernel, lanes: dict[Value, int] | None = None
                              ) -> tuple[int, float]:
    """(registers per thread, registers left for loads in flight): see ``register_model``.
    The window is unbounded when every load is hoisted to its block's start, else what the
    occupancy's registers leave beside the kernel with its loads issued where they are used.
    Seen in the SASS (nvdisasm) of BERT's two 45-load straight-line scatter kernels at 32
    registers: at most 16-17 loads pending at once, ~4.5 load latencies when replayed at one
    instruction per cycle; modeled: windows of 11-12 registers, 6-7 latencies."""
    body = expand_block_reduce(kernel)
    lanes = used_lanes(kernel.body) if lanes is None else lanes  # the same for every walk
    hoisted = _Lifetimes(kernel, lanes)
    hoisted.walk(body)
    regs = costmodel.estimate_registers([hoisted.peak_live()])
    keeps_occupancy = occupancy_registers(math.prod(kernel.block), kernel.min_blocks_per_sm)
    full_occupancy = occupancy_registers(math.prod(kernel.block))
    if full_occupancy < regs <= keeps_occupancy:
        # Store addresses are hoisted only up to the full occupancy's registers, even where
        # ``minctasm`` allows more (docs/ARCHITECTURE.md); beyond, each waits for its store.
        loads_only = _Lifetimes(kernel, lanes, hoist_stores=False)
        loads_only.walk(body)
        regs = max(full_occupancy, costmodel.estimate_registers([loads_only.peak_live()]))
    if regs <= keeps_occupancy:
        return regs, math.inf
    # ptxas hoists loads only while that keeps the occupancy the block size allows; beyond,
    # it issues them where they are used (seen: blocks of 64+ threads at 40-89 modeled with
    # hoisting are 32 in ptxas; one-warp blocks go up to 64 with the loads hoisted).
    in_place = _Lifetimes(kernel, lanes, hoist_loads=False)
    in_place.walk(body)
    in_place_regs = costmodel.estimate_registers([in_place.peak_live()])
    return max(keeps_occupancy, in_place_regs), keeps_occupancy - in_place_regs


def register_model(kernel: Kernel) -> int:
    """Registers per thread ptxas is modeled to allocate (the rules: docs/ARCHITECTURE.md)."""
    return registers_and_load_window(kernel)[0]
