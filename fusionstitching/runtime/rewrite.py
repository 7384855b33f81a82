"""Put the stitched kernels back into the program XLA executes.

``replace_patterns`` swaps each stitched pattern (XLA kernels of the entry computation) for
one typed-FFI ``custom-call`` to its kernel, pinning the layouts it was generated for;
``hlo/normalize.py`` turns the rest back into pre-optimization-style HLO; XLA compiles the
result again (``runtime/xla.py``). ``RewriteError``: what the rewrite cannot express (the
caller keeps XLA's executable). The route and why: docs/ARCHITECTURE.md, "runtime/".
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ..hlo.attrs import input_output_alias
from ..hlo.ir import Instruction, Module, Shape, format_shape
from ..hlo.eval_values import UnsupportedOp
from ..hlo.normalize import RewriteError, normalize_for_xla
from ..hlo.xla_runner import cudnn_calls_as_convolutions
from .ffi import TARGET_PREFIX


def rewrite_module(module: Module, kernels: Sequence, targets: Sequence[str],
                   backend_configs: Sequence[str] | None = None,
                   donated: Mapping[str, Instruction] | None = None) -> Module:
    """XLA's optimized module with ``kernels`` (pipeline.StitchedKernel: ``.pattern.nodes``,
    ``.spec.inputs/.outputs``) as calls to the FFI targets ``targets`` (one per kernel), in a
    form XLA compiles again. ``backend_configs`` (one per kernel, HLO attribute text) carry
    what the target needs at run time: the GPU launch path (runtime/gpu.py) puts each
    kernel's PTX and launch dimensions there; the CPU targets need none. An XLA:GPU cuDNN
    convolution is written as the HLO convolution it stands for, whose cuDNN call XLA:GPU
    derives again. ``donated`` (`donated_parameters`; host kernels only): a kernel output
    that becomes a donated parameter is written into that parameter's buffer."""
    try:
        plain = cudnn_calls_as_convolutions(module)
    except UnsupportedOp as exc:
        raise RewriteError(str(exc)) from exc
    refuse_configured_custom_calls(plain)
    return normalize_for_xla(replace_patterns(plain, kernels, targets, backend_configs,
                                              donated), pinned_prefix=TARGET_PREFIX)


def donated_parameters(module: Module) -> dict[str, Instruction]:
    """{instruction: the parameter whose buffer it ends in}: each result of the entry's
    tuple root that ``input_output_alias`` places in a donated parameter's buffer."""
    entry = module.entry
    if entry.root.opcode != "tuple":
        return {}
    params = {i.parameter_number: i for i in entry.instructions if i.opcode == "parameter"}
    return {entry.root.operands[out]: params[param]
            for out, param in input_output_alias(module.header_attrs).items()
            if out < len(entry.root.operands) and param in params}


def refuse_configured_custom_calls(module: Module) -> None:
    """XLA's own library calls (``__cublas$gemm``, ...) keep their meaning in attributes the
    StableHLO route drops (measured: a cuDNN convolution passed through without its
    ``window`` aborts the whole process in XLA's ConvPaddingLegalization), and a custom
    call's ``backend_config`` would be stripped by the normalization. Such a module stays
    XLA's."""
    for comp in module.computations:
        for inst in comp.instructions:
            target = inst.custom_call_target or ""
            if inst.opcode != "custom-call" or target.startswith(TARGET_PREFIX):
                continue
            if target.startswith("__") or "backend_config" in inst.attrs:
                raise RewriteError(f"custom call {inst.name} to {target} carries XLA "
                                   "configuration the rewrite cannot keep")


# -- 1. stitched patterns -> custom calls ---------------------------------------------------

def replace_patterns(module: Module, kernels: Sequence, targets: Sequence[str],
                     backend_configs: Sequence[str] | None = None,
                     donated: Mapping[str, Instruction] | None = None) -> Module:
    entry = module.entry
    replaced = {node for k in kernels for node in k.pattern.nodes}
    replaced |= {name.partition("#")[0] for k in kernels for name, _ in k.spec.outputs}
    kept = [dataclasses.replace(i, is_root=False) for i in entry.instructions
            if i.name not in replaced]
    configs = [None] * len(kernels) if backend_configs is None else backend_configs
    for kernel, target, config in zip(kernels, targets, configs, strict=True):
        kept.extend(custom_call(kernel.spec, target, config, donated))

    root = entry.root.name
    instructions = _without_replaced_predecessors(_topological(_live(kept, root)), replaced)
    for inst in instructions:
        inst.is_root = inst.name == root
    computations = [dataclasses.replace(entry, instructions=instructions) if c is entry else c
                    for c in module.computations]
    return dataclasses.replace(module, computations=computations)


def custom_call(spec, target: str, backend_config: str | None = None,
                donated: Mapping[str, Instruction] | None = None) -> list[Instruction]:
    """The instructions that call kernel ``spec`` (registered as FFI target ``target``): one
    custom call named after its output, or a tuple-shaped call plus one get-tuple-element per
    output (named after the outputs). ``backend_config``: the attribute's HLO text, if any.

    An output ``X#i`` is element i of a multi-output fusion X whose tuple is used outside the
    pattern (codegen/flatten.py); the tuple ``X`` is rebuilt from those elements.

    Outputs written over an input (the host kernel's ``in_place``) alias that operand. An
    output that becomes a donated parameter the kernel does not read (``donated``) aliases
    that parameter, passed as one more operand: the kernel ignores it, XLA hands it the
    parameter's buffer as the output's, and no copy into the parameter follows."""
    inputs = list(spec.inputs)
    host = getattr(spec, "host_kernel", None)  # GPU kernels have none
    aliases = [(output - len(inputs), source) for source, output in
               (host.in_place if host is not None else ())]
    read = {name for name, _ in inputs}
    for index, (name, shape) in enumerate(spec.outputs):
        param = (donated or {}).get(name)
        if param is not None and param.name not in read and param.shape.same_array(shape) \
                and index not in {out for out, _ in aliases}:
            aliases.append((index, len(inputs)))
            inputs.append((param.name, param.shape))
    operands = [name for name, _ in inputs]
    constraints = ", ".join(format_shape(_with_layout(s)) for _, s in inputs)
    attrs = {
        "custom_call_target": f'"{target}"',
        "api_version": "API_VERSION_TYPED_FFI",
        "operand_layout_constraints": "{" + constraints + "}",
    }
    if backend_config is not None:
        attrs["backend_config"] = backend_config
    outputs = [(output_name(name), _with_layout(shape)) for name, shape in spec.outputs]
    if aliases:
        index = (lambda out: "{}") if len(outputs) == 1 else (lambda out: f"{{{out}}}")
        attrs["output_to_operand_aliasing"] = "{" + ", ".join(
            f"{index(out)}: ({source}, {{}})" for out, source in sorted(aliases)) + "}"
    if len(outputs) == 1:
        name, shape = outputs[0]
        calls = [Instruction(name, shape, "custom-call", operands, attrs)]
    else:
        tuple_shape = Shape("tuple", tuple_shapes=tuple(s for _, s in outputs))
        call = Instruction(f"{spec.name}.call", tuple_shape, "custom-call", operands, attrs)
        calls = [call] + [Instruction(name, shape, "get-tuple-element", [call.name],
                                      {"index": str(i)})
                          for i, (name, shape) in enumerate(outputs)]
    return calls + _rebuilt_tuples(spec.outputs)


def output_name(name: str) -> str:
    """The instruction holding pattern output ``name`` after `custom_call`."""
    base, _, index = name.partition("#")
    return f"{base}.element{index}" if index else name


def _rebuilt_tuples(outputs) -> list[Instruction]:
    elements: dict[str, list[tuple[int, str, Shape]]] = {}
    for name, shape in outputs:
        base, _, index = name.partition("#")
        if index:
            elements.setdefault(base, []).append((int(index), output_name(name), shape))
    tuples = []
    for base, parts in elements.items():
        parts.sort()
        if [i for i, _, _ in parts] != list(range(len(parts))):
            raise RewriteError(f"tuple {base} leaves the pattern with elements missing")
        shape = Shape("tuple", tuple_shapes=tuple(s.without_layout() for _, _, s in parts))
        tuples.append(Instruction(base, shape, "tuple", [n for _, n, _ in parts]))
    return tuples


def _with_layout(shape: Shape) -> Shape:
    """The shape with its layout spelled out: the kernel's buffers are in this physical order.
    Scalars have no layout to spell (XLA's parser rejects ``f32[]{}`` inside a tuple)."""
    return dataclasses.replace(shape, layout=shape.minor_to_major if shape.rank else None)


def _live(instructions: list[Instruction], root: str) -> list[Instruction]:
    """Instructions the root depends on, plus every parameter (the signature must not change)."""
    by_name = {i.name: i for i in instructions}
    if root not in by_name:
        raise RewriteError(f"the root {root!r} is inside a pattern but no kernel outputs it")
    live, stack = set(), [root]
    while stack:
        name = stack.pop()
        if name in live:
            continue
        if name not in by_name:
            raise RewriteError(f"{name!r} is used after the rewrite but no longer defined "
                               "(a pattern value used outside is missing from the outputs)")
        live.add(name)
        stack.extend(by_name[name].operands)
    return [i for i in instructions if i.name in live or i.opcode == "parameter"]


def _without_replaced_predecessors(instructions: list[Instruction],
                                   replaced: set[str]) -> list[Instruction]:
    """Control predecessors that a kernel replaced are dropped: they ordered reads before a
    write in XLA's buffer assignment (copies of donated buffers), which XLA makes again for
    the rewritten module. A name no longer defined would fail its parse, and so would a
    kernel's output: its call comes after every instruction it does not feed."""
    defined = {i.name for i in instructions}
    return [i.without_control_predecessors({n for n in i.control_predecessors
                                            if n not in defined or n in replaced})
            for i in instructions]


def _topological(instructions: list[Instruction]) -> list[Instruction]:
    """Operands before users, otherwise the given order (stable, so the text stays readable).

    Raises RewriteError on a cycle: kernels that depend on each other through the rest of
    the module (the explorer's plans are acyclic; this keeps a bad plan from looping here)."""
    by_name = {i.name: i for i in instructions}
    placed: set[str] = set()
    on_path: set[str] = set()  # expanded, operands not all placed yet
    order: list[Instruction] = []
    for start in instructions:
        stack = [(start, False)]
        while stack:
            inst, expanded = stack.pop()
            if inst.name in placed:
                continue
            if expanded:
                on_path.discard(inst.name)
                placed.add(inst.name)
                order.append(inst)
                continue
            if inst.name in on_path:
                raise RewriteError(f"the stitched kernels form a cycle through {inst.name}: "
                                   "a kernel needs a value that needs the kernel's own result")
            on_path.add(inst.name)
            stack.append((inst, True))
            stack.extend((by_name[op], False) for op in reversed(inst.operands)
                         if op not in placed)
    return order
