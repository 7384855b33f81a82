"""A Keras time-series classifier as the FordA example writes it, on random series (no
download): three Conv1D + BatchNormalization + ReLU blocks, global average pooling, softmax,
Adam, model.fit with a validation split (500 series in batches of 32: a partial last
batch), then evaluate. Either Keras backend. Prints one JSON line with the losses.

    python benchmarks/scripts/keras_timeseries.py
"""
import json

import keras
import numpy as np

keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.standard_normal((600, 128, 1)).astype("float32")
y = (x[:, :64, 0].mean(axis=1) > 0).astype("int32")

inputs = keras.Input((128, 1))
h = inputs
for _ in range(3):
    h = keras.layers.Conv1D(32, 3, padding="same")(h)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
h = keras.layers.GlobalAveragePooling1D()(h)
outputs = keras.layers.Dense(2, activation="softmax")(h)
model = keras.Model(inputs, outputs)
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
              metrics=["sparse_categorical_accuracy"])
history = model.fit(x[:500], y[:500], batch_size=32, epochs=3, validation_split=0.2,
                    verbose=0)
test_loss = model.evaluate(x[500:], y[500:], verbose=0)[0]
print(json.dumps({"loss": history.history["loss"][-1], "test_loss": test_loss}))
