"""HLO text through XLA:CPU (jaxlib): the second opinion next to the numpy evaluator.

``run_hlo_with_xla`` parses the text with XLA's own parser, converts it to StableHLO and runs
it on XLA:CPU: fusions become calls (where XLA rejects that, the module is normalized as the
runtime's is, normalize.py) and cuDNN calls the HLO convolutions they stand for. XLA
re-optimizes, so this checks semantics, not the dump's kernels (drift.py judges a result by
XLA's own distance from its f64 result); ``optimized_hlo_text`` prints large constants in full
(``as_text()`` elides them).
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from .attrs import ConvDims
from .eval_values import UnsupportedOp
from .gpu_library import BACKWARD_CONV_TARGETS, CONV_TARGETS
from .ir import Instruction, Module, Shape, print_module
from .normalize import normalize_for_xla
from .parser import parse_module
from .xla_text import hlo_module_text, optimized_hlo_text  # noqa: F401 - re-exported

# A fusion instruction: ``= <shape> fusion(...), kind=kLoop, calls=%comp``.
_FUSION_OPCODE = re.compile(r"(\s)fusion\(")
_FUSION_CALLEE = re.compile(r"kind=k\w+,\s*calls=")


def fusions_to_calls(text: str) -> str:
    """Rewrites every ``fusion`` instruction into a ``call`` of the same computation."""
    return _FUSION_CALLEE.sub("to_apply=", _FUSION_OPCODE.sub(r"\1call(", text))


def run_hlo_with_xla(text: str, args: list) -> list[np.ndarray]:
    """Compiles HLO text with XLA:CPU and runs it; returns the flattened result leaves."""
    executable, buffers = prepared_for_xla_cpu(text, args)
    return [np.asarray(out) for out in executable.execute(buffers)]


def prepared_for_xla_cpu(text: str, args: list) -> tuple:
    """(XLA:CPU's loaded executable of the module, ``args`` on its device): run it with
    ``executable.execute(buffers)``, as often as wanted."""
    import jax
    import jax.extend
    from jax._src.lib import xla_client

    backend = jax.extend.backend.get_backend("cpu")
    device = backend.local_devices()[:1]

    def compile_text(hlo_text: str):
        module = xla_client.hlo.hlo_module_from_text(hlo_text)
        stablehlo = xla_client._xla.mlir.hlo_to_stablehlo(
            module.as_serialized_hlo_module_proto())
        options = xla_client.CompileOptions()
        # No YNNPACK fusions: they drop the NaN of a maximum that HLO propagates (a dlrm
        # step's NaN loss came out finite), so the oracle would not compute HLO's semantics.
        options.env_option_overrides = [("xla_cpu_experimental_ynn_fusion_type", "")]
        return backend.compile_and_load(stablehlo, device, options)

    if "__cudnn$" in text:
        text = cudnn_calls_as_hlo(text)
    try:
        executable = compile_text(fusions_to_calls(text))
    except jax.errors.JaxRuntimeError:
        # Called computations keep their bitcasts' layouts, which the StableHLO route drops
        # ("layout minor_to_major field contains ..."): then take the route the runtime uses,
        # fusions inlined and bitcasts written as the reshapes/transposes they mean. The
        # arguments are logical arrays laid out by XLA, whatever layouts the entry names.
        executable = compile_text(print_module(normalize_for_xla(parse_module(text),
                                                                 caller_layouts=False)))
    # XLA must receive exactly the module's parameter types: without x64, device_put
    # narrows s64/u64/f64 arrays to 32 bits.
    with jax.enable_x64(True):
        buffers = [jax.device_put(np.asarray(a), device[0]) for a in args]
    return executable, buffers


# -- cuDNN convolutions as HLO ----------------------------------------------------------------
# XLA:CPU has no cuDNN: each ``__cudnn$conv*`` custom call of an XLA:GPU module is written as
# the HLO convolution it stands for (gpu_library describes the calls), so that XLA itself, and
# not our evaluator, runs it. Gradients are the transposed convolutions JAX's own transpose
# rules build (jax._src.lax.convolution: _conv_general_dilated_transpose_lhs / _rhs).

def cudnn_calls_as_hlo(text: str) -> str:
    """The module text with every cuDNN convolution custom call replaced by HLO ops."""
    return print_module(cudnn_calls_as_convolutions(parse_module(text)))


def cudnn_calls_as_convolutions(module: Module) -> Module:
    """A copy of ``module`` with every cuDNN convolution custom call replaced by HLO ops (a
    tuple of the result and the zero-filled scratch buffer, as the call returns). Raises
    UnsupportedOp for a call that has no such form here."""
    computations = []
    for comp in module.computations:
        lowered, shapes = [], {i.name: i.shape for i in comp.instructions}
        for inst in comp.instructions:
            if inst.opcode == "custom-call" and inst.custom_call_target in (
                    CONV_TARGETS + BACKWARD_CONV_TARGETS):
                lowered += _cudnn_as_hlo(inst, shapes)
            else:
                lowered.append(inst)
        computations.append(dataclasses.replace(comp, instructions=lowered))
    return dataclasses.replace(module, computations=computations)


def _dilate(sizes, dilation):
    return [0 if n == 0 else 1 + d * (n - 1) for n, d in zip(sizes, dilation)]


def _window_text(size, stride, pad, lhs_dilate, rhs_dilate) -> str:
    def join(values):
        return "x".join(map(str, values))

    parts = [f"size={join(size)}"]
    if any(v != 1 for v in stride):
        parts.append(f"stride={join(stride)}")
    if any(p != (0, 0) for p in pad):
        parts.append("pad=" + "x".join(f"{lo}_{hi}" for lo, hi in pad))
    if any(v != 1 for v in lhs_dilate):
        parts.append(f"lhs_dilate={join(lhs_dilate)}")
    if any(v != 1 for v in rhs_dilate):
        parts.append(f"rhs_dilate={join(rhs_dilate)}")
    return "{" + " ".join(parts) + "}"


def _swap(labels: str, a: str, b: str) -> str:
    return labels.translate(str.maketrans({a: b, b: a}))


def _cudnn_as_hlo(inst, shapes: dict) -> list:
    """The instructions that replace one cuDNN call (``shapes``: its computation's shapes by
    name); the last is a tuple named as the call."""
    config = (inst.attr_json() or {}).get("cudnn_conv_backend_config", {})
    name, target = inst.name, inst.custom_call_target
    out_shape, scratch_shape = inst.shape.tuple_shapes
    dtype = out_shape.dtype
    conv = ConvDims.parse(inst.attrs)
    input_labels, filter_labels, output_labels = (
        conv.input_labels, conv.filter_labels, conv.output_labels)
    rank, window, groups = len(conv.spatial), conv.window, conv.feature_group_count
    if any(window.reversal) and target not in CONV_TARGETS:
        # A forward call keeps its window, reversal included: HLO's convolution has it and
        # XLA:CPU runs it (a flax ResNet step's filter gradients come as such calls).
        raise UnsupportedOp(f"%{inst.name}: cuDNN gradient convolution with a reversed window")
    new: list = []

    def add(suffix, shape, opcode, operands, attrs=None, literal=None):
        new.append(Instruction(f"{name}.{suffix}", shape, opcode, list(operands),
                               dict(attrs or {}), literal=literal))
        return new[-1].name

    def scalar(suffix, value, element=dtype):
        return add(suffix, Shape(element), "constant", [], literal=repr(value) if isinstance(
            value, float) else str(value))

    def full(suffix, value, shape=out_shape):
        return add(suffix, shape, "broadcast", [scalar(suffix + ".s", value, shape.dtype)],
                   {"dimensions": "{}"})

    def binary(suffix, opcode, a, b):
        return add(suffix, out_shape, opcode, [a, b])

    def spatial(labels, dims):
        return [dims[labels.index(str(i))] for i in range(rank)]

    def operand_dims(i):
        return shapes[inst.operands[i]].dims

    lhs, rhs = inst.operands[:2]
    if target in CONV_TARGETS:
        attrs = {"window": inst.attrs.get("window", "{}"), "dim_labels": inst.attrs["dim_labels"]}
        if groups != 1:
            attrs["feature_group_count"] = str(groups)
        result = add("conv", out_shape, "convolution", [lhs, rhs], attrs)
    elif target == "__cudnn$convBackwardInput":  # operands (d_output, filter) -> d_input
        if groups != 1:
            raise UnsupportedOp(f"%{name}: cuDNN input gradient with feature groups")
        kernel = window.size
        filter_spatial = [filter_labels.index(str(i)) for i in range(rank)]
        w = add("reversed", Shape(dtype, operand_dims(1)), "reverse", [rhs],
                {"dimensions": "{" + ",".join(map(str, filter_spatial)) + "}"})
        in_sizes = spatial(input_labels, out_shape.dims)
        out_sizes = spatial(output_labels, operand_dims(0))
        lhs_dilated = _dilate(in_sizes, window.base_dilation)
        rhs_dilated = _dilate(kernel, window.window_dilation)
        out_dilated = _dilate(out_sizes, window.stride)
        before = [r - lo - 1 for r, (lo, _) in zip(rhs_dilated, window.padding)]
        after = [lh + r - 1 - o - b for lh, r, o, b in
                 zip(lhs_dilated, rhs_dilated, out_dilated, before)]
        attrs = {"window": _window_text(kernel, window.base_dilation, list(zip(before, after)),
                                        window.stride, window.window_dilation),
                 "dim_labels": f"{output_labels}_{_swap(filter_labels, 'o', 'i')}->"
                               f"{input_labels}"}
        result = add("conv", out_shape, "convolution", [lhs, w], attrs)
    else:  # __cudnn$convBackwardFilter: operands (input, d_output) -> d_filter
        in_sizes = spatial(input_labels, operand_dims(0))
        out_sizes = spatial(output_labels, operand_dims(1))
        lhs_dilated = _dilate(in_sizes, window.base_dilation)
        rhs_dilated = _dilate(window.size, window.window_dilation)
        out_dilated = _dilate(out_sizes, window.stride)
        pad = [(lo, o - lh + r - lo - 1) for (lo, _), o, lh, r in
               zip(window.padding, out_dilated, lhs_dilated, rhs_dilated)]
        dy_labels = output_labels.translate(str.maketrans({"b": "i", "f": "o"}))
        grad_labels = filter_labels.translate(str.maketrans({"i": "b", "o": "f"}))
        attrs = {"window": _window_text(out_sizes, window.window_dilation, pad,
                                        window.base_dilation, window.stride),
                 "dim_labels": f"{_swap(input_labels, 'b', 'f')}_{dy_labels}->{grad_labels}"}
        if groups != 1:
            attrs["batch_group_count"] = str(groups)
        result = add("conv", out_shape, "convolution", [lhs, rhs], attrs)
    scale = float(config.get("conv_result_scale", 1))
    if scale != 1:
        result = binary("scaled", "multiply", result, full("scale", scale))
    if target == "__cudnn$convBiasActivationForward":
        feature = output_labels.index("f")
        bias = add("bias", out_shape, "broadcast", [inst.operands[2]],
                   {"dimensions": "{" + str(feature) + "}"})
        result = binary("biased", "add", result, bias)
        side_scale = float(config.get("side_input_scale", 0))
        if len(inst.operands) > 3 and side_scale != 0:
            side = inst.operands[3]
            if side_scale != 1:
                side = binary("side", "multiply", side, full("side_scale", side_scale))
            result = binary("with_side", "add", result, side)
        result = _activation(config, result, binary, full, add, out_shape, name)
    scratch = full("scratch", 0, scratch_shape)
    new.append(Instruction(name, inst.shape, "tuple", [result, scratch], is_root=inst.is_root))
    return new


def _activation(config, x, binary, full, add, shape, name):
    mode = config.get("activation_mode", "kNone")
    if mode == "kNone":
        return x
    if mode == "kRelu":
        return binary("relu", "maximum", x, full("zero", 0.0))
    if mode == "kRelu6":
        return add("relu6", shape, "clamp", [full("zero", 0.0), x, full("six", 6.0)])
    if mode == "kTanh":
        return add("tanh", shape, "tanh", [x])
    if mode == "kSigmoid":
        return add("sigmoid", shape, "logistic", [x])
    if mode in ("kElu", "kLeakyRelu"):
        positive = add("positive", Shape("pred", shape.dims, shape.layout), "compare",
                       [x, full("zero", 0.0)], {"direction": "GT"})
        other = (add("expm1", shape, "exponential-minus-one", [x]) if mode == "kElu" else
                 binary("leaky", "multiply", x, full("alpha", float(
                     config.get("leakyrelu_alpha", 0)))))
        return add("activated", shape, "select", [positive, x, other])
    raise UnsupportedOp(f"%{name}: cuDNN activation {mode}")


