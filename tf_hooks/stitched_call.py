"""The stitched executable as TF's own XLA call: the stitched module runs as one
``XlaCallModule`` op (StableHLO, as jax2tf emits it) inside a ``tf.function(jit_compile=True)``
that reads the captured variables and assigns the updates, so TF's executor hands the
variables over in C++, as for TF's own step. Our kernels are typed-FFI targets registered with
the copy of XLA that TF links too (``XLA_FFI_GetApi`` of libtensorflow_framework).
Imported at interpreter start with tf_hooks: TF and jax only inside the functions."""
from __future__ import annotations

import functools
import glob
import os
import re

from .hlo_function import hlo_function

_TARGET = re.compile(r'custom_call_target="(fusionstitching[^"]*)"')


class NotCallable(Exception):
    """TF cannot run the stitched module; the message says why."""


@functools.cache
def tf_ffi_api() -> int:
    """Address of the ``XLA_FFI_Api`` of the XLA inside TensorFlow."""
    import ctypes

    import tensorflow as tf

    found = sorted(glob.glob(os.path.join(tf.sysconfig.get_lib(), "libtensorflow_framework*")))
    if not found:
        raise NotCallable(f"no libtensorflow_framework in {tf.sysconfig.get_lib()}")
    library = ctypes.CDLL(found[0])  # loaded by TF already: the same copy
    try:
        get_api = library.XLA_FFI_GetApi
    except AttributeError:
        raise NotCallable(f"{os.path.basename(found[0])} exports no XLA_FFI_GetApi "
                          f"(TensorFlow {tf.__version__} is too old)") from None
    get_api.restype = ctypes.c_void_p
    return get_api()


def stitched_step(rewritten_hlo: str, in_avals: list, out_avals: tuple, signature):
    """TF's concrete function of (the flat inputs, then each captured variable's resource
    handle) that runs the stitched module on the inputs and the variables' values, assigns
    the updates and returns the outputs. Call it inside ``jax.enable_x64(True)``."""
    import tensorflow as tf
    from tensorflow.compiler.tf2xla.python import xla as tfxla

    from fusionstitching.runtime import ffi

    targets = sorted(set(_TARGET.findall(rewritten_hlo)))
    try:
        ffi.register_with(tf_ffi_api(), targets)
    except RuntimeError as exc:
        raise NotCallable(f"TF's XLA did not take our kernels: {exc}") from None
    exported = _exported(rewritten_hlo, in_avals, out_avals, targets)
    if exported.calling_convention_version > tfxla.call_module_maximum_supported_version():
        raise NotCallable(f"TensorFlow {tf.__version__} runs XlaCallModule versions up to "
                          f"{tfxla.call_module_maximum_supported_version()}, jax exported "
                          f"version {exported.calling_convention_version}")
    n, dtypes = signature.num_inputs, [dtype for _, dtype in signature.variables]

    def step(*args):
        inputs, handles = list(args[:n]), args[n:]
        values = [tf.raw_ops.ReadVariableOp(resource=h, dtype=d) for h, d in zip(handles, dtypes)]
        results = _call_module(exported, inputs + values)
        for variable, value in zip(signature.updates, results[signature.num_outputs:]):
            tf.raw_ops.AssignVariableOp(resource=handles[variable], value=value)
        return results[:signature.num_outputs]

    specs = [tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)) for a in in_avals[:n]]
    specs += [tf.TensorSpec([], tf.resource)] * len(dtypes)
    return tf.function(step, jit_compile=True, autograph=False).get_concrete_function(*specs)


def _exported(rewritten_hlo: str, in_avals: list, out_avals: tuple, targets: list):
    """``jax.export`` of the stitched module (our custom calls allowed by name)."""
    import jax

    from fusionstitching.stitched_jit import original_jax_jit

    run = hlo_function(rewritten_hlo, out_avals)
    checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in targets]
    return jax.export.export(original_jax_jit()(run, keep_unused=True), platforms=["cpu"],
                             disabled_checks=checks)(*in_avals)


def _call_module(exported, args: list) -> list:
    """The ``XlaCallModule`` op running ``exported`` on ``args`` (inside a traced function),
    with the attributes jax2tf gives it."""
    import jax
    import tensorflow as tf
    from tensorflow.compiler.tf2xla.python import xla as tfxla

    version = exported.calling_convention_version
    attrs = dict(version=version, module=exported.mlir_module_serialized,
                 Tout=[tf.as_dtype(a.dtype) for a in exported.out_avals],
                 Sout=[tuple(a.shape) for a in exported.out_avals],
                 platforms=[p.upper() for p in exported.platforms], function_list=[],
                 has_token_input_output=False,
                 disabled_checks=[str(check) for check in exported.disabled_safety_checks])
    if version >= 10:
        attrs["use_shardy_partitioner"] = jax.config.jax_use_shardy_partitioner
    kept = [a for i, a in enumerate(args) if i in exported.module_kept_var_idx]
    return list(tfxla.call_module(kept, **attrs))
