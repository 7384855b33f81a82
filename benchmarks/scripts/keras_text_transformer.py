"""A Keras text classifier with a Transformer block, as the IMDB example writes it, on
random token sequences (no download): token and position embeddings, multi-head attention,
LayerNormalization, a feed-forward block, Dropout, pooling, softmax; Adam, model.fit with
validation data, then evaluate. Either Keras backend. Prints one JSON line with the losses.

    python benchmarks/scripts/keras_text_transformer.py
"""
import json

import keras
import numpy as np
from keras import layers

vocab, maxlen, dim, heads, ff = 2000, 64, 32, 2, 32


class TransformerBlock(layers.Layer):
    def __init__(self):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=heads, key_dim=dim)
        self.ffn = keras.Sequential([layers.Dense(ff, activation="relu"), layers.Dense(dim)])
        self.norm1, self.norm2 = layers.LayerNormalization(epsilon=1e-6), \
            layers.LayerNormalization(epsilon=1e-6)
        self.drop1, self.drop2 = layers.Dropout(0.1), layers.Dropout(0.1)

    def call(self, inputs):
        attention = self.drop1(self.att(inputs, inputs))
        h = self.norm1(inputs + attention)
        return self.norm2(h + self.drop2(self.ffn(h)))


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self):
        super().__init__()
        self.token = layers.Embedding(vocab, dim)
        self.position = layers.Embedding(maxlen, dim)

    def call(self, x):
        positions = keras.ops.arange(0, keras.ops.shape(x)[-1], 1)
        return self.token(x) + self.position(positions)


keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.integers(1, vocab, (900, maxlen)).astype("int32")
y = (x[:, :8].mean(axis=1) > vocab / 2).astype("int32")

inputs = layers.Input((maxlen,))
h = TransformerBlock()(TokenAndPositionEmbedding()(inputs))
h = layers.Dropout(0.1)(layers.GlobalAveragePooling1D()(h))
h = layers.Dropout(0.1)(layers.Dense(20, activation="relu")(h))
outputs = layers.Dense(2, activation="softmax")(h)
model = keras.Model(inputs, outputs)
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x[:700], y[:700], batch_size=32, epochs=2,
                    validation_data=(x[700:800], y[700:800]), verbose=0)
test_loss = model.evaluate(x[800:], y[800:], verbose=0)[0]
print(json.dumps({"loss": history.history["loss"][-1], "test_loss": test_loss}))
