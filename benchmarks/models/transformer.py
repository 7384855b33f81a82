"""Transformer (Vaswani et al.), training: post-LN encoder-decoder with ReLU FFN, shared
embeddings, fixed sinusoid positions, label-smoothed cross-entropy, one Adam step.

"paper" is Transformer-base with 4096 tokens per side per batch (Table 1: batch 4096 tokens),
as 64 sentences of 64 tokens.
"""
from __future__ import annotations

import math

import numpy as np

from . import layers, training
from .layers import EncoderConfig as Config
from .ops import rng_input

DROPOUT = 0.1
SMOOTHING = 0.1


CONFIGS = {"small": Config(batch=2, seq=8, vocab=64, hidden=32, heads=2, ffn=64, layers=1),
           "paper": Config(batch=64, seq=64, vocab=32000, hidden=512, heads=8, ffn=2048,
                           layers=6)}


def param_shapes(cfg: Config) -> dict:
    h = cfg.hidden
    ffn = {"ffn_in": layers.dense_shapes(h, cfg.ffn), "ffn_out": layers.dense_shapes(cfg.ffn, h)}
    encoder = {"self": layers.attention_shapes(h, cfg.heads), "ln1": layers.layer_norm_shapes(h),
               **ffn, "ln2": layers.layer_norm_shapes(h)}
    decoder = {**encoder, "cross": layers.attention_shapes(h, cfg.heads),
               "ln3": layers.layer_norm_shapes(h)}
    return {"emb": (cfg.vocab, h),
            "encoder": {f"{i:02d}": encoder for i in range(cfg.layers)},
            "decoder": {f"{i:02d}": decoder for i in range(cfg.layers)}}


def batch(cfg: Config, framework: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    shape = (cfg.batch, cfg.seq)
    lengths = rng.integers(cfg.seq // 2, cfg.seq + 1, (2, cfg.batch))
    return {"source": rng.integers(1, cfg.vocab, shape, dtype=np.int32),
            "source_mask": (np.arange(cfg.seq) < lengths[0][:, None]).astype(np.int32),
            "target_in": rng.integers(1, cfg.vocab, shape, dtype=np.int32),
            "target_out": rng.integers(1, cfg.vocab, shape, dtype=np.int32),
            "target_mask": (np.arange(cfg.seq) < lengths[1][:, None]).astype(np.float32),
            "rng": rng_input(framework, seed)}


def loss(F, params, batch):
    hidden = F.shape(params["emb"])[1]
    seq = F.shape(batch["source"])[1]
    sites = iter(range(1000))

    def drop(x):
        return F.dropout(x, DROPOUT, F.fold(batch["rng"], next(sites)))

    def embed(tokens):
        positions = layers.sinusoid_positions(F, seq, hidden)
        return drop(F.take(params["emb"], tokens) * math.sqrt(hidden) + positions)

    def ffn(p, x):
        inner = F.maximum(layers.dense(F, x, p["ffn_in"]), 0.0)
        return drop(layers.dense(F, inner, p["ffn_out"]))

    source_bias = layers.padding_bias(F, batch["source_mask"])
    x = embed(batch["source"])
    for p in params["encoder"].values():
        x = layers.layer_norm(F, x + drop(layers.attention(F, x, x, p["self"], source_bias)),
                              **p["ln1"])
        x = layers.layer_norm(F, x + ffn(p, x), **p["ln2"])
    y = embed(batch["target_in"])
    causal = layers.causal_bias(F, seq)
    for p in params["decoder"].values():
        y = layers.layer_norm(F, y + drop(layers.attention(F, y, y, p["self"], causal)),
                              **p["ln1"])
        y = layers.layer_norm(F, y + drop(layers.attention(F, y, x, p["cross"], source_bias)),
                              **p["ln3"])
        y = layers.layer_norm(F, y + ffn(p, y), **p["ln2"])
    logits = F.einsum("bsh,vh->bsv", y, params["emb"])
    return layers.cross_entropy(F, logits, batch["target_out"], batch["target_mask"],
                                smoothing=SMOOTHING)


def jax_train(params, opt_state, batch):
    return training.jax_train_step(loss, params, opt_state, batch)
