"""A wrong kernel is caught: by the runtime's default check of its trial call (the job falls
back to XLA and says why), by ``replay --verify`` and by the fuzzer. The defect is planted in
the code generator (tanh lowered as sine), so every build of the kernel is wrong alike."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusionstitching
from fusionstitching.capture import jax_hlo
from fusionstitching.codegen.host import HostLowering
from fusionstitching.codegen.llvm_lowering import ThreadLowering
from fusionstitching.fuzz.differential import Verdict, run_program
from fusionstitching.fuzz.programs import Input, Program
from fusionstitching.hlo.parser import parse_module
from fusionstitching.pipeline import Options, stitch_module


@pytest.fixture
def tanh_as_sine(monkeypatch):
    compute = ThreadLowering.compute

    def wrong(self, op, args, arg_types, dtype, attr):
        return compute(self, "sine" if op == "tanh" else op, args, arg_types, dtype, attr)

    monkeypatch.setattr(ThreadLowering, "compute", wrong)


def scaled_tanh(x):  # three kernels on XLA:CPU and XLA:GPU, two stitched
    y = jnp.tanh(x * 1.37)
    return y * jnp.sum(y, axis=0, keepdims=True), jnp.max(y, axis=1)


def test_the_default_check_falls_back_from_a_wrong_kernel(tanh_as_sine, caplog):
    x = np.random.default_rng(0).standard_normal((32, 128)).astype(np.float32)
    fn = fusionstitching.jit(scaled_tanh, cache_dir=None)  # the defaults
    with caplog.at_level("WARNING", logger="fusionstitching"):
        got = [jax.tree_util.tree_map(np.asarray, fn(x)) for _ in range(3)]
    want = jax.jit(scaled_tanh)(x)
    for out in got:  # every call answered by XLA: the first before the build, then the check
        for a, b in zip(out, want):
            np.testing.assert_array_equal(a, np.asarray(b))
    (report,) = fn.reports()
    assert report.runtime["state"] == "fallback" and report.runtime["kept"] == "xla"
    assert report.runtime["why"].startswith("verify: outputs differ from XLA's")
    assert any("verify" in r.message for r in caplog.records)


def test_replay_verify_names_the_wrong_kernel(tanh_as_sine):
    x = np.zeros((32, 128), np.float32)
    module = parse_module(jax_hlo(scaled_tanh, x, target="h100"))
    report = stitch_module(module, Options(verify=True, ptxas=False, workers=0)).report
    assert report.verify.ran and not report.verify.ok
    notes = [f.reason for f in report.fallbacks if f.stage == "verify"]
    assert any("fusionstitching_" in n and "differs" in n for n in notes), notes


def test_replay_verify_checks_the_cpu_schedule_too(monkeypatch):
    """A defect only in the CPU schedule's build (tanh as sine where the runtime's CPU
    kernels compute it): the emulated GPU schedule agrees, the CPU one does not, and verify
    with the CPU schedule says so. The kernel cache keys on the IR, not the lowering: none."""
    math_call = HostLowering.math_call

    def wrong(self, op, args):
        return math_call(self, "sine" if self.fast and op == "tanh" else op, args)

    monkeypatch.setattr(HostLowering, "math_call", wrong)
    x = np.zeros((32, 128), np.float32)
    module = parse_module(jax_hlo(scaled_tanh, x, target="h100"))
    gpu_only = stitch_module(module, Options(verify=True, ptxas=False, workers=0)).report
    assert gpu_only.verify.ok and gpu_only.verify.schedules == ["GPU (emulated)"]
    both = stitch_module(module, Options(verify=True, ptxas=False, workers=0, host=True)).report
    assert both.verify.ran and not both.verify.ok
    assert both.verify.schedules == ["GPU (emulated)", "CPU"]
    notes = [f.reason for f in both.fallbacks if f.stage == "verify"]
    assert any("CPU schedule" in n for n in notes), notes
    monkeypatch.setattr(HostLowering, "math_call", math_call)
    fixed = stitch_module(module, Options(verify=True, ptxas=False, workers=0, host=True)).report
    assert fixed.verify.ok and fixed.verify.schedules == ["GPU (emulated)", "CPU"]


def test_the_fuzzer_reports_a_wrong_kernel_on_both_routes(tanh_as_sine):
    source = ("def f(x0):\n    v0 = jnp.tanh(x0 * 1.37)\n"
              "    return (v0 * jnp.sum(v0, axis=0, keepdims=True), jnp.max(v0, axis=1))\n")
    program = Program(7, source, (Input("x0", (32, 128), "float"),), False)
    outcome = run_program(program)
    assert [r.verdict for r in outcome.routes] == [Verdict.MISMATCH, Verdict.MISMATCH], \
        outcome.describe()
    assert outcome.failed and "def f(x0)" in outcome.describe()
