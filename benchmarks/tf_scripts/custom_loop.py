"""An unchanged TF custom training loop: tf.function(jit_compile=True) train step, Adam.

A small MLP with LayerNorm and GELU on fixed random data. Prints one JSON line with the loss
of every step and a checksum of the final weights, and saves the weights to $OUT (.npz) when
set, so a run with FUSIONSTITCHING=1 can be compared with a plain one.

    python benchmarks/tf_scripts/custom_loop.py [STEPS]
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
tf.random.set_seed(0)
rng = np.random.default_rng(0)
x = tf.constant(rng.standard_normal((64, 32)), tf.float32)
y = tf.constant(rng.integers(0, 10, 64), tf.int32)

w1 = tf.Variable(tf.random.normal([32, 64], stddev=0.2), name="w1")
b1 = tf.Variable(tf.zeros([64]), name="b1")
gamma = tf.Variable(tf.ones([64]), name="gamma")
beta = tf.Variable(tf.zeros([64]), name="beta")
w2 = tf.Variable(tf.random.normal([64, 10], stddev=0.2), name="w2")
params = [w1, b1, gamma, beta, w2]
optimizer = tf.keras.optimizers.Adam(1e-2)


def forward(x):
    h = x @ w1 + b1
    mean, var = tf.nn.moments(h, axes=[-1], keepdims=True)
    h = (h - mean) * tf.math.rsqrt(var + 1e-5) * gamma + beta
    return tf.nn.gelu(h) @ w2


@tf.function(jit_compile=True)
def train_step(x, y):
    with tf.GradientTape() as tape:
        logits = forward(x)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    grads = tape.gradient(loss, params)
    optimizer.apply_gradients(zip(grads, params))
    return loss


losses = [float(train_step(x, y)) for _ in range(steps)]
weights = {v.name: v.numpy() for v in params}
if os.environ.get("OUT"):
    np.savez(os.environ["OUT"], **weights)
print(json.dumps({"losses": losses, "weights_sum": float(sum(w.sum() for w in weights.values()))}))
