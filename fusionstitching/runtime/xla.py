"""Compile HLO text with XLA (through jaxlib) and run the executable.

jaxlib 0.10 compiles only MLIR: HLO text is parsed by XLA's own parser
(``hlo_module_from_text``), converted with ``hlo_to_stablehlo`` and compiled with the same
compile options ``jax.jit`` uses. These are jax internals, pinned by setup.py to jax 0.10.
"""
from __future__ import annotations

from collections.abc import Sequence


def compile_hlo(hlo_text: str, device=None):
    """A loaded XLA executable for the module (on ``device``, default: the first device)."""
    import jax
    from jax._src import compiler
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client as xc
    from jax._src.lib.mlir import ir

    device = device or jax.devices()[0]
    proto = xc.hlo.hlo_module_from_text(hlo_text)
    stablehlo = xc._xla.mlir.hlo_to_stablehlo(proto.as_serialized_hlo_module_proto())
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    with mlir.make_ir_context():
        return device.client.compile_and_load(
            ir.Module.parse(stablehlo), executable_devices=xc.DeviceList((device,)),
            compile_options=options)


def executable_text(executable) -> str:
    """The optimized HLO the executable runs (what jax's ``Compiled.as_text()`` prints)."""
    return "\n\n".join(module.to_string() for module in executable.hlo_modules())


def execute(executable, args: Sequence) -> list:
    """Run on one device; ``args`` are arrays (numpy or jax) in parameter order; returns one
    jax array per output (a root tuple is returned as its elements)."""
    import jax

    device = executable.local_devices()[0]
    buffers = [jax.device_put(a, device) for a in args]
    results = executable.execute_sharded(buffers)
    return [per_device[0] for per_device in results.disassemble_into_single_device_arrays()]
