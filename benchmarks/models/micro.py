"""Micro models: the memory-intensive patterns the paper's workloads are made of, each one
function written once (``layers``, against ``ops``) and built for JAX and for TF.

LayerNorm, RMSNorm, Softmax (over the last axis), log-softmax cross-entropy, GELU (tanh and
erf), bias + dropout + residual, BatchNorm in training mode, and one Adam update.

JAX functions live at the module top level because GPU capture imports them by
``module:qualname`` in a child process (``fusionstitching.capture``). TensorFlow is only
imported by ``tf_functions()``, so that child (and every JAX user) does not pay TF's import.
"""
from __future__ import annotations

import functools

import numpy as np

from . import layers
from .ops import JAX, ops_for, rng_input

EPS = layers.EPS
DROPOUT = 0.1
MODELS = ("layernorm", "softmax", "rmsnorm", "cross_entropy", "gelu_tanh", "gelu_erf",
          "bias_dropout_residual", "batchnorm_train", "adam")


def _bodies(F) -> dict:
    """Each micro model as a function of arrays, for the ops namespace F."""
    return {
        "layernorm": lambda x, gamma, beta: layers.layer_norm(F, x, gamma, beta),
        "softmax": lambda x: layers.softmax(F, x),
        "rmsnorm": lambda x, gamma: layers.rms_norm(F, x, gamma),
        "cross_entropy": lambda logits, labels: layers.cross_entropy(F, logits, labels),
        "gelu_tanh": lambda x: layers.gelu_tanh(F, x),
        "gelu_erf": lambda x: layers.gelu_erf(F, x),
        "bias_dropout_residual": lambda x, bias, residual, key: layers.bias_dropout_residual(
            F, x, bias, residual, key, DROPOUT),
        "batchnorm_train": lambda x, gamma, beta, mean, var: layers.batch_norm_train(
            F, x, gamma, beta, mean, var),
        "adam": lambda param, grad, m, v, step: layers.adam(F, param, grad, m, v, step),
    }


_JAX_BODIES = _bodies(JAX)


# Top-level JAX functions (importable by name for GPU capture in a child process).
def layernorm(x, gamma, beta):
    return _JAX_BODIES["layernorm"](x, gamma, beta)


def softmax(x):
    return _JAX_BODIES["softmax"](x)


def rmsnorm(x, gamma):
    return _JAX_BODIES["rmsnorm"](x, gamma)


def cross_entropy(logits, labels):
    return _JAX_BODIES["cross_entropy"](logits, labels)


def gelu_tanh(x):
    return _JAX_BODIES["gelu_tanh"](x)


def gelu_erf(x):
    return _JAX_BODIES["gelu_erf"](x)


def bias_dropout_residual(x, bias, residual, key):
    return _JAX_BODIES["bias_dropout_residual"](x, bias, residual, key)


def batchnorm_train(x, gamma, beta, mean, var):
    return _JAX_BODIES["batchnorm_train"](x, gamma, beta, mean, var)


def adam(param, grad, m, v, step):
    return _JAX_BODIES["adam"](param, grad, m, v, step)


JAX_FUNCTIONS = {name: globals()[name] for name in MODELS}


def arg_specs(model: str, shape: tuple[int, ...], framework: str = "jax") -> list:
    """(shape, numpy dtype) of the model's arguments for the main input x of ``shape``:
    per-feature vectors are [last dim]; cross-entropy's labels are the rows' class ids."""
    f32 = np.dtype(np.float32)
    hidden = (shape[-1],)
    key = rng_input(framework, 0)
    return {"layernorm": [(shape, f32), (hidden, f32), (hidden, f32)],
            "softmax": [(shape, f32)], "rmsnorm": [(shape, f32), (hidden, f32)],
            "cross_entropy": [(shape, f32), (shape[:-1], np.dtype(np.int32))],
            "gelu_tanh": [(shape, f32)], "gelu_erf": [(shape, f32)],
            "bias_dropout_residual": [(shape, f32), (hidden, f32), (shape, f32),
                                      (key.shape, key.dtype)],
            "batchnorm_train": [(shape, f32)] + [(hidden, f32)] * 4,
            "adam": [(shape, f32)] * 4 + [((), f32)]}[model]


def arg_shapes(model: str, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Shapes of the model's arguments for input x of ``shape``."""
    return [s for s, _ in arg_specs(model, shape)]


def example_inputs(model: str, shape: tuple[int, ...], dtype=np.float32, seed: int = 0,
                   framework: str = "jax"):
    """Random numpy inputs for the model (fixed seed, so runs are reproducible). Integer
    inputs are valid class ids, the random key is the framework's, Adam's step is 1 and its
    second moment non-negative."""
    rng = np.random.default_rng(seed)
    values = []
    for i, (s, dt) in enumerate(arg_specs(model, shape, framework)):
        if model == "cross_entropy" and i == 1:
            values.append(rng.integers(0, shape[-1], s).astype(dt))
        elif model == "bias_dropout_residual" and i == 3:
            values.append(rng_input(framework, seed))
        elif model == "adam" and i == 4:
            values.append(np.array(1.0, dtype))
        else:
            x = rng.standard_normal(s).astype(dtype)
            values.append(np.abs(x) if (model, i) in (("adam", 3), ("batchnorm_train", 4)) else x)
    return values


@functools.cache
def tf_functions() -> dict:
    """The same models as ``tf.function(jit_compile=True)``, keyed like JAX_FUNCTIONS."""
    import tensorflow as tf

    functions = {}
    for name, body in _bodies(ops_for("tf")).items():
        body.__name__ = f"tf_{name}"  # TF names the function (and XLA's module) after it
        functions[name] = tf.function(body, jit_compile=True, autograph=False)
    return functions
