"""Building blocks shared by the models and micro-models, written against ``ops`` (``F``).

Each is written out op by op (no jax.nn / Keras layers) so the HLO shows the plain
elementwise + reduce chains that XLA fuses and FusionStitching stitches, as the paper's
TensorFlow models produced them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .ops import SQRT_2_OVER_PI

EPS = 1e-5
NEG_INF = -1e9  # additive mask for attention logits (finite, so fully masked rows stay finite)


# ------------------------------------------------------------------------ parameters

@dataclass(frozen=True)
class EncoderConfig:
    """Sizes of a BERT/Transformer-style model."""

    batch: int
    seq: int
    vocab: int
    hidden: int
    heads: int
    ffn: int
    layers: int


def init_params(shapes: dict, seed: int) -> dict:
    """Nested dict of float32 numpy arrays for a nested dict of shapes (fixed seed).

    Weights ~ N(0, 1/fan_in); names ending in ``_b`` / ``beta`` (biases) start at 0 and
    ``gamma`` (scales) at 1, as the frameworks initialize them.
    """
    rng = np.random.default_rng(seed)

    def make(name, value):
        if isinstance(value, dict):
            return {k: make(k, v) for k, v in value.items()}
        if name.endswith("_b") or name == "beta" or name == "b":
            return np.zeros(value, np.float32)
        if name == "gamma":
            return np.ones(value, np.float32)
        fan_in = value[0] if len(value) > 1 else 1
        return (rng.standard_normal(value) / math.sqrt(fan_in)).astype(np.float32)

    return {k: make(k, v) for k, v in shapes.items()}


def dense_shapes(n_in: int, n_out: int) -> dict:
    return {"w": (n_in, n_out), "b": (n_out,)}


def layer_norm_shapes(hidden: int) -> dict:
    return {"gamma": (hidden,), "beta": (hidden,)}


def attention_shapes(hidden: int, heads: int) -> dict:
    head_dim = hidden // heads
    return {"wq": (hidden, heads, head_dim), "wk": (hidden, heads, head_dim),
            "wv": (hidden, heads, head_dim), "wo": (heads, head_dim, hidden),
            "q_b": (heads, head_dim), "k_b": (heads, head_dim), "v_b": (heads, head_dim),
            "o_b": (hidden,)}


def rnn_shapes(n_in: int, hidden: int, gates: int) -> dict:
    """GRU (gates=3) or LSTM (gates=4) cell: input and recurrent kernels, one bias."""
    return {"wx": (n_in, gates * hidden), "wh": (hidden, gates * hidden),
            "b": (gates * hidden,)}


# ------------------------------------------------------------------------ elementwise + norms

def dense(F, x, p):
    return F.einsum("...i,io->...o", x, p["w"]) + p["b"]


def layer_norm(F, x, gamma, beta):
    mean = F.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = F.mean(centered * centered, axis=-1, keepdims=True)
    return centered * F.rsqrt(var + EPS) * gamma + beta


def rms_norm(F, x, gamma):
    mean_square = F.mean(x * x, axis=-1, keepdims=True)
    return x * F.rsqrt(mean_square + EPS) * gamma


def softmax(F, x):
    shifted = x - F.max(x, axis=-1, keepdims=True)
    e = F.exp(shifted)
    return e / F.sum(e, axis=-1, keepdims=True)


def log_softmax(F, x):
    shifted = x - F.max(x, axis=-1, keepdims=True)
    return shifted - F.log(F.sum(F.exp(shifted), axis=-1, keepdims=True))


def cross_entropy(F, logits, labels, weights=None, smoothing: float = 0.0):
    """Mean softmax cross-entropy with integer labels (optionally label-smoothed, weighted)."""
    classes = F.shape(logits)[-1]
    target = F.one_hot(labels, classes)
    if smoothing:
        target = target * (1.0 - smoothing) + smoothing / classes
    loss = -F.sum(target * log_softmax(F, logits), axis=-1)
    if weights is None:
        return F.mean(loss, axis=None)
    return F.sum(loss * weights) / (F.sum(weights) + 1e-6)


def gelu_tanh(F, x):
    return 0.5 * x * (1.0 + F.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))


def gelu_erf(F, x):
    return 0.5 * x * (1.0 + F.erf(x * (1.0 / math.sqrt(2.0))))


def bias_dropout_residual(F, x, bias, residual, key, rate):
    return F.dropout(x + bias, rate, key) + residual


def batch_norm_train(F, x, gamma, beta, running_mean, running_var, momentum=0.9):
    """Training-mode BatchNorm over all but the last (channel) axis; returns the output and
    the updated running statistics."""
    axes = tuple(range(len(F.shape(x)) - 1))
    mean = F.mean(x, axis=axes)
    centered = x - mean
    var = F.mean(centered * centered, axis=axes)
    y = centered * F.rsqrt(var + EPS) * gamma + beta
    return (y, momentum * running_mean + (1.0 - momentum) * mean,
            momentum * running_var + (1.0 - momentum) * var)


def batch_norm_infer(F, x, p):
    """Inference-mode BatchNorm with the running statistics in ``p``."""
    return (x - p["mean"]) * F.rsqrt(p["var"] + EPS) * p["gamma"] + p["beta"]


def adam(F, param, grad, m, v, step, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """One Adam update (Kingma & Ba, with bias correction); ``step`` counts from 1."""
    m = b1 * m + (1.0 - b1) * grad
    v = b2 * v + (1.0 - b2) * grad * grad
    m_hat = m / (1.0 - b1 ** step)
    v_hat = v / (1.0 - b2 ** step)
    return param - lr * m_hat / (F.sqrt(v_hat) + eps), m, v


# ------------------------------------------------------------------------ attention

def attention(F, x_q, x_kv, p, bias, dropout=None):
    """Multi-head attention; ``bias`` is added to the [B, heads, Sq, Sk] logits (masking)."""
    head_dim = F.shape(p["wq"])[-1]
    q = F.einsum("bsh,hnd->bsnd", x_q, p["wq"]) + p["q_b"]
    k = F.einsum("bsh,hnd->bsnd", x_kv, p["wk"]) + p["k_b"]
    v = F.einsum("bsh,hnd->bsnd", x_kv, p["wv"]) + p["v_b"]
    logits = F.einsum("bqnd,bknd->bnqk", q, k) * (1.0 / math.sqrt(head_dim)) + bias
    probs = softmax(F, logits)
    if dropout is not None:
        probs = dropout(probs)
    context = F.einsum("bnqk,bknd->bqnd", probs, v)
    return F.einsum("bqnd,ndh->bqh", context, p["wo"]) + p["o_b"]


def padding_bias(F, mask):
    """[B, S] 1/0 mask -> additive [B, 1, 1, S] logits bias."""
    return F.reshape((1.0 - F.cast(mask, F.float32)) * NEG_INF,
                     (F.shape(mask)[0], 1, 1, F.shape(mask)[1]))


def causal_bias(F, length: int):
    position = F.arange(length)
    future = F.cast(F.expand_dims(position, 0) > F.expand_dims(position, 1), F.float32)
    return F.reshape(future * NEG_INF, (1, 1, length, length))


def sinusoid_positions(F, length: int, hidden: int):
    """Transformer's fixed position encoding [length, hidden], computed in the graph."""
    position = F.expand_dims(F.arange(length), 1)
    rate = F.exp(F.arange(hidden // 2) * (-math.log(10000.0) / (hidden // 2)))
    angle = position * F.expand_dims(rate, 0)
    return F.concat([F.sin(angle), F.cos(angle)], axis=1)


# ------------------------------------------------------------------------ recurrent cells

def gru_cell(F, p, h, x, attention_score=None):
    """GRU as DIEN writes it (h' = (1-u) h + u h~); with ``attention_score`` [B] it is DIEN's
    AUGRU, whose update gate is scaled by the attention score."""
    xw = F.matmul(x, p["wx"]) + p["b"]
    hw = F.matmul(h, p["wh"])
    xu, xr, xn = F.split(xw, 3, axis=-1)
    hu, hr, hn = F.split(hw, 3, axis=-1)
    u = F.sigmoid(xu + hu)
    r = F.sigmoid(xr + hr)
    candidate = F.tanh(xn + r * hn)
    if attention_score is not None:
        u = u * F.reshape(attention_score, (-1, 1))
    return (1.0 - u) * h + u * candidate


def lstm_cell(F, p, state, x):
    h, c = state
    gates = F.matmul(x, p["wx"]) + F.matmul(h, p["wh"]) + p["b"]
    i, f, g, o = F.split(gates, 4, axis=-1)
    c = F.sigmoid(f + 1.0) * c + F.sigmoid(i) * F.tanh(g)
    h = F.sigmoid(o) * F.tanh(c)
    return h, c


def rnn(F, cell, p, xs, initial, reverse=False):
    """Runs ``cell(F, p, state, x)`` over time-major ``xs`` [T, B, I]; returns the final state
    and the hidden states [T, B, H]."""
    def step(state, x):
        state = cell(F, p, state, x)
        return state, state[0] if isinstance(state, tuple) else state
    return F.scan(step, initial, xs, reverse=reverse)


def bidirectional_lstm(F, p_fwd, p_bwd, xs):
    """[T, B, I] -> [T, B, 2H]: forward and backward LSTM outputs side by side."""
    hidden = F.shape(p_fwd["wh"])[0]
    batch = F.shape(xs)[1]
    zeros = (F.zeros((batch, hidden)), F.zeros((batch, hidden)))
    _, forward = rnn(F, lstm_cell, p_fwd, xs, zeros)
    _, backward = rnn(F, lstm_cell, p_bwd, xs, zeros, reverse=True)
    return F.concat([forward, backward], axis=-1)
