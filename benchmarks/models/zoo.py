"""The paper's workloads (Table 1) as functions plus arguments, ready to capture or run.

    fn, args = zoo.jax_workload("bert", "train", "small")      # args: ShapeDtypeStructs
    fn, args = zoo.jax_workload("bert", "train", "small", abstract=False)  # seeded values
    fn, args = zoo.tf_workload("bert", "train", "small")       # args: TensorSpecs

Sizes: "small" (tests and the HLO corpus: tiny hidden sizes, 1-2 layers, short sequences,
seconds to capture on CPU) and "paper" (the batch sizes of the paper's Table 1).
"""
from __future__ import annotations

import functools

import jax
import numpy as np

from . import asr, bert, crnn, dien, layers, training, transformer

MODELS = {"bert": bert, "dien": dien, "transformer": transformer, "asr": asr, "crnn": crnn}
SIZES = ("small", "paper")
# (model, mode, frameworks): the paper's Table 1; TF/Keras versions of BERT, DIEN, Transformer.
WORKLOADS = [("bert", "train", ("jax", "tf")), ("bert", "infer", ("jax", "tf")),
             ("dien", "train", ("jax", "tf")), ("dien", "infer", ("jax", "tf")),
             ("transformer", "train", ("jax", "tf")),
             ("asr", "infer", ("jax",)), ("crnn", "infer", ("jax",))]
PARAM_SEED = 0


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), tree)


def params(model: str, size: str, abstract: bool = True) -> dict:
    shapes = MODELS[model].param_shapes(MODELS[model].CONFIGS[size])
    if abstract:
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, np.float32), shapes,
                            is_leaf=lambda s: isinstance(s, tuple))
    return layers.init_params(shapes, PARAM_SEED)


def jax_workload(model: str, mode: str, size: str, abstract: bool = True):
    """(top-level JAX function, its arguments) of a workload; abstract args capture without
    allocating the paper-size weights."""
    module = MODELS[model]
    batch = module.batch(module.CONFIGS[size], "jax")
    p = params(model, size, abstract)
    if mode == "train":
        opt_state = training.opt_state_like(p)
        if not abstract:
            opt_state = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), opt_state)
        return module.jax_train, (p, opt_state, _abstract(batch) if abstract else batch)
    return module.jax_infer, (p, _abstract(batch) if abstract else batch)


@functools.cache
def tf_workload(model: str, mode: str, size: str):
    """(``tf.function(jit_compile=True)``, its arguments as TensorSpecs) of a workload; the
    weights (and Keras Adam's slots) are tf.Variables with the same seeded values as JAX's."""
    import tensorflow as tf

    module = MODELS[model]
    variables = training.tf_variables(params(model, size, abstract=False))
    batch = tf_batch(model, size)
    if mode == "train":
        fn = training.tf_train_step(module.loss, variables, list(batch))
    else:
        fn = training.tf_infer(module.infer, variables, list(batch))
    return fn, tuple(tf.TensorSpec(v.shape, tf.as_dtype(v.dtype)) for v in batch.values())


def tf_batch(model: str, size: str) -> dict:
    """The batch of a TF workload (seeded numpy values, in the function's argument order)."""
    module = MODELS[model]
    return module.batch(module.CONFIGS[size], "tf")
