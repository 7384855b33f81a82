"""Fault injection in every runtime stage: each run completes with XLA's results and a
``fallbacks`` entry naming the stage; plus static/donated arguments and the executor's
choice between XLA's and the stitched executable."""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fusionstitching.stitched_jit import jit  # noqa: E402
from fusionstitching.runtime import build, executor, ffi, kernel_objects, xla  # noqa: E402
from helpers import REPO, args, expected, layernorm  # noqa: E402


def run_twice(fn, a):
    """Two calls: the first tries the candidate (runs XLA's and it); the second runs the kept
    one, or, when the candidate was timed faster, one of the two real calls confirming it."""
    first, second = np.asarray(fn(*a)), np.asarray(fn(*a))
    return first, second


def stages(report):
    return [f.stage for f in report.fallbacks]


def test_kernel_that_fails_to_build(monkeypatch, caplog):
    def broken(text):
        raise RuntimeError("LLVM ran out of luck")

    monkeypatch.setattr(kernel_objects, "_emit_object", broken)
    fn, a = jit(layernorm, cache_dir=None, keep="stitched"), args()
    with caplog.at_level("WARNING", logger="fusionstitching"):
        results = run_twice(fn, a)
    for got in results:
        np.testing.assert_array_equal(got, expected(*a))
    (report,) = fn.reports()
    assert stages(report) == ["host"] and "LLVM ran out of luck" in report.fallbacks[0].reason
    assert report.runtime["kept"] == "xla" and report.fs.patterns == 0
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1


def test_ptxas_error(monkeypatch):
    from fusionstitching import codegen

    def broken(spec, arch="sm_90"):
        raise RuntimeError("ptxas fatal: Unresolved extern function '__nv_nothing'")

    monkeypatch.setattr(codegen, "compile_nvptx", broken)
    fn, a = jit(layernorm, cache_dir=None, ptxas=True, keep="stitched"), args()
    for got in run_twice(fn, a):
        np.testing.assert_array_equal(got, expected(*a))
    (report,) = fn.reports()
    assert stages(report) == ["ptxas"] and "Unresolved extern" in report.fallbacks[0].reason
    assert report.runtime["kept"] == "xla"
    assert 'custom_call_target="fusionstitching' not in fn.lower(*a).compile().as_text()


def test_ffi_registration_failure(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("XLA refused the target")

    monkeypatch.setattr(ffi, "register_kernel", broken)
    fn, a = jit(layernorm, cache_dir=None), args()
    for got in run_twice(fn, a):
        np.testing.assert_array_equal(got, expected(*a))
    (report,) = fn.reports()
    assert stages(report) == ["ffi"] and "refused" in report.fallbacks[0].reason


def test_wrong_result_kernel_is_caught_by_verify(monkeypatch, caplog):
    real_ir = kernel_objects.host_ir

    def wrong_ir(spec):  # the means divide by 64 instead of 128 (the row length)
        return real_ir(spec).replace("0x3f80000000000000", "0x3f90000000000000")

    monkeypatch.setattr(kernel_objects, "host_ir", wrong_ir)
    fn, a = jit(layernorm, cache_dir=None, verify=True, keep="stitched"), args()
    with caplog.at_level("WARNING", logger="fusionstitching"):
        for got in run_twice(fn, a):
            np.testing.assert_array_equal(got, expected(*a))
    (report,) = fn.reports()
    assert stages(report) == ["verify"] and "differ" in report.fallbacks[0].reason
    assert report.verify.ran and not report.verify.ok and report.verify.max_abs_err > 1e-3
    assert report.runtime["state"] == "fallback" and report.runtime["kept"] == "xla"
    assert report.fs.mem_kernels == report.xla.mem_kernels  # the stitched kernels never run
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1


def test_verify_is_not_blind_when_the_trial_calls_outputs_are_nan(monkeypatch, caplog):
    """One NaN in every row of the trial call's x makes every output NaN, XLA's and a wrong
    kernel's alike (NaN == NaN): the check goes on to inputs that keep the outputs finite."""
    real_ir = kernel_objects.host_ir
    monkeypatch.setattr(kernel_objects, "host_ir", lambda spec: real_ir(spec).replace(
        "0x3f80000000000000", "0x3f90000000000000"))  # the means divide by 64, not 128
    fn, a = jit(layernorm, cache_dir=None, verify=True, keep="stitched"), args()
    poisoned = [a[0].copy(), *a[1:]]
    poisoned[0][:, 5] = np.nan
    with caplog.at_level("WARNING", logger="fusionstitching"):
        assert np.isnan(np.asarray(fn(*poisoned))).all()
        np.testing.assert_array_equal(np.asarray(fn(*a)), expected(*a))
    (report,) = fn.reports()
    assert stages(report) == ["verify"] and "NaN/inf as 0" in report.fallbacks[0].reason
    assert report.runtime["kept"] == "xla"
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1


def test_verify_on_nan_outputs_passes_a_correct_kernel_on_finite_inputs():
    fn, a = jit(layernorm, cache_dir=None, verify=True, keep="stitched"), args()
    poisoned = [a[0].copy(), *a[1:]]
    poisoned[0][:, 5] = np.nan
    fn(*poisoned)
    np.testing.assert_allclose(np.asarray(fn(*a)), expected(*a), rtol=1e-5, atol=1e-5)
    (report,) = fn.reports()
    assert report.verify.ok and not report.fallbacks and report.runtime["kept"] == "stitched"
    assert any("NaN/inf as 0" in what for what in report.verify.against), report.verify


def test_verify_passes_for_a_correct_kernel():
    fn, a = jit(layernorm, cache_dir=None, verify=True, keep="stitched"), args()
    first, second = run_twice(fn, a)
    np.testing.assert_array_equal(first, expected(*a))  # the deciding call answers with XLA's
    np.testing.assert_allclose(second, expected(*a), rtol=1e-5, atol=1e-5)
    (report,) = fn.reports()
    assert report.verify.ran and report.verify.ok and not report.fallbacks
    assert report.runtime["kept"] == "stitched" and report.runtime["swapped_at_call"] == 2
    assert report.fs.mem_kernels < report.xla.mem_kernels


def test_runtime_error_in_the_stitched_executable(monkeypatch):
    real_swap = xla.swap_executable

    def failing_swap(lowered, compiled, executable):
        stitched = real_swap(lowered, compiled, executable)

        def run(*args, **kwargs):
            raise jax.errors.JaxRuntimeError("INTERNAL: injected kernel fault")

        run.as_text = stitched.as_text
        return run

    monkeypatch.setattr(xla, "swap_executable", failing_swap)
    fn, a = jit(layernorm, cache_dir=None, keep="stitched"), args()
    for got in run_twice(fn, a):
        np.testing.assert_array_equal(got, expected(*a))
    (report,) = fn.reports()
    assert stages(report) == ["execute"] and "injected kernel fault" in report.fallbacks[0].reason


def test_whole_module_failure_names_the_stage(monkeypatch):
    from fusionstitching.runtime import rewrite

    def broken(*args, **kwargs):
        raise rewrite.RewriteError("tuple-shaped copy x: StableHLO has no copy")

    monkeypatch.setattr(rewrite, "rewrite_module", broken)
    # keep='stitched': no kernel is measured (one measured slower than XLA's on a busy machine
    # would never reach the rewrite)
    fn, a = jit(layernorm, cache_dir=None, keep="stitched"), args()
    for got in run_twice(fn, a):
        np.testing.assert_array_equal(got, expected(*a))
    (report,) = fn.reports()
    assert stages(report) == ["rewrite"] and "StableHLO has no copy" in report.fallbacks[0].reason
    assert report.fallbacks[0].nodes  # the patterns that were left to XLA
    assert report.fs.patterns == 0 and report.fs.mem_kernels == report.xla.mem_kernels > 0
    assert report.runtime["kept"] == "xla" and "rewrite" in report.runtime["why"]


def test_keep_fastest_times_both_and_reports_it():
    fn, a = jit(layernorm, cache_dir=None), args()
    run_twice(fn, a)
    # the trial's winner, if the stitched one, is confirmed on real calls, in runs of one
    # executable each
    for _ in range(2 * executor.CONFIRM_ROUNDS * executor.RUN_CALLS):
        np.testing.assert_allclose(np.asarray(fn(*a)), expected(*a), rtol=1e-5, atol=1e-5)
    (report,) = fn.reports()
    runtime = report.runtime
    assert runtime["state"] == "settled" and runtime["kept"] in ("xla", "stitched")
    assert runtime["xla_us"] > 0 and runtime["stitched_us"] > 0
    faster = "stitched" if runtime["stitched_us"] < runtime["xla_us"] else "xla"
    assert runtime["kept"] == faster
    assert (report.fs.mem_kernels < report.xla.mem_kernels) == (faster == "stitched")
    assert report.to_json()["runtime"]["kept"] == faster


def test_static_and_donated_arguments():
    def scaled(x, g, b, scale, *, shift):
        return layernorm(x, g, b) * scale + shift

    fn = jit(scaled, static_argnums=3, static_argnames="shift", donate_argnums=0,
             cache_dir=None, keep="stitched", verify=True)
    a = args()
    for scale, shift in ((2.0, 1.0), (3.0, 1.0), (2.0, 1.0)):
        want = np.asarray(jax.jit(scaled, static_argnums=3, static_argnames="shift")(
            *a, scale, shift=shift))
        donated, *rest = [jnp.asarray(x) for x in a]
        np.testing.assert_allclose(np.asarray(fn(donated, *rest, scale, shift=shift)), want,
                                   rtol=1e-5, atol=1e-5)
        assert donated.is_deleted() and not any(r.is_deleted() for r in rest)  # as jax.jit
    assert len(fn.reports()) == 2  # one per static value, the third call reused the first
    assert all(r.runtime["kept"] == "stitched" and r.verify.ok for r in fn.reports())
    text = fn.lower(*a, 2.0, shift=1.0).compile().as_text()
    assert 'custom_call_target="fusionstitching' in text
    assert "input_output_alias={ {}: (0, {}, may-alias) }" in text.splitlines()[0]


def test_donated_buffers_are_reused_by_the_stitched_executable():
    def update(x, g, b):
        return x - 0.1 * layernorm(x, g, b)

    fn = jit(update, donate_argnums=0, cache_dir=None, keep="stitched")
    a = args()
    x = jnp.asarray(a[0])
    for _ in range(2):
        pointer = x.unsafe_buffer_pointer()
        want = np.array(jax.jit(update)(x, *a[1:]))
        x = fn(x, *a[1:])
        assert x.unsafe_buffer_pointer() == pointer  # the output lives in the donated buffer
        # A copy, not np.asarray's view: on the CPU a live view (one kept until the garbage
        # collector's next pass, say) is an external reference, and PJRT then copies a donated
        # buffer instead of reusing it, for jax.jit as for us; this failed once in CI.
        np.testing.assert_allclose(np.array(x), want, rtol=1e-5, atol=1e-5)
    assert fn.reports()[0].runtime["kept"] == "stitched"


class Recorded:
    """An executable that notes each run (its label and whether the caller's thread ran it)."""

    def __init__(self, compiled, label: str, runs: list):
        self.compiled, self.label, self.runs = compiled, label, runs

    def __call__(self, *args, **kwargs):
        import threading

        self.runs.append((self.label, threading.current_thread() is threading.main_thread()))
        return self.compiled(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.compiled, name)


def recorded_async(monkeypatch, fn, a, runs):
    """Compile ``fn`` for ``a`` with every run of either executable recorded; returns the
    Compiled once the background build is done."""
    real_swap = xla.swap_executable
    monkeypatch.setattr(xla, "swap_executable", lambda *args: Recorded(real_swap(*args),
                                                                       "stitched", runs))
    compiled = fn.lower(*a).compile()
    compiled.executor.xla = compiled.executor.active = Recorded(compiled.xla_compiled, "xla",
                                                                runs)
    assert compiled.wait_built(120)
    return compiled


def on_call(runs: list) -> list:
    """Runs made by the calling thread since the last look."""
    made = [label for label, caller in runs if caller]
    runs.clear()
    return made


def timing_in_runs(monkeypatch, run_calls: int, runs: list):
    """A Compiled whose trial timed the stitched executable faster, confirming it in runs of
    ``run_calls`` calls; its first call (XLA's, on the caller's thread) is made."""
    monkeypatch.setattr(executor, "best_times", lambda xla_run, stitched, inputs, **_: (2e-3, 1e-3))
    compiled = recorded_async(monkeypatch, jit(layernorm, cache_dir=None, async_compile=True),
                              args(), runs)
    compiled.executor.run_calls = run_calls
    compiled(*args())
    assert on_call(runs) == ["xla"] and compiled.wait_built(60)
    assert compiled.executor.info.state == "timing"
    return compiled


def test_async_trial_runs_off_the_call_path(monkeypatch):
    monkeypatch.setattr(executor, "best_times", lambda xla_run, stitched, inputs, **_: (1e-3, 2e-3))
    runs = []
    compiled = recorded_async(monkeypatch, jit(layernorm, cache_dir=None, async_compile=True,
                                               verify=True), args(), runs)
    assert compiled.executor.info.state == "pending"
    results = [np.asarray(compiled(*args())) for _ in range(4)]
    assert on_call(runs) == ["xla"] * 4  # the trial's runs were all on its own thread
    assert compiled.wait_built(60)
    info = compiled.executor.info
    assert info.state == "settled" and info.kept == "xla" and info.trial_call == 1
    assert "off the call path" in info.why and info.swapped_at_call is None
    assert compiled.report().verify.ok
    for got in results:
        np.testing.assert_array_equal(got, expected(*args()))


def test_async_candidate_faster_off_the_path_is_confirmed_one_executable_per_call(monkeypatch):
    monkeypatch.setattr(executor, "CLEAR_ROUNDS", executor.CONFIRM_ROUNDS + 1)  # all rounds
    runs = []
    compiled = timing_in_runs(monkeypatch, 1, runs)
    per_call = []
    for _ in range(2 * executor.CONFIRM_ROUNDS):
        got = np.asarray(compiled(*args()))
        np.testing.assert_allclose(got, expected(*args()), rtol=1e-5, atol=1e-5)
        per_call.append(on_call(runs))
    assert per_call == [["stitched"], ["xla"]] * executor.CONFIRM_ROUNDS
    info = compiled.executor.info
    assert info.state == "settled" and f"calls 2-{1 + 2 * executor.CONFIRM_ROUNDS}" in info.why
    assert info.kept == ("stitched" if executor.stitched_wins(info.stitched_us, info.xla_us)
                         else "xla")
    compiled(*args())
    assert on_call(runs) == [info.kept]


def test_confirmation_in_runs_of_calls_waits_only_for_each_runs_first_and_last(monkeypatch):
    monkeypatch.setattr(executor, "CLEAR_ROUNDS", executor.CONFIRM_ROUNDS + 1)  # all rounds
    # runs of back-to-back calls of one executable (RUN_CALLS), timed from the first's outputs
    runs = []
    compiled = timing_in_runs(monkeypatch, 3, runs)
    waited = []
    real_wait = jax.block_until_ready
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waited.append(1) or real_wait(x))
    per_call, waits = [], []
    for _ in range(2 * 3 * executor.CONFIRM_ROUNDS):
        waited.clear()
        got = np.asarray(compiled(*args()))
        np.testing.assert_allclose(got, expected(*args()), rtol=1e-5, atol=1e-5)
        per_call.append(on_call(runs))
        waits.append(len(waited))
    assert per_call == ([["stitched"]] * 3 + [["xla"]] * 3) * executor.CONFIRM_ROUNDS
    assert waits == [1, 0, 1] * 2 * executor.CONFIRM_ROUNDS  # the executor waits for no other
    info = compiled.executor.info
    assert info.state == "settled" and "in runs of 3 calls of one executable" in info.why
    assert f"calls 2-{1 + 6 * executor.CONFIRM_ROUNDS}" in info.why


def test_confirmation_leaves_each_runs_first_call_untimed(monkeypatch):
    monkeypatch.setattr(executor, "CLEAR_ROUNDS", executor.CONFIRM_ROUNDS + 1)  # all rounds
    # the first call after the other executable's run is slow (cold caches): not weighed
    compiled = timing_in_runs(monkeypatch, 3, [])
    real_execute = compiled.executor._execute

    def first_of_run_slow(executable, call_args, call_kwargs):
        if compiled.executor._run_done == 0:
            time.sleep(0.1)
        return real_execute(executable, call_args, call_kwargs)

    monkeypatch.setattr(compiled.executor, "_execute", first_of_run_slow)
    for _ in range(2 * 3 * executor.CONFIRM_ROUNDS):
        compiled(*args())
    samples = compiled.executor._samples
    assert all(len(s) == executor.CONFIRM_ROUNDS for s in samples.values())
    assert max(max(s) for s in samples.values()) < 0.02, samples  # timed, a sleep adds 0.033


def test_async_trial_with_donated_arguments():
    fn = jit(layernorm, donate_argnums=0, cache_dir=None, async_compile=True, verify=True)
    a = args()
    compiled = fn.lower(*a).compile()
    assert compiled.wait_built(120)
    for _ in range(1 + 2 * executor.CONFIRM_ROUNDS * executor.RUN_CALLS):  # the trial, then
        # any confirmation
        x = jnp.asarray(a[0])
        got = np.asarray(compiled(x, *a[1:]))  # the first call starts the trial on copies
        assert x.is_deleted()
        np.testing.assert_allclose(got, expected(*a), rtol=1e-5, atol=1e-5)
        assert compiled.wait_built(60)
        if compiled.executor.info.state == "settled":
            break
    report = compiled.report()
    assert report.runtime["state"] == "settled" and not report.fallbacks, report.runtime
    assert report.verify.ran and report.verify.ok


def test_called_inside_another_trace_inlines_like_jax_jit():
    fn, a = jit(layernorm, cache_dir=None), args()
    grad = jax.jit(jax.grad(lambda x: fn(x, a[1], a[2]).sum()))(a[0])
    want = jax.jit(jax.grad(lambda x: layernorm(x, a[1], a[2]).sum()))(a[0])
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want), rtol=1e-4, atol=1e-4)
    assert fn.reports() == []  # nothing compiled by us: jax traced through it


def test_keep_must_be_known():
    with pytest.raises(ValueError, match="keep"):
        executor.Executor(xla=None, name="f", keep="slowest")


def test_build_error_carries_the_stage():
    error = build.BuildError("xla-compile", "INVALID_ARGUMENT: bad layout")
    assert (error.stage, error.reason) == ("xla-compile", "INVALID_ARGUMENT: bad layout")


def test_an_async_build_plans_in_a_process_of_its_own(tmp_path):
    """Planning is Python: with a cache directory it runs in a child (no GIL taken from the
    job, and it finishes after a short job ends); the build then loads the child's plan."""
    compiled = jit(layernorm, cache_dir=str(tmp_path), async_compile=True,
                   keep="stitched").lower(*args()).compile()
    assert compiled.wait_built(300)
    report = compiled.report()
    assert report.cache["plan"] == "hit" and report.fs.patterns >= 1, report.cache
    np.testing.assert_allclose(np.asarray(compiled(*args())), expected(*args()), rtol=1e-5,
                               atol=1e-5)


def test_the_planning_process_yields_the_cores_to_the_job(tmp_path):
    """The planning process starts a session of its own, which Linux schedules as a group
    (autogroup) weighed like the job's whatever its nice value: the group itself is niced."""
    if not os.path.exists("/proc/self/autogroup"):
        pytest.skip("no autogroup scheduling on this kernel: nice alone orders the processes")
    compiled = jit(layernorm, cache_dir=str(tmp_path), async_compile=False,
                   keep="stitched").lower(*args()).compile()
    compiled.lifecycle.reference = None  # as if not planned yet
    if not shutil.which("flock"):
        pytest.skip("no flock program: the planning process cannot be held at its lock")
    # Holding the planning lock keeps the child waiting in flock, after it set its group's
    # nice and before it plans, so the group is read from a living process (a child that
    # planned fast had ended before the first read).
    lock = os.path.join(tempfile.gettempdir(), f"fusionstitching-planning-{os.getuid()}")
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        child = compiled.lifecycle._plan_in_child()
        assert child is not None
        deadline, group = time.monotonic() + 10, ""
        while time.monotonic() < deadline and "nice 19" not in group:
            with open(f"/proc/{child.pid}/autogroup") as f:
                group = f.read()
            time.sleep(0.05)
        alive = child.poll() is None
        with open("/proc/self/autogroup") as f:
            own_group = f.read()
        fcntl.flock(held, fcntl.LOCK_UN)
    child.wait(300)
    assert alive, "the planning process ended while the lock was held"
    if not group.strip():
        # the kernel shows no group for a session it could not give one (a container's
        # scheduler, say): there is nothing to nice, the process's own nice orders it
        pytest.skip("the kernel gave the planning process's session no autogroup")
    assert "nice 19" in group, group
    if own_group.strip():  # the job's own session may have no group either (a CI runner's had none)
        assert group.split()[0] != own_group.split()[0], group  # a group of its own


def test_a_job_shorter_than_stitch_after_s_plans_at_exit_for_its_next_run(tmp_path):
    """No planning process or build runs beside a job in its first STITCH_AFTER_S; a job that
    ends sooner starts planning at exit, and a later run (a longer one) loads the plan."""
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys, time\n"
        "sys.path.insert(0, os.path.join(%r, 'tests'))\n"
        "from fusionstitching.stitched_jit import jit\n"
        "from fusionstitching import job_clock\n"
        "from helpers import args, layernorm\n"
        "job_clock.STITCH_AFTER_S = float(sys.argv[2])\n"
        # keep="fastest": a keep="stitched" build starts at once, whatever the job's age
        "compiled = jit(layernorm, cache_dir=%r, async_compile=True, keep='fastest')"
        ".lower(*args()).compile()\n"
        "compiled.wait_built(float(sys.argv[1]))\n"
        "print(compiled.lifecycle._planning_started, compiled.report().cache)\n"
        % (REPO, str(tmp_path / "cache")))
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)

    def run(stitch_after_s: float) -> str:
        done = subprocess.run([sys.executable, str(script), "2", str(stitch_after_s)],
                              capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip()

    assert run(600.0) == "False None"  # not planning yet when the job ended
    # the planning process holds this user's planning lock until it is done
    with open(os.path.join(tempfile.gettempdir(), f"fusionstitching-planning-{os.getuid()}"),
              "a") as lock:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any((tmp_path / "cache").rglob("*")):
            time.sleep(0.1)  # the process has not taken the lock yet
        time.sleep(1.0)
        fcntl.flock(lock, fcntl.LOCK_EX)
    second = run(0.0)
    assert second.startswith("False {") and "'plan': 'hit'" in second, second
