"""The stitched executable as TF's own XLA call: the stitched module runs as one
``XlaCallModule`` op (StableHLO, as jax2tf emits it) inside a ``tf.function(jit_compile=True)``
that reads the captured variables and assigns the updates, so TF's executor hands the
variables over in C++, as for TF's own step. Our kernels are typed-FFI targets registered with
the copy of XLA that TF links too (`tf_ffi_apis`).
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


# Where TensorFlow's builds export their XLA's FFI API: the C entry (the `tensorflow` wheel's
# libtensorflow_framework) or only the C++ function behind it, ``xla::ffi::GetXlaFfiApi()``
# (the `tensorflow-cpu` wheel's libtensorflow_cc). Both take nothing and return the pointer.
_API_GETTERS = ("XLA_FFI_GetApi", "_ZN3xla3ffi12GetXlaFfiApiEv")
_LIBRARIES = ("libtensorflow_framework*", "libtensorflow_cc*")


@functools.cache
def tf_ffi_apis() -> tuple[int, ...]:
    """Addresses of each ``XLA_FFI_Api`` found in the TensorFlow libraries this process has
    loaded (a build may carry XLA in more than one: our targets go to each)."""
    import ctypes

    import tensorflow as tf

    apis = []
    for pattern in _LIBRARIES:
        for path in sorted(glob.glob(os.path.join(tf.sysconfig.get_lib(), pattern))):
            try:  # only a library TF loaded: never a second copy
                library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            except OSError:
                continue
            for name in _API_GETTERS:
                getter = getattr(library, name, None)
                if getter is not None:
                    getter.restype = ctypes.c_void_p
                    apis.append(getter())
                    break
    if not apis:
        raise NotCallable(f"TensorFlow {tf.__version__}'s libraries in "
                          f"{tf.sysconfig.get_lib()} export no XLA FFI API")
    return tuple(dict.fromkeys(apis))


def stitched_step(rewritten_hlo: str, in_avals: list, out_avals: tuple, signature):
    """TF's concrete function of (the flat inputs, then each captured variable's resource
    handle) that runs the stitched module on the inputs and the variables' values, assigns
    the updates and returns the outputs. Call it inside ``jax.enable_x64(True)``."""
    import tensorflow as tf
    from tensorflow.compiler.tf2xla.python import xla as tfxla

    from fusionstitching.runtime import ffi

    targets = sorted(set(_TARGET.findall(rewritten_hlo)))
    try:
        for api in tf_ffi_apis():
            ffi.register_with(api, targets)
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
