"""The TF front end's executor: ``runtime.executor.Executor`` whose calls are TF calls."""
from __future__ import annotations

import functools
from dataclasses import dataclass


@functools.cache
def tf_executor():
    """The class ``TfExecutor``: ``runtime.executor.Executor`` whose calls are TF calls.
    Defined on first use: importing this module (at start-up) must not import the runtime.

    ``xla`` is TF's module compiled by jaxlib (the trial times it against the stitched
    executable) and stands for TF's own function when a call runs it; a stitched call runs
    the TF step around the stitched module (``tf_hooks/stitched_call.py``). The trial call
    keeps host copies of the module's parameters read before TF's call (which writes the
    variables) and, as expected outputs, of TF's outputs and the variables TF wrote: on the
    custom loop's step that costs ~0.6 ms, where jax arrays through DLPack and their device
    copies took ~4.7 ms; the trial makes its device arrays from them, off the call path."""
    from fusionstitching.runtime.executor import Executor

    @dataclass
    class TfExecutor(Executor):
        compiled: object = None  # the tf_hook.TfCompiled whose calls it runs

        def _execute(self, executable, args, kwargs):
            (flat,) = args
            if executable is self.xla:
                return self.compiled._tf(flat)
            return self.compiled._step(flat)

        def _call_errors(self) -> tuple:
            return (Exception,)  # our kernels or TF's XLA call: TF's own function answers

        def _trial_call(self, args, kwargs):
            import numpy as np
            import tensorflow as tf

            (flat,) = args
            compiled, sig = self.compiled, self.compiled.signature
            read = lambda variables: [tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)
                                      for handle, dtype in variables]
            # copies (TF may reuse the buffers), the parameters before TF's call writes them
            params = [np.array(t) for t in list(flat) + read(sig.variables)]
            outputs = compiled._tf(flat)
            updated = read(sig.variables[v] for v in sig.updates)
            return (params, {}), outputs, [np.array(t) for t in outputs + updated]

        def _reference_on_calls(self) -> str:
            return "plain TF" if self.compiled.plain_reference else "TF's XLA"

        def _fresh(self, inputs):
            import jax

            return jax.device_put(inputs)  # before each run's clock starts, off the call path

        def _checked_trial(self, *trial) -> None:
            import jax

            with jax.enable_x64(True):  # per thread: the background trial's thread too
                super()._checked_trial(*trial)

    return TfExecutor
