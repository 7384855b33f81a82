"""Compile HLO text with XLA (through jaxlib) and run the executable.

jaxlib 0.10 compiles only MLIR: HLO text is parsed by XLA's own parser
(``hlo_module_from_text``), converted with ``hlo_to_stablehlo`` and compiled with the same
compile options ``jax.jit`` uses. These are jax internals, pinned by setup.py to jax 0.10.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ..hlo.collectives import as_replicas


def compile_hlo(hlo_text: str, device=None, debug_options: dict | None = None,
                devices: Sequence | None = None):
    """A loaded XLA executable for the module (on ``device``, default: the first device);
    ``debug_options`` (``{"xla_gpu_enable_command_buffer": "FUSION"}``) apply to this compile
    only, over XLA_FLAGS. With several ``devices`` the module is the program each of them
    runs (an SPMD partition's), compiled as replicas in that order (``as_replicas``)."""
    import jax
    from jax._src import compiler
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client as xc
    from jax._src.lib.mlir import ir

    devices = tuple(devices) if devices else (device or jax.devices()[0],)
    count, assignment = len(devices), None
    if count > 1:
        hlo_text = as_replicas(hlo_text)
        assignment = np.array([d.id for d in devices]).reshape(count, 1)
    proto = xc.hlo.hlo_module_from_text(hlo_text)
    stablehlo = xc._xla.mlir.hlo_to_stablehlo(proto.as_serialized_hlo_module_proto())
    options = compiler.get_compile_options(num_replicas=count, num_partitions=1,
                                           device_assignment=assignment,
                                           env_options_overrides=debug_options)
    with mlir.make_ir_context():
        return devices[0].client.compile_and_load(
            ir.Module.parse(stablehlo), executable_devices=xc.DeviceList(devices),
            compile_options=options)


def executable_devices(compiled) -> tuple:
    """The devices of a ``jax.stages.Compiled``, every process's, in the order of its device
    assignment (partition or replica ``i`` runs on the ``i``-th)."""
    return tuple(compiled._executable._unloaded_executable.device_list)


def swap_executable(lowered, compiled, executable):
    """A ``jax.stages.Compiled`` like ``compiled`` (from ``lowered``) that runs ``executable``.

    The rewritten module has the same parameters and results as XLA's, so everything jax
    built around XLA's executable (argument checks, pytrees, input handlers, its C++ dispatch
    fast path) stays valid; only the loaded executable differs. jax 0.10 internals:
    ``MeshExecutable._unloaded_executable`` is a dataclass whose ``load()`` rebuilds the
    call path around ``xla_executable``.
    """
    from jax._src import stages

    unloaded = dataclasses.replace(compiled._executable._unloaded_executable,
                                   xla_executable=executable)
    return stages.Compiled(unloaded.load(), lowered._lowering.const_args, lowered.args_info,
                           lowered.out_tree, lowered._no_kwargs, lowered._in_types,
                           lowered._out_types)


def executable_text(executable) -> str:
    """The optimized HLO the executable runs (what jax's ``Compiled.as_text()`` prints)."""
    return "\n\n".join(module.to_string() for module in executable.hlo_modules())


def execute(executable, args: Sequence) -> list:
    """Run on one device; ``args`` are arrays (numpy or jax) in parameter order; returns one
    jax array per output (a root tuple is returned as its elements)."""
    import jax

    device = executable.local_devices()[0]
    buffers = list(args)
    # jax.device_put costs ~100 us per call even for arrays already there: move only the
    # others, in one batched call.
    moving = [i for i, a in enumerate(buffers)
              if not (isinstance(a, jax.Array) and a.devices() == {device})]
    if moving:
        for i, moved in zip(moving, jax.device_put([buffers[i] for i in moving], device)):
            buffers[i] = moved
    results = executable.execute_sharded(buffers)
    return [per_device[0] for per_device in results.disassemble_into_single_device_arrays()]
