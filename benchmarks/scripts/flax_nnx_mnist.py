"""A flax nnx training script as the MNIST tutorial writes it, on random images (no
download): a CNN module (two convolutions, average pooling, two linear layers), optax
AdamW through nnx.Optimizer, an nnx.jit train step and eval step over batches of 32
(the last batch partial), 2 epochs. Prints one JSON line with the final losses.

    python benchmarks/scripts/flax_nnx_mnist.py
"""
import json
from functools import partial

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class CNN(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 16, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(16, 32, kernel_size=(3, 3), rngs=rngs)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(7 * 7 * 32, 128, rngs=rngs)
        self.linear2 = nnx.Linear(128, 10, rngs=rngs)

    def __call__(self, x):
        x = self.avg_pool(nnx.relu(self.conv1(x)))
        x = self.avg_pool(nnx.relu(self.conv2(x)))
        x = x.reshape(x.shape[0], -1)
        return self.linear2(nnx.relu(self.linear1(x)))


def loss_fn(model, images, labels):
    logits = model(images)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@nnx.jit
def train_step(model, optimizer, images, labels):
    loss, grads = nnx.value_and_grad(loss_fn)(model, images, labels)
    optimizer.update(model, grads)
    return loss


@nnx.jit
def eval_step(model, images, labels):
    return loss_fn(model, images, labels)


rng = np.random.default_rng(0)
images = rng.random((1000, 28, 28, 1)).astype("float32")
labels = rng.integers(0, 10, 1000).astype("int32")
model = CNN(rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
for epoch in range(2):
    for start in range(0, 900, 32):
        loss = train_step(model, optimizer, jnp.asarray(images[start:start + 32]),
                          jnp.asarray(labels[start:start + 32]))
test = [float(eval_step(model, jnp.asarray(images[s:s + 32]), jnp.asarray(labels[s:s + 32])))
        for s in range(900, 1000, 32)]
print(json.dumps({"loss": float(loss), "test_loss": float(np.mean(test))}))
