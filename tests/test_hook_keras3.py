"""FUSIONSTITCHING=1 on a model nobody here wrote: Keras 3 on the JAX backend, whose trainer
jits its train/test/predict steps with ``jax.jit(step, donate_argnums=0, out_shardings=None)``."""
from __future__ import annotations

import textwrap

import pytest

from helpers_hook import plain_and_stitched

# Dense, BatchNormalization (non-trainable state), Dropout (the seed generator's state), Adam:
# 4 train steps, then 4 test and 4 predict steps; a fixed seed, so every run is the same job.
SCRIPT = textwrap.dedent("""
    import os
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["KERAS_BACKEND"] = "jax"
    import numpy as np
    import keras
    import jax
    print("jax.jit replaced:", hasattr(jax.jit, "fusionstitching_original"))
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 16)).astype("float32")
    y = rng.standard_normal((64, 4)).astype("float32")
    model = keras.Sequential([
        keras.Input((16,)), keras.layers.Dense(32, activation="gelu"),
        keras.layers.BatchNormalization(), keras.layers.Dropout(0.25),
        keras.layers.LayerNormalization(), keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"])
    history = model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    print("loss:", history.history["loss"][-1])
    print("evaluate:", *model.evaluate(x, y, batch_size=16, verbose=0))
    print("predict:", float(np.abs(model.predict(x, batch_size=16, verbose=0)).sum()))
""")
STEPS = {"jit_train_step", "jit_test_step", "jit_predict_step"}


@pytest.mark.slow  # ~60 s: two Keras start-ups, 3 step functions' kernels on 2 shared cores
def test_keras3_fit_evaluate_predict_are_stitched(tmp_path):
    pytest.importorskip("keras", minversion="3")
    want, got, reports, _ = plain_and_stitched(tmp_path, SCRIPT,
                                               keys=("loss", "evaluate", "predict"))
    assert {r["module"] for r in reports} == STEPS, [r["module"] for r in reports]
    for r in reports:
        assert not r["fallbacks"], (r["module"], r["fallbacks"])
        assert r["fs"]["patterns"] >= 1 and r["fs"]["mem_kernels"] < r["xla"]["mem_kernels"]
        assert r["verify"]["ran"] and r["verify"]["ok"], (r["module"], r["verify"])
        # calls 3 and 4 run in jax's dispatch, without the runtime (stitched_jit.jax_dispatch)
        assert r["runtime"]["kept"] == "stitched" and r["runtime"]["calls"] == 2, r["runtime"]

    # The stitched steps train the same model: loss, metrics and predictions as XLA's.
    assert set(got) == {"loss", "evaluate", "predict"} and got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
