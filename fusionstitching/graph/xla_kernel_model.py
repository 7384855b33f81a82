"""XLA's kernels as the latency-evaluator sees them, so XLA's plan is priced like the stitched one.

``xla_kernel_profile(graph, node, device)`` models one kernel XLA launches from the graph
alone: bytes as ``pattern_traffic`` counts them; a thread per output element (a warp per
reduced row); per thread, each fused op's instructions (costmodel/instructions.py, the table
of the stitched kernels) times the elements it computes, its loads by dependency level and its
longest dependency chain's latency, as for the stitched kernels; 128 threads per block.
"""
from __future__ import annotations

import math

import costmodel
from costmodel import WARP
from costmodel.instructions import OVERLAPPED_LOAD, add_instructions, op_instructions, overlapped
from costmodel.latency import chain_latency

from ..hlo.ir import Instruction, Shape
from .demand import demanded_elements
from .opgraph import OpGraph
from .traffic import pattern_traffic

XLA_THREADS_PER_BLOCK = 128
SHUFFLE_STEPS = 5  # log2(32): xor butterfly over a warp
# Loads a reduction thread has in flight at once: XLA unrolls its per-thread reduction loop;
# 8 is the bound the stitched kernels' loops are fully unrolled to (assumption, the same
# memory-level parallelism for both plans).
XLA_UNROLL = 8


def _leaves(shape: Shape) -> list[Shape]:
    return [leaf for s in shape.tuple_shapes for leaf in _leaves(s)] if shape.is_tuple \
        else [shape]


def _elements(shape: Shape) -> int:
    return max(leaf.num_elements for leaf in _leaves(shape))


# Ops that read their operand 0 (or the update, operand 1) at an index computed from the
# values of the others: operand -> the operands holding the index.
_INDEXED_READS = {"gather": (0, slice(1, None)), "dynamic-slice": (0, slice(1, None)),
                  "dynamic-update-slice": (1, slice(2, None))}
# Ops that move one operand's elements unchanged: a parameter seen through them is still read
# where the op's user reads it.
_PASS_THROUGH = {"bitcast", "reshape", "copy", "transpose", "broadcast", "slice", "convert"}


def load_levels(instructions: list[Instruction]) -> dict[str, int]:
    """The dependency level of each parameter's loads: 1 when read at the thread's own index,
    one more than the index's level when read at a loaded index (a gather's operand). A
    thread's loads of one level are in flight at once: each level waits one load latency."""
    names = {i.name: i for i in instructions}
    value: dict[str, int] = {}  # instruction -> level of the latest load it depends on
    reads: dict[str, int] = {}  # parameter -> level of its loads

    def source(name: str) -> str:
        while name in names and names[name].opcode in _PASS_THROUGH:
            name = names[name].operands[0]
        return name

    for inst in instructions:
        operands = [value.get(o, 1) for o in inst.operands]  # outside operands: loaded
        if inst.opcode == "parameter":
            value[inst.name] = 1
            continue
        value[inst.name] = max(operands, default=0)
        if inst.opcode in _INDEXED_READS:
            data, index = _INDEXED_READS[inst.opcode]
            level = 1 + max(operands[index], default=0)
            read = source(inst.operands[data])
            reads[read] = max(reads.get(read, 1), level)
            value[inst.name] = max(value[inst.name], level)
    for name, inst in names.items():
        if inst.opcode == "parameter":
            reads.setdefault(name, 1)
    return reads


def add_loads(counts: dict[str, float], loads_per_level: dict[int, list[float]]) -> None:
    """A thread's loads, per level as [loads, the most of any one input]: XLA unrolls its
    element loop by XLA_UNROLL, so each group of that many elements of every input on a level
    waits one full latency and the group's other loads overlap it."""
    for loads, most in loads_per_level.values():
        groups = math.ceil(most / XLA_UNROLL)
        add_instructions(counts, {"ld_global": groups, OVERLAPPED_LOAD: loads - groups})


def _op_instructions(inst: Instruction) -> dict[str, int]:
    return dict(op_instructions(inst.opcode, _leaves(inst.shape)[0].dtype))


def critical_chain(instructions: list[Instruction]) -> set[str]:
    """The elementwise ops on an element's longest dependency chain (``chain_latency``, as
    the stitched kernels' chains are ranked). A reduce
    ends the chains into it (its combination loop is priced as a chain of its own) and starts
    a new one, which its users' chains continue."""
    chain: dict[str, tuple[float, tuple[str, ...]]] = {}
    for inst in instructions:
        before = max((chain[o] for o in inst.operands if o in chain), key=lambda c: c[0],
                     default=(0.0, ()))
        if inst.opcode in ("reduce", "reduce-window"):
            before = (0.0, ())
        cycles = chain_latency(_op_instructions(inst))
        chain[inst.name] = (before[0] + cycles, before[1] + (inst.name,)) if cycles else before
    return set(max(chain.values(), key=lambda c: c[0], default=(0.0, ()))[1])


def fused_instructions(graph: OpGraph, node_name: str) -> list[Instruction]:
    """The instructions one XLA kernel runs: a fusion's computation, or the op itself."""
    inst = graph.computation.index().by_name[node_name]
    if inst.opcode == "fusion":
        return graph.module.computation(inst.called_computations[0]).instructions
    return [inst]


def xla_kernel_profile(graph: OpGraph, node_name: str,
                       device: costmodel.Device) -> costmodel.KernelProfile:
    node = graph.nodes[node_name]
    instructions = fused_instructions(graph, node_name)
    outputs = _elements(node.shape)
    reduces = [i for i in instructions if i.opcode in ("reduce", "reduce-window")]
    # A reduction kernel's rows are its reductions' results, whatever else it outputs.
    threads = max(_elements(r.shape) for r in reduces) * WARP if reduces else outputs
    counts: dict[str, float] = {}
    names = {i.name: i for i in instructions}
    # What each op computes: a gather's operand only at the gathered elements.
    demand = demanded_elements(instructions, {o: graph.nodes[o].shape for o in node.operands})
    levels = load_levels(instructions)
    critical = critical_chain(instructions)
    loads: dict[int, list[float]] = {}

    def load(level: int, read: int) -> None:
        # every thread reads at least one element (a broadcast operand is read per thread)
        n = max(1.0, read / threads)
        entry = loads.setdefault(level, [0.0, 0.0])
        entry[0] += n
        entry[1] = max(entry[1], n)

    for inst in instructions:
        if inst.opcode == "parameter":
            load(levels[inst.name], demand[inst.name])
        elif inst.opcode in ("reduce", "reduce-window"):
            operand = names.get(inst.operands[0])  # absent for an unfused reduce
            reduced = _elements((operand or graph.nodes[inst.operands[0]]).shape)
            dtype = _leaves(inst.shape)[0].dtype
            combine = {"fp32": 1} if dtype in ("f32", "f16", "bf16") else {"int": 1}
            add_instructions(counts, combine, reduced / threads)  # this thread's share
            add_instructions(counts, {"shfl": SHUFFLE_STEPS})  # then across the warp
            add_instructions(counts, combine, SHUFFLE_STEPS)
        else:
            per_thread = demand[inst.name] / threads
            # The chain waits once per unrolled group of this thread's elements.
            waits = min(per_thread, math.ceil(per_thread / XLA_UNROLL)) \
                if inst.name in critical else 0.0
            ops = _op_instructions(inst)
            add_instructions(counts, ops, waits)
            if per_thread > waits:
                add_instructions(counts, {overlapped(k): n for k, n in ops.items()},
                                 per_thread - waits)
    if node.opcode != "fusion":  # an unfused op reads its operands from global memory
        for operand in node.operands:
            load(levels.get(operand, 1), demand[operand])
    add_loads(counts, loads)
    add_instructions(counts, {"st_global": 1}, outputs / threads * len(_leaves(node.shape)))
    add_instructions(counts, {"int": 2})  # the element index from blockIdx and threadIdx
    block = min(XLA_THREADS_PER_BLOCK, device.max_threads_per_block, threads)
    # An elementwise tree holds at most one loaded value per input and the value it computes.
    inputs = sum(1 for i in instructions if i.opcode == "parameter") \
        if node.opcode == "fusion" else len(node.operands)
    live = inputs + 1
    bytes_read, bytes_written = pattern_traffic(graph, [node_name])
    return costmodel.KernelProfile(
        grid_blocks=max(1, math.ceil(threads / block)), threads_per_block=block,
        regs_per_thread=costmodel.estimate_registers([live]), smem_bytes=0,
        instructions=counts, bytes_read=bytes_read, bytes_written=bytes_written)
