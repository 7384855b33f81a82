"""A TF custom training loop under tf.distribute.MirroredStrategy over two logical CPUs: the
replica function calls a tf.function(jit_compile=True) for its loss and gradients, then
all-reduces them. Prints one JSON line with the loss of every step.

    python benchmarks/tf_scripts/mirrored_loop.py [STEPS]
"""
import json
import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
tf.random.set_seed(0)
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 32)).astype(np.float32)
y = rng.integers(0, 10, 64).astype(np.int32)
with strategy.scope():
    w1 = tf.Variable(tf.random.normal([32, 64], stddev=0.2), name="w1")
    b1 = tf.Variable(tf.zeros([64]), name="b1")
    w2 = tf.Variable(tf.random.normal([64, 10], stddev=0.2), name="w2")
params = [w1, b1, w2]
batches = iter(strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensors((x, y)).repeat()))


@tf.function(jit_compile=True)
def loss_and_grads(x, y):
    with tf.GradientTape() as tape:
        logits = tf.nn.gelu(x @ w1 + b1) @ w2
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    return loss, tape.gradient(loss, params)


@tf.function
def train_step(x, y):
    def replica(x, y):
        loss, grads = loss_and_grads(x, y)
        grads = tf.distribute.get_replica_context().all_reduce("MEAN", grads)
        for v, g in zip(params, grads):
            v.assign_sub(0.1 * g)
        return loss
    return strategy.reduce("MEAN", strategy.run(replica, args=(x, y)), axis=None)


print(json.dumps({"losses": [float(train_step(*next(batches))) for _ in range(steps)]}))
