"""Numpy evaluation of XLA:GPU's opaque nodes, so a GPU module can be executed on this CPU.

XLA:GPU hands some work to libraries; its optimized HLO then holds nodes whose meaning lives
in their ``backend_config`` rather than in HLO ops:

- cuBLAS GEMMs, ``custom-call``s to ``__cublas$gemm`` and ``__cublas$lt$matmul``:
  ``gemm_backend_config`` gives ``alpha_real`` (scale of the product), ``beta`` (scale of an
  addend operand C), ``dot_dimension_numbers`` and an ``epilogue`` (``DEFAULT``, ``BIAS``,
  ``RELU``, ``GELU``, their ``BIAS_`` forms and ``GELU_AUX``, which also returns the
  pre-activation). The result is a tuple ``(D, [aux,] workspace)``.
- cuDNN convolutions, ``custom-call``s to ``__cudnn$convForward`` and
  ``__cudnn$convBiasActivationForward``: ``window``, ``dim_labels`` and
  ``feature_group_count`` as on an HLO convolution; ``cudnn_conv_backend_config`` gives
  ``conv_result_scale``, ``side_input_scale`` and ``activation_mode``. Result
  ``(output, scratch)``.
- Triton GEMM fusions (``kind=kCustom`` with fusion kind ``__triton_gemm`` or
  ``__triton_nested_gemm_fusion``): plain HLO, a dot with its fused producers and consumers,
  so evaluating the fused computation is their meaning.

Operand order and epilogue semantics follow XLA's gemm_rewriter / cublas_lt_matmul_thunk and
cudnn_fused_conv_rewriter. Workspace and scratch outputs are zero-filled: nothing reads them.
The entry point is ``evaluate_custom_call(module, inst, operands)``; any other target raises
``UnsupportedOp`` with the target's name.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .evaluator import UnsupportedOp, _convolution, evaluate_computation
from .ir import Instruction, Module, Shape

GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul")
CONV_TARGETS = ("__cudnn$convForward", "__cudnn$convBiasActivationForward")
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
    raise UnsupportedOp(f"custom-call to {target!r} (%{inst.name}): not a cuBLAS GEMM or cuDNN "
                        "forward convolution this evaluator knows")


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
    for l, r in zip(lb + lc, rb + rc):
        lhs_sub[l] = rhs_sub[r] = next(letters)
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
    result = _convolution(None, as_convolution, operands[:2]).astype(np.float32) * float(
        config.get("conv_result_scale", 1))
    if inst.custom_call_target == "__cudnn$convBiasActivationForward":
        bias = operands[2]  # over the output feature dimension
        feature = inst.attrs["dim_labels"].split("->")[1].index("f")
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


# ------------------------------------------------------------------------------------ outputs

def _cast(value: np.ndarray, shape: Shape) -> np.ndarray:
    return np.asarray(value).reshape(shape.dims).astype(shape.numpy_dtype)


def _with_scratch(values: list, shapes: list[Shape]):
    """The custom call's result: the computed arrays, then zero-filled workspace buffers."""
    if len(shapes) == 1:
        return values[0]
    scratch = [np.zeros(s.dims, s.numpy_dtype) for s in shapes[len(values):]]
    return tuple(values + scratch)
