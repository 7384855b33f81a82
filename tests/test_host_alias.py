"""Fast host kernels tell LLVM that their buffers never overlap (alias scopes, codegen/host.py):
an optimizer step that stores to twelve outputs is vectorized, and gives XLA:CPU's numbers."""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import llvmlite.binding as llvm  # noqa: E402
import numpy as np  # noqa: E402

from fusionstitching.capture import jax_hlo  # noqa: E402
from fusionstitching.codegen import compile_host  # noqa: E402
from fusionstitching.codegen import host  # noqa: E402
from fusionstitching.codegen.llvm_lowering import optimize  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402
from fusionstitching.pipeline import Options, stitch_module  # noqa: E402


def adam(p, g, m, v):
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    return p - 0.01 * m / (jnp.sqrt(v) + 1e-7), m, v


def adam_of_four(*args):
    """Four parameters' updates: 16 inputs, 12 outputs (a model's optimizer step)."""
    return [out for k in range(4) for out in adam(*args[4 * k:4 * k + 4])]


def optimized_ir(kernel) -> str:
    module = llvm.parse_assembly(host.host_ir(kernel, fast=True))
    optimize(module, host._host_machine(), unroll_and_vectorize=True)
    return str(module)


def test_updates_storing_twelve_outputs_are_vectorized_with_xlas_numbers(monkeypatch):
    rng = np.random.default_rng(0)
    args = [rng.random((64, 32)).astype(np.float32) if k % 4 == 3 else
            rng.standard_normal((64, 32)).astype(np.float32) for k in range(16)]
    module = parse_module(jax_hlo(adam_of_four, *args, target="cpu"))
    (kernel,) = stitch_module(module, Options(target="h100", ptxas=False, host=True)).kernels
    spec = kernel.spec
    assert len(spec.outputs) == 12
    assert "fdiv <" in optimized_ir(spec.host_kernel)  # the division, on vectors
    arrays = {param.name: a for param, a in zip(module.entry.parameters, args)}
    got = compile_host(spec, fast=True)(*(arrays[name] for name, _ in spec.inputs))
    outputs = module.entry.root.operands  # the step's results, in order
    want = dict(zip(outputs, jax.jit(adam_of_four)(*args)))
    for (name, _), a in zip(spec.outputs, got):  # XLA:CPU contracts multiply-adds: ulps
        np.testing.assert_allclose(a, np.asarray(want[name]), rtol=2e-6, atol=1e-7)
    # without the scopes LLVM keeps the loop scalar: the scopes are what vectorizes it, and
    # they change no bit
    monkeypatch.setattr(host, "_buffer_scopes", lambda module, kernel: None)
    assert "fdiv <" not in optimized_ir(spec.host_kernel)
    scalar = compile_host(spec, fast=True)(*(arrays[name] for name, _ in spec.inputs))
    for a, b in zip(got, scalar):
        np.testing.assert_array_equal(a, b)
