"""Each host kernel against XLA:CPU running the same instructions (runtime/cpu_speed.py): the
pattern as a module of its own computes what the kernel computes, and with the default
``keep="fastest"`` a kernel measured slower is left to XLA, a decision the plan remembers."""
from __future__ import annotations

import os
from types import SimpleNamespace

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fusionstitching.capture import jax_hlo  # noqa: E402
from fusionstitching.codegen import compile_host  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402
from fusionstitching.hlo.xla_runner import run_hlo_with_xla  # noqa: E402
from fusionstitching.pipeline import Options, stitch_module  # noqa: E402
from fusionstitching.runtime import cpu_speed, ffi  # noqa: E402
from fusionstitching.stitched_jit import jit  # noqa: E402
from helpers import args, expected, layernorm  # noqa: E402


def softmax_and_stats(x, b):
    """Two outputs of other sizes, a broadcast and reductions: multi-output fusions whose
    elements are the pattern's outputs."""
    h = x + b
    e = jnp.exp(h - jnp.max(h, axis=-1, keepdims=True))
    return e / jnp.sum(e, axis=-1, keepdims=True), jnp.mean(h, axis=0)


def planned(fn, *a):
    module = parse_module(jax_hlo(fn, *a, target="cpu"))
    result = stitch_module(module, Options(target="h100", ptxas=False, host=True))
    assert result.kernels
    return result


def test_the_pattern_alone_and_the_call_module_compute_what_the_kernel_computes():
    """Both sides of the measurement: XLA's pattern module and the module calling the
    registered kernel, against the kernel compiled here."""
    rng = np.random.default_rng(0)
    x, b = rng.standard_normal((64, 128), np.float32), rng.standard_normal(128, np.float32)
    result = planned(softmax_and_stats, x, b)
    for kernel in result.kernels:
        spec = kernel.spec
        inputs = [rng.standard_normal(s.dims).astype(s.numpy_dtype) for _, s in spec.inputs]
        got = compile_host(spec, fast=True)(*inputs)
        for text in (cpu_speed.pattern_module(result.graph.module, spec),
                     cpu_speed.call_module(spec, registered(spec))):
            want = run_hlo_with_xla(text, inputs)
            assert len(got) == len(want) == len(spec.outputs)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, np.asarray(w), rtol=2e-6, atol=1e-6)


def registered(spec) -> str:
    host = compile_host(spec, fast=True)
    return ffi.register_kernel(spec.name, host.address, len(spec.inputs), len(spec.outputs),
                               owner=host)


@pytest.mark.real_timing
def test_compare_times_both_sides():
    x = np.ones((64, 128), np.float32)
    result = planned(softmax_and_stats, x, np.ones(128, np.float32))
    spec = result.kernels[0].spec
    target = registered(spec)
    host_us, xla_us = cpu_speed.compare(result.graph.module, spec, target)
    assert 0 < host_us < 1e6 and 0 < xla_us < 1e6


def test_a_kernel_measured_slower_is_left_to_xla(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_speed, "compare", lambda module, spec, target: (200.0, 100.0))
    fn, a = jit(layernorm, cache_dir=str(tmp_path)), args()
    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(fn(*a)), expected(*a))
    (report,) = fn.reports()
    assert [f.stage for f in report.fallbacks] == ["measured"]
    assert "200.0 us against XLA:CPU's 100.0 us" in report.fallbacks[0].reason
    assert report.fs.patterns == 0  # nothing stitched is left to run

    # The decision is part of the plan: a new process (here a new jit) finds it in the cache.
    monkeypatch.setattr(cpu_speed, "compare", lambda module, spec, target: 1 / 0)
    again = jit(layernorm, cache_dir=str(tmp_path))
    np.testing.assert_array_equal(np.asarray(again(*a)), expected(*a))
    (cached,) = again.reports()
    assert cached.cache["plan"] == "hit"
    assert [f.stage for f in cached.fallbacks] == ["measured"]


# Faster alone, or a little slower: alone both sides pay an executable's fixed cost, so within
# SLOWER_ALONE the trial of the whole step decides.
@pytest.mark.parametrize("times", [(100.0, 200.0), (140.0, 100.0)],
                         ids=["faster-alone", "a-little-slower-alone"])
def test_a_kernel_within_slower_alone_runs(monkeypatch, times):
    monkeypatch.setattr(cpu_speed, "compare", lambda module, spec, target: times)
    fn, a = jit(layernorm, cache_dir=None), args()
    np.testing.assert_allclose(np.asarray(fn(*a)), expected(*a), rtol=1e-5, atol=1e-5)
    (report,) = fn.reports()
    # the stitched executable has the kernel (whether the whole step then ran faster than
    # XLA's is the executor's timing, on this busy machine either way)
    assert report.fallbacks == [] and report.runtime["stitched_plan"]["patterns"] == 1


def test_keep_stitched_is_not_measured(monkeypatch):
    monkeypatch.setattr(cpu_speed, "compare", lambda module, spec, target: 1 / 0)
    fn, a = jit(layernorm, cache_dir=None, keep="stitched"), args()
    np.testing.assert_allclose(np.asarray(fn(*a)), expected(*a), rtol=1e-5, atol=1e-5)
    (report,) = fn.reports()
    assert report.fallbacks == [] and report.runtime["kept"] == "stitched"


def test_a_failed_measurement_leaves_the_kernel_to_xla(monkeypatch):
    def broken(module, spec, target):
        raise RuntimeError("XLA would not compile the pattern")

    monkeypatch.setattr(cpu_speed, "compare", broken)
    fn, a = jit(layernorm, cache_dir=None), args()
    np.testing.assert_array_equal(np.asarray(fn(*a)), expected(*a))
    (report,) = fn.reports()
    assert [f.stage for f in report.fallbacks] == ["measure"]
    assert "would not compile" in report.fallbacks[0].reason


def argmax_rows(x):
    return jnp.argmax(x, axis=-1)


def ties_and_nans():
    """Rows with repeated maxima and NaNs (which index wins is the combiner's business)."""
    x = np.random.default_rng(2).integers(-3, 4, (2, 16, 256)).astype(np.float32)
    x[0, 3, [7, 200]] = np.nan
    return x


@pytest.mark.real_timing
def test_an_xla_kernel_the_plan_leaves_alone_is_replaced_where_ours_is_clearly_faster():
    """An argmax alone is nothing to fuse, but XLA:CPU runs its variadic reduce as scalar code
    (~40 us here) and ours side by side (~1 us): timed alone, ours is kept, with its bits."""
    x = ties_and_nans()
    fn = jit(argmax_rows, cache_dir=None)
    np.testing.assert_array_equal(np.asarray(fn(x)), np.asarray(jnp.argmax(x, axis=-1)))
    (report,) = fn.reports()
    assert report.fallbacks == []
    (kernel,) = report.kernels
    assert "_alone_" in kernel.name and len(kernel.nodes) == 1


def test_an_xla_kernel_left_alone_stays_xlas_unless_clearly_faster(monkeypatch):
    """Timed 1.2x faster alone (conftest's default) is not enough for a swap that saves no
    memory traffic (cpu_speed.FASTER_ALONE); 2x is."""
    x = ties_and_nans()
    fn = jit(argmax_rows, cache_dir=None)
    np.testing.assert_array_equal(np.asarray(fn(x)), np.asarray(jnp.argmax(x, axis=-1)))
    (report,) = fn.reports()
    assert report.kernels == [] and report.fallbacks == []
    (left,) = report.left_to_xla  # the argmax, and why
    assert left.reason == ("timed alone on this CPU, a kernel of ours was not 1.5x faster "
                           "than XLA's") and len(left.nodes) == 1

    monkeypatch.setattr(cpu_speed, "compare", lambda module, spec, target: (10.0, 20.0))
    faster = jit(argmax_rows, cache_dir=None)
    np.testing.assert_array_equal(np.asarray(faster(x)), np.asarray(jnp.argmax(x, axis=-1)))
    (report,) = faster.reports()
    assert [len(k.nodes) for k in report.kernels] == [1]


def test_keep_stitched_replaces_nothing_it_has_not_measured():
    fn = jit(argmax_rows, cache_dir=None, keep="stitched")
    x = ties_and_nans()
    np.testing.assert_array_equal(np.asarray(fn(x)), np.asarray(jnp.argmax(x, axis=-1)))
    (report,) = fn.reports()
    assert report.kernels == []


def test_the_pattern_alone_leaves_the_modules_order_behind():
    """XLA orders the copy of a donated parameter after its readers (control
    predecessors); the pattern's module has no such readers, and no such order."""
    text = """HloModule ordered, input_output_alias={ {0}: (0, {}, may-alias) }
ENTRY %main (a: f32[8], b: f32[8]) -> (f32[8], f32[8]) {
  %a = f32[8]{0} parameter(0)
  %b = f32[8]{0} parameter(1)
  %copy.1 = f32[8]{0} copy(%a)
  %read = f32[8]{0} multiply(%copy.1, %b)
  %new = f32[8]{0} add(%a, %b), control-predecessors={%read}
  ROOT %out = (f32[8]{0}, f32[8]{0}) tuple(%new, %read)
}
"""
    module = parse_module(text)
    f8 = module.entry.by_name()["a"].shape
    spec = SimpleNamespace(nodes=["new"], inputs=[("a", f8), ("b", f8)], outputs=[("new", f8)])
    pattern = cpu_speed.pattern_module(module, spec)
    assert "control-predecessors" not in pattern
    a, b = np.arange(8, dtype=np.float32), np.ones(8, np.float32)
    (got,) = run_hlo_with_xla(pattern, [a, b])
    np.testing.assert_array_equal(np.asarray(got), a + b)
