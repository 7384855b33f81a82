"""How many elements of each value a kernel computes or reads: what its users demand.

A fused emitter (XLA's, and our code generator's index propagation alike) computes a value
only at the indices its users read: the operand of a gather or dynamic-slice only at the
gathered elements (a cross-entropy's log-probability of each label out of a [64, 32000]
expression: 64 elements, and 64 elements of the logits read). Every other op reads the share
of its operands that its own demand covers: all of them, unless it is itself partly demanded.
"""
from __future__ import annotations

import math

from ..hlo.ir import Instruction, Shape

# Ops that read operand 0 only at the elements of their result.
_GATHERING = {"gather", "dynamic-slice"}


def elements(shape: Shape) -> int:
    """The elements of a shape; of a tuple, its largest leaf's."""
    if shape.is_tuple:
        return max((elements(s) for s in shape.tuple_shapes), default=0)
    return shape.num_elements


def demanded_elements(instructions: list[Instruction],
                      operand_shapes: dict[str, Shape] | None = None) -> dict[str, int]:
    """Elements computed of each instruction, and read of each operand from outside (shapes
    in ``operand_shapes``), for instructions in operands-before-users order. A value nothing
    among them reads is wholly demanded (a result)."""
    shapes = dict(operand_shapes or {})
    shapes.update((i.name, i.shape) for i in instructions)
    demand: dict[str, int] = {}
    for inst in reversed(instructions):
        size = elements(inst.shape)
        own = min(size, demand.get(inst.name, size))
        demand[inst.name] = own
        for position, operand in enumerate(inst.operands):
            operand_size = elements(shapes[operand])
            if inst.opcode in _GATHERING and position == 0:
                share = min(operand_size, own)
            elif own >= size or size == 0:
                share = operand_size
            else:  # the part of the operand behind the demanded part of the result
                share = min(operand_size, math.ceil(operand_size * own / size))
            demand[operand] = max(demand.get(operand, 0), share)
    return demand
