"""An unchanged Keras script as the examples write them: a tabular classifier compiled with
the defaults (``jit_compile="auto"``), trained, evaluated and used to predict on 100 rows in
batches of 32, so every step function also meets a last batch of 4 rows.

Dense layers with BatchNormalization and Dropout, binary cross-entropy, Adam. Prints one
JSON line with every step's loss, the evaluation, a checksum of the predictions and of the
final weights, and saves the weights to $OUT (.npz) when set.

    python benchmarks/tf_scripts/keras_tabular.py [EPOCHS]
"""
import json
import os
import sys

import keras
import numpy as np
from step_losses import StepLosses  # beside this script

epochs = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else 2
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
features = rng.standard_normal((100, 30)).astype("float32")
targets = (features[:, :3].sum(axis=1) > 0.5).astype("float32")

model = keras.Sequential([
    keras.Input((30,)),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.BatchNormalization(),
    keras.layers.Dropout(0.3),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(1, activation="sigmoid"),
])
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy",
              metrics=["accuracy"])
recorder = StepLosses()
model.fit(features, targets, batch_size=32, epochs=epochs, shuffle=False, verbose=0,
          callbacks=[recorder])
evaluation = model.evaluate(features, targets, batch_size=32, verbose=0)
predictions = model.predict(features, batch_size=32, verbose=0)
weights = {f"{i}:{w.path}": np.asarray(w) for i, w in enumerate(model.weights)}
if os.environ.get("OUT"):
    np.savez(os.environ["OUT"], **weights)
print(json.dumps({"losses": recorder.losses, "evaluate": [float(v) for v in evaluation],
                  "predict": float(np.abs(predictions).sum()),
                  "weights_sum": float(sum(w.sum() for w in weights.values()))}))
