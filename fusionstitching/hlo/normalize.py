"""Optimized HLO back into HLO that XLA compiles again (``normalize_for_xla``).

XLA does not take its own optimized HLO back (jaxlib compiles StableHLO only, and the
HLO -> StableHLO route loses fusion configs, ``copy`` and bitcast layouts), so the module is
turned into pre-optimization style that says the same thing logically. The runtime's rewrite
(runtime/rewrite.py) and the XLA:CPU oracle (xla_runner.py) both take this route.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from .ir import ELEMENT_BITS, Computation, Instruction, Module, Shape


class RewriteError(ValueError):
    """The module cannot be rewritten into HLO that XLA accepts; the caller falls back."""


def normalize_for_xla(module: Module, pinned_prefix: str | None = None,
                      caller_layouts: bool = True) -> Module:
    """``module`` in pre-optimization style: fusions inlined, layouts dropped, bitcasts and
    copies written as logical ops, backend_config and the scheduling header gone. Custom calls
    to targets starting with ``pinned_prefix`` keep the layouts their kernels were generated
    for. ``caller_layouts``: the caller's buffers are laid out as the entry says (the
    runtime's rewrite), so those layouts must be XLA's defaults; False where the arguments
    are logical arrays that XLA lays out itself (the oracle, the measurement of a kernel).
    Raises RewriteError where XLA could not take the result."""
    if caller_layouts:
        _require_default_entry_layouts(module.entry)
    fused = {name for comp in module.computations for inst in comp.instructions
             if inst.opcode in FUSIONS for name in inst.called_computations}
    computations = []
    for comp in module.computations:
        if comp.name in fused:
            continue  # inlined into its caller
        _require_done_after_start(comp)
        identity = {i.name: i.name for i in comp.instructions}
        instructions = _lower_body(module, comp, identity, None, pinned_prefix)
        names = [i.name for i in instructions]
        if len(names) != len(set(names)):
            raise RewriteError(f"inlining fusions into {comp.name} gives duplicate names")
        computations.append(dataclasses.replace(comp, instructions=instructions))
    return dataclasses.replace(module, computations=computations, header_attrs="")


# An async fusion (XLA:GPU puts a while body's dynamic slices in them) is inlined like a plain
# one: the start's body computes the value, the done names it.
FUSIONS = ("fusion", "fusion-start")


def _require_done_after_start(comp: Computation) -> None:
    starts = {i.name for i in comp.instructions if i.opcode == "fusion-start"}
    for inst in comp.instructions:
        if inst.opcode != "fusion-done" and starts.intersection(inst.operands):
            raise RewriteError(f"{inst.name} reads an async fusion's state: only its "
                               "fusion-done can")


def _require_default_entry_layouts(entry: Computation) -> None:
    """Dropping layouts lets XLA choose row-major ones for the entry's parameters and result;
    the caller's buffers are laid out as the original module said, so both must agree."""
    for inst in entry.parameters + [entry.root]:
        for leaf in inst.shape.leaves():
            if leaf.minor_to_major != tuple(range(leaf.rank - 1, -1, -1)):
                raise RewriteError(f"entry value {inst.name} has the non-default layout "
                                   f"{leaf}")


def _lower_body(module: Module, comp: Computation, names: dict[str, str],
                root_name: str | None, pinned_prefix: str | None) -> list[Instruction]:
    """``comp``'s instructions in normalized form. ``names`` maps each name in ``comp`` to its
    name in the output (for an inlined fusion: parameters -> the fusion's operands, the root ->
    ``root_name``, everything else prefixed)."""
    shapes = {i.name: i.shape for i in comp.instructions}
    out: list[Instruction] = []
    for inst in comp.instructions:
        if root_name is not None:
            if inst.opcode == "parameter":
                continue  # the fusion's operand stands for it
            names[inst.name] = root_name if inst.is_root else f"{root_name}.{inst.name}"
        operands = [names[op] for op in inst.operands]
        lowered = dataclasses.replace(inst, name=names[inst.name], operands=operands,
                                      operand_shapes=None)
        if root_name is not None:
            lowered.is_root = False
        out.extend(_lower_instruction(module, lowered, [shapes[op] for op in inst.operands],
                                      pinned_prefix))
    return out


def _lower_instruction(module: Module, inst: Instruction, operand_shapes: list[Shape],
                       pinned_prefix: str | None) -> Iterable[Instruction]:
    if inst.opcode == "custom-call" and pinned_prefix is not None and \
            (inst.custom_call_target or "").startswith(pinned_prefix):
        return [inst]  # keeps the physical layouts it was generated for
    if inst.opcode in FUSIONS:
        (called,) = inst.called_computations
        fused = module.computation(called)
        names = {p.name: op for p, op in zip(fused.parameters, inst.operands)}
        value = inst.name if inst.opcode == "fusion" else _async_value(inst.name)
        body = _lower_body(module, fused, names, value, pinned_prefix)
        for lowered in body:
            lowered.is_root = inst.is_root and lowered.name == inst.name
        return body
    attrs = {k: v for k, v in inst.attrs.items() if k != "backend_config"}
    logical = dataclasses.replace(inst, shape=inst.shape.without_layout(), attrs=attrs)
    if inst.opcode == "fusion-done":  # the start's value under the done's name
        if inst.shape.is_tuple:
            raise RewriteError(f"tuple-shaped {inst.name}: StableHLO has no copy")
        return [dataclasses.replace(logical, opcode="reshape",
                                    operands=[_async_value(inst.operands[0])])]
    if inst.opcode == "bitcast":
        return _bitcast_as_logical(logical, inst.shape, operand_shapes[0])
    if inst.opcode == "copy":
        if inst.shape.is_tuple:
            raise RewriteError(f"tuple-shaped copy {inst.name}: StableHLO has no copy")
        return [dataclasses.replace(logical, opcode="reshape")]
    return [logical]


def _async_value(start: str) -> str:
    return f"{start}.value"


def _bitcast_as_logical(inst: Instruction, result: Shape, source: Shape) -> list[Instruction]:
    """A bitcast reads the operand's buffer in physical order and lays the bytes out in the
    result's layout: transpose to the source's physical order, reshape, transpose back from
    the result's physical order (identity transposes left out); a change of element type of
    the same size is a final ``bitcast-convert``."""
    if ELEMENT_BITS[source.dtype] != ELEMENT_BITS[result.dtype]:
        raise RewriteError(f"bitcast {inst.name} changes the element size")
    src_order = list(reversed(source.minor_to_major))  # major to minor
    dst_order = list(reversed(result.minor_to_major))
    steps: list[Instruction] = []
    value = inst.operands[0]

    def emit(suffix, opcode, dims, attrs, dtype=source.dtype):
        nonlocal value
        steps.append(dataclasses.replace(inst, name=f"{inst.name}.{suffix}",
                                         shape=Shape(dtype, tuple(dims)), opcode=opcode,
                                         operands=[value], attrs=attrs, is_root=False))
        value = steps[-1].name

    if src_order != sorted(src_order):
        emit("physical", "transpose", [source.dims[d] for d in src_order],
             {"dimensions": _braces(src_order)})
    emit("reshape", "reshape", [result.dims[d] for d in dst_order], {})
    if dst_order != sorted(dst_order):
        emit("logical", "transpose", result.dims, {"dimensions": _braces(np.argsort(dst_order))})
    if source.dtype != result.dtype:
        emit("convert", "bitcast-convert", result.dims, {}, dtype=result.dtype)
    steps[-1] = dataclasses.replace(steps[-1], name=inst.name, is_root=inst.is_root)
    return steps


def _braces(values) -> str:
    return "{" + ",".join(str(int(v)) for v in values) + "}"
