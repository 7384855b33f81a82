"""``--keras_jit``: Keras 3 on TF resolves ``compile(jit_compile="auto")`` to XLA without a GPU too.

Keras turns XLA off for TF on a machine with CPUs only, so no step of a script compiled with
the default would reach the TF hook and the env var did nothing. With the flag (``auto`` by
default under FUSIONSTITCHING=1), "auto" means what it means on a GPU machine: XLA wherever the
model's layers support it, never under a tf.distribute strategy. The steps it turns on run as
plain TF until the job has run STITCH_AFTER_S (tf_hook.py: an XLA compile costs a short job more
than it can save); ``--keras_jit=always`` gives them XLA from the first call. An explicit
``jit_compile=False`` stays False, and ``--keras_jit=false`` keeps Keras's own resolution.
"""
from __future__ import annotations

import functools
import inspect

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
        if original(model):
            return True  # Keras's own choice (a GPU machine): XLA from the first call
        supported = bool(trainer.model_supports_jit(model))
        model._fusionstitching_auto_jit = supported  # read by turned_on_here
        return supported

    _resolve_auto_jit_compile.fusionstitching_original = original
    cls._resolve_auto_jit_compile = _resolve_auto_jit_compile
    original_compile = cls.compile
    parameters = inspect.signature(original_compile)

    @functools.wraps(original_compile)
    def compile(model, *args, **kwargs):
        result = original_compile(model, *args, **kwargs)
        # Keras resolves "auto" also when compile sets an explicit value (TF's __setattr__
        # reads the jit_compile property first): an explicit jit_compile is the user's choice
        try:
            asked = parameters.bind(model, *args, **kwargs).arguments.get("jit_compile", "auto")
        except TypeError:
            asked = "auto"
        if asked != "auto":
            model._fusionstitching_auto_jit = False
        return result

    cls.compile = compile


def turned_on_here(function) -> bool:
    """Whether a jit-compiled tf.function is a step of a model whose XLA this flag turned on:
    Keras's step functions are closures over the model."""
    python_function = inspect.unwrap(getattr(function, "python_function", None) or
                                     (lambda: None))
    for cell in getattr(python_function, "__closure__", None) or ():
        try:
            if getattr(cell.cell_contents, "_fusionstitching_auto_jit", False) is True:
                return True
        except ValueError:  # an empty cell
            continue
    return False


def install_when_imported() -> None:
    import sys

    from .jax_hook import _AfterImport

    if TRAINER in sys.modules:
        install()
    else:
        sys.meta_path.insert(0, _AfterImport(TRAINER, install))
