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
* ptxas issues an input's load at the start of its straight-line block (after the last
  branch, loop or barrier; in a rolled loop, its body's: a phased kernel's 16 loads per
  iteration all issue at the body's top in the SASS) to hide its latency, so the value is
  live from there to its last use (seen in the unrolled warp schedules: loads after the
  shuffles are hoisted above them, but a load after the block's first warp reduction only
  up to that reduction, in whose latency it is issued: ConvNeXt's LayerNorm rows load gamma
  and beta between the first reduction's shuffles), as long as that keeps the occupancy the
  block size allows (32 registers for blocks of 64 threads or more; 64 for one-warp blocks,
  of which an SM holds only 32);
  beyond, ptxas issues loads where they are used and may spill a little to stay there;
  a shared load is issued so too, below the block's last shared store (Mistral's rotary
  kernel: all 16 LDS right after its barrier), and a loaded bool is a byte in a register
  (LDG.E.U8), not a predicate;
* a buffer's base address is a kernel parameter that ptxas reads from the constant bank where
  it is needed (no register); a loop steps one 64-bit pointer per access whose index is
  affine in its variable, accesses to a buffer at constant distances sharing one ([reg+imm]:
  a phased kernel's 16 loads per iteration from 2 pointers; loop strength reduction), and
  one counter, and the indices that built them die in its preheader; a loop stepping 8
  pointers or more steps the kernel parameters' base registers themselves, which then live
  from the kernel's start (seen in packed kernels: a later loop's pointers are live during
  the earlier loops); an access
  whose index is not affine (a remainder, a gathered row) computes its address in the body
  from its buffer's base, which ptxas for sm_90 loads into a register pair before the loop
  (for sm_80 the multiply-add reads it from the constant bank; the model follows sm_90, the
  default target);
  straight-line code keeps one 64-bit address per access pattern and adds constant offsets;
  a store's base address is read from the constant bank at the start of its straight-line
  block, as loads are hoisted, so its register pair lives from there (SASS of a packed
  kernel: the 15 output pointers of a block of scalar stores all read before its first
  store; model 15, ptxas 42 before this rule), one per buffer and varying part of the index
  (stores at constant distances are [reg+imm] from one register pair), while a load's
  address dies at the load; but only up to the full occupancy's registers (ignoring
  ``minctasm``): beyond, the rest are read where the stores free registers (12 loads and 12
  stores to 12 buffers in blocks of 128: 7 bases read before the first store, 5 after,
  32 registers; ResNet's packed optimizer step: each base added at its store, 32);
* a multi-instruction op (libdevice, IEEE division and square root) holds temporaries, more
  for the libdevice functions measured to need more (sine, cosine, tan, atan2, power, ...);
* scalar constants, and elements of constant arrays at a known index (LLVM folds the load
  from the initializer), are immediates and predicates live in predicate registers: none takes
  a general register; an element at a varying index is loaded as an input's (LDG);
* an instruction GVN removes reads nothing: a repeated chain costs only its result (the four
  Philox streams of a dropout kernel repeat one key schedule);
* an integer add of a register and an immediate is recomputed by ptxas at each use (one
  IADD3/VIADD) instead of held: the register lives, the sum only at its use (the Philox round
  keys in the SASS);
* a 64-bit integer is two 32-bit registers that die apart (a truncation reads the low one, a
  shift right by 32 the high one: mul.wide.u32 / mul.hi.u32), and only one when its upper
  half is known zero (a zero extension, a shift right by 32);
* a 128-bit load of which only some lanes are used holds only those (ptxas drops dead lanes:
  v4 loads with one used lane are 32-bit LDGs in the SASS).

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
from costmodel.latency import chain_latency
from costmodel.occupancy import ARCH_LIMITS
from costmodel.instructions import (GENERIC_CLASS, OVERLAPPED_LOAD, add_instructions,
                                    op_instructions, overlapped)

from . import KernelSpec
from .kernel_ir import (UNROLL_FACTOR, WARP, Barrier, BlockReduce, Compute, Const, ConstLoad,
                        DynamicIndex, GlobalLoad, GlobalStore, If, IndexLet, IndexValue, Ix,
                        Kernel, Loop, Mod, SharedLoad, SharedStore, Value, Var, VectorExtract,
                        WarpReduce, defined_values, expand_block_reduce, used_values,
                        value_range)
from .schedule import INTS

SHUFFLE_STEPS = WARP.bit_length() - 1  # xor butterfly over 32 lanes: 5 shuffles
# 32-bit registers per value; default 1 (a 128-bit vector load's value holds 4)
REGISTER_WIDTH = {"s64": 2, "u64": 2, "f64": 2, "pred": 0, "f32x4": 4, "s32x4": 4}
VECTOR_WIDTHS = ("f32x4", "s32x4")
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


def trip_count(loop: Loop) -> int:
    """Iterations of the thread that runs the loop longest (its warp waits for it)."""
    lowest_start, _ = value_range(loop.start)
    return max(0, -(-(loop.stop - lowest_start) // loop.step))


# -- instructions ----------------------------------------------------------------------------

def _compute_dtype(s: Compute) -> str:
    # compare and select produce pred / take pred; the arithmetic happens in the data type.
    return s.args[-1].dtype if s.args else s.dst.dtype


class _Block:
    """One straight-line block (between branches, loops and barriers) as it is counted.

    Global loads by dependency level: a load whose address reads no value loaded in the
    block is on level 1, one whose address reads a value loaded on level k (a gathered row, a
    dynamic-slice start) on level k + 1. Values from earlier blocks are on level 0: their
    loads were waited for when those blocks ended.

    The other instructions by dependency chain: ``chain`` holds, for each value computed in
    the block, the longest chain of instructions ending at it (its cycles, ``chain_latency``,
    and its instructions by class); loaded values and values from earlier blocks
    start chains. The block's longest chain waits each instruction's latency, and every other
    instruction issues while the chain waits (``_InstructionCounter.flush``)."""

    def __init__(self):
        self.level: dict = {}  # Value or index Var defined in this block -> its level
        self.loads: dict[int, list[float]] = {}  # level -> [loads, registers they hold]
        self.addresses: set = set()  # (buffer, offset less unrolled constants) seen
        self.chain: dict[Value, tuple[float, dict[str, float]]] = {}
        self.issued: dict[str, float] = {}  # per run of the block, every copy

    def of(self, values=(), index: Ix | None = None) -> int:
        deps = list(values) + (list(index.vars()) if index is not None else [])
        return max((self.level.get(d, 0) for d in deps), default=0)

    def load(self, s: GlobalLoad, registers: int, copies: int) -> None:
        level = self.of(index=s.offset) + 1
        self.level[s.dst] = level
        entry = self.loads.setdefault(level, [0.0, 0.0])
        entry[0] += copies
        entry[1] += copies * registers

    def longest(self, values) -> tuple[float, dict[str, float]]:
        return max((self.chain[v] for v in values if v in self.chain),
                   key=lambda c: c[0], default=(0.0, {}))

    def extend(self, dst: Value, operands, instructions, copies: int, repeat: int = 1) -> None:
        """``dst`` computed by ``instructions`` from ``operands`` in each of ``copies``; its
        chain repeats them ``repeat`` times (an accumulation across unrolled copies)."""
        cycles, counts = self.longest(operands)
        counts = dict(counts)
        add_instructions(counts, instructions, repeat)
        self.chain[dst] = (cycles + repeat * chain_latency(instructions), counts)
        add_instructions(self.issued, instructions, copies)


class _InstructionCounter:
    """The instructions one thread executes, by op class (``count_instructions``)."""

    def __init__(self, kernel: Kernel, counts: dict[str, float], load_window: float):
        self.kernel, self.counts, self.window = kernel, counts, load_window
        self.lanes = _used_lanes(kernel.body)
        # Index arithmetic (see `index`): how often each variable takes a new value, the
        # variables that are constants in each copy of an unrolled loop (which take a new
        # value per copy), and the sub-expressions already computed.
        self.var_times: dict[Var, float] = {kernel.tid: 1.0, kernel.bid: 1.0}
        self.constant: set[Var] = set()
        self.computed: set = set()
        self.known: dict[Value, object] = {}  # constants' values
        self.carried: set[Value] = set()  # accumulators of the unrolled loop being walked

    def add(self, instructions, times: float) -> None:
        add_instructions(self.counts, instructions, times)

    def renames_registers(self, s: Compute) -> bool:
        """An integer op that only picks registers, no instruction: a conversion between
        integer widths (a 64-bit integer is two 32-bit registers: truncating reads the low
        one, a zero extension pairs it with RZ) and a logical shift right of a 64-bit
        integer by 32 (the high one). Seen in the SASS (sm_90) of Transformer train TF's
        Philox dropout kernel: 1,004 integer instructions, where counting its 1,868
        conversions and 619 such shifts as one each made 4,695 (now 2,339)."""
        if s.op == "convert":
            return s.args[0].dtype in INTS and s.dst.dtype in INTS
        return s.op == "shift-right-logical" and REGISTER_WIDTH.get(s.dst.dtype) == 2 and \
            self.known.get(s.args[1]) == 32

    def times_of(self, index: Ix) -> float:
        return max((self.var_times.get(v, 1.0) for v in index.vars()), default=0.0)

    def index(self, index: Ix) -> None:
        """Integer instructions for an index, as LLVM's GVN, LICM and reassociation leave
        them: each sub-expression (a division or remainder, a partial sum) is computed once,
        as often as its variables change (a thread's base offset once, a loop's step each
        iteration), and a variable of an unrolled loop is a constant in each copy (an
        immediate offset). Terms are added outermost first, so that the partial sums of
        invariant terms are loop invariants. BERT train JAX's 6-phase LayerNorm chain has
        about 430 integer instructions in its SASS (sm_90, static count) for 222 loads;
        counting every index from scratch gave 3,028 per thread, this 456."""
        prefix: tuple = ()
        for atom, c in sorted(index.terms, key=lambda t: (self.times_of(Ix((t,))), repr(t))):
            if not (Ix(((atom, c),)).vars() - self.constant):
                continue  # a constant in each copy: folded into the offset
            if not isinstance(atom, Var) and atom not in self.computed:
                self.computed.add(atom)
                self.index(atom.arg)
                self.add({"int": 1}, self.times_of(atom.arg))
            prefix += ((atom, c),)
            if (len(prefix) > 1 or c != 1) and prefix not in self.computed:
                self.computed.add(prefix)
                self.add({"int": 1}, self.times_of(Ix(prefix)))

    def flush(self, block: _Block, times: float) -> None:
        """Charge a block's loads: each level waits a full load latency once per batch of
        loads the register window holds in flight, its other loads issue behind it. Then its
        other instructions: those of its longest dependency chain wait their latency, every
        other one issues while they wait (ptxas interleaves independent chains: the copies
        of an unrolled loop, the per-point work of a straight-line stage), so it costs only
        its issue cycles (``<class>_overlapped``)."""
        _, chain = block.longest(block.chain)
        self.add(chain, times)
        self.add({overlapped(k): n - chain.get(k, 0.0) for k, n in block.issued.items()
                  if n > chain.get(k, 0.0)}, times)
        block.chain.clear()
        block.issued.clear()
        for loads, registers in block.loads.values():
            batches = loads if self.window <= 0 else \
                min(loads, max(1, math.ceil(registers / self.window)))
            self.add({"ld_global": batches}, times)
            if loads > batches:
                self.add({OVERLAPPED_LOAD: loads - batches}, times)
        block.loads.clear()
        block.level.clear()
        block.addresses.clear()

    def address(self, block: _Block, buffer: int, offset: Ix, times: float) -> None:
        """A global access's 64-bit address: a buffer's base plus the offset is two adds
        (IADD3, IADD3.X) per access pattern of a straight-line block; the copies of an
        unrolled loop and constant offsets share it (``[R+imm]`` in the SASS)."""
        varying = tuple(t for t in offset.terms if Ix((t,)).vars() - self.constant)
        if (buffer, varying) not in block.addresses:
            block.addresses.add((buffer, varying))
            self.add({"int": 2}, times)

    def walk(self, body: list, times: float, copies: int = 1) -> None:
        """``body`` run ``times`` times; ``copies`` > 1: the iterations of a loop LLVM
        unrolls, one straight-line block whose iterations' loads are independent."""
        block, each = _Block(), times * copies
        for s in body:
            match s:
                case Const():
                    self.known[s.dst] = s.value  # an immediate
                case IndexValue():
                    self.index(s.index)
                    block.level[s.dst] = block.of(index=s.index)
                case IndexLet():
                    self.index(s.index)
                    self.var_times[s.var] = self.times_of(s.index)
                    if not s.index.vars() - self.constant:
                        self.constant.add(s.var)
                    block.level[s.var] = block.of(index=s.index)
                case Compute():
                    instructions = {} if self.renames_registers(s) else \
                        op_instructions(s.op, _compute_dtype(s))
                    # An accumulator carried through unrolled copies joins them in a chain.
                    repeat = copies if self.carried.intersection(s.args) else 1
                    block.extend(s.dst, s.args, instructions, copies, repeat)
                    block.level[s.dst] = block.of(s.args)
                case GlobalLoad():
                    self.index(s.offset)
                    self.address(block, s.buffer, s.offset, times)
                    block.load(s, self.lanes.get(s.dst, REGISTER_WIDTH.get(s.dst.dtype, 1)),
                               copies)
                case GlobalStore():
                    self.add({"st_global": 1}, each)
                    self.index(s.offset)
                    self.address(block, s.buffer, s.offset, times)
                case SharedLoad():
                    block.extend(s.dst, (), {"ld_shared": 1}, copies)
                    self.index(s.index)
                case SharedStore():
                    self.add({"st_shared": 1}, each)
                    self.index(s.index)
                case Loop():
                    self.flush(block, times)
                    self.loop(s, each)
                case If():
                    self.flush(block, times)
                    self.add({"int": 1}, each)
                    self.walk(s.body, each)  # if any lane of the warp does
                case WarpReduce():
                    block.extend(s.dst, [s.src], _warp_reduce(s.kind, s.dst.dtype,
                                                              len(s.offsets())), copies)
                    block.level[s.dst] = block.of([s.src])
                case BlockReduce():  # as expand_block_reduce lowers it: a barrier inside
                    self.flush(block, times)
                    self.add(_warp_reduce(s.kind, s.dst.dtype), 2 * each)
                    self.add({"st_shared": 1, "barrier": 1, "ld_shared": 1, "int": 2,
                              "fp32": 1}, each)
                case Barrier():
                    self.flush(block, times)
                    self.add({"barrier": 1}, each)
                case _:
                    self.add({GENERIC_CLASS: 1}, each)
                    level = block.of(used_values(s))
                    for v in defined_values(s):  # a vector's lanes, a dynamic index
                        block.level[v] = level
                    if isinstance(s, DynamicIndex):
                        block.level[s.var] = level
                        self.var_times[s.var] = each
                    self.walk(_nested_body(s), each)
        self.flush(block, times)

    def loop(self, s: Loop, times: float) -> None:
        trips = trip_count(s)
        self.index(s.start)
        self.var_times[s.var] = times * trips
        unrolled = unrolled_trips(s, self.kernel) is not None and trips > 1
        if unrolled:
            self.constant.add(s.var)
            outer, self.carried = self.carried, {a.carried for a in s.accumulates
                                                 if a.carried is not None}
            self.walk(s.body, times, copies=trips)
            self.carried = outer
        else:
            self.walk(s.body, times * trips)
            self.add({"int": 2}, times * trips)  # step, compare-and-branch
        for a in s.accumulates:
            if a.carried is None:  # else the body computes the combination
                self.add(op_instructions(a.kind, a.dst.dtype), times * trips)


def count_instructions(kernel: Kernel, counts: dict[str, float],
                       load_window: float = math.inf) -> None:
    """Add the instructions one thread executes to ``counts`` (by op class).

    Loads: ptxas issues a straight-line block's independent loads back to back, so a block
    waits one full load latency per dependency level (``_Block``) and each further load
    of a level costs its issue (OVERLAPPED_LOAD), as long as their values fit in
    ``load_window`` registers; a level holding more waits once per window's worth (ptxas
    issues the rest as registers free up). A loop LLVM unrolls is one such block.

    Other instructions: a block waits the latency of the instructions on its longest
    dependency chain and issues the others behind them (``_Block``)."""
    _InstructionCounter(kernel, counts, load_window).walk(kernel.body, 1.0)


def _warp_reduce(kind: str, dtype: str, steps: int = SHUFFLE_STEPS) -> dict[str, float]:
    """A butterfly's instructions: per step a shuffle and the combination, a chain."""
    counts = {"shfl": float(steps)}
    add_instructions(counts, op_instructions(kind, dtype), steps)
    return counts


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

    def __init__(self, kernel: Kernel, hoist_loads: bool = True, hoist_stores: bool = True):
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
        self.lanes = _used_lanes(kernel.body)
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
        return next((scope[cse_key] for scope in reversed(self.available) if cse_key in scope),
                    None)

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
        # A store's base is read at the start of its block (see the module docstring).
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
        match s:
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
            case Compute():
                cse_key = ("compute", s.op, s.attr, tuple(self.operand(a) for a in s.args))
                if self.reuse(s.dst, cse_key):
                    return
                if self.rematerialized(s):
                    return
                for i, a in enumerate(s.args):
                    self.use_value(a, self.half_read(s, i))
                if s.op in OP_TEMPORARIES and _compute_dtype(s) == "f32":
                    self.define(("sequence", next(self.fresh)), OP_TEMPORARIES[s.op])
                elif sum(op_instructions(s.op, _compute_dtype(s)).values()) > 2:
                    # A multi-instruction sequence (libdevice, IEEE division and square root)
                    # holds intermediate results besides its operands and result.
                    self.define(("sequence", next(self.fresh)), SEQUENCE_TEMPORARIES)
                if self.upper_half_zero(s):
                    self.narrow.add(s.dst)
                self.define_reusable(s.dst, cse_key)
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
        stepped = {(x.buffer, str(x.offset)) for x in _flatten(s.body)
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

    def live_counts(self) -> list[int]:
        events = []
        for key, born in self.start.items():
            events += [(born, self.width[key]), (self.end.get(key, born) + 0.5, -self.width[key])]
        live, counts = 0, []
        for _, change in sorted(events):
            live += change
            counts.append(live)
        return counts


def _bare_var(index: Ix) -> Var | None:
    """The variable an index is, if it is one variable as is (no instruction computes it)."""
    if index.const == 0 and len(index.terms) == 1:
        atom, coefficient = index.terms[0]
        if isinstance(atom, Var) and coefficient == 1:
            return atom
    return None


def _used_lanes(body: list) -> dict[Value, int]:
    """Registers of each vector value only read through lane extracts: the lanes whose
    extract is used (ptxas drops the dead lanes of a 128-bit load: the corpus's v4 loads of
    which one lane is used are 32-bit LDGs in their SASS)."""
    statements = list(_flatten(body))
    used = {v for s in statements for v in used_values(s)}
    lanes: dict[Value, set[int]] = {}
    whole = set()  # vectors read whole (stored, packed): every lane is a register
    for s in statements:
        if isinstance(s, VectorExtract):
            lanes.setdefault(s.src, set())
            if s.dst in used:
                lanes[s.src].add(s.lane)
        elif not isinstance(s, (Loop, If)):  # their bodies' reads are visited one by one
            whole.update(v for v in used_values(s) if v.dtype in VECTOR_WIDTHS)
    return {v: max(1, len(used_lanes)) for v, used_lanes in lanes.items() if v not in whole}


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
    """The range of an index LLVM can prove: threadIdx.x is below the block size (the kernel's
    ``maxntidx`` annotation, from which LLVM's NVVMIntrRange pass bounds the intrinsic: a
    16 x 32 tile of 512 threads unrolls its 8-trip loop over ``tid // 16`` fully, as it would
    not for tid < 1024), remainders are below their divisor; other variables are unknown."""
    lo = hi = index.const
    for atom, c in index.terms:
        if isinstance(atom, Var):
            if atom != kernel.tid:
                return None
            alo, ahi = 0, kernel.block[0] - 1
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
    scalar, seen without a loop in the PTX), is a guarded body. Otherwise only a loop of
    exactly ``UNROLL_FACTOR`` trips for every start LLVM can prove (``_known_range``) becomes
    straight-line code; longer loops are unrolled in groups (counted as loops here), shorter
    ones not at all; loops that store were seen unrolled only partially, which leaves their
    values short-lived, so they count as loops. LLVM also keeps an 8-trip loop with a large
    body a loop (UNROLL_FACTOR), which this does not see: such a loop is priced as unrolled."""
    if not loop.accumulates and not _reads_var(loop.body, loop.var):
        return 1
    bounds = _trip_bounds(loop, kernel)
    if bounds is None:
        return None
    least, most = bounds
    if most <= 1:
        return most
    stores = any(isinstance(x, GlobalStore) for x in _flatten(loop.body))
    if most == least == UNROLL_FACTOR and not stores:
        return most
    return None


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


def _registers_and_load_window(spec: KernelSpec) -> tuple[int, float]:
    """(registers per thread, registers left for loads in flight): see ``register_model``.
    The window is unbounded when every load is hoisted to its block's start, else what the
    occupancy's registers leave beside the kernel with its loads issued where they are used.
    Seen in the SASS (nvdisasm) of BERT's two 45-load straight-line scatter kernels at 32
    registers: at most 16-17 loads pending at once, ~4.5 load latencies when replayed at one
    instruction per cycle; modeled: windows of 11-12 registers, 6-7 latencies."""
    body = expand_block_reduce(spec.kernel)
    hoisted = _Lifetimes(spec.kernel)
    hoisted.walk(body)
    regs = costmodel.estimate_registers(hoisted.live_counts())
    keeps_occupancy = occupancy_registers(math.prod(spec.kernel.block),
                                          spec.kernel.min_blocks_per_sm)
    full_occupancy = occupancy_registers(math.prod(spec.kernel.block))
    if full_occupancy < regs <= keeps_occupancy:
        # Store addresses are hoisted only up to the full occupancy's registers, even where
        # ``minctasm`` allows more (see the module docstring); beyond, each waits for its store.
        loads_only = _Lifetimes(spec.kernel, hoist_stores=False)
        loads_only.walk(body)
        regs = max(full_occupancy, costmodel.estimate_registers(loads_only.live_counts()))
    if regs <= keeps_occupancy:
        return regs, math.inf
    # ptxas hoists loads only while that keeps the occupancy the block size allows; beyond,
    # it issues them where they are used (seen: blocks of 64+ threads at 40-89 modeled with
    # hoisting are 32 in ptxas; one-warp blocks go up to 64 with the loads hoisted).
    in_place = _Lifetimes(spec.kernel, hoist_loads=False)
    in_place.walk(body)
    in_place_regs = costmodel.estimate_registers(in_place.live_counts())
    return max(keeps_occupancy, in_place_regs), keeps_occupancy - in_place_regs


def register_model(spec: KernelSpec) -> int:
    """Registers per thread ptxas is modeled to allocate (see the module docstring)."""
    return _registers_and_load_window(spec)[0]


# -- the latency-evaluator's view --------------------------------------------------------------

def kernel_profile(spec: KernelSpec) -> costmodel.KernelProfile:
    regs, load_window = _registers_and_load_window(spec)
    counts: dict[str, float] = {}
    count_instructions(spec.kernel, counts, load_window)
    return costmodel.KernelProfile(
        grid_blocks=math.prod(spec.grid), threads_per_block=math.prod(spec.block),
        regs_per_thread=regs, smem_bytes=spec.smem_bytes,
        instructions=counts, bytes_read=spec.read_bytes, bytes_written=spec.write_bytes)


def modeled_kernel_us(spec: KernelSpec, device: costmodel.Device) -> float:
    """The latency-evaluator's time for this kernel on ``device`` (modeled, not measured),
    from the profile ``generate`` kept when there is one."""
    profile = spec.profile if spec.profile is not None else kernel_profile(spec)
    return costmodel.kernel_latency_us(profile, device).total_us

