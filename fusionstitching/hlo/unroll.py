"""Small while loops of integer arithmetic unrolled into the entry computation
(``unroll_loops``), so that a plan can stitch across their iterations.

jax lowers its threefry generator (dropout's random bits) to a rolled loop of 5 iterations on
CPU; XLA:CPU runs each iteration as a dozen thunks (copies of the loop state, two fusions, the
counter), which costs more than the bits. A loop is unrolled when XLA has annotated its trip
count, the trip count times its body's size is small, its body computes integers only (then
the bits cannot change), and nothing in it is a dot, a custom call, nested control flow or has
side effects. Why: docs/ARCHITECTURE.md, "Loops unrolled on the host route".
"""
from __future__ import annotations

import dataclasses
import enum

from .ir import Computation, Instruction, Module, Shape

# Trip count times body instructions, at most: the unrolled code stays a few hundred
# instructions per loop (jax's threefry: 5 x about 25).
MAX_UNROLLED_INSTRUCTIONS = 400
# Instructions that keep a loop rolled: compute-bound or opaque work (not this compiler's
# business), nested control flow, and anything with side effects or state of its own.
KEEPS_ROLLED = {
    "dot", "convolution", "custom-call", "while", "conditional", "call", "async-start",
    "async-done", "async-update", "fusion-start", "fusion-done", "rng", "rng-bit-generator",
    "rng-get-and-update-state", "infeed", "outfeed", "send", "send-done", "recv",
    "recv-done", "all-reduce", "all-reduce-start", "all-reduce-done", "all-gather",
    "all-gather-start", "all-gather-done", "all-to-all", "reduce-scatter",
    "collective-permute", "collective-permute-start", "collective-permute-done",
    "collective-broadcast", "partition-id", "replica-id", "after-all", "add-dependency",
    "optimization-barrier", "domain", "cholesky", "triangular-solve", "fft",
}


def unroll_loops(module: Module) -> Module:
    """``module`` with each unrollable ``while`` of its entry (or wrapped by a call of its
    entry: XLA:CPU's small calls) replaced by its iterations; ``module`` itself when there is
    none."""
    entry = module.entry
    users = entry.users()
    by_name = entry.by_name()
    loops: dict[str, tuple[Instruction, int]] = {}  # entry instruction -> (its loop, trips)
    for inst in entry.instructions:
        loop = _loop_of(module, inst)
        if loop is not None:
            reads = [by_name[u] for u in users.get(inst.name, [])]
            trips = unrollable_trips(module, loop, reads)
            if isinstance(trips, int):
                loops[inst.name] = (loop, trips)
    if not loops:
        return module
    renamed: dict[str, str] = {}  # a get-tuple-element of an unrolled loop -> its value
    instructions: list[Instruction] = []
    for inst in entry.instructions:
        inst = _with_operands(inst, [renamed.get(o, o) for o in inst.operands])
        if inst.name in renamed:
            continue  # a read of an unrolled loop's state: the value it names stands for it
        if inst.name not in loops:
            instructions.append(inst)
            continue
        loop, trips = loops[inst.name]
        # a call's operand is its loop's (_loop_of)
        state = _initial_state(inst.name, loop.shape, by_name[inst.operands[0]], instructions)
        body = module.computation(_attr_name(loop, "body"))
        for iteration in range(trips):
            state = _iteration(body, state, f"{inst.name}.{iteration}", instructions)
        reads = [by_name[u] for u in users.get(inst.name, [])]
        if inst.is_root or any(read.is_root for read in reads):  # the root keeps its name
            instructions.append(Instruction(inst.name, inst.shape, "tuple", state,
                                            is_root=inst.is_root))
        renamed.update((read.name, state[int(read.attrs["index"])]) for read in reads
                       if not read.is_root)
    names = {i.name for i in instructions}
    gone = {name for name in loops if name not in names} | set(renamed)
    before = {i.name for i in entry.instructions}
    instructions = _bitcasts_as_reshapes(instructions, before)
    # an unrolled loop and its reads: the values they stood for are computed before
    # anything reads them
    instructions = [i.without_control_predecessors(gone) for i in instructions]
    instructions = _without_dead(instructions)
    kept = dataclasses.replace(entry, instructions=instructions)
    return dataclasses.replace(module, computations=_reachable(module, kept))


def _loop_of(module: Module, inst: Instruction) -> Instruction | None:
    """The ``while`` that entry instruction ``inst`` is, or that it calls: a computation of
    one parameter and a loop over it (XLA:CPU's ``xla_cpu_small_call``); else None."""
    if inst.opcode == "while":
        return inst
    if inst.opcode != "call" or len(inst.operands) != 1:
        return None
    callee = module.computation(inst.called_computations[0])
    if [i.opcode for i in callee.instructions] != ["parameter", "while"]:
        return None
    param, loop = callee.instructions
    return loop if loop.is_root and loop.operands == [param.name] else None


class RolledKind(enum.Enum):
    """Why a loop stays rolled."""

    NO_TRIP_COUNT = "XLA did not annotate the loop's trip count"
    TOO_LARGE = "trip count times body instructions over MAX_UNROLLED_INSTRUCTIONS"
    KEPT_OPCODE = "its body calls an instruction of KEEPS_ROLLED"
    STATE_FORM = "its state is not a flat tuple read element by element"
    FLOATING_POINT = "its body computes floating-point values"


@dataclasses.dataclass(frozen=True)
class KeptRolled:
    kind: RolledKind
    detail: str


def unrollable_trips(module: Module, inst: Instruction, reads: list[Instruction]
                     ) -> int | KeptRolled:
    """The trip count of ``while`` ``inst`` (``reads``: the instructions that read its value)
    when `unroll_loops` unrolls it, else why not."""
    trips = ((inst.attr_json() or {}).get("known_trip_count") or {}).get("n")
    if trips is None or not str(trips).isdigit() or int(trips) < 1:
        return KeptRolled(RolledKind.NO_TRIP_COUNT, f"{inst.name}: known_trip_count {trips}")
    body = module.computation(_attr_name(inst, "body"))
    size = int(trips) * len(body.instructions)
    if size > MAX_UNROLLED_INSTRUCTIONS:
        return KeptRolled(RolledKind.TOO_LARGE, f"{inst.name}: {trips} x "
                          f"{len(body.instructions)} instructions")
    for name in sorted(module.called_by([inst])):
        for called in module.computation(name).instructions:
            if called.opcode in KEEPS_ROLLED:
                return KeptRolled(RolledKind.KEPT_OPCODE, f"{inst.name}: {called.name} is a "
                                  f"{called.opcode}")
            if not all(_integer(leaf.dtype) for leaf in called.shape.leaves()):
                return KeptRolled(RolledKind.FLOATING_POINT, f"{inst.name}: {called.name} is "
                                  f"{called.shape}")
    flat = inst.shape.is_tuple and not any(s.is_tuple for s in inst.shape.tuple_shapes)
    (param,) = body.parameters or [None]
    if len(inst.operands) != 1 or not flat or param is None or \
            body.root.opcode != "tuple" or \
            len(body.root.operands) != len(inst.shape.tuple_shapes):
        return KeptRolled(RolledKind.STATE_FORM, f"{inst.name}: not a flat tuple")
    reads = reads + [body.by_name()[u] for u in body.users().get(param.name, [])]
    for read in reads:
        if read.opcode != "get-tuple-element" or "index" not in read.attrs:
            return KeptRolled(RolledKind.STATE_FORM, f"{inst.name}: {read.name} reads the "
                              "whole state")
    return int(trips)


def _integer(dtype: str) -> bool:
    """Integers and predicates: XLA fuses an unrolled loop's float arithmetic differently (a
    multiply and an add contracted, say) and its bits change; integer arithmetic (threefry's)
    gives the same bits however it is fused."""
    return dtype == "pred" or dtype.startswith(("s", "u"))


def _initial_state(name: str, shape: Shape, init: Instruction,
                   instructions: list[Instruction]) -> list[str]:
    """The names of the elements of loop ``name``'s state (of ``shape``) before the first
    iteration (``init``: the loop's operand)."""
    if init.opcode == "tuple":
        return list(init.operands)
    state = []
    for index, element in enumerate(shape.tuple_shapes):
        element_name = f"{name}.init.{index}"
        instructions.append(Instruction(element_name, element, "get-tuple-element",
                                        [init.name], {"index": str(index)}))
        state.append(element_name)
    return state


def _iteration(body: Computation, state: list[str], prefix: str,
               instructions: list[Instruction]) -> list[str]:
    """Appends one iteration of ``body`` on loop state ``state`` (element names) to
    ``instructions``, its names prefixed with ``prefix``; returns the next state."""
    names: dict[str, str] = {}
    for inst in body.instructions:
        if inst.opcode == "parameter":
            continue
        if inst.opcode == "get-tuple-element" and inst.operands[0] == body.parameters[0].name:
            names[inst.name] = state[int(inst.attrs["index"])]
            continue
        operands = [names[o] for o in inst.operands]
        if inst.is_root:
            return operands
        if _is_identity_copy(inst, body):  # the loop's buffer shuffling, not a value
            names[inst.name] = operands[0]
            continue
        names[inst.name] = f"{prefix}.{inst.name}"
        attrs = {k: v for k, v in inst.attrs.items() if k != "control-predecessors"}
        instructions.append(dataclasses.replace(
            _with_operands(inst, operands), name=names[inst.name], attrs=attrs,
            is_root=False))
    raise AssertionError("a loop body without a root")  # unrollable_trips checked it has one


def _is_identity_copy(inst: Instruction, body: Computation) -> bool:
    if inst.opcode != "copy" or inst.shape.is_tuple:
        return False
    source: Shape = body.by_name()[inst.operands[0]].shape
    return source == inst.shape and source.minor_to_major == inst.shape.minor_to_major


def _bitcasts_as_reshapes(instructions: list[Instruction], before: set[str]
                          ) -> list[Instruction]:
    """Bitcasts that read an unrolled value (or are unrolled) as reshapes, where both shapes
    are row-major (then the two say the same). The plan looks through a bitcast, as XLA gives
    it no buffer, but a kernel reads one from outside: a bitcast between two parts of one
    kernel (threefry's key, a u32[1] read as u32[]) made the kernel wait on its own output. A
    reshape is an op the kernel computes."""
    unrolled = {i.name for i in instructions} - before
    shapes = {i.name: i.shape for i in instructions}
    out = []
    for inst in instructions:
        if inst.opcode == "bitcast" and (inst.name in unrolled or inst.operands[0] in unrolled):
            source = shapes[inst.operands[0]]
            if _row_major(inst.shape) and _row_major(source) and source.dtype == inst.shape.dtype:
                inst = dataclasses.replace(inst, opcode="reshape")
        out.append(inst)
    return out


def _row_major(shape: Shape) -> bool:
    return not shape.is_tuple and shape.minor_to_major == tuple(reversed(range(shape.rank)))


def _without_dead(instructions: list[Instruction]) -> list[Instruction]:
    """``instructions`` less those nothing reads: the loop state's elements no one reads
    after the loop (its counter, say) and the tuples that started the loops. Parameters and
    instructions of KEEPS_ROLLED opcodes (side effects among them) stay."""
    read = set()
    for inst in reversed(instructions):
        if _kept(inst) or inst.name in read:
            read.update(inst.operands)
            read.update(inst.control_predecessors)
    return [i for i in instructions if _kept(i) or i.name in read]


def _kept(inst: Instruction) -> bool:
    return inst.is_root or inst.opcode == "parameter" or inst.opcode in KEEPS_ROLLED


def _with_operands(inst: Instruction, operands: list[str]) -> Instruction:
    if operands == inst.operands:
        return inst
    return dataclasses.replace(inst, operands=operands)


def _attr_name(inst: Instruction, key: str) -> str:
    return inst.attrs[key].strip().lstrip("%")


def _reachable(module: Module, entry: Computation) -> list[Computation]:
    """``module``'s computations with ``entry`` in place of its entry, less those nothing
    reachable from it calls (the unrolled loops' bodies and conditions), in their order."""
    old, called = module.entry, module.called_by(entry.instructions)
    return [entry if c is old else c for c in module.computations
            if c is old or c.name in called]
