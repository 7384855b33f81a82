"""An unchanged TF script whose jit-compiled function leaves the batch dimension open in its
input signature (dynamic shapes): TF's XLA compiles it per concrete shape, and so does
FusionStitching. Prints one JSON line with the outputs' checksums.

    python benchmarks/tf_scripts/dynamic_shapes.py
"""
import json

import numpy as np
import tensorflow as tf


@tf.function(jit_compile=True, input_signature=[tf.TensorSpec([None, 16], tf.float32)])
def normalize(x):
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return tf.nn.relu((x - mean) * tf.math.rsqrt(var + 1e-5))


rng = np.random.default_rng(0)
sums = [float(normalize(tf.constant(rng.standard_normal((n, 16)), tf.float32)).numpy().sum())
        for n in (4, 8, 4)]
print(json.dumps({"sums": sums}))
