"""CRNN (Shi et al., inference): VGG-style convolutions with BatchNorm, ReLU and max pooling
over a text-line image, the height collapsed into features per column, two bidirectional
LSTMs, per-column class log-probabilities and greedy decoding. "paper": batch 8 (Table 1),
32x100 grey images, the original 7-convolution stack, LSTMs of 256, 37 classes.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from . import conv, layers
from .ops import JAX


@dataclass(frozen=True)
class Config:
    batch: int
    height: int
    width: int
    channels: tuple[int, ...]
    hidden: int
    classes: int


CONFIGS = {"small": Config(batch=2, height=16, width=32, channels=(4, 8, 8), hidden=8,
                           classes=12),
           "paper": Config(batch=8, height=32, width=100,
                           channels=(64, 128, 256, 256, 512, 512, 512), hidden=256,
                           classes=37)}


def _pools(n: int):
    """Pooling after each convolution: 2x2 early, 2x1 (keep width: the time axis) later."""
    pools = [(2, 2), (2, 2)] + [None, (2, 1)] * n
    return pools[:n]


def param_shapes(cfg: Config) -> dict:
    convs, c_in, height = {}, 1, cfg.height
    for i, (c_out, pool) in enumerate(zip(cfg.channels, _pools(len(cfg.channels)))):
        convs[f"{i:02d}"] = conv.conv_shapes((3, 3), c_in, c_out)
        c_in = c_out
        height //= pool[0] if pool else 1
    width = height * c_in
    return {"conv": convs,
            "rnn1": {"fwd": layers.rnn_shapes(width, cfg.hidden, 4),
                     "bwd": layers.rnn_shapes(width, cfg.hidden, 4)},
            "rnn2": {"fwd": layers.rnn_shapes(2 * cfg.hidden, cfg.hidden, 4),
                     "bwd": layers.rnn_shapes(2 * cfg.hidden, cfg.hidden, 4)},
            "out": layers.dense_shapes(2 * cfg.hidden, cfg.classes)}


def batch(cfg: Config, framework: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"image": rng.random((cfg.batch, cfg.height, cfg.width, 1)).astype(np.float32)}


def jax_infer(params, batch):
    x = batch["image"]
    convs = params["conv"]
    for p, pool in zip(convs.values(), _pools(len(convs))):
        x = jax.nn.relu(conv.conv_bn(x, p))
        if pool:
            x = conv.max_pool(x, pool, pool)
    b, h, w, c = x.shape
    x = jnp.reshape(jnp.transpose(x, (2, 0, 1, 3)), (w, b, h * c))   # columns are time steps
    x = layers.bidirectional_lstm(JAX, params["rnn1"]["fwd"], params["rnn1"]["bwd"], x)
    x = layers.bidirectional_lstm(JAX, params["rnn2"]["fwd"], params["rnn2"]["bwd"], x)
    log_probs = layers.log_softmax(JAX, layers.dense(JAX, x, params["out"]))
    return log_probs, JAX.argmax(log_probs, axis=-1)
