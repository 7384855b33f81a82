"""Training steps around a model's loss: JAX (grad + the Adam of ``layers.adam``) and
TF/Keras (GradientTape + ``keras.optimizers.Adam`` on tf.Variables), both XLA-compiled."""
from __future__ import annotations

import jax

from . import layers
from .ops import JAX, tf_ops


def opt_state_like(params):
    """Abstract Adam state (ShapeDtypeStructs) for abstract params."""
    like = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    return {"m": like, "v": like, "step": jax.ShapeDtypeStruct((), "float32")}


def jax_train_step(loss_fn, params, opt_state, batch):
    """One step: loss and gradients of ``loss_fn(F, params, batch)``, then Adam on every
    parameter. Returns (loss, new params, new optimizer state)."""
    loss, grads = jax.value_and_grad(lambda p: loss_fn(JAX, p, batch))(params)
    step = opt_state["step"] + 1.0
    leaves, treedef = jax.tree.flatten(params)
    updated = [layers.adam(JAX, p, g, m, v, step) for p, g, m, v in zip(
        leaves, *(treedef.flatten_up_to(t) for t in (grads, opt_state["m"], opt_state["v"])))]
    new_params, new_m, new_v = (treedef.unflatten([u[i] for u in updated]) for i in range(3))
    return loss, new_params, {"m": new_m, "v": new_v, "step": step}


def tf_variables(params: dict):
    """tf.Variables with the initial values of ``params`` (same nesting)."""
    import tensorflow as tf
    return tf.nest.map_structure(lambda p: tf.Variable(p), params)


def tf_train_step(loss_fn, variables, keys):
    """``tf.function(jit_compile=True)`` training step on ``variables`` with Keras' Adam; it
    takes the batch's tensors positionally in the order of ``keys`` (TF's compiler-IR query
    accepts TensorSpecs only as flat arguments)."""
    import keras
    import tensorflow as tf

    F = tf_ops()
    flat = tf.nest.flatten(variables)
    optimizer = keras.optimizers.Adam(learning_rate=1e-3)
    optimizer.build(flat)

    @tf.function(jit_compile=True)
    def train_step(*tensors):
        batch = dict(zip(keys, tensors))
        with tf.GradientTape() as tape:
            loss = loss_fn(F, variables, batch)
        optimizer.apply_gradients(zip(tape.gradient(loss, flat), flat))
        return loss

    return train_step


def tf_infer(forward_fn, variables, keys):
    """``tf.function(jit_compile=True)`` inference on ``variables`` (batch as in tf_train_step)."""
    import tensorflow as tf

    F = tf_ops()

    @tf.function(jit_compile=True)
    def infer(*tensors):
        return forward_fn(F, variables, dict(zip(keys, tensors)))

    return infer
