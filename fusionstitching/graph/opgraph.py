"""The op graph: nodes are XLA's kernels (fusions or unfused ops), edges carry bytes.

Op classes follow the paper (section 4): light elementwise, expensive elementwise and
reduction ops are memory-intensive and may be stitched; data movement ops are
memory-intensive too but need index maps the first code generator may not have; opaque ops
(dot, convolution, library calls, control flow, collectives, rng, sort) are never stitched
and bound the memory-intensive regions; so are the integer scalars a while loop starts from
(``loop_counter_starts``). No-op instructions (parameter, constant, tuple,
get-tuple-element, bitcast) launch nothing.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..hlo.ir import Computation, Instruction, Module, Shape
from ..hlo.verifier import instruction_problem, module_problem
from .demand import demanded_elements, elements
from .refusal import Refusal, RefusalKind, internal


class OpClass(enum.IntEnum):
    # Ordered by how much they constrain a kernel: a fusion takes its heaviest member's class.
    NOOP = 0
    LIGHT_ELEMENTWISE = 1
    DATA_MOVEMENT = 2
    EXPENSIVE_ELEMENTWISE = 3
    REDUCTION = 4
    OPAQUE = 5

    @property
    def memory_intensive(self) -> bool:
        return self not in (OpClass.NOOP, OpClass.OPAQUE)


NOOP_OPCODES = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast",
                "after-all", "partition-id", "replica-id"}
EXPENSIVE_OPCODES = {"exponential", "exponential-minus-one", "log", "log-plus-one", "tanh",
                     "logistic", "erf", "rsqrt", "sqrt", "cbrt", "power", "divide", "remainder",
                     "sine", "cosine", "tan", "atan2"}
REDUCTION_OPCODES = {"reduce", "reduce-window", "select-and-scatter"}
# broadcast, reshape and iota are index maps each thread evaluates alone: light elementwise.
DATA_MOVEMENT_OPCODES = {"transpose", "copy", "slice", "dynamic-slice", "dynamic-update-slice",
                         "concatenate", "pad", "reverse", "gather", "scatter"}
OPAQUE_OPCODES = {"dot", "convolution", "custom-call", "while", "conditional", "call",
                  "all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                  "collective-permute", "rng", "rng-bit-generator", "rng-get-and-update-state",
                  "sort", "fft", "triangular-solve", "cholesky", "infeed", "outfeed", "send",
                  "recv", "send-done", "recv-done", "async-start", "async-update", "async-done",
                  "all-reduce-start", "all-reduce-done", "all-gather-start", "all-gather-done",
                  "collective-permute-start", "collective-permute-done", "copy-start",
                  "copy-done", "custom-call-start", "custom-call-done", "fusion-start",
                  "fusion-done", "domain", "map",
                  "optimization-barrier", "add-dependency"}


def classify_instruction(inst: Instruction, module: Module,
                         fused_classes: dict[str, OpClass] | None = None) -> OpClass:
    """Op class of one instruction; a fusion gets the heaviest class of its fused ops.
    ``fused_classes`` caches the class of each fused computation between calls."""
    if inst.opcode == "fusion" and not _launches_nothing(inst):
        memo = {} if fused_classes is None else fused_classes
        return _fused_class(inst.called_computations[0], module, memo)
    return _own_class(inst)


def _launches_nothing(inst: Instruction) -> bool:
    return inst.opcode in NOOP_OPCODES or elements(inst.shape) == 0  # an empty array


def _own_class(inst: Instruction) -> OpClass:
    """The class of an instruction other than a fusion."""
    op = inst.opcode
    if _launches_nothing(inst):
        return OpClass.NOOP
    if op in OPAQUE_OPCODES:
        return OpClass.OPAQUE
    if op in REDUCTION_OPCODES:
        return OpClass.REDUCTION
    if op in EXPENSIVE_OPCODES:
        return OpClass.EXPENSIVE_ELEMENTWISE
    if op in DATA_MOVEMENT_OPCODES:
        return OpClass.DATA_MOVEMENT
    return OpClass.LIGHT_ELEMENTWISE


def _fused_class(name: str, module: Module, memo: dict[str, OpClass]) -> OpClass:
    """The class of a fused computation, nested fusions first, with an explicit stack: a
    chain of a thousand nested fusions must not reach Python's recursion limit (the parser
    has checked that no computation calls itself)."""
    stack = [name]
    while stack:
        comp = module.computation(stack[-1])
        nested = [i.called_computations[0] for i in comp.instructions
                  if i.opcode == "fusion" and not _launches_nothing(i)]
        missing = [n for n in nested if n not in memo]
        if missing:
            stack.extend(missing)
            continue
        classes = [memo[i.called_computations[0]]
                   if i.opcode == "fusion" and not _launches_nothing(i) else _own_class(i)
                   for i in comp.instructions]
        # A fusion of only no-ops (e.g. a bitcast fusion) still launches a copy kernel.
        memo[comp.name] = max(classes + [OpClass.LIGHT_ELEMENTWISE])
        stack.pop()
    return memo[name]


@dataclass
class Node:
    name: str
    opcode: str
    op_class: OpClass
    shape: Shape
    operands: list[str]  # distinct operand names, in order
    users: list[str] = field(default_factory=list)
    fusion_kind: str | None = None
    tuple_index: int | None = None  # get-tuple-element's index
    # Operands the kernel reads only in part (the operand of a gather): elements read.
    partial_reads: dict[str, int] = field(default_factory=dict)
    refusal: Refusal | None = None  # why the graph leaves this node to XLA (as OPAQUE)

    @property
    def is_kernel(self) -> bool:
        """Does XLA launch something for this node?"""
        return self.op_class != OpClass.NOOP

    @property
    def memory_intensive(self) -> bool:
        return self.op_class.memory_intensive


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    bytes: int


@dataclass
class OpGraph:
    """Nodes in topological (printed) order; ``outputs`` are the values the ROOT returns."""

    module: Module
    computation: Computation
    nodes: dict[str, Node]
    edges: list[Edge]
    outputs: list[str]
    # What modules below derive from the whole graph once (traffic.py's consumers of each
    # value): a graph is not changed after build_graph.
    derived: dict = field(default_factory=dict, repr=False, compare=False)

    def buffer_of(self, name: str) -> str:
        """The node whose buffer ``name`` views: bitcasts are looked through, since XLA gives
        a bitcast no buffer of its own."""
        node = self.nodes[name]
        while node.opcode == "bitcast":
            node = self.nodes[node.operands[0]]
        return node.name

    def kernel_nodes(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.is_kernel]

    def memory_intensive_nodes(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.memory_intensive]


def build_graph(module: Module, computation: Computation | None = None) -> OpGraph:
    """The op graph of ``computation`` (default: the entry). An instruction the graph does not
    understand (``check_instruction``) becomes an opaque node with its ``refusal``: left to
    XLA, never guessed at."""
    comp = computation or module.entry
    by_name = {i.name: i for i in comp.instructions}
    fused_classes: dict[str, OpClass] = {}
    nodes: dict[str, Node] = {}
    for inst in comp.instructions:
        refusal = check_instruction(inst, module, by_name)
        op_class = OpClass.OPAQUE
        if refusal is None:
            try:
                op_class = classify_instruction(inst, module, fused_classes)
            except Exception as exc:  # a defect of ours: this node is XLA's
                refusal = internal(exc)
        nodes[inst.name] = Node(
            name=inst.name, opcode=inst.opcode, op_class=op_class,
            shape=inst.shape, operands=list(dict.fromkeys(inst.operands)),
            fusion_kind=inst.fusion_kind,
            tuple_index=(int(inst.attrs["index"]) if inst.opcode == "get-tuple-element"
                         and refusal is None else None), refusal=refusal)
    for name in loop_counter_starts(comp):
        if nodes[name].is_kernel:
            nodes[name].op_class = OpClass.OPAQUE
    for inst in comp.instructions:
        node = nodes[inst.name]
        if node.is_kernel and node.refusal is None:
            try:
                node.partial_reads = _partial_reads(module, inst, nodes)
            except Exception as exc:
                node.op_class, node.refusal = OpClass.OPAQUE, internal(exc)
    edges = []
    for node in nodes.values():
        for op in node.operands:
            nodes[op].users.append(node.name)
            edges.append(Edge(op, node.name, nodes[op].shape.byte_size))
    root = comp.root
    outputs = list(dict.fromkeys(root.operands)) if root.opcode == "tuple" else [root.name]
    return OpGraph(module, comp, nodes, edges, outputs)


def check_instruction(inst: Instruction, module: Module,
                      by_name: dict[str, Instruction]) -> Refusal | None:
    """Why the graph cannot take ``inst`` as XLA's kernel (None when it can): the HLO rules
    the stages after it rely on, which the parser does not check."""
    def malformed(detail: str) -> Refusal:
        return Refusal(RefusalKind.MALFORMED, f"%{inst.name}: {detail}")

    if inst.opcode == "get-tuple-element":
        index = inst.attrs.get("index", "")
        operand = by_name[inst.operands[0]].shape if len(inst.operands) == 1 else None
        if operand is None or not index.isdigit():
            return malformed("get-tuple-element needs one operand and an index")
        if not operand.is_tuple or int(index) >= len(operand.tuple_shapes):
            return malformed(f"index {index} is outside its operand's shape {operand}")
    elif inst.opcode == "fusion":
        fused = module.computation(inst.called_computations[0])
        numbers = {p.parameter_number for p in fused.parameters}
        if numbers != set(range(len(inst.operands))):
            return malformed(f"{len(inst.operands)} operands for the parameters "
                             f"{sorted(numbers)} of %{fused.name}")
        if (problem := module_problem(module, fused)) is not None:
            return malformed(f"in %{fused.name}: {problem}")
    elif inst.opcode == "while" and len(inst.operands) != 1:
        return malformed("a while takes one operand")
    problem = instruction_problem(inst, [by_name[o].shape for o in inst.operands])
    return None if problem is None else malformed(problem)


INTEGER_DTYPES = {"s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64"}


def loop_counter_starts(comp: Computation) -> set[str]:
    """The instructions that compute the integer scalars a ``while`` in ``comp`` starts from,
    back through integer scalars only. XLA:GPU's trip-count analysis evaluates a loop
    counter's start value from them; as our kernel's output it would be opaque, the loop's
    trip count unknown, and every iteration would wait for the host to read its condition
    (a flax LSTM step ran 2x slower on an H200 that way)."""
    by_name = {inst.name: inst for inst in comp.instructions}
    found: set[str] = set()
    pending = []
    for inst in comp.instructions:
        if inst.opcode != "while" or len(inst.operands) != 1:  # check_instruction refuses it
            continue
        init = by_name[inst.operands[0]]
        starts = init.operands if init.opcode == "tuple" else [init.name]
        pending += [name for name in starts if _integer_scalar(by_name[name].shape)]
    while pending:
        name = pending.pop()
        if name in found:
            continue
        found.add(name)
        pending += [o for o in by_name[name].operands if _integer_scalar(by_name[o].shape)]
    return found


def _integer_scalar(shape: Shape) -> bool:
    return shape.dtype in INTEGER_DTYPES and shape.dims == ()


def _partial_reads(module: Module, inst: Instruction, nodes: dict[str, Node]) -> dict[str, int]:
    """The operands ``inst``'s kernel reads only in part, and the elements it reads of each."""
    if inst.opcode == "fusion":
        fused = module.computation(inst.called_computations[0]).instructions
        demand = demanded_elements(fused)
        read: dict[str, int] = {}
        for param in fused:
            if param.opcode == "parameter":
                operand = inst.operands[param.parameter_number]
                read[operand] = read.get(operand, 0) + demand.get(param.name, 0)
    elif inst.opcode in ("gather", "dynamic-slice"):
        read = demanded_elements([inst], {o: nodes[o].shape for o in inst.operands})
    else:
        return {}
    return {o: n for o, n in read.items() if o in nodes and n < elements(nodes[o].shape)}
