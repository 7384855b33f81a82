"""Stitched sums are as accurate as XLA's own: within 4x XLA's distance from the f64 result
(and one ulp of the result: the rounding any result has), for 2^10 to 2^24 elements, f32,
bf16 and f16, over rows, columns and whole tensors, on the CPU's schedules (the runtime) and
the GPU's (H100 replay, its kernels run by the host backend). A thread walking a long row in
f32 was up to 4e-4 relative off where XLA's tree of partial sums was exact."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fusionstitching
from fusionstitching.capture import jax_hlo
from fusionstitching.hlo.parser import parse_module
from fusionstitching.pipeline import Options, stitch_module
from fusionstitching.verification import _leaves, execute_stitched

SHAPES = {"whole": lambda n: ((n,), None), "rows": lambda n: ((4, n // 4), 1),
          "columns": lambda n: ((n // 256, 256), 0)}


def summed(axis, values: str, mean: bool):
    """Two kernels XLA keeps apart (the sum, and an op of its result), to be stitched;
    ``values``: "constant" (every term 0.50025, where sums in one order drift) or "abs"."""
    def f(x):
        y = x * 0.0 + 0.50025 if values == "constant" else jnp.abs(x) + 0.5
        s = jnp.mean(y, axis=axis) if mean else jnp.sum(y, axis=axis)
        return s, jnp.tanh(s)
    return f


def exact(x, axis, values: str, mean: bool) -> np.ndarray:
    x = x.astype(np.float64)
    y = x * 0 + float(np.asarray(0.50025, x.dtype if x.dtype == np.float32 else np.float32)) \
        if values == "constant" else np.abs(x) + 0.5
    return y.mean(axis=axis) if mean else y.sum(axis=axis)


def distances(route: str, dtype, logn: int, shape: str, values: str):
    n = 1 << logn
    dims, axis = SHAPES[shape](n)
    mean = dtype != np.float32  # narrow types: a mean stays in their range
    x = np.random.default_rng(logn).standard_normal(dims).astype(dtype)
    fn = summed(axis, values, mean)
    if values == "constant" and dtype != np.float32:
        pytest.skip("0.50025 is not a narrow float: the exact terms differ")
    want = exact(x, axis, values, mean)
    xla = np.asarray(jax.jit(fn)(x)[0]).astype(np.float64)
    if route == "cpu":
        stitched = fusionstitching.jit(fn, keep="stitched", verify=False, cache_dir=None)
        ours = np.asarray(stitched(x)[0]).astype(np.float64)
        kept = stitched.reports()[0].runtime["kept"]
    else:
        module = parse_module(jax_hlo(fn, x, target="h100"))
        result = stitch_module(module, Options(target="h100", host=True, ptxas=False,
                                               workers=0))
        ours = _leaves(execute_stitched(module, result.kernels, [x]))[0].astype(np.float64)
        kept = "stitched" if result.kernels else "xla"
    ulp = float(np.spacing(np.asarray(np.abs(want).max(), dtype)).astype(np.float64))
    return np.abs(ours - want).max(), np.abs(xla - want).max(), ulp, kept


CASES = [(np.float32, logn, shape, values) for logn in (10, 17, 24) for shape in SHAPES
         for values in ("constant", "abs")] + \
        [(dtype, logn, shape, "abs") for dtype in (ml_dtypes.bfloat16, np.float16)
         for logn in (10, 17, 20) for shape in SHAPES]


@pytest.mark.parametrize("route", ["cpu", "h100"])
@pytest.mark.parametrize("dtype, logn, shape, values", CASES,
                         ids=[f"{np.dtype(d).name}-2^{n}-{s}-{v}" for d, n, s, v in CASES])
def test_stitched_sum_is_as_accurate_as_xlas(route, dtype, logn, shape, values):
    ours, xla, ulp, kept = distances(route, dtype, logn, shape, values)
    assert ours <= 4 * xla + ulp, (ours, xla, ulp, kept)
