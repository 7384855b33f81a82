"""The few array operations the models are written in, for JAX and for TensorFlow.

Every model and micro-model is written once against this namespace (``F``), so its JAX and
TF versions are the same computation op for op and differ only where the frameworks differ
(random bits, loops, gradients). ``JAX`` is ready at import; ``tf_ops()`` imports TensorFlow
only when asked, so JAX users (and the GPU capture child process) never pay for it.
"""
from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import jax
import numpy as np
import jax.numpy as jnp
from jax import lax


def _jax_dropout(x, rate, key):
    """Inverted dropout; ``key`` is raw threefry key data (uint32[2]) passed as an input."""
    keep = jax.random.bernoulli(jax.random.wrap_key_data(key), 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def _jax_fold(key, i):
    """A different key per dropout site, from the one key input."""
    return jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(key), i))


def _jax_scan(step, carry, xs, reverse=False):
    """``(carry, ys)`` of ``step(carry, x) -> (carry, y)`` over the leading axis of ``xs``."""
    return lax.scan(step, carry, xs, reverse=reverse)


JAX = SimpleNamespace(
    name="jax",
    einsum=jnp.einsum, matmul=jnp.matmul,
    mean=lambda x, axis, keepdims=False: jnp.mean(x, axis=axis, keepdims=keepdims),
    sum=lambda x, axis=None, keepdims=False: jnp.sum(x, axis=axis, keepdims=keepdims),
    max=lambda x, axis, keepdims=False: jnp.max(x, axis=axis, keepdims=keepdims),
    argmax=lambda x, axis: jnp.argmax(x, axis=axis).astype(jnp.int32),
    exp=jnp.exp, log=jnp.log, tanh=jnp.tanh, erf=lax.erf, rsqrt=lax.rsqrt, sqrt=jnp.sqrt,
    sigmoid=jax.nn.sigmoid, sin=jnp.sin, cos=jnp.cos,
    maximum=jnp.maximum, minimum=jnp.minimum, where=jnp.where,
    take=lambda table, ids: jnp.take(table, ids, axis=0),
    one_hot=lambda labels, n: jax.nn.one_hot(labels, n, dtype=jnp.float32),
    concat=lambda xs, axis: jnp.concatenate(xs, axis=axis),
    split=lambda x, n, axis: jnp.split(x, n, axis=axis),
    stack=lambda xs, axis: jnp.stack(xs, axis=axis),
    reshape=jnp.reshape, transpose=jnp.transpose, expand_dims=jnp.expand_dims,
    cast=lambda x, dtype: x.astype(dtype), float32=jnp.float32, int32=jnp.int32,
    arange=lambda n: jnp.arange(n, dtype=jnp.float32),
    zeros=lambda shape: jnp.zeros(shape, jnp.float32),
    shape=lambda x: tuple(x.shape),
    dropout=_jax_dropout, fold=_jax_fold, scan=_jax_scan,
)


@functools.cache
def tf_ops() -> SimpleNamespace:
    """The same namespace for TensorFlow (``tf.function(jit_compile=True)`` bodies)."""
    import tensorflow as tf

    def dropout(x, rate, seed):
        # seed: int32[2] input, TF's stateless RNG (XLA expands it to Philox in plain ops).
        return tf.nn.experimental.stateless_dropout(x, rate, seed=seed)

    def scan(step, carry, xs, reverse=False):
        """lax.scan's contract with a tf.while_loop over TensorArrays (one XLA while)."""
        steps = int(tf.nest.flatten(xs)[0].shape[0])  # static, so the outputs' shapes are
        inputs = tf.nest.map_structure(
            lambda x: tf.TensorArray(x.dtype, size=steps).unstack(x), xs)
        carry_out, y_first = step(carry, tf.nest.map_structure(lambda ta: ta.read(0), inputs))
        outputs = tf.nest.map_structure(
            lambda y: tf.TensorArray(y.dtype, size=steps, element_shape=y.shape), y_first)

        def body(i, carry, outputs):
            t = steps - 1 - i if reverse else i
            carry, y = step(carry, tf.nest.map_structure(lambda ta: ta.read(t), inputs))
            outputs = tf.nest.map_structure(lambda ta, v: ta.write(t, v), outputs, y)
            return i + 1, carry, outputs

        del carry_out  # the first step above only tells the output shapes
        _, carry, outputs = tf.while_loop(lambda i, *_: i < steps, body, (0, carry, outputs),
                                          maximum_iterations=steps)
        return carry, tf.nest.map_structure(
            lambda ta, y: tf.ensure_shape(ta.stack(), (steps, *y.shape)), outputs, y_first)

    return SimpleNamespace(
        name="tf",
        einsum=tf.einsum, matmul=tf.matmul,
        mean=lambda x, axis, keepdims=False: tf.reduce_mean(x, axis=axis, keepdims=keepdims),
        sum=lambda x, axis=None, keepdims=False: tf.reduce_sum(x, axis=axis, keepdims=keepdims),
        max=lambda x, axis, keepdims=False: tf.reduce_max(x, axis=axis, keepdims=keepdims),
        argmax=lambda x, axis: tf.argmax(x, axis=axis, output_type=tf.int32),
        exp=tf.exp, log=tf.math.log, tanh=tf.tanh, erf=tf.math.erf, rsqrt=tf.math.rsqrt,
        sqrt=tf.sqrt, sigmoid=tf.sigmoid, sin=tf.sin, cos=tf.cos,
        maximum=tf.maximum, minimum=tf.minimum, where=tf.where,
        take=lambda table, ids: tf.gather(table, ids),
        one_hot=lambda labels, n: tf.one_hot(labels, n, dtype=tf.float32),
        concat=lambda xs, axis: tf.concat(xs, axis=axis),
        split=lambda x, n, axis: tf.split(x, n, axis=axis),
        stack=lambda xs, axis: tf.stack(xs, axis=axis),
        reshape=tf.reshape, transpose=tf.transpose, expand_dims=tf.expand_dims,
        cast=tf.cast, float32=tf.float32, int32=tf.int32,
        arange=lambda n: tf.range(n, dtype=tf.float32),
        zeros=lambda shape: tf.zeros(shape, tf.float32),
        shape=lambda x: tuple(int(d) for d in x.shape),
        dropout=dropout, fold=lambda seed, i: seed + tf.constant([0, i + 1], tf.int32),
        scan=scan,
    )


def rng_input(framework: str, seed: int) -> np.ndarray:
    """The random-key input of a model step: threefry key data (JAX) or a stateless seed (TF)."""
    if framework == "jax":
        return np.array([0, seed], np.uint32)
    return np.array([seed, 0], np.int32)


def ops_for(framework: str) -> SimpleNamespace:
    return JAX if framework == "jax" else tf_ops()


SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
