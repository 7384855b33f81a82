"""XLA's kernels as the latency-evaluator sees them, so XLA's plan is priced like the stitched one.

``xla_kernel_profile(graph, node_name, device)`` describes one kernel XLA launches (a fusion or
an unfused op) without its code, from the graph alone:

* global bytes: ``pattern_traffic(graph, [node])``, the accounting the stitched plan uses;
* threads: one per output element, as XLA's loop emitter launches elementwise kernels. A
  reduction kernel gives each reduction result (row) a warp instead (XLA's reduction emitter
  reduces a row with at least a warp), which loops over its share of the row and then
  combines the lanes with a 5-step shuffle butterfly;
* instructions per thread: each fused op's instructions (costmodel/instructions.py, the table
  the stitched kernels are counted with) times its elements per thread, one global load per
  element of each parameter (in unrolled groups of 8 whose loads overlap, as in the stitched
  kernels' unrolled loops) and one global store per output element;
* 128 threads per block (XLA:GPU's default block size for loop fusions; assumption, not
  re-checked) and registers for one loaded value per input plus the value being computed,
  through ``costmodel.estimate_registers``.
"""
from __future__ import annotations

import math

import costmodel
from costmodel.instructions import OVERLAPPED_LOAD, add_instructions, op_instructions

from ..hlo.ir import Instruction, Shape
from .opgraph import OpGraph
from .traffic import pattern_traffic

XLA_THREADS_PER_BLOCK = 128
WARP = 32
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


def add_loads(counts: dict[str, float], loads: float) -> None:
    """A thread's loads of one input, in unrolled groups of XLA_UNROLL: the first load of a
    group waits the full latency, the others overlap it."""
    groups = math.ceil(loads / XLA_UNROLL)
    add_instructions(counts, {"ld_global": groups, OVERLAPPED_LOAD: loads - groups})


def fused_instructions(graph: OpGraph, node_name: str) -> list[Instruction]:
    """The instructions one XLA kernel runs: a fusion's computation, or the op itself."""
    inst = graph.computation.by_name()[node_name]
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
    for inst in instructions:
        if inst.opcode == "parameter":
            # every thread reads at least one element (a broadcast operand is read per thread)
            add_loads(counts, max(1.0, _elements(inst.shape) / threads))
        elif inst.opcode in ("reduce", "reduce-window"):
            operand = names.get(inst.operands[0])  # absent for an unfused reduce
            reduced = _elements((operand or graph.nodes[inst.operands[0]]).shape)
            dtype = _leaves(inst.shape)[0].dtype
            combine = {"fp32": 1} if dtype in ("f32", "f16", "bf16") else {"int": 1}
            add_instructions(counts, combine, reduced / threads)  # this thread's share
            add_instructions(counts, {"shfl": SHUFFLE_STEPS})  # then across the warp
            add_instructions(counts, combine, SHUFFLE_STEPS)
        else:
            add_instructions(counts, op_instructions(inst.opcode, _leaves(inst.shape)[0].dtype),
                             _elements(inst.shape) / threads)
    if node.opcode != "fusion":  # an unfused op reads its operands from global memory
        for operand in node.operands:
            add_loads(counts, max(1.0, _elements(graph.nodes[operand].shape) / threads))
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
