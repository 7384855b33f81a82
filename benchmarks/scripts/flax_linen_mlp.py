"""A flax linen training script as the examples write it: an MLP with LayerNorm and
Dropout, a TrainState with optax Adam, a jax.jit train step over shuffled batches of 64 of
random regression data, 4 epochs. Prints one JSON line with the final loss.

    python benchmarks/scripts/flax_linen_mlp.py
"""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        for width in (256, 256):
            x = nn.Dense(width)(x)
            x = nn.LayerNorm()(x)
            x = nn.gelu(x)
            x = nn.Dropout(0.1, deterministic=not train)(x)
        return nn.Dense(1)(x)


@jax.jit
def train_step(state, x, y, key):
    def loss_fn(params):
        pred = state.apply_fn({"params": params}, x, train=True, rngs={"dropout": key})
        return jnp.mean((pred[:, 0] - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


rng = np.random.default_rng(0)
x = rng.standard_normal((2048, 64)).astype("float32")
y = np.tanh(x[:, :8].sum(axis=1)).astype("float32")
model = MLP()
key = jax.random.key(0)
params = model.init(key, jnp.ones((1, 64)), train=False)["params"]
state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))
for epoch in range(4):
    order = rng.permutation(len(x))
    for start in range(0, len(x), 64):
        batch = order[start:start + 64]
        key, step_key = jax.random.split(key)
        state, loss = train_step(state, jnp.asarray(x[batch]), jnp.asarray(y[batch]), step_key)
print(json.dumps({"loss": float(loss)}))
