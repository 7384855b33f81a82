"""BERT (Devlin et al.): post-LN encoder with GELU (erf), masked-LM and next-sentence heads.

Training: MLM + NSP loss, one Adam step. Inference: the encoder's sequence output and the
sentence-pair classifier's probabilities. "paper" is BERT-base at the paper's batch size 32
(Table 1), sequence length 128.
"""
from __future__ import annotations

import numpy as np

from . import layers, training
from .layers import EncoderConfig as Config
from .ops import JAX, rng_input

DROPOUT = 0.1


CONFIGS = {"small": Config(batch=2, seq=16, vocab=64, hidden=32, heads=2, ffn=64, layers=1),
           "paper": Config(batch=32, seq=128, vocab=30522, hidden=768, heads=12, ffn=3072,
                           layers=12)}


def param_shapes(cfg: Config) -> dict:
    h = cfg.hidden
    block = {"attention": layers.attention_shapes(h, cfg.heads),
             "ln1": layers.layer_norm_shapes(h), "ffn_in": layers.dense_shapes(h, cfg.ffn),
             "ffn_out": layers.dense_shapes(cfg.ffn, h), "ln2": layers.layer_norm_shapes(h)}
    return {"word_emb": (cfg.vocab, h), "pos_emb": (cfg.seq, h), "type_emb": (2, h),
            "emb_ln": layers.layer_norm_shapes(h),
            "blocks": {f"{i:02d}": block for i in range(cfg.layers)},
            "mlm_dense": layers.dense_shapes(h, h), "mlm_ln": layers.layer_norm_shapes(h),
            "mlm_out_b": (cfg.vocab,), "pooler": layers.dense_shapes(h, h),
            "nsp": layers.dense_shapes(h, 2)}


def batch(cfg: Config, framework: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    shape = (cfg.batch, cfg.seq)
    lengths = rng.integers(cfg.seq // 2, cfg.seq + 1, cfg.batch)
    mask = (np.arange(cfg.seq) < lengths[:, None]).astype(np.int32)
    return {"tokens": rng.integers(0, cfg.vocab, shape, dtype=np.int32),
            "segments": (np.arange(cfg.seq) >= lengths[:, None] // 2).astype(np.int32),
            "mask": mask,
            "mlm_labels": rng.integers(0, cfg.vocab, shape, dtype=np.int32),
            "mlm_weights": (mask * (rng.random(shape) < 0.15)).astype(np.float32),
            "nsp_labels": rng.integers(0, 2, cfg.batch, dtype=np.int32),
            "rng": rng_input(framework, seed)}


def encoder(F, params, batch, train: bool):
    seq = F.shape(batch["tokens"])[1]
    drop = (lambda x, i: F.dropout(x, DROPOUT, F.fold(batch["rng"], i))) if train \
        else (lambda x, i: x)
    x = (F.take(params["word_emb"], batch["tokens"]) + params["pos_emb"][:seq]
         + F.take(params["type_emb"], batch["segments"]))
    x = drop(layers.layer_norm(F, x, **params["emb_ln"]), 0)
    bias = layers.padding_bias(F, batch["mask"])
    for i, p in enumerate(params["blocks"].values()):
        attended = layers.attention(F, x, x, p["attention"], bias,
                                    dropout=lambda a: drop(a, 3 * i + 1))
        x = layers.layer_norm(F, x + drop(attended, 3 * i + 2), **p["ln1"])
        hidden = layers.gelu_erf(F, layers.dense(F, x, p["ffn_in"]))
        x = layers.layer_norm(F, x + drop(layers.dense(F, hidden, p["ffn_out"]), 3 * i + 3),
                              **p["ln2"])
    return x


def pooled(F, params, x):
    return F.tanh(layers.dense(F, x[:, 0], params["pooler"]))


def loss(F, params, batch):
    x = encoder(F, params, batch, train=True)
    h = layers.layer_norm(F, layers.gelu_erf(F, layers.dense(F, x, params["mlm_dense"])),
                          **params["mlm_ln"])
    logits = F.einsum("bsh,vh->bsv", h, params["word_emb"]) + params["mlm_out_b"]
    mlm = layers.cross_entropy(F, logits, batch["mlm_labels"], batch["mlm_weights"])
    nsp = layers.cross_entropy(F, layers.dense(F, pooled(F, params, x), params["nsp"]),
                               batch["nsp_labels"])
    return mlm + nsp


def infer(F, params, batch):
    x = encoder(F, params, batch, train=False)
    return x, layers.softmax(F, layers.dense(F, pooled(F, params, x), params["nsp"]))


def jax_train(params, opt_state, batch):
    return training.jax_train_step(loss, params, opt_state, batch)


def jax_infer(params, batch):
    return infer(JAX, params, batch)
