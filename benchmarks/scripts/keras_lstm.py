"""A Keras LSTM classifier as the IMDB bidirectional-LSTM example writes it, on random
token sequences (no download): an embedding, two stacked bidirectional LSTMs, a sigmoid
output; Adam, model.fit on 500 sequences in batches of 32 (a partial last batch of 20),
then evaluate. Either Keras backend. Prints one JSON line with the losses.

    python benchmarks/scripts/keras_lstm.py
"""
import json

import keras
import numpy as np
from keras import layers

vocab, maxlen = 2000, 40
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.integers(1, vocab, (600, maxlen)).astype("int32")
y = (x[:, :5].mean(axis=1) > vocab / 2).astype("float32")

inputs = keras.Input(shape=(None,), dtype="int32")
h = layers.Embedding(vocab, 32)(inputs)
h = layers.Bidirectional(layers.LSTM(16, return_sequences=True))(h)
h = layers.Bidirectional(layers.LSTM(16))(h)
outputs = layers.Dense(1, activation="sigmoid")(h)
model = keras.Model(inputs, outputs)
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
history = model.fit(x[:500], y[:500], batch_size=32, epochs=2, verbose=0)
test_loss = model.evaluate(x[500:], y[500:], batch_size=32, verbose=0)[0]
print(json.dumps({"loss": history.history["loss"][-1], "test_loss": test_loss}))
