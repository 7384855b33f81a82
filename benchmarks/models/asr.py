"""ASR (DeepSpeech2-style, inference): two strided convolutions with BatchNorm and clipped
ReLU over the spectrogram, bidirectional LSTMs over time, per-frame character
log-probabilities and their greedy (argmax) decoding. "paper": batch 8 (Table 1), 4 s of
audio (400 frames x 161 frequency bins), 3 BiLSTM layers of 512.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from . import conv, layers
from .ops import JAX

CLIP = 20.0


@dataclass(frozen=True)
class Config:
    batch: int
    frames: int
    bins: int
    channels: int
    hidden: int
    layers: int
    chars: int


CONFIGS = {"small": Config(batch=2, frames=16, bins=16, channels=4, hidden=8, layers=1,
                           chars=12),
           "paper": Config(batch=8, frames=400, bins=161, channels=32, hidden=512, layers=3,
                           chars=29)}
STRIDES = ((2, 2), (1, 2))  # (time, frequency) of the two convolutions


def param_shapes(cfg: Config) -> dict:
    bins = cfg.bins
    for _, f in STRIDES:
        bins = -(-bins // f)
    width = bins * cfg.channels
    rnns = {}
    for i in range(cfg.layers):
        n_in = width if i == 0 else 2 * cfg.hidden
        rnns[f"{i:02d}"] = {"fwd": layers.rnn_shapes(n_in, cfg.hidden, 4),
                            "bwd": layers.rnn_shapes(n_in, cfg.hidden, 4)}
    return {"conv1": conv.conv_shapes((11, 41), 1, cfg.channels),
            "conv2": conv.conv_shapes((11, 21), cfg.channels, cfg.channels),
            "rnn": rnns, "out": layers.dense_shapes(2 * cfg.hidden, cfg.chars)}


def batch(cfg: Config, framework: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"spectrogram": rng.standard_normal((cfg.batch, cfg.frames, cfg.bins)).astype(
        np.float32)}


def jax_infer(params, batch):
    x = jnp.expand_dims(batch["spectrogram"], -1)                    # [B, T, F, 1]
    for name, strides in zip(("conv1", "conv2"), STRIDES):
        x = jnp.clip(conv.conv_bn(x, params[name], strides), 0.0, CLIP)
    b, t, f, c = x.shape
    x = jnp.transpose(jnp.reshape(x, (b, t, f * c)), (1, 0, 2))       # [T', B, F'C]
    for p in params["rnn"].values():
        x = layers.bidirectional_lstm(JAX, p["fwd"], p["bwd"], x)
    log_probs = layers.log_softmax(JAX, layers.dense(JAX, x, params["out"]))
    return log_probs, JAX.argmax(log_probs, axis=-1)
