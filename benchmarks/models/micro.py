"""Micro models: LayerNorm, Softmax and RMSNorm over the last axis, in JAX and in TF.

Each is written out op by op (not jax.nn / tf.nn / Keras layers) so that the HLO shows the
plain reduce + elementwise chains that XLA fuses and FusionStitching stitches.

JAX functions live at the module top level because GPU capture imports them by
``module:qualname`` in a child process (``fusionstitching.capture``). TensorFlow is only
imported by ``tf_functions()``, so that child (and every JAX user) does not pay TF's import.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
import numpy as np

EPS = 1e-5
MODELS = ("layernorm", "softmax", "rmsnorm")


def layernorm(x, gamma, beta):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = jnp.mean(centered * centered, axis=-1, keepdims=True)
    return centered * lax.rsqrt(var + EPS) * gamma + beta


def softmax(x):
    shifted = x - jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(shifted)
    return e / jnp.sum(e, axis=-1, keepdims=True)


def rmsnorm(x, gamma):
    mean_square = jnp.mean(x * x, axis=-1, keepdims=True)
    return x * lax.rsqrt(mean_square + EPS) * gamma


JAX_FUNCTIONS = {"layernorm": layernorm, "softmax": softmax, "rmsnorm": rmsnorm}


def arg_shapes(model: str, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Shapes of the model's arguments for input x of `shape` (the scales are [H])."""
    hidden = (shape[-1],)
    return {"layernorm": [shape, hidden, hidden], "softmax": [shape],
            "rmsnorm": [shape, hidden]}[model]


def example_inputs(model: str, shape: tuple[int, ...], dtype=np.float32, seed: int = 0):
    """Random numpy inputs for the model (fixed seed, so runs are reproducible)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in arg_shapes(model, shape)]


@functools.cache
def tf_functions() -> dict:
    """The same three models as ``tf.function(jit_compile=True)``, keyed like JAX_FUNCTIONS."""
    import tensorflow as tf

    @tf.function(jit_compile=True)
    def tf_layernorm(x, gamma, beta):
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        centered = x - mean
        var = tf.reduce_mean(centered * centered, axis=-1, keepdims=True)
        return centered * tf.math.rsqrt(var + EPS) * gamma + beta

    @tf.function(jit_compile=True)
    def tf_softmax(x):
        shifted = x - tf.reduce_max(x, axis=-1, keepdims=True)
        e = tf.exp(shifted)
        return e / tf.reduce_sum(e, axis=-1, keepdims=True)

    @tf.function(jit_compile=True)
    def tf_rmsnorm(x, gamma):
        mean_square = tf.reduce_mean(x * x, axis=-1, keepdims=True)
        return x * tf.math.rsqrt(mean_square + EPS) * gamma

    return {"layernorm": tf_layernorm, "softmax": tf_softmax, "rmsnorm": tf_rmsnorm}
