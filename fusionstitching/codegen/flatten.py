"""Flatten a pattern (entry instructions: XLA fusions or unfused ops) into one list of ops.

XLA's fusions are inlined, so the schedule sees one dataflow graph whose only boundary is
what the pattern reads from and writes to global memory: inputs become `parameter` ops (in
`inputs` order; entry constants are inlined unless elided), outputs are the values used
outside the pattern or in the entry ROOT, always arrays (a multi-output fusion's results
named after their get-tuple-element users, or ``name#i``). A variadic reduce is one
tuple-shaped `reduce` op carrying its `Combiner`, read through ``reduce#i`` ops.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ..hlo.attrs import Window, parse_literal
from ..hlo.ir import Instruction, Module, Shape
from .errors import CodegenError, Refusal
from .kernel_ir import Buffer
from .ops import REDUCERS, REDUCIBLE, identity


@dataclass
class Combiner:
    """A variadic reduction's to_apply computation as scalar ops (argmax: compare/select on
    (value, index) pairs), inlined by the schedule on the accumulators and each element.

    XLA calls it as f(accumulators..., elements...): ``params`` are named in that order."""

    params: list[str]
    ops: list[FlatOp]  # operands before users; operands name params or earlier ops
    results: list[str]  # the param or op giving each element of the new accumulator


@dataclass
class FlatOp:
    name: str  # entry name, or "<fusion>/<name inside the fused computation>"
    opcode: str
    shape: Shape
    operands: list[str]
    attrs: dict[str, str] = field(default_factory=dict)
    literal: str | None = None
    parameter_number: int | None = None
    reducer: str | None = None  # reduce, scatter: opcode of its single-op to_apply computation
    combiner: Combiner | None = None  # variadic reduce: its to_apply computation as scalar ops

    @property
    def dimensions(self) -> tuple[int, ...]:
        return _dimensions(self.attrs.get("dimensions"))


@lru_cache(maxsize=1 << 12)
def _dimensions(text: str | None) -> tuple[int, ...]:
    """``dimensions={1,0}`` as an Instruction reads it, once per text (read per element)."""
    return Instruction("", None, "", attrs={} if text is None else {"dimensions": text}
                       ).dimensions


@dataclass
class Pattern:
    nodes: list[str]
    ops: list[FlatOp]  # operands before users
    inputs: list[tuple[str, Shape]]
    outputs: list[tuple[str, Shape]]
    output_values: list[str]  # the FlatOp computing each output

    def op_map(self) -> dict[str, FlatOp]:
        return {op.name: op for op in self.ops}

    def buffers(self) -> list[Buffer]:
        """A kernel's buffers: the inputs, then the outputs."""
        return [Buffer(n, s, False) for n, s in self.inputs] + \
            [Buffer(n, s, True) for n, s in self.outputs]

    def canonical_form(self) -> tuple | None:
        """The pattern with every name replaced by its position: equal for patterns that
        differ only in names (a model's repeated layers). None with a variadic combiner."""
        if any(op.combiner is not None for op in self.ops):
            return None
        position: dict[str, int] = {}
        for name, _ in self.inputs:
            position.setdefault(name, len(position))
        ops = []
        for op in self.ops:
            if any(o not in position for o in op.operands):
                return None  # not in operands-before-users order: no form
            ignored = NOT_IN_CANONICAL_FORM - (set() if op.reducer else {"to_apply"})
            ops.append((op.opcode, op.shape, tuple(position[o] for o in op.operands),
                        op.literal, op.parameter_number, op.reducer,
                        tuple(sorted((k, v) for k, v in op.attrs.items() if k not in ignored))))
            position.setdefault(op.name, len(position))
        if any(v not in position for v in self.output_values):
            return None
        return (tuple(s for _, s in self.inputs), tuple(s for _, s in self.outputs),
                tuple(position[v] for v in self.output_values), tuple(ops))


_NO_OPS = {"get-tuple-element", "tuple", "parameter"}
# Attributes that name a computation or carry no meaning for the kernel: not in a pattern's
# canonical form (``to_apply`` only where ``reducer`` says what it computes).
NOT_IN_CANONICAL_FORM = frozenset({"frontend_attributes", "to_apply", "metadata"})


def reducer_of(module: Module, inst: Instruction) -> str:
    comp = module.computation(inst.called_computations[0])
    params = {p.name for p in comp.parameters}
    root = comp.root
    body = [i for i in comp.instructions if i.opcode != "parameter"]
    if len(params) != 2 or body != [root] or set(root.operands) != params \
            or root.opcode not in REDUCERS:
        ops = ", ".join(i.opcode for i in body) or f"returns its parameter {root.name}"
        raise CodegenError(Refusal.UNSUPPORTED_COMBINER,
                           f"{inst.opcode} {inst.name}: to_apply {comp.name} is not a single "
                           f"add/maximum/minimum/multiply/and/or ({ops})")
    return root.opcode


def combiner_of(module: Module, inst: Instruction) -> Combiner:
    """The to_apply computation of a variadic reduce: scalar ops ending in a tuple."""
    comp = module.computation(inst.called_computations[0])
    n = len(inst.shape.tuple_shapes)
    params = sorted(comp.parameters, key=lambda p: p.parameter_number)
    root = comp.root
    if len(params) != 2 * n or root.opcode != "tuple" or len(root.operands) != n:
        raise CodegenError(Refusal.UNSUPPORTED_COMBINER,
                           f"reduce {inst.name}: to_apply {comp.name} does not take {2 * n} "
                           f"scalars and return a tuple of {n}")
    ops = []
    for i in comp.instructions:
        if i.opcode == "parameter" or i.is_root:
            continue
        if i.shape.is_tuple or i.shape.rank or i.called_computations or i.opcode in _NO_OPS:
            raise CodegenError(Refusal.UNSUPPORTED_COMBINER,
                               f"reduce {inst.name}: to_apply {comp.name} has {i.opcode} "
                               f"{i.name} (only scalar ops are inlined)")
        ops.append(FlatOp(i.name, i.opcode, i.shape, list(i.operands), dict(i.attrs), i.literal))
    return Combiner([p.name for p in params], ops, list(root.operands))


def refuse_dynamic(inst: Instruction) -> None:
    """A bounded-dynamic array (``f32[<=8]``) holds its true size beside the data, written and
    read by XLA's own kernels; a stitched kernel would treat the bound as the size."""
    if any(any(leaf.dynamic) for leaf in inst.shape.leaves()):
        raise CodegenError(Refusal.DYNAMIC_SHAPE,
                           f"{inst.opcode} {inst.name}: bounded-dynamic shape "
                           f"{inst.shape} (its size is known only at run time)")


def flatten(module: Module, nodes: list[str]) -> Pattern:
    entry = module.entry
    index = entry.index()
    by_name, users = index.by_name, index.users
    missing = [n for n in nodes if n not in by_name]
    if missing:
        raise CodegenError(Refusal.NOT_IN_ENTRY,
                           f"not in the entry computation: {', '.join(missing)}")
    # A multi-output fusion's get-tuple-elements are no-ops: they belong to its pattern.
    # So are those of a tuple-shaped get-tuple-element (an argmin's reduce in a fusion's tuple).
    in_pattern, tuples = set(nodes), [n for n in nodes if by_name[n].shape.is_tuple]
    while tuples:
        for user in users[tuples.pop()]:
            if by_name[user].opcode == "get-tuple-element" and user not in in_pattern:
                in_pattern.add(user)
                if by_name[user].shape.is_tuple:
                    tuples.append(user)
    ops: list[FlatOp] = []
    value: dict[str, str] = {}  # entry array value -> FlatOp name
    elements: dict[str, list[str]] = {}  # tuple-valued pattern node -> FlatOp name per element
    inputs: list[tuple[str, Shape]] = []
    read_through: set[str] = set()  # entry bitcasts of pattern values, computed in the kernel

    def made_here(name: str) -> bool:
        while name not in in_pattern and by_name[name].opcode == "bitcast":
            name = by_name[name].operands[0]
        return name in in_pattern

    def entry_operand(name: str) -> str:
        if name in value:
            return value[name]
        if name in elements:
            raise CodegenError(Refusal.TUPLE, f"tuple {name} used other than by get-tuple-element")
        inst = by_name[name]
        if inst.opcode == "bitcast" and made_here(name):
            # XLA:GPU bitcasts between kernels at entry level (a collective combiner's
            # concatenate and slices): read as an input, the kernel would wait for itself.
            read_through.add(name)
            value[name] = add_op(inst, name, [entry_operand(inst.operands[0])])
            return value[name]
        if inst.opcode == "get-tuple-element" and by_name[inst.operands[0]].opcode == "tuple":
            # Read the tuple's element itself: through the tuple the kernel would wait for
            # the tuple's other elements, which may be its own outputs (a cycle).
            element = by_name[inst.operands[0]].operands[int(inst.attrs["index"])]
            value[name] = entry_operand(element)
            return value[name]
        refuse_dynamic(inst)
        if inst.opcode == "constant" and not inst.literal_elided:
            ops.append(FlatOp(name, "constant", inst.shape, [], literal=inst.literal))
        elif inst.shape.is_tuple:
            raise CodegenError(Refusal.TUPLE, f"input {name} is a tuple; read its elements through "
                               f"get-tuple-element")
        else:
            ops.append(FlatOp(name, "parameter", inst.shape, [], parameter_number=len(inputs)))
            inputs.append((name, inst.shape))
        value[name] = name
        return name

    parts: dict[str, list[str]] = {}  # variadic reduce -> its get-tuple-element FlatOps

    def add_op(inst: Instruction, name: str, operands: list[str]) -> str:
        refuse_dynamic(inst)
        if inst.opcode == "reduce-window" and len(operands) != 2:
            raise CodegenError(Refusal.UNSUPPORTED_OP,
                               f"reduce-window {inst.name}: variadic reduce-windows are not "
                               f"supported")
        variadic = inst.opcode == "reduce" and inst.shape.is_tuple
        combiner = combiner_of(module, inst) if variadic else None
        reducer = reducer_of(module, inst) if not variadic and inst.opcode in (
            "reduce", "reduce-window", "scatter") else None
        if inst.opcode in ("fusion", "call", "while", "conditional") or (
                inst.called_computations and reducer is None and combiner is None):
            raise CodegenError(Refusal.UNSUPPORTED_OP,
                               f"{inst.opcode} {inst.name} calls a computation; only fusions "
                               f"at entry level, reductions and scatters are stitched")
        ops.append(FlatOp(name, inst.opcode, inst.shape, operands, dict(inst.attrs),
                          inst.literal, reducer=reducer, combiner=combiner))
        if variadic:  # its results are read as arrays, as XLA's get-tuple-elements read them
            parts[name] = [f"{name}#{i}" for i in range(len(inst.shape.tuple_shapes))]
            ops.extend(FlatOp(part, "get-tuple-element", leaf, [name], {"index": str(i)})
                       for i, (part, leaf) in enumerate(zip(parts[name], inst.shape.tuple_shapes)))
        return name

    def inline(fusion: Instruction, operands: list[str]) -> list[str]:
        """Inline a fused computation; returns the FlatOp per result (one unless multi-output).
        Nested fusions are inlined from an explicit stack of ``inline_steps``, so a chain of
        a thousand nested fusions does not reach Python's recursion limit."""
        stack, results = [inline_steps(fusion, operands)], None
        while stack:
            try:
                nested = stack[-1].send(results)
            except StopIteration as done:
                stack.pop()
                results = done.value
                continue
            stack.append(inline_steps(*nested))
            results = None
        return results

    def inline_steps(fusion: Instruction, operands: list[str]):
        """``inline`` of one fused computation, as a generator: it yields each nested fusion
        with its operands and is sent back that fusion's results."""
        comp = module.computation(fusion.called_computations[0])
        local: dict[str, str] = {}
        for inst in comp.instructions:
            if inst.opcode == "parameter":
                local[inst.name] = operands[inst.parameter_number]
            elif inst.opcode == "fusion":
                results = yield inst, [local[o] for o in inst.operands]
                if len(results) != 1:
                    raise CodegenError(Refusal.TUPLE, f"nested multi-output fusion {inst.name}")
                local[inst.name] = results[0]
            elif inst.opcode == "tuple" and inst.is_root:
                return [local[o] for o in inst.operands]
            elif inst.opcode == "get-tuple-element" and local[inst.operands[0]] in parts:
                local[inst.name] = parts[local[inst.operands[0]]][int(inst.attrs["index"])]
            elif inst.opcode in _NO_OPS:
                raise CodegenError(Refusal.UNSUPPORTED_OP,
                                   f"{inst.opcode} {inst.name} inside fusion {fusion.name}")
            elif inst.literal_elided:  # an entry-level one is read as an input instead
                raise CodegenError(Refusal.ELIDED_CONSTANT,
                                   f"constant {inst.name} inside fusion {fusion.name} is "
                                   f"elided ('{{...}}'): its values are not in the module")
            else:
                local[inst.name] = add_op(inst, f"{fusion.name}/{inst.name}",
                                          [local[o] for o in inst.operands])
        root = local[comp.root.name]
        return parts.get(root, [root])

    # printed order: operands before users
    in_order = [by_name[n] for n in sorted(in_pattern, key=index.position.__getitem__)]
    for inst in in_order:
        if inst.opcode == "get-tuple-element" and inst.operands[0] in elements:
            element = elements[inst.operands[0]][int(inst.attrs["index"])]
            if not inst.shape.is_tuple:
                value[inst.name] = element
            elif element in parts:  # a variadic reduce's results
                elements[inst.name] = parts[element]
            else:
                raise CodegenError(Refusal.TUPLE, f"nested tuple {inst.name}")
            continue
        operands = [entry_operand(o) for o in inst.operands]
        if inst.opcode == "fusion":
            results = inline(inst, operands)
            if inst.shape.is_tuple:
                elements[inst.name] = results
            else:
                value[inst.name] = results[0]
        elif inst.opcode == "tuple":
            elements[inst.name] = operands
        elif inst.opcode in _NO_OPS:
            raise CodegenError(Refusal.UNSUPPORTED_OP,
                               f"{inst.opcode} {inst.name} cannot be part of a kernel")
        else:
            name = add_op(inst, inst.name, operands)
            if name in parts:
                elements[inst.name] = parts[name]
            else:
                value[inst.name] = name

    def used_outside(name: str) -> bool:
        """A user outside the pattern, or a bitcast read through that one has (or is ROOT)."""
        return any(u not in in_pattern and (u not in read_through or by_name[u].is_root
                                            or used_outside(u)) for u in users[name])

    outputs: list[tuple[str, Shape]] = []
    output_values: list[str] = []
    for inst in in_order:
        name = inst.name
        outside = used_outside(name)
        if inst.shape.is_tuple:
            if inst.is_root or outside:
                for i, leaf in enumerate(inst.shape.tuple_shapes):
                    if leaf.is_tuple:
                        raise CodegenError(Refusal.TUPLE, f"nested tuple output {name}")
                    outputs.append((f"{name}#{i}", leaf))
                    output_values.append(elements[name][i])
        elif outside or inst.is_root:
            outputs.append((name, inst.shape))
            output_values.append(value[name])
    if not outputs:
        raise CodegenError(Refusal.NO_OUTPUTS, "pattern has no outputs")

    _fold_partial_reductions(ops)
    _transpose_before_reductions(ops, set(output_values))
    output_values = _merge_repeated_ops(ops, output_values)
    # Drop what no output needs (e.g. unused results of a multi-output fusion).
    needed = set(output_values)
    for op in reversed(ops):
        if op.name in needed:
            needed.update(op.operands)
    ops = [op for op in ops if op.name in needed]
    params = [op for op in ops if op.opcode == "parameter"]
    inputs = [inputs[op.parameter_number] for op in params]
    for number, op in enumerate(params):
        op.parameter_number = number
    _refuse_long_chains(ops)
    return Pattern(list(nodes), ops, inputs, outputs, output_values)


# The schedule computes each value from its operands' values recursively (a few Python frames
# per op), and kernel IR values hash their operand trees; chains longer than this would reach
# Python's recursion limit (1000 frames: ~300 ops), where they failed before this check.
MAX_CHAIN_OPS = 250


def _refuse_long_chains(ops: list[FlatOp]) -> None:
    """CodegenError when the longest dependency chain of ``ops`` (operands before users) is
    longer than MAX_CHAIN_OPS: such a pattern is left to XLA, with the reason."""
    depth: dict[str, int] = {}
    for op in ops:
        depth[op.name] = 1 + max((depth.get(o, 0) for o in op.operands), default=0)
        if depth[op.name] > MAX_CHAIN_OPS:
            raise CodegenError(Refusal.CHAIN_TOO_LONG,
                               f"unsupported: a chain of more than {MAX_CHAIN_OPS} dependent "
                               f"ops (up to {op.name}); the code generator builds shorter ones")


def _fold_partial_reductions(ops: list[FlatOp]) -> None:
    """reduce(reduce-window(x)) -> reduce(x) when the windows tile the reduced dimensions.

    XLA:CPU splits long row reductions into a reduce-window over tiles of the row (padded with
    the init value when the tiles overhang the row) followed by a reduce of the tile results.
    With the same associative combiner and an init value that is its identity, that is the
    same reduction of x in another order, and stitching it as one row reduction is what a GPU
    kernel does anyway (the reduce's own init is combined in by the schedule).

    XLA:GPU's tree reduction splits a long row instead: reduce(reduce(bitcast x to [.., n1,
    n2, ..]) over n2) over n1 (a vocabulary row of 32000 as 128 x 250); folded the same way.
    """
    by_name = {op.name: op for op in ops}
    for op in ops:
        # XLA:CPU may tile more than once (reduce-window of a reduce-window): fold each level.
        while op.opcode == "reduce" and op.combiner is None:
            inner = by_name.get(op.operands[0])
            if _folds_into(op, inner, by_name):
                op.operands = [inner.operands[0], op.operands[1]]
            elif _splits_row_of(op, inner, by_name):
                op.operands = [by_name[inner.operands[0]].operands[0], op.operands[1]]
            else:
                break


def _transpose_before_reductions(ops: list[FlatOp], outputs: set[str]) -> None:
    """transpose(reduce(x)) -> reduce(transpose(x)) when the transpose is all that reads the
    reduction (an Adam update of a weight gradient reduced in the other layout).

    A thread group owns one result of the reduction and can read it only at that result;
    the transposed read needs another group's result (cross-block communication). Reducing a
    transposed x gives each group the result at the transpose's own index instead. The
    reduced dimensions move first in their order, so every result combines the same
    elements in the same order as before (bit-identical)."""
    by_name = {op.name: op for op in ops}
    users: dict[str, list[FlatOp]] = {}
    for op in ops:
        for operand in op.operands:
            users.setdefault(operand, []).append(op)
    for red in ops:
        readers = users.get(red.name, [])
        if red.opcode != "reduce" or red.combiner is not None or red.name in outputs or \
                len(readers) != 1 or readers[0].opcode != "transpose":
            continue
        transpose, x_shape = readers[0], by_name[red.operands[0]].shape
        reduced = sorted(red.dimensions)
        kept = [d for d in range(x_shape.rank) if d not in reduced]
        order = reduced + [kept[j] for j in transpose.dimensions]
        # The reduce's name now holds the transposed x, the transpose's the reduction.
        moved = Shape(x_shape.dtype, tuple(x_shape.dims[d] for d in order))
        red_x, red_init = red.operands
        transpose.opcode, transpose.operands, transpose.reducer = "reduce", [red.name, red_init], \
            red.reducer
        transpose.attrs = {**red.attrs, "dimensions": "{" + ",".join(
            str(i) for i in range(len(reduced))) + "}"}
        red.opcode, red.shape, red.operands, red.reducer = "transpose", moved, [red_x], None
        red.attrs = {"dimensions": "{" + ",".join(map(str, order)) + "}"}


# Ops that compute something new each time they run: never merged.
_NOT_REPEATABLE = {"rng", "rng-bit-generator", "rng-get-and-update-state", "custom-call"}


def _merge_repeated_ops(ops: list[FlatOp], output_values: list[str]) -> list[str]:
    """Readers of an op that repeats an earlier one (same opcode, shape, operands and
    attributes) read the earlier one instead; returns the output values renamed so.

    XLA repeats work across fusions (a LayerNorm's mean computed in each of two fusions);
    stitched into one kernel, the schedule would reduce the same values twice. The emitter
    already computes a repeated elementwise op once per index (value CSE, paper 4.5), but a
    reduction's partial sums, shuffles and shared-memory round trips are emitted per reduce
    op, so the repeat is removed here, for every op alike. A merged reduction combines the
    same elements in the same order: results are bit-identical."""
    first: dict[tuple, str] = {}
    rename: dict[str, str] = {}
    for op in ops:
        op.operands = [rename.get(o, o) for o in op.operands]
        if op.opcode in _NOT_REPEATABLE or op.combiner is not None:
            continue
        # The to_apply computation's name differs per fusion; `reducer` is what it computes.
        ignored = {"frontend_attributes"} | ({"to_apply"} if op.reducer else set())
        key = (op.opcode, op.shape, tuple(op.operands), op.literal, op.parameter_number,
               op.reducer, tuple(sorted((k, v) for k, v in op.attrs.items()
                                        if k not in ignored)))
        if key in first:
            rename[op.name] = first[key]
        else:
            first[key] = op.name
    return [rename.get(v, v) for v in output_values]


def _folds_into(op: FlatOp, inner: FlatOp | None, by_name: dict[str, FlatOp]) -> bool:
    """Is ``inner`` a reduce-window with ``op``'s combiner, starting at its identity, whose
    (padded) windows tile exactly the dimensions ``op`` reduces?"""
    if inner is None or inner.opcode != "reduce-window" or inner.reducer != op.reducer or \
            not _is_identity(by_name[inner.operands[1]], inner.reducer):
        return False
    window = Window.parse(inner.attrs.get("window"), inner.shape.rank)
    source, pad = by_name[inner.operands[0]], [low + high for low, high in window.padding]
    reduced = set(op.dimensions)
    return window.undilated and window.size == window.stride and all(
        (size == 1 and p == 0) or d in reduced
        for d, (size, p) in enumerate(zip(window.size, pad))) and all(
        inner.shape.dims[d] * window.size[d] == source.shape.dims[d] + pad[d]
        for d in range(source.shape.rank))


def _splits_row_of(op: FlatOp, inner: FlatOp | None, by_name: dict[str, FlatOp]) -> bool:
    """Is ``inner`` a reduction with ``op``'s combiner, starting at its identity, over the
    minor half n2 of a dimension that a reshape split into (n1, n2), and ``op`` the reduction
    of ``inner`` over n1?"""
    if inner is None or inner.opcode != "reduce" or inner.combiner is not None or \
            inner.reducer != op.reducer or \
            not _is_identity(by_name[inner.operands[1]], inner.reducer):
        return False
    split = by_name[inner.operands[0]]
    if split.opcode not in ("bitcast", "reshape") or split.operands[0] not in by_name:
        return False
    x = by_name[split.operands[0]]
    if split.opcode == "bitcast" and not all(  # a bitcast between row-major shapes reshapes
            s.minor_to_major == tuple(range(s.rank - 1, -1, -1)) for s in (split.shape, x.shape)):
        return False
    dims, split_dims = x.shape.dims, split.shape.dims
    if len(split_dims) != len(dims) + 1:  # a reshape that merges dimensions splits none
        return False
    k = next((d for d in range(len(dims)) if dims[d] != split_dims[d]), len(dims))
    return k < len(dims) and split_dims[:k] == dims[:k] and split_dims[k + 2:] == dims[k + 1:] and \
        split_dims[k] * split_dims[k + 1] == dims[k] and \
        tuple(inner.dimensions) == (k + 1,) and tuple(op.dimensions) == (k,)


def _is_identity(init: FlatOp, kind: str) -> bool:
    """Folding drops the reduce-window's init value (each window's start and its padding): it
    must leave every combination unchanged."""
    if init.opcode != "constant" or init.shape.rank or (init.shape.dtype, kind) not in REDUCIBLE:
        return False
    return parse_literal(init.literal or "", init.shape).reshape(-1)[0] == \
        identity(kind, init.shape.dtype)
