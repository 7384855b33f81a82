"""``--keras_jit``: Keras 3 on TF resolves ``compile(jit_compile="auto")`` to XLA without a GPU too.

Keras turns XLA off for TF on a machine with CPUs only, so no step of a script compiled with
the default would reach the TF hook and the env var did nothing. With the flag (on by default
under FUSIONSTITCHING=1), "auto" means on every machine what it means on a GPU one: XLA
wherever the model's layers support it, never under a tf.distribute strategy. An explicit
``jit_compile=False`` stays False, and ``--keras_jit=false`` keeps Keras's own resolution.
"""
from __future__ import annotations

from fusionstitching.logs import log

TRAINER = "keras.src.trainers.trainer"


def install() -> None:
    """Replace ``Trainer._resolve_auto_jit_compile`` of Keras 3 (once)."""
    import importlib

    trainer = importlib.import_module(TRAINER)
    cls = trainer.Trainer
    original = getattr(cls, "_resolve_auto_jit_compile", None)
    if original is None or not hasattr(trainer, "model_supports_jit"):
        log.info("--keras_jit: this Keras resolves jit_compile='auto' in a way not known "
                 "here; it is left as it is")
        return
    if hasattr(original, "fusionstitching_original"):
        return

    def _resolve_auto_jit_compile(model):
        from keras.src import backend

        if backend.backend() != "tensorflow":
            return original(model)
        if getattr(model, "_distribute_strategy", None):
            return False  # as Keras: no XLA under tf.distribute
        return bool(trainer.model_supports_jit(model))

    _resolve_auto_jit_compile.fusionstitching_original = original
    cls._resolve_auto_jit_compile = _resolve_auto_jit_compile


def install_when_imported() -> None:
    import sys

    from .jax_hook import _AfterImport

    if TRAINER in sys.modules:
        install()
    else:
        sys.meta_path.insert(0, _AfterImport(TRAINER, install))
