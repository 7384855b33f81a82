"""``ir.Module`` -> HLO text in the layout ``HloModule::ToString`` uses.

The output parses back to an equal Module (parser.parse_module) and is accepted by XLA's own
parser. Like XLA, long tuple shapes and operand lists get ``/*index=N*/`` markers every five
elements; the parser drops them again.
"""
from __future__ import annotations

from .ir import Computation, Instruction, Module, Shape


def _join_indexed(items: list[str]) -> str:
    """``a, b, c, d, e, /*index=5*/f``: XLA's markers that help reading long lists."""
    return ", ".join(f"/*index={i}*/{s}" if i and i % 5 == 0 else s
                     for i, s in enumerate(items))


def format_shape(shape: Shape) -> str:
    if shape.is_tuple:
        return "(" + _join_indexed([format_shape(s) for s in shape.tuple_shapes]) + ")"
    dynamic = shape.dynamic or (False,) * len(shape.dims)
    dims = ",".join(("<=" if dyn else "") + str(d) for d, dyn in zip(shape.dims, dynamic))
    text = f"{shape.dtype}[{dims}]"
    if shape.layout is not None:
        text += "{" + ",".join(map(str, shape.layout)) + shape.layout_suffix + "}"
    return text


def print_instruction(inst: Instruction) -> str:
    """One instruction line, without indentation."""
    if inst.opcode == "constant":
        args = inst.literal or ""
    elif inst.opcode == "parameter":
        args = str(inst.parameter_number)
    else:
        shapes = inst.operand_shapes or [None] * len(inst.operands)
        args = _join_indexed([(f"{format_shape(s)} " if s is not None else "") + f"%{name}"
                              for s, name in zip(shapes, inst.operands)])
    attrs = "".join(f", {key}={value}" for key, value in inst.attrs.items())
    root = "ROOT " if inst.is_root else ""
    return f"{root}%{inst.name} = {format_shape(inst.shape)} {inst.opcode}({args}){attrs}"


def print_computation(comp: Computation) -> str:
    """``[ENTRY] %name (p: shape, ...) -> shape {`` + indented instructions + ``}``.

    The signature is derived from the parameters and root (shapes without layout, as XLA
    prints it), so it cannot disagree with the body.
    """
    params = ", ".join(f"{p.name}: {format_shape(p.shape.without_layout())}"
                       for p in comp.parameters)
    result = format_shape(comp.root.shape.without_layout())
    lines = [f"{'ENTRY ' if comp.is_entry else ''}%{comp.name} ({params}) -> {result} {{"]
    lines += [f"  {print_instruction(inst)}" for inst in comp.instructions]
    lines.append("}" + comp.suffix)
    return "\n".join(lines)


def print_module(module: Module) -> str:
    header = f"HloModule {module.name}"
    if module.header_attrs:
        header += f", {module.header_attrs}"
    out = [header + "\n\n"]
    for title, lines in module.sections:
        out.append(title + "\n" + "".join(line + "\n" for line in lines) + "\n")
    if module.sections:
        out.append("\n")
    out += [print_computation(comp) + "\n\n" for comp in module.computations]
    return "".join(out)
