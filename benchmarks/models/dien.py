"""DIEN (Zhou et al., Deep Interest Evolution Network): embedding lookups of user, item and
category ids; a GRU over the behavior sequence (interest extractor); DIN-style attention of
the target item over the GRU states; an AUGRU (attention-scaled update gate) over the
sequence (interest evolution); an MLP with PReLU on the concatenated features; 2-way softmax.

Training: cross-entropy and one Adam step (DIEN's auxiliary loss with negative sequences is
left out). Inference: click probabilities. "paper": batch 256 (Table 1), 100 behaviors,
18-wide embeddings, the Amazon-Books table sizes of the DIEN code.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import layers, training
from .ops import JAX


@dataclass(frozen=True)
class Config:
    batch: int
    seq: int
    users: int
    items: int
    categories: int
    embedding: int


CONFIGS = {"small": Config(batch=4, seq=8, users=16, items=32, categories=8, embedding=4),
           "paper": Config(batch=256, seq=100, users=543060, items=367983, categories=1601,
                           embedding=18)}
ATTENTION_UNITS = (80, 40)
MLP_UNITS = (200, 80)


def param_shapes(cfg: Config) -> dict:
    e = cfg.embedding
    hidden = 2 * e  # item + category embedding: the GRU keeps the behavior width
    attention_in = 4 * hidden
    features = e + 4 * hidden  # user, target, behavior sum, target * sum, final interest
    return {"user_emb": (cfg.users, e), "item_emb": (cfg.items, e),
            "cate_emb": (cfg.categories, e),
            "gru": layers.rnn_shapes(hidden, hidden, 3),
            "augru": layers.rnn_shapes(hidden, hidden, 3),
            "att1": layers.dense_shapes(attention_in, ATTENTION_UNITS[0]),
            "att2": layers.dense_shapes(*ATTENTION_UNITS),
            "att3": layers.dense_shapes(ATTENTION_UNITS[1], 1),
            "fc1": layers.dense_shapes(features, MLP_UNITS[0]), "prelu1": (MLP_UNITS[0],),
            "fc2": layers.dense_shapes(*MLP_UNITS), "prelu2": (MLP_UNITS[1],),
            "fc3": layers.dense_shapes(MLP_UNITS[1], 2)}


def batch(cfg: Config, framework: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, cfg.seq + 1, cfg.batch)
    return {"user": rng.integers(0, cfg.users, cfg.batch, dtype=np.int32),
            "item": rng.integers(0, cfg.items, cfg.batch, dtype=np.int32),
            "cate": rng.integers(0, cfg.categories, cfg.batch, dtype=np.int32),
            "history_items": rng.integers(0, cfg.items, (cfg.batch, cfg.seq), dtype=np.int32),
            "history_cates": rng.integers(0, cfg.categories, (cfg.batch, cfg.seq),
                                          dtype=np.int32),
            "history_mask": (np.arange(cfg.seq) < lengths[:, None]).astype(np.float32),
            "label": rng.integers(0, 2, cfg.batch, dtype=np.int32)}


def _prelu(F, x, alpha):
    return F.maximum(x, 0.0) + alpha * F.minimum(x, 0.0)


def logits(F, params, batch):
    target = F.concat([F.take(params["item_emb"], batch["item"]),
                       F.take(params["cate_emb"], batch["cate"])], axis=-1)      # [B, 2E]
    history = F.concat([F.take(params["item_emb"], batch["history_items"]),
                        F.take(params["cate_emb"], batch["history_cates"])], axis=-1)  # [B,T,2E]
    mask = batch["history_mask"]
    mask_t = F.transpose(mask, (1, 0))                                            # [T, B]
    batch_size, hidden = F.shape(target)

    # Interest extractor: GRU over the behaviors; padded steps keep the previous state.
    def extractor(h, inputs):
        x, m = inputs
        h = F.where(F.expand_dims(m, 1) > 0.0, layers.gru_cell(F, params["gru"], h, x), h)
        return h, h
    _, states = F.scan(extractor, F.zeros((batch_size, hidden)),
                       (F.transpose(history, (1, 0, 2)), mask_t))
    states = F.transpose(states, (1, 0, 2))                                      # [B, T, H]

    # DIN attention of the target over the interest states, masked softmax over time.
    query = F.expand_dims(target, 1) + F.zeros(F.shape(states))
    att_in = F.concat([query, states, query - states, query * states], axis=-1)
    hidden1 = F.sigmoid(layers.dense(F, att_in, params["att1"]))
    hidden2 = F.sigmoid(layers.dense(F, hidden1, params["att2"]))
    scores = F.reshape(layers.dense(F, hidden2, params["att3"]), (batch_size, -1))
    scores = F.where(mask > 0.0, scores, layers.NEG_INF + F.zeros(F.shape(scores)))
    attention = layers.softmax(F, scores)                                        # [B, T]

    # Interest evolution: AUGRU, its update gate scaled by the attention score.
    def evolution(h, inputs):
        x, a, m = inputs
        h = F.where(F.expand_dims(m, 1) > 0.0,
                    layers.gru_cell(F, params["augru"], h, x, attention_score=a), h)
        return h, h
    final, _ = F.scan(evolution, F.zeros((batch_size, hidden)),
                      (F.transpose(states, (1, 0, 2)), F.transpose(attention, (1, 0)), mask_t))

    history_sum = F.sum(history * F.expand_dims(mask, 2), axis=1)
    features = F.concat([F.take(params["user_emb"], batch["user"]), target, history_sum,
                         target * history_sum, final], axis=-1)
    x = _prelu(F, layers.dense(F, features, params["fc1"]), params["prelu1"])
    x = _prelu(F, layers.dense(F, x, params["fc2"]), params["prelu2"])
    return layers.dense(F, x, params["fc3"])


def loss(F, params, batch):
    return layers.cross_entropy(F, logits(F, params, batch), batch["label"])


def infer(F, params, batch):
    return layers.softmax(F, logits(F, params, batch))


def jax_train(params, opt_state, batch):
    return training.jax_train_step(loss, params, opt_state, batch)


def jax_infer(params, batch):
    return infer(JAX, params, batch)
