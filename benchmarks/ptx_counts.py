"""Global loads and stores a PTX kernel executes, for the PTX comparison (compare_xla_ptx.py).

Outside loops, an access is counted once for every launched thread that reaches it. Which
threads reach it is decided from the guards on the straight-line path to it: its own
predicate (``@%p ld``), each forward branch over it (``@%p bra`` to a label after it) and
each ``@%p ret`` before it, back to the nearest label (a label is a join: guards above it
need not hold on every path, so they are not applied). A guard counts when its predicate
is a function of the thread and block index alone (``ThreadValues``); any other guard (on
a loaded or shuffled value) is ignored, so the thread counts as executing. A row
reduction's result store guarded to one thread per row then counts once per row, as it
executes, not once per launched thread.

Inside a loop (a cycle of the control-flow graph) an access is counted per thread and per
iteration by the caller, every thread counting.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import networkx as nx
import numpy as np

_WIDTH_BITS = {"b8": 8, "u8": 8, "s8": 8, "b16": 16, "f16": 16, "u16": 16, "s16": 16,
               "b32": 32, "f32": 32, "u32": 32, "s32": 32, "b64": 64, "f64": 64, "u64": 64,
               "s64": 64}
_COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
            "gt": np.greater, "ge": np.greater_equal}
_INTEGER_OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "and": np.bitwise_and,
                "or": np.bitwise_or, "xor": np.bitwise_xor, "min": np.minimum,
                "max": np.maximum, "shl": np.left_shift}


@dataclass
class PtxCounts:
    loads: int  # ld.global instructions executed outside loops, summed over threads
    load_bytes: int  # bytes those load
    stores: int
    store_bytes: int
    looped_loads: int  # static ld.global instructions inside a loop (per thread, per trip)
    looped_load_bytes: int
    looped_stores: int


@dataclass
class _Instruction:
    guard: tuple[str, bool] | None  # (predicate register, negated)
    opcode: str
    operands: list[str]


def _parse(line: str) -> _Instruction | None:
    m = re.match(r"^\s*(?:@(!?)(%\w+)\s+)?([a-z][\w.]*)\s*(.*?);", line)
    if not m:
        return None
    negated, predicate, opcode, rest = m.groups()
    operands = [o.strip() for o in rest.split(",")] if rest.strip() else []
    return _Instruction((predicate, negated == "!") if predicate else None, opcode, operands)


def _normalize(value: np.ndarray, kind: str) -> np.ndarray:
    """Wraps an int64 array to the PTX type's width (signed types keep their sign)."""
    bits = _WIDTH_BITS.get(kind, 64)  # predicates and 64-bit types as they are
    if bits >= 64:
        return value
    value = value & ((1 << bits) - 1)
    return value - ((value >> (bits - 1)) << bits) if kind.startswith("s") else value


class ThreadValues:
    """Registers as functions of the launched thread: each evaluated for every thread (a
    numpy array over ``grid * block`` threads) where it has one definition in the kernel and
    that definition depends on %tid.x, %ctaid.x, %ntid.x, %nctaid.x and immediates only."""

    def __init__(self, instructions: list[_Instruction], grid: int, block: int):
        self.definitions: dict[str, _Instruction | None] = {}
        for inst in instructions:
            if inst.operands and not inst.opcode.startswith(("st.", "bra", "bar", "ret")):
                for dst in re.findall(r"%\w+", inst.operands[0]):  # {%r1, %r2}: vector loads
                    # A register defined twice (a phi, a loop counter) has no one value.
                    self.definitions[dst] = None if dst in self.definitions else inst
        tid, bid = np.arange(block), np.arange(grid)
        self.special = {"%tid.x": np.tile(tid, grid), "%ctaid.x": np.repeat(bid, block),
                        "%ntid.x": np.full(grid * block, block),
                        "%nctaid.x": np.full(grid * block, grid)}
        self.threads = grid * block
        self.memo: dict[str, np.ndarray | None] = {}

    def value(self, operand: str) -> np.ndarray | None:
        if operand in self.special:
            return self.special[operand]
        if re.fullmatch(r"-?\d+|0[xX][0-9a-fA-F]+", operand):
            return np.full(self.threads, int(operand, 0), dtype=np.int64)
        if not operand.startswith("%") or operand not in self.definitions:
            return None
        if operand not in self.memo:
            self.memo[operand] = None  # a cycle through the definitions has no value
            inst = self.definitions[operand]
            self.memo[operand] = None if inst is None else self._evaluate(inst)
        return self.memo[operand]

    def _evaluate(self, inst: _Instruction) -> np.ndarray | None:
        if inst.guard is not None:
            return None  # defined only for some threads
        parts = inst.opcode.split(".")
        kind = parts[-1]
        args = [self.value(o) for o in inst.operands[1:]]
        if any(a is None for a in args):
            return None
        if parts[0] == "mov" and len(args) == 1:
            return args[0]
        if parts[0] == "cvt":  # cvt.dtype.atype: integer conversions only
            types = [p for p in parts[1:] if p in _WIDTH_BITS]
            return _normalize(args[0], types[0]) if all(t[0] in "usb" for t in types) else None
        if parts[0] == "not":
            return ~args[0] if kind == "pred" else _normalize(~args[0], kind)
        if parts[0] == "setp" and parts[1] in _COMPARE:
            a, b = (_normalize(x, "u" + kind[1:] if kind[0] == "b" else kind) for x in args)
            return _COMPARE[parts[1]](a, b)
        if parts[0] == "selp":
            return np.where(args[2].astype(bool), args[0], args[1])
        if kind == "pred" and parts[0] in ("and", "or", "xor"):
            return _INTEGER_OPS[parts[0]](args[0].astype(bool), args[1].astype(bool))
        if kind[0] not in "usb" or len(args) != 2 or "wide" in parts or "hi" in parts:
            return None
        a, b = (_normalize(x, kind) for x in args)
        if parts[0] in _INTEGER_OPS:
            return _normalize(_INTEGER_OPS[parts[0]](a, b), kind)
        if parts[0] == "shr":
            return _normalize(a >> b, kind)
        if parts[0] in ("div", "rem") and np.all(b != 0):
            quotient = np.trunc(a / b).astype(np.int64)  # PTX rounds toward zero
            return _normalize(quotient if parts[0] == "div" else a - quotient * b, kind)
        return None


def _access_bytes(opcode: str) -> int:
    parts = opcode.split(".")
    lanes = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d", p)), 1)
    return lanes * _WIDTH_BITS.get(parts[-1], 32) // 8


def _in_loops(lines: list[str], parsed: list, labels: dict[str, int],
              branches: dict[int, int | None]) -> list[bool]:
    """Per line, whether it lies on a cycle of the control-flow graph. A branch back to an
    earlier label is not enough: LLVM places some blocks out of line (a rare path after the
    kernel's ret, branching back to where it left)."""
    starts = sorted({0, *labels.values(), *(i + 1 for i in branches),
                     *(i + 1 for i, inst in enumerate(parsed) if inst and inst.opcode == "ret")})
    starts = [b for b in starts if b < len(lines)]
    block_of = np.searchsorted(starts, np.arange(len(lines)), side="right") - 1
    cfg = nx.DiGraph()
    for k, start in enumerate(starts):
        end = starts[k + 1] - 1 if k + 1 < len(starts) else len(lines) - 1
        cfg.add_node(k)
        last = next((parsed[i] for i in range(end, start - 1, -1) if parsed[i]), None)
        if end in branches and branches[end] is not None:
            cfg.add_edge(k, int(block_of[branches[end]]))
        ends_path = last is not None and last.guard is None and (
            last.opcode == "ret" or last.opcode.startswith("bra"))
        if not ends_path and k + 1 < len(starts):
            cfg.add_edge(k, k + 1)
    cyclic = {k for component in nx.strongly_connected_components(cfg) for k in component
              if len(component) > 1 or cfg.has_edge(k, k)}
    return [int(block_of[i]) in cyclic for i in range(len(lines))]


def count_accesses(ptx: str, grid: int, block: int) -> PtxCounts:
    """Global loads/stores of a PTX kernel launched as ``grid`` blocks of ``block`` threads:
    executed ones outside loops, static ones inside (see the module docstring)."""
    lines = ptx.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines)
              if (m := re.match(r"^(\$L\w+):", line.strip()))}
    parsed = [_parse(line) for line in lines]
    branches = {i: labels.get(inst.operands[-1]) for i, inst in enumerate(parsed)
                if inst and inst.opcode.startswith("bra") and inst.operands}
    looped = _in_loops(lines, parsed, labels, branches)
    values = ThreadValues([inst for inst in parsed if inst], grid, block)

    def holds(guard: tuple[str, bool]) -> np.ndarray | None:
        value = values.value(guard[0])
        return None if value is None else value.astype(bool) != guard[1]

    def executing(i: int) -> int:
        mask = np.ones(grid * block, dtype=bool)
        if parsed[i].guard and (h := holds(parsed[i].guard)) is not None:
            mask &= h
        for j in range(i - 1, -1, -1):
            if lines[j].strip().startswith("$L"):
                break  # a join: the guards above it need not hold on every path
            inst = parsed[j]
            if inst is None or inst.guard is None:
                continue
            skips = inst.opcode.startswith("bra") and (branches.get(j) or -1) > i
            if (skips or inst.opcode == "ret") and (h := holds(inst.guard)) is not None:
                mask &= ~h
        return int(mask.sum())

    counts = PtxCounts(0, 0, 0, 0, 0, 0, 0)
    for i, line in enumerate(lines):
        in_loop = looped[i]
        for opcode in re.findall(r"\b(ld\.global[\w.]*|st\.global[\w.]*)", line):
            size = _access_bytes(opcode)
            threads = 0 if in_loop else executing(i)
            if opcode.startswith("ld"):
                counts.loads += threads
                counts.load_bytes += size * threads
                counts.looped_loads += in_loop
                counts.looped_load_bytes += size * in_loop
            else:
                counts.stores += threads
                counts.store_bytes += size * threads
                counts.looped_stores += in_loop
    return counts
