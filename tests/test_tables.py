"""Host kernels tabulate expensive values of few distinct inputs (codegen/schedules/tables.py):
RoPE's sine and cosine once per angle and part, whether the angles are an input or computed
from iota, and the kernels give XLA:CPU's numbers."""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fusionstitching.codegen import compile_host  # noqa: E402
from fusionstitching.codegen.host import split_loop  # noqa: E402
from fusionstitching.codegen.kernel_ir import Compute, Loop  # noqa: E402
from fusionstitching.codegen.schedules import tables  # noqa: E402
from helpers import run_in_parts  # noqa: E402
from test_host_reuse import host_kernel_of  # noqa: E402


def rope_and_norms(x, angles):
    """Rotary embedding of x [batch, positions, dims] by angles [positions, dims], and each
    row's squared norm: sine and cosine of the angles once per element of x (XLA's form)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
    y = x * jnp.cos(angles) + rotated * jnp.sin(angles)
    return y, (y * y).sum(-1)


def computes(body, op: str) -> int:
    return sum(isinstance(s, Compute) and s.op == op for s in body) + sum(
        computes(s.body, op) for s in body if isinstance(s, Loop))


def test_rope_computes_sine_and_cosine_once_per_angle_and_part():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 16, 8), np.float32)
    angles = rng.uniform(-30, 30, (16, 8)).astype(np.float32)
    spec = host_kernel_of(rope_and_norms, x, angles)
    kernel = spec.host_kernel
    assert split_loop(kernel) == "blocks"  # its rows still shared out among parts
    assert [(a.name, a.size) for a in kernel.scratch] == [("table0", 128), ("table1", 128)]
    assert [computes(loop.body, "cosine") + 2 * computes(loop.body, "sine")
            for loop in kernel.part_prologue] == [1, 2]  # cosine's table, then sine's
    assert computes(kernel.body, "sine") == computes(kernel.body, "cosine") == 0
    host = compile_host(spec, fast=True)
    inputs = [angles, x] if kernel.buffers[0].shape.dims == (16, 8) else [x, angles]
    want = [np.asarray(w) for w in jax.jit(rope_and_norms)(x, angles)]
    whole = run_in_parts(host, spec, inputs, None)
    for got, w in zip(whole, want):
        np.testing.assert_allclose(got.reshape(w.shape), w, rtol=2e-6, atol=2e-6)
    for parts in (2, 3):  # each part fills its own tables
        for got, w in zip(run_in_parts(host, spec, inputs, parts), whole):
            np.testing.assert_array_equal(got, w)


def test_a_few_uses_per_angle_are_not_tabulated():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 16, 8), np.float32)  # 2 uses of each angle: not enough
    angles = rng.uniform(-3, 3, (16, 8)).astype(np.float32)
    kernel = host_kernel_of(rope_and_norms, x, angles).host_kernel
    assert not kernel.scratch and not kernel.part_prologue
    assert computes(kernel.body, "sine") > 0


def rope_of_positions(x):
    """The same, with the angles computed in the step (positions times 10000^(-i/4), as
    keras_hub's Mistral does): the kernel computes them from index values."""
    positions, dims = x.shape[1], x.shape[2]
    inverse = 10000.0 ** (-jnp.arange(dims // 2, dtype=jnp.float32) / (dims // 2))
    angles = jnp.arange(positions, dtype=jnp.float32)[:, None] * inverse
    return rope_and_norms(x, jnp.concatenate([angles, angles], -1))


def test_angles_computed_from_iota_are_tabulated_over_their_index_values():
    x = np.random.default_rng(5).standard_normal((64, 16, 8), np.float32)
    spec = host_kernel_of(rope_of_positions, x)
    kernel = spec.host_kernel
    assert kernel.part_prologue and all(isinstance(s, Loop) for s in kernel.part_prologue)
    assert computes(kernel.body, "sine") == computes(kernel.body, "cosine") == 0
    assert computes(kernel.part_prologue, "sine") == computes(kernel.part_prologue, "cosine") == 1
    assert all(a.size <= 4096 for a in kernel.scratch)  # index values' ranges, not the output
    host = compile_host(spec, fast=True)
    want = [np.asarray(w) for w in jax.jit(rope_of_positions)(x)]
    for parts in (None, 2):
        for got, w in zip(run_in_parts(host, spec, [x], parts), want):
            np.testing.assert_allclose(got.reshape(w.shape), w, rtol=2e-6, atol=4e-6)


def test_the_same_rotated_values_bit_for_bit_with_and_without_tables(monkeypatch):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((64, 16, 8), np.float32)
    tabulated = host_kernel_of(rope_of_positions, x)
    monkeypatch.setattr(tables, "TABULATE_REUSE", 10 ** 9)  # no value is used that often
    plain = host_kernel_of(rope_of_positions, x)
    assert tabulated.host_kernel.scratch and not plain.host_kernel.scratch
    (rotated_t, norms_t), (rotated_p, norms_p) = (compile_host(spec, fast=True)(x)
                                                  for spec in (tabulated, plain))
    np.testing.assert_array_equal(rotated_t, rotated_p)
    # a sum fast builds let LLVM reassociate: the two kernels' loops vectorize differently
    np.testing.assert_allclose(norms_t, norms_p, rtol=1e-6, atol=0)
