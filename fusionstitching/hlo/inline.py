"""Fusions and calls replaced by the bodies of the computations they call, without recursion.

The evaluator runs a called computation by calling itself, two or three Python frames a
level, so 900 nested fusions (a valid, if hostile, module) hit Python's recursion limit; with
the nesting inlined the same values come from one flat list of instructions.
"""
from __future__ import annotations

import dataclasses

from .ir import Computation, Instruction, Module

INLINED = ("fusion", "call")


def nesting_depth(module: Module, comp: Computation) -> int:
    """How many fusions or calls deep ``comp``'s calls go (0: none)."""
    table = module.computation_map()
    depth: dict[str, int] = {}
    stack = [(comp.name, False)]
    while stack:
        name, children_done = stack.pop()
        if name in depth or name not in table:
            continue
        callees = [c for inst in table[name].instructions if inst.opcode in INLINED
                   for c in inst.called_computations]
        if children_done:
            depth[name] = max((depth.get(c, 0) + 1 for c in callees), default=0)
        else:
            stack.append((name, True))
            stack.extend((c, False) for c in callees if c not in depth)
    return depth.get(comp.name, 0)


def inline_calls(module: Module, comp: Computation) -> tuple[Module, Computation]:
    """``comp`` with every fusion and call (and those inside them) replaced by the called
    computation's instructions; the called root takes the fusion's name, so users and the
    computation's result are unchanged. The module gains the new computation."""
    table = module.computation_map()
    result_name = comp.root.name  # an inlined root takes its fusion's name, so this stays
    flat: list[Instruction] = []
    # Each frame: the instructions left to copy, the renaming of the computation they belong
    # to (its parameters stand for the call's operands), a prefix for new names, and the name
    # the root takes (None for ``comp`` itself, which keeps its own root).
    stack = [(list(reversed(comp.instructions)), {}, "", None)]
    while stack:
        pending, renamed, prefix, root_name = stack[-1]
        if not pending:
            stack.pop()
            continue
        inst = pending.pop()
        operands = [renamed.get(op, op) for op in inst.operands]
        if inst.opcode == "parameter" and root_name is not None:
            continue  # stands for an operand of the call (in ``renamed``)
        name = root_name if (inst.is_root and root_name is not None) else \
            renamed.setdefault(inst.name, f"{prefix}{inst.name}")
        if inst.opcode in INLINED:
            called = table[inst.called_computations[0]]
            params = {p.name: op for p, op in
                      zip(called.parameters, (operands[p.parameter_number]
                                              for p in called.parameters))}
            if called.root.opcode == "parameter":  # the call returns an operand as is
                flat.append(dataclasses.replace(
                    inst, name=name, opcode="copy", operands=[params[called.root.name]],
                    attrs={}, is_root=name == result_name))
                continue
            stack.append((list(reversed(called.instructions)), params, f"{name}/", name))
            continue
        flat.append(dataclasses.replace(inst, name=name, operands=operands,
                                        is_root=name == result_name))
    inlined = Computation(f"{comp.name}.inlined", flat, is_entry=False)
    return dataclasses.replace(module, computations=module.computations + [inlined]), inlined
