"""Put the stitched kernels back into the program XLA executes.

Route (measured with jax/jaxlib 0.10.2 on CPU):

XLA does not take its own optimized HLO back as input. The only compile entry jaxlib 0.10
exposes is ``Client.compile_and_load(<StableHLO/MLIR module>)``; there is no
``XlaComputation`` / ``HloModuleProto`` compile, and no "run backend only" build option in
its Python API. Going through ``hlo_to_stablehlo`` (HLO -> StableHLO) fails on optimized text:
CPU fusions lose the ``backend_config`` the CPU emitter needs, ``copy`` has no StableHLO
counterpart, and ``bitcast`` is a reinterpretation of the physical buffer that only means
something together with the layouts StableHLO drops.

So the rewrite turns the optimized module back into *pre-optimization style* HLO that says
the same thing logically, and lets XLA optimize it again:

1. ``replace_patterns``: each stitched pattern (XLA kernels in the entry computation) is
   removed and replaced by one ``custom-call`` to its FFI target (``fusionstitching_...``,
   ``api_version=API_VERSION_TYPED_FFI``); a multi-output kernel returns a tuple and one
   ``get-tuple-element`` per output. The replacement instructions take the *names* of the
   values they replace, so no user needs rewiring. The custom call pins the physical layouts
   the kernel was generated for (``operand_layout_constraints`` and the result layout), which
   survive the StableHLO route as ``operand_layouts`` / ``result_layouts``; XLA inserts any
   transposes needed around it.
2. ``normalize_for_xla``: every remaining fusion is inlined (its fused computation's
   instructions go into the caller, the root takes the fusion's name), layouts are dropped
   (every HLO op except ``bitcast`` is layout-independent), ``bitcast`` becomes the logical
   transpose/reshape/transpose it stands for, ``copy`` (a logical identity) becomes a
   same-shape ``reshape``, and ``backend_config`` and the scheduling header go.
3. ``compile_hlo`` (``runtime/xla.py``): HLO text -> ``hlo_to_stablehlo`` -> the same compile
   options ``jax.jit`` uses -> ``compile_and_load``. XLA runs its whole pipeline again: it
   re-fuses what we left to it (its own rules, its own plan) and treats our custom calls as
   opaque. The executable it returns is the program that runs; its ``as_text`` shows our
   custom calls among XLA's kernels.

The GPU launch path (``runtime/gpu.py``) is the same rewrite of XLA:GPU's optimized module:
step 1 additionally gives each custom call a ``backend_config`` (jaxlib's Triton kernel-call
proto with the kernel's PTX and launch dimensions) and the target names are registered to
jaxlib's PTX launcher instead of host kernels.

Why not the alternatives: keeping XLA's fusions as ``call``s (what hlo/xla_runner.py does for
verification) compiles modules without layout changes, but fails on bitcasts between
layouts (checked on the module of ``test_bitcast_between_layouts_becomes_logical_ops``:
"layout minor_to_major field contains 1 elements, but shape has 2 dimensions"); handing XLA
its optimized module unchanged is not possible through jaxlib's API.
The running program is then dispatched by jax itself: ``runtime.xla.swap_executable`` puts
the new executable into the ``jax.stages.Compiled`` that ``jax.jit`` built for the same
signature (same parameters and results), so pytrees, argument checks and jax's C++ fast path
are unchanged (measured: 139 us vs 150 us per call on a small function).

Cost, measured on this CPU (shared machine, so +-30%): one more XLA compile per signature,
of a module that is smaller than the original where patterns were replaced:

    JAX LayerNorm 64x256: XLA compile of jax.jit 0.65 s; rewritten module 0.10 s
        (the whole LayerNorm is one custom call); host kernel (LLVM -O3) 0.98 s.
    MLP training step (LayerNorm, GELU, softmax cross-entropy, grads; 5 stitched patterns):
        XLA compile 3.1 s; rewritten module 2.6 s; normalized module without any
        replacement 5.0 s (XLA re-fuses more inlined ops); host kernels 0.5-1.5 s each.

So the host-kernel compile, not XLA, dominates the extra JIT time: the kernel cache and the
async swap (issue 3, later parts) are where that time goes away. The MLP step run under
``fusionstitching.jit`` for 50 SGD steps gives the same loss as ``jax.jit`` (4.6959810e-2 vs
4.6959758e-2).

Limits: only the entry computation is rewritten (patterns inside while/conditional bodies are
left to XLA); entry parameters and result must have default layouts (XLA picks row-major
ones for the rewritten module; JAX always uses them); a bitcast that changes the element
type, or an XLA-internal custom call that needs its backend_config, makes the rewrite raise
``RewriteError`` and the caller falls back to XLA's own executable.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from ..hlo.ir import ELEMENT_BITS, Computation, Instruction, Module, Shape
from ..hlo.printer import format_shape
from .ffi import TARGET_PREFIX


class RewriteError(ValueError):
    """The module cannot be rewritten into HLO that XLA accepts; the caller falls back."""


def rewrite_module(module: Module, kernels: Sequence, targets: Sequence[str],
                   backend_configs: Sequence[str] | None = None) -> Module:
    """XLA's optimized module with ``kernels`` (pipeline.StitchedKernel: ``.pattern.nodes``,
    ``.spec.inputs/.outputs``) as calls to the FFI targets ``targets`` (one per kernel), in a
    form XLA compiles again. ``backend_configs`` (one per kernel, HLO attribute text) carry
    what the target needs at run time: the GPU launch path (runtime/gpu.py) puts each
    kernel's PTX and launch dimensions there; the CPU targets need none."""
    refuse_configured_custom_calls(module)
    return normalize_for_xla(replace_patterns(module, kernels, targets, backend_configs))


def refuse_configured_custom_calls(module: Module) -> None:
    """XLA's own library calls (``__cudnn$convForward``, ``__cublas$gemm``, ...) keep
    their meaning in attributes the StableHLO route drops (measured: a cuDNN convolution
    without its ``window`` aborts the whole process in XLA's ConvPaddingLegalization), and a
    custom call's ``backend_config`` would be stripped by the normalization. Such a module
    stays XLA's."""
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
                     backend_configs: Sequence[str] | None = None) -> Module:
    entry = module.entry
    replaced = {node for k in kernels for node in k.pattern.nodes}
    replaced |= {name.partition("#")[0] for k in kernels for name, _ in k.spec.outputs}
    kept = [dataclasses.replace(i, is_root=False) for i in entry.instructions
            if i.name not in replaced]
    configs = [None] * len(kernels) if backend_configs is None else backend_configs
    for kernel, target, config in zip(kernels, targets, configs, strict=True):
        kept.extend(custom_call(kernel.spec, target, config))

    root = entry.root.name
    instructions = _topological(_live(kept, root))
    for inst in instructions:
        inst.is_root = inst.name == root
    computations = [dataclasses.replace(entry, instructions=instructions) if c is entry else c
                    for c in module.computations]
    return dataclasses.replace(module, computations=computations)


def custom_call(spec, target: str, backend_config: str | None = None) -> list[Instruction]:
    """The instructions that call kernel ``spec`` (registered as FFI target ``target``): one
    custom call named after its output, or a tuple-shaped call plus one get-tuple-element per
    output (named after the outputs). ``backend_config``: the attribute's HLO text, if any.

    An output ``X#i`` is element i of a multi-output fusion X whose tuple is used outside the
    pattern (codegen/flatten.py); the tuple ``X`` is rebuilt from those elements."""
    operands = [name for name, _ in spec.inputs]
    constraints = ", ".join(format_shape(_with_layout(s)) for _, s in spec.inputs)
    attrs = {
        "custom_call_target": f'"{target}"',
        "api_version": "API_VERSION_TYPED_FFI",
        "operand_layout_constraints": "{" + constraints + "}",
    }
    if backend_config is not None:
        attrs["backend_config"] = backend_config
    outputs = [(_output_name(name), _with_layout(shape)) for name, shape in spec.outputs]
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


def _output_name(name: str) -> str:
    base, _, index = name.partition("#")
    return f"{base}.element{index}" if index else name


def _rebuilt_tuples(outputs) -> list[Instruction]:
    elements: dict[str, list[tuple[int, str, Shape]]] = {}
    for name, shape in outputs:
        base, _, index = name.partition("#")
        if index:
            elements.setdefault(base, []).append((int(index), _output_name(name), shape))
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


# -- 2. optimized HLO -> HLO that XLA compiles again -----------------------------------------

def normalize_for_xla(module: Module) -> Module:
    _require_default_entry_layouts(module.entry)
    fused = {name for comp in module.computations for inst in comp.instructions
             if inst.opcode == "fusion" for name in inst.called_computations}
    computations = []
    for comp in module.computations:
        if comp.name in fused:
            continue  # inlined into its caller
        identity = {i.name: i.name for i in comp.instructions}
        instructions = _lower_body(module, comp, identity, root_name=None)
        names = [i.name for i in instructions]
        if len(names) != len(set(names)):
            raise RewriteError(f"inlining fusions into {comp.name} gives duplicate names")
        computations.append(dataclasses.replace(comp, instructions=instructions))
    return dataclasses.replace(module, computations=computations, header_attrs="")


def _require_default_entry_layouts(entry: Computation) -> None:
    """Dropping layouts lets XLA choose row-major ones for the entry's parameters and result;
    the caller's buffers are laid out as the original module said, so both must agree."""
    for inst in entry.parameters + [entry.root]:
        for leaf in inst.shape.leaves():
            if leaf.minor_to_major != tuple(range(leaf.rank - 1, -1, -1)):
                raise RewriteError(f"entry value {inst.name} has the non-default layout "
                                   f"{format_shape(leaf)}")


def _lower_body(module: Module, comp: Computation, names: dict[str, str],
                root_name: str | None) -> list[Instruction]:
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
        out.extend(_lower_instruction(module, lowered, [shapes[op] for op in inst.operands]))
    return out


def _lower_instruction(module: Module, inst: Instruction,
                       operand_shapes: list[Shape]) -> Iterable[Instruction]:
    if inst.opcode == "custom-call" and (inst.custom_call_target or "").startswith(TARGET_PREFIX):
        return [inst]  # ours: keeps the physical layouts it was generated for
    if inst.opcode == "fusion":
        (called,) = inst.called_computations
        fused = module.computation(called)
        names = {p.name: op for p, op in zip(fused.parameters, inst.operands)}
        body = _lower_body(module, fused, names, root_name=inst.name)
        for lowered in body:
            lowered.is_root = inst.is_root and lowered.name == inst.name
        return body
    attrs = {k: v for k, v in inst.attrs.items() if k != "backend_config"}
    logical = dataclasses.replace(inst, shape=inst.shape.without_layout(), attrs=attrs)
    if inst.opcode == "bitcast":
        return _bitcast_as_logical(logical, inst.shape, operand_shapes[0])
    if inst.opcode == "copy":
        if inst.shape.is_tuple:
            raise RewriteError(f"tuple-shaped copy {inst.name}: StableHLO has no copy")
        return [dataclasses.replace(logical, opcode="reshape")]
    return [logical]


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
