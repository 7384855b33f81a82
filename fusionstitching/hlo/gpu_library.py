"""XLA:GPU's library calls evaluated on numpy, so that a GPU module runs on this CPU.

cuBLAS GEMMs (``__cublas$gemm``, ``__cublas$lt$matmul``: alpha, beta, epilogues) and cuDNN
convolutions (forward, bias + activation, input and filter gradients) as their
``backend_config`` says, following XLA's gemm and cuDNN rewriters; workspace and scratch
outputs are zero-filled. Importing this module registers the calls with the evaluator;
``evaluate_custom_call`` also takes Triton GEMM fusions (plain HLO: their fused computation).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .attrs import ConvDims, Window
from .eval_movement import pad_array
from .eval_reduce import convolution, window_offsets, window_pad, window_slices
from .eval_values import UnsupportedOp, accumulation_dtype
from .evaluator import evaluate_computation, register_custom_call
from .ir import Instruction, Module, Shape

GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul")
CONV_TARGETS = ("__cudnn$convForward", "__cudnn$convBiasActivationForward")
BACKWARD_CONV_TARGETS = ("__cudnn$convBackwardInput", "__cudnn$convBackwardFilter")
TRITON_GEMM_KINDS = ("__triton_gemm", "__triton_nested_gemm_fusion")


def evaluate_custom_call(module: Module, inst: Instruction, operands: list):
    """Value of an XLA:GPU library node (custom-call or Triton GEMM fusion) on numpy operands."""
    if inst.opcode == "fusion":
        kind = (inst.attr_json() or {}).get("fusion_backend_config", {}).get("kind")
        if kind not in TRITON_GEMM_KINDS:
            raise UnsupportedOp(f"fusion kind {kind!r} (%{inst.name}) is not a Triton GEMM")
        return evaluate_computation(module, inst.called_computations[0], operands)
    target = inst.custom_call_target
    if target in GEMM_TARGETS:
        return _gemm(inst, operands)
    if target in CONV_TARGETS:
        return _cudnn_convolution(inst, operands)
    if target in BACKWARD_CONV_TARGETS:
        return _cudnn_convolution_gradient(inst, operands)
    raise UnsupportedOp(f"custom-call to {target!r} (%{inst.name}): not a cuBLAS GEMM or cuDNN "
                        "convolution this evaluator knows")


# ------------------------------------------------------------------------------------ cuBLAS

def _dims(numbers: dict, key: str) -> list[int]:
    return [int(d) for d in numbers.get(key, [])]


def _dot(lhs: np.ndarray, rhs: np.ndarray, numbers: dict, acc: np.dtype) -> np.ndarray:
    """dot_general with XLA's output order: batch dims, lhs free dims, rhs free dims."""
    lb, lc = _dims(numbers, "lhs_batch_dimensions"), _dims(numbers, "lhs_contracting_dimensions")
    rb, rc = _dims(numbers, "rhs_batch_dimensions"), _dims(numbers, "rhs_contracting_dimensions")
    lf = [d for d in range(lhs.ndim) if d not in lb + lc]
    rf = [d for d in range(rhs.ndim) if d not in rb + rc]
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    lhs_sub = [""] * lhs.ndim
    rhs_sub = [""] * rhs.ndim
    for left, right in zip(lb + lc, rb + rc):
        lhs_sub[left] = rhs_sub[right] = next(letters)
    for d in lf:
        lhs_sub[d] = next(letters)
    for d in rf:
        rhs_sub[d] = next(letters)
    out = [lhs_sub[d] for d in lb] + [lhs_sub[d] for d in lf] + [rhs_sub[d] for d in rf]
    return np.einsum(f"{''.join(lhs_sub)},{''.join(rhs_sub)}->{''.join(out)}",
                     lhs.astype(acc), rhs.astype(acc))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    # cuBLASLt's GELU epilogue is the tanh approximation (cuBLAS docs, CUBLASLT_EPILOGUE_GELU).
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


_ACTIVATIONS = {"RELU": lambda x: np.maximum(x, 0), "GELU": _gelu_tanh}


def _gemm(inst: Instruction, operands: list):
    config = (inst.attr_json() or {}).get("gemm_backend_config")
    if config is None:
        raise UnsupportedOp(f"%{inst.name}: cuBLAS custom-call without gemm_backend_config")
    shapes = list(inst.shape.tuple_shapes) if inst.shape.is_tuple else [inst.shape]
    out_shape = shapes[0]
    narrow = out_shape.numpy_dtype.kind == "f" and out_shape.numpy_dtype.itemsize < 4
    acc = np.dtype(np.float32) if narrow else out_shape.numpy_dtype
    lhs, rhs, *rest = operands
    result = _dot(lhs, rhs, config["dot_dimension_numbers"], acc) * float(
        config.get("alpha_real", 1))
    if float(config.get("alpha_imag", 0)) != 0:
        raise UnsupportedOp(f"%{inst.name}: complex alpha")
    beta = float(config.get("beta", 0))
    if beta != 0:  # operand 2 is C (XLA aliases it with the output): D = alpha A.B + beta C
        result = result + beta * rest.pop(0).astype(acc)
    epilogue = config.get("epilogue", "DEFAULT")
    parts = epilogue.split("_")
    if parts[0] == "BIAS":  # bias vector over the output's last (column) dimension
        result = result + rest.pop(0).astype(acc)
        parts = parts[1:]
    aux = None
    if parts[-1:] == ["AUX"]:
        if parts[:-1] != ["GELU"]:
            raise UnsupportedOp(f"%{inst.name}: epilogue {epilogue} (bit-mask aux output)")
        aux, parts = result, parts[:-1]
    if parts and parts != ["DEFAULT"]:
        (activation,) = parts
        if activation not in _ACTIVATIONS:
            raise UnsupportedOp(f"%{inst.name}: cuBLAS epilogue {epilogue}")
        result = _ACTIVATIONS[activation](result)
    values = [_cast(result, out_shape)] + ([_cast(aux, shapes[1])] if aux is not None else [])
    return _with_scratch(values, shapes)


# ------------------------------------------------------------------------------------ cuDNN

def _relu6(x):
    return np.clip(x, 0, 6)


_CUDNN_ACTIVATIONS = {"kNone": lambda x: x, "kRelu": lambda x: np.maximum(x, 0),
                      "kRelu6": _relu6, "kTanh": np.tanh,
                      "kSigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
                      "kElu": lambda x: np.where(x > 0, x, np.expm1(x))}


def _cudnn_convolution(inst: Instruction, operands: list):
    config = (inst.attr_json() or {}).get("cudnn_conv_backend_config", {})
    shapes = list(inst.shape.tuple_shapes) if inst.shape.is_tuple else [inst.shape]
    out_shape = shapes[0]
    # The same convolution as an HLO op, accumulated in f32 for f16/bf16 outputs.
    narrow = out_shape.numpy_dtype.kind == "f" and out_shape.numpy_dtype.itemsize < 4
    as_convolution = dataclasses.replace(
        inst, opcode="convolution", shape=Shape("f32", out_shape.dims) if narrow else out_shape)
    result = convolution(None, as_convolution, operands[:2]).astype(np.float32) * float(
        config.get("conv_result_scale", 1))
    if inst.custom_call_target == "__cudnn$convBiasActivationForward":
        bias = operands[2]  # over the output feature dimension
        feature = ConvDims.parse(inst.attrs).output_labels.index("f")
        result = result + np.reshape(bias, [-1 if d == feature else 1
                                            for d in range(result.ndim)])
        if len(operands) > 3:
            result = result + float(config.get("side_input_scale", 0)) * operands[3]
        mode = config.get("activation_mode", "kNone")
        if mode == "kLeakyRelu":
            alpha = float(config.get("leakyrelu_alpha", 0))
            result = np.where(result > 0, result, alpha * result)
        elif mode in _CUDNN_ACTIVATIONS:
            result = _CUDNN_ACTIVATIONS[mode](result)
        else:
            raise UnsupportedOp(f"%{inst.name}: cuDNN activation {mode}")
    return _with_scratch([_cast(result, out_shape)], shapes)


def _cudnn_convolution_gradient(inst: Instruction, operands: list):
    """``__cudnn$convBackwardInput`` / ``__cudnn$convBackwardFilter``: the adjoint of the
    forward convolution that the call's window, dim_labels and feature_group_count describe.

    Computed in the canonical layouts of ``eval_reduce.convolution`` (input [N, C, spatial...],
    filter [O, I, spatial...]) with the same tap loop, transposed: the forward convolution adds
    ``patch(offset) . w[offset]`` into the output for every kernel tap; its filter gradient at a
    tap is ``patch(offset)^T . dy``, its input gradient scatters ``dy . w[offset]`` back to the
    patch's positions in the padded input, and the padding (and any base dilation) is then
    undone, positions that padding cut away getting zero. The result shape is the call's own
    (the forward input or filter shape): input positions that no window reaches (a stride that
    does not divide the padded size) get zero, as in the gradient.
    """
    config = (inst.attr_json() or {}).get("cudnn_conv_backend_config", {})
    if config.get("activation_mode", "kNone") != "kNone":
        raise UnsupportedOp(f"%{inst.name}: cuDNN {inst.custom_call_target} with activation "
                            f"{config['activation_mode']}")
    conv = ConvDims.parse(inst.attrs)
    if conv.batch_group_count != 1:
        raise UnsupportedOp(f"%{inst.name}: cuDNN convolution with batch_group_count")
    shapes = list(inst.shape.tuple_shapes) if inst.shape.is_tuple else [inst.shape]
    out_shape = shapes[0]
    input_labels, filter_labels, output_labels = (
        conv.input_labels, conv.filter_labels, conv.output_labels)
    spatial, groups, window = conv.spatial, conv.feature_group_count, conv.window
    acc = accumulation_dtype(out_shape.numpy_dtype)

    def canonical(array, labels, order):
        return np.transpose(array, [labels.index(c) for c in order]).astype(acc)

    def canonical_dims(labels, order):
        return [out_shape.dims[labels.index(c)] for c in order]

    reversed_axes = [2 + i for i, r in enumerate(window.reversal) if r]
    if inst.custom_call_target == "__cudnn$convBackwardInput":
        dy = canonical(operands[0], output_labels, "bf" + spatial)
        w = np.flip(canonical(operands[1], filter_labels, "oi" + spatial), reversed_axes)
        result = _input_gradient(dy, w, canonical_dims(input_labels, "bf" + spatial),
                                 window, groups)
        order, labels = "bf" + spatial, input_labels
    else:
        x = canonical(operands[0], input_labels, "bf" + spatial)
        dy = canonical(operands[1], output_labels, "bf" + spatial)
        result = _filter_gradient(x, dy, canonical_dims(filter_labels, "oi" + spatial),
                                  window, groups)
        result = np.flip(result, reversed_axes)
        order, labels = "oi" + spatial, filter_labels
    result = result * float(config.get("conv_result_scale", 1))
    result = np.transpose(result, [order.index(c) for c in labels])
    return _with_scratch([_cast(result, out_shape)], shapes)


def _padded_positions(window: Window, sizes) -> list[np.ndarray]:
    """Per spatial dim: for each position of the padded (base-dilated) input, the input
    element placed there, or -1 for padding."""
    return [pad_array(np.arange(n), -1, [(lo, hi, d - 1)])
            for n, (lo, hi), d in zip(sizes, window.padding, window.base_dilation)]


def _filter_gradient(x, dy, filter_dims, window: Window, groups: int) -> np.ndarray:
    """d(sum(dy * conv(x, w)))/dw, canonical layouts; filter_dims = [O, I, spatial...]."""
    out_features, in_per_group, *kernel = filter_dims
    if list(window.size) != kernel:
        raise UnsupportedOp(f"window size {list(window.size)} does not match filter {kernel}")
    x = window_pad(window, x, np.zeros((), x.dtype), leading=2)
    batch, out_sizes = x.shape[0], list(dy.shape[2:])
    x = x.reshape(batch, groups, in_per_group, *x.shape[2:])
    dy = dy.reshape(batch, groups, out_features // groups, -1)  # output positions flattened
    grad = np.zeros((groups, out_features // groups, in_per_group, *kernel), x.dtype)
    for offset in window_offsets(window):
        patch = x[(slice(None),) * 3 + window_slices(window, offset, out_sizes)]
        grad[(Ellipsis,) + offset] = np.einsum("ngip,ngop->goi",
                                               patch.reshape(*patch.shape[:3], -1), dy)
    return grad.reshape(out_features, in_per_group, *kernel)


def _input_gradient(dy, w, input_dims, window: Window, groups: int) -> np.ndarray:
    """d(sum(dy * conv(x, w)))/dx, canonical layouts; input_dims = [N, C, spatial...]."""
    batch, features, *sizes = input_dims
    out_features, in_per_group = w.shape[:2]
    if features != groups * in_per_group or list(window.size) != list(w.shape[2:]):
        raise UnsupportedOp(f"filter {list(w.shape)} does not fit input {input_dims} with "
                            f"{groups} feature groups and window size {list(window.size)}")
    positions = _padded_positions(window, sizes)
    out_sizes = list(dy.shape[2:])
    w = w.reshape(groups, out_features // groups, in_per_group, *w.shape[2:])
    dy = dy.reshape(batch, groups, out_features // groups, *out_sizes)
    padded = np.zeros((batch, groups, in_per_group, *(len(p) for p in positions)), dy.dtype)
    for offset in window_offsets(window):  # each tap's window positions are distinct: no collisions
        padded[(slice(None),) * 3 + window_slices(window, offset, out_sizes)] += np.einsum(
            "ngo...,goi->ngi...", dy, w[(Ellipsis,) + offset])
    grad = padded.reshape(batch, features, *padded.shape[3:])
    for axis, (source, n) in enumerate(zip(positions, sizes), start=2):  # undo pad and dilation
        kept = np.nonzero(source >= 0)[0]
        unpadded = np.zeros(grad.shape[:axis] + (n,) + grad.shape[axis + 1:], grad.dtype)
        index = [slice(None)] * grad.ndim
        index[axis] = source[kept]
        unpadded[tuple(index)] = np.take(grad, kept, axis=axis)
        grad = unpadded
    return grad


# ------------------------------------------------------------------------------------ outputs

def _cast(value: np.ndarray, shape: Shape) -> np.ndarray:
    return np.asarray(value).reshape(shape.dims).astype(shape.numpy_dtype)


def _with_scratch(values: list, shapes: list[Shape]):
    """The custom call's result: the computed arrays, then zero-filled workspace buffers."""
    if len(shapes) == 1:
        return values[0]
    scratch = [np.zeros(s.dims, s.numpy_dtype) for s in shapes[len(values):]]
    return tuple(values + scratch)


for _target in GEMM_TARGETS + CONV_TARGETS + BACKWARD_CONV_TARGETS:
    register_custom_call(_target, evaluate_custom_call)
