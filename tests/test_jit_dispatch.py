"""Calls after the decision run in jaxlib's own dispatch (stitched_jit.jax_dispatch): the
decided executable, chosen per signature as jax.jit chooses, without the runtime's Python."""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fusionstitching import stitched_jit  # noqa: E402
from fusionstitching.stitched_jit import jit  # noqa: E402
from helpers import args, expected, layernorm  # noqa: E402


def test_decided_calls_run_in_jax_dispatch():
    fn, a = jit(layernorm, cache_dir=None, keep="stitched", verify=False), args()
    for _ in range(5):
        np.testing.assert_allclose(np.asarray(fn(*a)), expected(*a), rtol=1e-5, atol=1e-5)
    (report,) = fn.reports()
    # keep='stitched' without verify: decided when built, before call 1; the runtime answers
    # calls 1 and 2 (jax makes the executable's own C++ call on its first), then gives jax's
    # dispatch the entry that runs calls 3 to 5.
    assert report.runtime["kept"] == "stitched" and report.runtime["swapped_at_call"] == 1
    assert report.runtime["calls"] == 2, report.runtime
    assert fn._dispatch._cache_size() == 1


def test_static_values_and_weak_types_choose_executables_as_jax_jit_does():
    def affine(x, y, *, n):
        return x * y + n

    ours = jit(affine, static_argnames="n", cache_dir=None)
    theirs = jax.jit(affine, static_argnames="n")
    x16, x32 = jnp.ones(8, jnp.bfloat16), jnp.arange(8, dtype=jnp.float32)
    calls = [((x32, 2.0), 1), ((x32, jnp.float32(2.0)), 1), ((x32, 2.0), 3),
             ((x16, 2.0), 1),  # a weak-typed float keeps bfloat16 ...
             ((x16, jnp.float32(2.0)), 1)]  # ... a float32 array promotes to float32
    for _ in range(2):  # the second round runs from jax's dispatch
        for (x, y), n in calls:
            got, want = ours(x, y, n=n), theirs(x, y, n=n)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert len(ours.reports()) == 5  # one executable per signature jax.jit tells apart


class FailingDispatch:
    """Stands in for jaxlib's dispatch: every call fails as a failing executable would."""

    def __init__(self):
        self.cleared = 0

    def __call__(self, *args, **kwargs):
        raise jax.errors.JaxRuntimeError("INTERNAL: injected fault in a decided executable")

    def _clear_cache(self):
        self.cleared += 1


def test_a_failing_decided_stitched_executable_falls_back_to_xla():
    fn, a = jit(layernorm, cache_dir=None, keep="stitched", verify=False), args()
    fn(*a)
    fn._dispatch = failing = FailingDispatch()
    np.testing.assert_array_equal(np.asarray(fn(*a)), np.asarray(jax.jit(layernorm)(*a)))
    (report,) = fn.reports()
    assert [f.stage for f in report.fallbacks] == ["execute"]
    assert "injected fault" in report.fallbacks[0].reason
    assert report.runtime["kept"] == "xla" and failing.cleared == 1


def test_an_error_of_xlas_own_executable_is_the_users():
    fn, a = jit(layernorm, cache_dir=None), args()
    fn(*a)
    fn.reports()[0]  # decided (either executable)
    compiled = next(iter(fn._compiled.values()))
    compiled.executor.fail("build", [], "left to XLA for this test")
    fn._dispatch = FailingDispatch()
    with pytest.raises(jax.errors.JaxRuntimeError, match="injected fault"):
        fn(*a)


def test_clear_cache_empties_the_dispatch():
    fn, a = jit(layernorm, cache_dir=None, keep="stitched", verify=False), args()
    fn(*a), fn(*a)
    assert fn._dispatch._cache_size() == 1
    fn.clear_cache()
    assert fn._dispatch._cache_size() == 0 and fn.reports() == []
    np.testing.assert_allclose(np.asarray(fn(*a)), expected(*a), rtol=1e-5, atol=1e-5)


def test_without_jaxlibs_dispatch_every_call_takes_the_runtime(monkeypatch):
    monkeypatch.setattr(stitched_jit, "jaxlib_cpp", None)
    fn, a = jit(layernorm, cache_dir=None, keep="stitched", verify=False), args()
    assert fn._dispatch == fn._python_dispatch
    for _ in range(4):
        np.testing.assert_allclose(np.asarray(fn(*a)), expected(*a), rtol=1e-5, atol=1e-5)
    assert fn.reports()[0].runtime["calls"] == 4
    with jax.disable_jit():
        np.testing.assert_allclose(np.asarray(fn(*a)), expected(*a), rtol=1e-5, atol=1e-5)
