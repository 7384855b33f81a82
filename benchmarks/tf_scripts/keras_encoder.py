"""An unchanged Keras script: a transformer encoder layer, compiled with jit_compile=True,
trained with model.fit and Adam.

Token embeddings, multi-head self-attention, LayerNorm, a GELU feed-forward block and a
mean-pooled classifier, on fixed random data. Prints one JSON line with the loss of every
step (a callback) and a checksum of the final weights, and saves the weights to $OUT (.npz)
when set, so a run with FUSIONSTITCHING=1 can be compared with a plain one.

    python benchmarks/tf_scripts/keras_encoder.py [STEPS]
"""
import json
import os
import sys

import keras
import numpy as np
from step_losses import StepLosses  # beside this script

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
batch, seq, vocab, dim, heads = 8, 16, 64, 32, 4
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
tokens = rng.integers(0, vocab, (steps * batch, seq)).astype("int32")
labels = rng.integers(0, 2, steps * batch).astype("int32")

inputs = keras.Input((seq,), dtype="int32")
h = keras.layers.Embedding(vocab, dim)(inputs)
attention = keras.layers.MultiHeadAttention(heads, dim // heads)(h, h)
h = keras.layers.LayerNormalization()(h + attention)
ff = keras.layers.Dense(dim, activation="gelu")(keras.layers.Dense(2 * dim)(h))
h = keras.layers.LayerNormalization()(h + ff)
outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(h))
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              jit_compile=True)


recorder = StepLosses()
model.fit(tokens, labels, batch_size=batch, epochs=1, shuffle=False, verbose=0,
          callbacks=[recorder])
weights = {f"{i}:{w.path}": np.asarray(w) for i, w in enumerate(model.weights)}
if os.environ.get("OUT"):
    np.savez(os.environ["OUT"], **weights)
print(json.dumps({"losses": recorder.losses,
                  "weights_sum": float(sum(w.sum() for w in weights.values()))}))
