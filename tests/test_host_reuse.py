"""Host kernels keep a value a later loop would compute again (codegen/schedules/host_reuse.py):
softmax's exp is computed once per element, and the kernel gives XLA:CPU's numbers."""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fusionstitching.capture import jax_hlo  # noqa: E402
from fusionstitching.codegen import compile_host  # noqa: E402
from fusionstitching.codegen.kernel_ir import Compute, Loop, SharedLoad, SharedStore  # noqa: E402
from fusionstitching.codegen.schedules import host_reuse  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402
from fusionstitching.pipeline import Options, stitch_module  # noqa: E402


def softmax(x):
    return jax.nn.softmax(x * 0.5, axis=-1)


def layernorm_tanh(x, g):
    mean = x.mean(-1, keepdims=True)
    centered = jnp.tanh(x) - mean
    return centered * jax.lax.rsqrt((centered ** 2).mean(-1, keepdims=True) + 1e-5) * g


def host_kernel_of(fn, *a):
    module = parse_module(jax_hlo(fn, *a, target="cpu"))
    (kernel,) = stitch_module(module, Options(target="h100", ptxas=False, host=True)).kernels
    return kernel.spec


def loop_ops(loop: Loop, op: str) -> int:
    return sum(isinstance(s, Compute) and s.op == op for s in loop.body)


def test_softmax_computes_exp_once_per_element():
    x = np.random.default_rng(0).standard_normal((24, 256)).astype(np.float32)
    spec = host_kernel_of(softmax, x)
    loops = [s for s in spec.host_kernel.body if isinstance(s, Loop)]
    exp_loops = [loop for loop in loops if loop_ops(loop, "exponential")]
    assert len(exp_loops) == 1, spec.host_kernel  # the sum's loop; the output's reads it back
    (kept,) = [a for a in spec.host_kernel.shared if a.name.startswith("kept")]
    assert kept.size == 256
    assert any(isinstance(s, SharedStore) and s.array == kept for s in exp_loops[0].body)
    assert any(isinstance(s, SharedLoad) and s.array == kept for s in loops[-1].body)
    got = compile_host(spec, fast=True)(x)[0]
    np.testing.assert_allclose(got, np.asarray(jax.jit(softmax)(x)), rtol=2e-6, atol=1e-7)


def test_the_same_numbers_bit_for_bit_with_and_without_kept_values(monkeypatch):
    rng = np.random.default_rng(1)
    x, g = rng.standard_normal((16, 128), np.float32), rng.standard_normal(128, np.float32)
    spec = host_kernel_of(layernorm_tanh, x, g)
    assert any(a.name.startswith("kept") for a in spec.host_kernel.shared)
    monkeypatch.setattr(host_reuse, "KEPT_BYTES", 0)  # nothing fits: nothing kept
    plain = host_kernel_of(layernorm_tanh, x, g)
    assert not any(a.name.startswith("kept") for a in plain.host_kernel.shared)
    kept_out = compile_host(spec, fast=True)(x, g)[0]
    np.testing.assert_array_equal(kept_out, compile_host(plain, fast=True)(x, g)[0])
    np.testing.assert_allclose(kept_out, np.asarray(jax.jit(layernorm_tanh)(x, g)),
                               rtol=1e-5, atol=1e-5)


def three_kept(x):
    a, b, c = jnp.exp(x), jnp.tanh(x), jnp.log1p(x * x)
    total = (a + b + c).sum(-1, keepdims=True)
    return (a + 2 * b + 3 * c) / total


def test_kept_arrays_are_named_in_the_loops_order():
    # Named in a set's order they changed with the interpreter's hash seed, and with them the
    # kernel's text and its cache key (zoo BERT train's kernel 12 differed run to run).
    x = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
    spec = host_kernel_of(three_kept, x)
    first = next(s for s in spec.host_kernel.body if isinstance(s, Loop))
    stored = [s.array.name for s in first.body if isinstance(s, SharedStore)]
    assert stored == ["kept0", "kept1", "kept2"], spec.host_kernel
    np.testing.assert_allclose(compile_host(spec, fast=True)(x)[0],
                               np.asarray(jax.jit(three_kept)(x)), rtol=2e-6, atol=1e-6)
