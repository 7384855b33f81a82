"""A fast host kernel in parts (codegen/host.py ``kernel_parts``) and its FFI handler running
them on XLA's intra-op thread pool (runtime/ffi.py ``parallel_ir``): the parts together write
exactly what the whole kernel writes, and stitched executables give XLA's numbers."""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fusionstitching.capture import jax_hlo  # noqa: E402
from fusionstitching.codegen import compile_host  # noqa: E402
from fusionstitching.codegen import host as host_codegen  # noqa: E402
from fusionstitching.codegen.host import split_extent, split_loop  # noqa: E402
from fusionstitching.codegen.kernel_ir import Loop  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402
from fusionstitching.pipeline import Options, stitch_module  # noqa: E402
from fusionstitching.stitched_jit import jit  # noqa: E402
from helpers import layernorm, run_in_parts  # noqa: E402


def softmax_and_stats(x, b):
    """Row reductions and an output of another size (written by the first block)."""
    h = x + b
    e = jnp.exp(h - jnp.max(h, axis=-1, keepdims=True))
    return e / jnp.sum(e, axis=-1, keepdims=True), jnp.mean(h, axis=0)


def adam(p, g, m, v):
    """Three outputs XLA:CPU computes in separate loop fusions: one loop kernel stitched (one
    block, its loop over rows shared out)."""
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    return p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), m, v


def scaled_layernorm(x, g, b):
    return layernorm(x * 1.5, g, b) + x


PATTERNS = [(softmax_and_stats, (37, 96)), (adam, (41, 64)), (scaled_layernorm, (29, 160))]


def arguments(fn, rows, cols, seed=0) -> list[np.ndarray]:
    """A rows x cols matrix, then vectors of cols (adam: four matrices, v positive)."""
    rng = np.random.default_rng(seed)
    count = fn.__code__.co_argcount
    if fn is adam:
        return [rng.standard_normal((rows, cols), np.float32) for _ in range(count - 1)] + [
            np.abs(rng.standard_normal((rows, cols), np.float32))]
    return [rng.standard_normal((rows, cols), np.float32)] + [
        rng.standard_normal(cols, np.float32) for _ in range(count - 1)]


def specs(fn, rows, cols):
    a = arguments(fn, rows, cols)
    module = parse_module(jax_hlo(fn, *a, target="cpu"))
    result = stitch_module(module, Options(target="h100", ptxas=False, host=True))
    assert result.kernels
    return [k.spec for k in result.kernels]


@pytest.mark.parametrize("fn, shape", PATTERNS, ids=[fn.__name__ for fn, _ in PATTERNS])
def test_the_parts_together_write_what_the_whole_kernel_writes(fn, shape):
    rng = np.random.default_rng(1)
    for spec in specs(fn, *shape):
        host = compile_host(spec, fast=True)
        assert host.parts_address and host.split_extent == split_extent(spec.host_kernel)
        inputs = [np.abs(rng.standard_normal(s.dims)).astype(s.numpy_dtype)
                  for _, s in spec.inputs]  # positive: adam's v
        whole = run_in_parts(host, spec, inputs, None)
        assert not any(np.isnan(o).any() for o in whole)
        # more parts than iterations too: the extra parts are empty
        for parts in (1, 2, 3, 7, max(host.split_extent, 1) + 2):
            for got, want in zip(run_in_parts(host, spec, inputs, parts), whole):
                np.testing.assert_array_equal(got, want)


def test_what_a_kernel_shares_out():
    rows, columns = specs(softmax_and_stats, 37, 96)
    assert split_loop(rows.host_kernel) == "blocks"  # a block per row
    assert split_extent(rows.host_kernel) == rows.host_kernel.grid[0] == 37
    # the column means: the columns schedule, its 96 results in one block of one part
    assert columns.host_kernel.grid == (1,) and split_loop(columns.host_kernel) is None
    assert split_extent(columns.host_kernel) == 0
    (update,) = specs(adam, 41, 64)
    loop = split_loop(update.host_kernel)
    assert update.host_kernel.grid == (1,) and isinstance(loop, Loop)
    assert split_extent(update.host_kernel) == loop.stop == 41  # its rows


def test_parts_follow_the_kernels_bytes():
    assert host_codegen.max_parts(0, 10 ** 9) == 1  # nothing to share out
    assert host_codegen.max_parts(512, host_codegen.PART_BYTES - 1) == 1  # too small to be worth a thread
    assert host_codegen.max_parts(512, 8 * host_codegen.PART_BYTES) == 8
    assert host_codegen.max_parts(3, 8 * host_codegen.PART_BYTES) == 3


@pytest.mark.parametrize("fn, shape", PATTERNS, ids=[fn.__name__ for fn, _ in PATTERNS])
def test_stitched_kernels_in_parts_on_xlas_thread_pool_give_xlas_numbers(monkeypatch, fn,
                                                                         shape):
    monkeypatch.setattr(host_codegen, "PART_BYTES", 1)  # every kernel as many parts as it can have
    a = arguments(fn, *shape, seed=2)
    stitched = jit(fn, cache_dir=None, keep="stitched")
    for _ in range(3):
        got, want = stitched(*a), jax.jit(fn)(*a)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-6, atol=2e-6)
    (report,) = stitched.reports()
    assert report.fs.patterns >= 1 and not report.fallbacks, report.fallbacks
