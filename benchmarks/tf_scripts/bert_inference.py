"""An unchanged TF inference script: a BERT-like encoder as one tf.function(jit_compile=True).

Two encoder layers (self-attention with an additive mask, LayerNorm, GELU feed-forward) over
token and position embeddings, fixed random weights and tokens. Prints one JSON line with a
checksum and saves the outputs to $OUT (.npy) when set.

    python benchmarks/tf_scripts/bert_inference.py [CALLS]
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 3
batch, seq, vocab, dim, heads, layers = 4, 32, 100, 64, 4, 2
rng = np.random.default_rng(0)


def weight(*shape):
    return tf.Variable(rng.standard_normal(shape).astype("float32") * 0.05)


token_embedding, position_embedding = weight(vocab, dim), weight(seq, dim)
blocks = [{"qkv": weight(dim, 3 * dim), "out": weight(dim, dim), "ln1": weight(dim),
           "up": weight(dim, 4 * dim), "down": weight(4 * dim, dim), "ln2": weight(dim)}
          for _ in range(layers)]


def layer_norm(x, scale):
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-12) * (1.0 + scale)


@tf.function(jit_compile=True)
def encode(tokens, mask):
    h = tf.gather(token_embedding, tokens) + position_embedding
    bias = (1.0 - tf.cast(mask, tf.float32))[:, None, None, :] * -10000.0
    for block in blocks:
        q, k, v = tf.split(tf.reshape(h @ block["qkv"], [batch, seq, 3, heads, dim // heads]),
                           3, axis=2)
        q, k, v = (tf.transpose(t[:, :, 0], [0, 2, 1, 3]) for t in (q, k, v))
        scores = tf.matmul(q, k, transpose_b=True) / (dim // heads) ** 0.5 + bias
        context = tf.transpose(tf.matmul(tf.nn.softmax(scores), v), [0, 2, 1, 3])
        h = layer_norm(h + tf.reshape(context, [batch, seq, dim]) @ block["out"], block["ln1"])
        h = layer_norm(h + tf.nn.gelu(h @ block["up"]) @ block["down"], block["ln2"])
    return h


tokens = tf.constant(rng.integers(0, vocab, (batch, seq)), tf.int32)
mask = tf.constant(np.arange(seq)[None, :] < rng.integers(seq // 2, seq + 1, (batch, 1)))
for _ in range(calls):
    out = encode(tokens, mask).numpy()
if os.environ.get("OUT"):
    np.save(os.environ["OUT"], out)
print(json.dumps({"sum": float(out.sum())}))
