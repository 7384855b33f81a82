"""A fast host kernel is checked against its own IR built without LLVM's loop vectorizer, in
the trial process (runtime/crash_check.py), and the unvectorized build runs where the two
differ: LLVM 22's vectorizer loaded a table read at ``i % 8`` as 16 consecutive floats in
keras_hub Mistral's rotary embedding (the fusion below, from XLA:CPU's optimized module of
its training step), and the stitched step computed garbage in a quarter of an output. The
host lowering now computes offsets in i64, from which LLVM vectorizes that kernel right."""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fusionstitching.codegen import compile_host, generate  # noqa: E402
from fusionstitching.codegen.generate import add_host_kernel  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402
from fusionstitching.hlo.xla_runner import run_hlo_with_xla  # noqa: E402
from fusionstitching.runtime import cache as kernel_cache  # noqa: E402
from fusionstitching.runtime import kernel_objects  # noqa: E402
from fusionstitching.runtime import crash_check  # noqa: E402
from fusionstitching.runtime.crash_check import Outcome, differences  # noqa: E402
from fusionstitching.hlo.inputs import seeded_inputs  # noqa: E402

# One XLA:CPU fusion of keras_hub Mistral's training step (random weights, generated here):
# the rotary embedding's cos half, x * cos(angles) + the sin half computed before.
ROTARY = """HloModule rotary
%rotate (p0: f32[2,16,4,8], p1: f32[2,4,16,8], p2: f32[1,16,2,4]) -> f32[32,32] {
  %p1 = f32[2,4,16,8]{3,2,1,0} parameter(1)
  %bitcast.260 = f32[2,4,16,1,8]{4,2,1,0,3} bitcast(%p1)
  %copy.149 = f32[2,4,16,1,8]{4,3,2,1,0} copy(%bitcast.260)
  %transpose.195 = f32[2,16,4,1,8]{4,3,1,2,0} transpose(%copy.149), dimensions={0,2,1,3,4}
  %copy.148 = f32[2,16,4,1,8]{4,3,2,1,0} copy(%transpose.195)
  %bitcast.259 = f32[2,16,4,8]{3,2,1,0} bitcast(%copy.148)
  %p2 = f32[1,16,2,4]{3,2,1,0} parameter(2)
  %cos.12 = f32[1,16,2,4]{3,2,1,0} cosine(%p2)
  %bitcast.261 = f32[16,8]{1,0} bitcast(%cos.12)
  %mul.165 = f32[2,16,4,8]{3,2,1,0} broadcast(%bitcast.261), dimensions={1,3}
  %mul.164 = f32[2,16,4,8]{3,2,1,0} multiply(%bitcast.259, %mul.165)
  %p0 = f32[2,16,4,8]{3,2,1,0} parameter(0)
  %add_any.52 = f32[2,16,4,8]{3,2,1,0} add(%mul.164, %p0)
  ROOT %bitcast.258 = f32[32,32]{1,0} bitcast(%add_any.52)
}

ENTRY %main (sin_half: f32[2,16,4,8], x: f32[2,4,16,8], angles: f32[1,16,2,4]) -> f32[32,32] {
  %sin_half = f32[2,16,4,8]{3,2,1,0} parameter(0)
  %x = f32[2,4,16,8]{3,2,1,0} parameter(1)
  %angles = f32[1,16,2,4]{3,2,1,0} parameter(2)
  ROOT %rotated = f32[32,32]{1,0} fusion(%sin_half, %x, %angles), kind=kLoop, calls=%rotate
}
"""


def rotary_spec():
    module = parse_module(ROTARY)
    return add_host_kernel(module, generate(module, ["rotated"], "rotary"))


def test_the_vectorized_build_of_the_once_miscompiled_kernel_is_kept_and_equals_xla():
    spec = rotary_spec()
    inputs = seeded_inputs([shape for _, shape in spec.inputs])
    (want,) = run_hlo_with_xla(ROTARY, inputs)
    outcomes = []

    def vectorized_agrees(vectorized, reference):
        outcomes.append(crash_check.run_in_child(vectorized, reference=reference))
        return outcomes[-1][0] is Outcome.RAN

    kept, _ = kernel_objects.compile_host_cached(
        spec, kernel_cache.KernelCache(None), kernel_cache.CacheStats(None),
        check=vectorized_agrees)
    # with i32 offsets: DIFFERS, "output 0: 479 of 1024 elements differ" (llvmlite 0.50)
    assert outcomes == [(Outcome.RAN, "")]
    (got,) = kept(*inputs)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_vectorized_build_the_check_refuses_is_replaced_by_the_unvectorized_one(tmp_path):
    spec = rotary_spec()
    inputs = seeded_inputs([shape for _, shape in spec.inputs])
    (want,) = run_hlo_with_xla(ROTARY, inputs)
    cache = kernel_cache.KernelCache(str(tmp_path))
    stats = kernel_cache.CacheStats(str(tmp_path))
    kept, key = kernel_objects.compile_host_cached(spec, cache, stats,
                                                 check=lambda vectorized, reference: False)
    text = kernel_objects.host_ir(spec)
    _, stored = cache.lookup(key, stats)
    assert stored == kernel_objects._emit_object(text, vectorize=False)
    assert stored != kernel_objects._emit_object(text, vectorize=True)
    (got,) = kept(*inputs)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_reference_computing_something_else_is_told_apart_in_the_trial():
    spec = rotary_spec()
    other = parse_module(ROTARY.replace("cosine(%p2)", "sine(%p2)"))
    other_spec = add_host_kernel(other, generate(other, ["rotated"], "rotary_sine"))
    # the emulated builds (no loop vectorizer)
    outcome, why = crash_check.run_in_child(compile_host(spec),
                                            reference=compile_host(other_spec))
    assert outcome is Outcome.DIFFERS
    assert "output 0:" in why and "elements differ" in why


def test_the_same_kernel_as_its_own_reference_runs():
    kernel = compile_host(rotary_spec())
    assert crash_check.run_in_child(kernel, reference=kernel) == (Outcome.RAN, "")


@pytest.mark.parametrize("case", ["reassociated", "nan_and_inf", "integers"])
def test_differences_accepts_what_reordering_changes(case):
    rng = np.random.default_rng(0)
    w = rng.standard_normal(1000).astype(np.float32)
    if case == "reassociated":  # a few ulps of the largest value
        got = w + np.float32(2e-7) * np.abs(w).max() * rng.standard_normal(1000)
    elif case == "nan_and_inf":
        w[[3, 7]] = np.nan, np.inf
        got = w.copy()
    else:
        w = rng.integers(-5, 5, 1000).astype(np.int32)
        got = w.copy()
    assert differences([got.astype(w.dtype)], [w]) == ""


@pytest.mark.parametrize("case", ["other_elements", "nan_for_a_value", "inf_sign",
                                  "one_integer"])
def test_differences_finds_what_a_miscompile_changes(case):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 16)).astype(np.float32)
    got = w.copy()
    if case == "other_elements":  # a vector loaded from the wrong place
        got[:, 8:] = w[:, :8]
    elif case == "nan_for_a_value":
        got[2, 3] = np.nan
    elif case == "inf_sign":
        w[1, 1], got[1, 1] = np.inf, -np.inf
    else:
        w = rng.integers(-5, 5, (4, 16)).astype(np.int32)
        got = w.copy()
        got[0, 0] += 1
    why = differences([w, got], [w, w])
    assert why.startswith("output 1:")
