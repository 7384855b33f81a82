"""A Keras convnet as the MNIST example writes it, on random 28x28 images (no download):
two Conv2D + MaxPooling blocks, Dropout, a softmax classifier, Adam, model.fit with a
validation split, then evaluate. Either Keras backend (KERAS_BACKEND). Prints one JSON line
with the final training loss and the test loss.

    python benchmarks/scripts/keras_convnet.py [EPOCHS]
"""
import json
import sys

import keras
import numpy as np

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.random((1100, 28, 28, 1)).astype("float32")
y = keras.utils.to_categorical(rng.integers(0, 10, 1100), 10)
x_test, y_test = x[1000:], y[1000:]

model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(16, 3, activation="relu"),
    keras.layers.MaxPooling2D(2),
    keras.layers.Conv2D(32, 3, activation="relu"),
    keras.layers.MaxPooling2D(2),
    keras.layers.Flatten(),
    keras.layers.Dropout(0.5),
    keras.layers.Dense(10, activation="softmax"),
])
model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
history = model.fit(x[:1000], y[:1000], batch_size=64, epochs=epochs, validation_split=0.1,
                    verbose=0)
test_loss = model.evaluate(x_test, y_test, verbose=0)[0]
print(json.dumps({"loss": history.history["loss"][-1], "test_loss": test_loss}))
