"""The instructions one thread of a stitched kernel executes, by op class (paper 4.3).

A loop's body counts once per iteration of its slowest thread. Within a straight-line block
(between branches, loops and barriers) independent global loads are in flight together, so
the block waits one load latency per dependency level, and only the instructions of its
longest dependency chain wait for their operands; the others cost their issue cycles.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache

from costmodel.instructions import (GENERIC_CLASS, OVERLAPPED_LOAD, add_instructions,
                                    op_instructions, overlapped)
from costmodel.latency import chain_latency

from ..index_expr import Ix, Var
from ..kernel_ir import (WARP, Barrier, BlockReduce, Compute, Const, DynamicIndex, GlobalLoad,
                         GlobalStore, If, IndexLet, IndexValue, Kernel, Loop, SharedLoad,
                         SharedStore, Value, VectorExtract, WarpReduce, defined_values,
                         nested_body, used_values)
from ..ops import INTS
from .lowered import REGISTER_WIDTH, compute_dtype, trip_count, unrolled_trips, used_lanes

SHUFFLE_STEPS = WARP.bit_length() - 1  # xor butterfly over 32 lanes: 5 shuffles


class _Block:
    """One straight-line block (between branches, loops and barriers) as it is counted.

    Global loads by dependency level: a load whose address reads no value loaded in the
    block is on level 1, one whose address reads a value loaded on level k (a gathered row, a
    dynamic-slice start) on level k + 1. Values from earlier blocks are on level 0: their
    loads were waited for when those blocks ended.

    The other instructions by dependency chain: ``chain`` holds, for each value computed in
    the block, the longest chain of instructions ending at it (its cycles, ``chain_latency``,
    and its link: the instructions that end it and the link of the chain it extends);
    loaded values and values from earlier blocks start chains. The block's longest chain
    waits each instruction's latency, and every other instruction issues while the chain
    waits (``_InstructionCounter.flush``). A chain's instructions by class are added up
    from its links only for the longest (`chain_counts`): one dict per block, not one per
    value."""

    def __init__(self):
        self.level: dict = {}  # Value or index Var defined in this block -> its level
        self.loads: dict[int, list[float]] = {}  # level -> [loads, registers they hold]
        self.addresses: set = set()  # (buffer, offset less unrolled constants) seen
        self.chain: dict[Value, tuple[float, tuple | None]] = {}  # (cycles, link)
        self.issued: dict[str, float] = {}  # per run of the block, every copy

    def of(self, values=(), index: Ix | None = None) -> int:
        level, highest = self.level, 0
        for d in (*values, *(index.vars() if index is not None else ())):
            at = level.get(d, 0)
            if at > highest:
                highest = at
        return highest

    def load(self, s: GlobalLoad, registers: int, copies: int) -> None:
        level = self.of(index=s.offset) + 1
        self.level[s.dst] = level
        entry = self.loads.setdefault(level, [0.0, 0.0])
        entry[0] += copies
        entry[1] += copies * registers

    def longest(self, values) -> tuple[float, tuple | None]:
        chain, best = self.chain, None
        for v in values:
            c = chain.get(v)
            if c is not None and (best is None or c[0] > best[0]):  # the first longest
                best = c
        return (0.0, None) if best is None else best

    def extend(self, dst: Value, operands, instructions, latency: float, copies: int,
               repeat: int = 1) -> None:
        """``dst`` computed by ``instructions`` (of ``latency`` cycles) from ``operands`` in
        each of ``copies``; its chain repeats them ``repeat`` times (an accumulation across
        unrolled copies)."""
        cycles, link = self.longest(operands)
        self.chain[dst] = (cycles + repeat * latency, (link, instructions, repeat))
        add_instructions(self.issued, instructions, copies)


def chain_counts(link: tuple | None) -> dict[str, float]:
    """A chain's instructions by class, added up from its first link to its last (in that
    order, so each class's sum is the same float as when the chain was extended)."""
    links = []
    while link is not None:
        links.append(link)
        link = link[0]
    counts: dict[str, float] = {}
    for _, instructions, repeat in reversed(links):
        add_instructions(counts, instructions, repeat)
    return counts


class _InstructionCounter:
    """The instructions one thread executes, by op class (``count_instructions``)."""

    def __init__(self, kernel: Kernel, counts: dict[str, float], load_window: float,
                 lanes: dict[Value, int] | None = None):
        self.kernel, self.counts, self.window = kernel, counts, load_window
        self.lanes = used_lanes(kernel.body) if lanes is None else lanes
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

    def times_of_atom(self, atom) -> float:
        return max((self.var_times.get(v, 1.0) for v in _atom_vars(atom)), default=0.0)

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
        # (the atoms of a sum are distinct: their printed form orders terms of equal times)
        for atom, c in sorted(index.terms, key=lambda t: (self.times_of_atom(t[0]),
                                                          t[0].sort_key)):
            if not (_atom_vars(atom) - self.constant):
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
        chain = chain_counts(block.longest(block.chain)[1])
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
        varying = tuple(t for t in offset.terms if _atom_vars(t[0]) - self.constant)
        if (buffer, varying) not in block.addresses:
            block.addresses.add((buffer, varying))
            self.add({"int": 2}, times)

    def walk(self, body: list, times: float, copies: int = 1) -> None:
        """``body`` run ``times`` times; ``copies`` > 1: the iterations of a loop LLVM
        unrolls, one straight-line block whose iterations' loads are independent."""
        block, each = _Block(), times * copies
        for s in body:
            match s:  # the most frequent first: Compute, then VectorExtract
                case Compute():
                    instructions, latency = _NO_INSTRUCTIONS if self.renames_registers(s) \
                        else _op_instructions(s.op, compute_dtype(s))
                    # An accumulator carried through unrolled copies joins them in a chain.
                    repeat = copies if self.carried.intersection(s.args) else 1
                    block.extend(s.dst, s.args, instructions, latency, copies, repeat)
                    block.level[s.dst] = block.of(s.args)
                case VectorExtract():  # as the generic case below counts it
                    self.add(_GENERIC, each)
                    block.level[s.dst] = block.of((s.src,))
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
                    block.extend(s.dst, (), _SHARED_LOAD, _SHARED_LOAD_LATENCY, copies)
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
                    butterfly = _warp_reduce(s.kind, s.dst.dtype, len(s.offsets()))
                    block.extend(s.dst, [s.src], butterfly, chain_latency(butterfly), copies)
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
                    inner = nested_body(s)
                    if inner:  # an empty body would only flush an empty block
                        self.walk(inner, each)
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
                       load_window: float = math.inf,
                       lanes: dict[Value, int] | None = None) -> None:
    """Add the instructions one thread executes to ``counts`` (by op class).

    Loads: ptxas issues a straight-line block's independent loads back to back, so a block
    waits one full load latency per dependency level (``_Block``) and each further load
    of a level costs its issue (OVERLAPPED_LOAD), as long as their values fit in
    ``load_window`` registers; a level holding more waits once per window's worth (ptxas
    issues the rest as registers free up). A loop LLVM unrolls is one such block.

    Other instructions: a block waits the latency of the instructions on its longest
    dependency chain and issues the others behind them (``_Block``). ``lanes``: the
    kernel's `used_lanes`, where the caller has them."""
    _InstructionCounter(kernel, counts, load_window, lanes).walk(kernel.body, 1.0)


_NO_INSTRUCTIONS: tuple[dict[str, float], float] = ({}, 0.0)
_GENERIC = {GENERIC_CLASS: 1}
_SHARED_LOAD = {"ld_shared": 1}
_SHARED_LOAD_LATENCY = chain_latency(_SHARED_LOAD)


@lru_cache(maxsize=None)
def _op_instructions(op: str, dtype: str) -> tuple[Mapping[str, int], float]:
    """An op's instructions by class and their chain latency: both depend on the op and type
    alone, and a kernel has thousands of computes over a few dozen of them."""
    instructions = op_instructions(op, dtype)
    return instructions, chain_latency(instructions)


def _atom_vars(atom) -> set[Var]:
    """The variables of one term of a sum (an Ix of that term alone has the same)."""
    return {atom} if isinstance(atom, Var) else atom.arg.vars()


def _warp_reduce(kind: str, dtype: str, steps: int = SHUFFLE_STEPS) -> dict[str, float]:
    """A butterfly's instructions: per step a shuffle and the combination, a chain."""
    counts = {"shfl": float(steps)}
    add_instructions(counts, op_instructions(kind, dtype), steps)
    return counts
