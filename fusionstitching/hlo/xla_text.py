"""XLA's optimized HLO of a compiled jax function as text, constants in full. Apart from
xla_runner.py so that the runtime's call path (the plan key) reads it without loading the
parser and the evaluator.
"""
from __future__ import annotations

from jax._src.lib import xla_client


def optimized_hlo_text(compiled) -> str:
    """The optimized HLO of a ``jax.jit(f).lower(...).compile()`` result, constants in full."""
    return hlo_module_text(compiled.runtime_executable().hlo_modules()[0])


def hlo_module_text(hlo_module) -> str:
    """A jaxlib HloModule as text, as ``as_text()`` prints it but with large constants in
    full (``as_text()`` elides them as ``{...}``, which no parser can read back)."""
    options = xla_client.hlo.HloPrintOptions()  # as_text()'s defaults, except...
    options.print_large_constants = True
    return hlo_module.to_string(options)
