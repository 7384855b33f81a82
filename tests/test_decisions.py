"""keep="fastest" decisions: the confirmation stops once the two executables are clearly
apart, and a decision is kept in the plan cache so the next run of the plan starts with it."""
from __future__ import annotations

import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fusionstitching.runtime import executor  # noqa: E402
from fusionstitching.runtime.decisions import Decision  # noqa: E402
from fusionstitching.stitched_jit import jit  # noqa: E402
from helpers import args, expected, layernorm  # noqa: E402


def test_clearly_apart_needs_every_sample_beaten_and_enough_of_them():
    assert not executor.clearly_apart([2.0, 2.1], [1.0, 1.1])  # too few
    assert executor.clearly_apart([2.0, 2.1, 2.2], [1.0, 1.1, 1.2])
    assert executor.clearly_apart([1.0, 1.1, 1.2], [2.0, 2.1, 2.2])
    assert not executor.clearly_apart([2.0, 1.0, 2.2], [1.5, 1.6, 1.7])  # overlapping
    assert not executor.clearly_apart([1.0, 1.01, 1.02], [0.99, 0.995, 0.999])  # within margin


def test_a_clear_difference_ends_the_confirmation_early(monkeypatch):
    monkeypatch.setattr(executor, "best_times", lambda *a, **k: (2e-3, 1e-3))
    fn = jit(layernorm, cache_dir=None)
    compiled = fn.lower(*args()).compile()
    run = compiled.executor._execute

    def xla_slower(executable, call_args, call_kwargs):
        if executable is compiled.executor.xla:
            time.sleep(0.02)
        return run(executable, call_args, call_kwargs)

    monkeypatch.setattr(compiled.executor, "_execute", xla_slower)
    compiled.executor.run_calls = 1
    for _ in range(1 + 2 * executor.CLEAR_ROUNDS):  # the trial's call, then 3 runs each
        np.testing.assert_allclose(np.asarray(compiled(*args())), expected(*args()),
                                   rtol=1e-5, atol=1e-5)
    info = compiled.executor.info
    assert info.state == "settled" and info.kept == "stitched", info
    assert f"calls 2-{1 + 2 * executor.CLEAR_ROUNDS}" in info.why


def decided(compiled, calls: int = 2):
    outputs = [np.asarray(compiled(*args())) for _ in range(calls)]
    return compiled.executor.info, outputs


def test_a_decision_for_xla_is_kept_and_the_next_run_starts_with_it(monkeypatch, tmp_path):
    monkeypatch.setattr(executor, "best_times", lambda *a, **k: (1e-3, 5e-3))  # clearly slower
    first = jit(layernorm, cache_dir=str(tmp_path)).lower(*args()).compile()
    info, _ = decided(first)
    assert info.state == "settled" and info.kept == "xla" and "measured" in info.why

    monkeypatch.setattr(executor, "best_times", lambda *a, **k: 1 / 0)  # never timed again
    second = jit(layernorm, cache_dir=str(tmp_path)).lower(*args()).compile()
    assert second.executor.info.state == "settled"  # decided before its first call
    assert second.executor.built is None and second.executor.info.build_s is None  # not built
    info, outputs = decided(second)
    assert info.kept == "xla" and info.trial_call is None, info
    assert info.why.startswith("decided by an earlier run on this machine (measured")
    assert (info.xla_us, info.stitched_us) == (1000.0, 5000.0)
    np.testing.assert_array_equal(outputs[0], outputs[1])
    # unbuilt, its Report names the module as the built one's did
    assert second.lifecycle.report().module == first.lifecycle.report().module == "jit_layernorm"


def test_a_decision_for_stitched_is_checked_then_kept_from_the_first_calls(tmp_path,
                                                                           monkeypatch):
    first = jit(layernorm, cache_dir=str(tmp_path)).lower(*args()).compile()
    first.executor.decisions.save(Decision("stitched", 20.0, 10.0, "measured on calls 2-97"))
    monkeypatch.setattr(executor, "best_times", lambda *a, **k: 1 / 0)
    runs = []
    for _ in range(2):  # two runs of the job: the same executable for the same calls
        compiled = jit(layernorm, cache_dir=str(tmp_path), verify=True).lower(*args()).compile()
        info, outputs = decided(compiled, 3)
        assert info.kept == "stitched" and info.trial_call == 1 and info.swapped_at_call == 2
        assert compiled.report().verify.ran and compiled.report().verify.ok
        runs.append(outputs)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_a_confirmation_open_at_exit_goes_on_in_the_next_run(monkeypatch, tmp_path):
    monkeypatch.setattr(executor, "best_times", lambda *a, **k: (2e-3, 1e-3))  # confirm it
    monkeypatch.setattr(executor, "CLEAR_ROUNDS", executor.CONFIRM_ROUNDS + 1)  # all rounds
    first = jit(layernorm, cache_dir=str(tmp_path)).lower(*args()).compile()
    first.executor.run_calls = 1
    decided(first, 1 + 4)  # the trial's call, then 2 runs of each
    assert first.executor.info.state == "timing"
    executor._keep_open_samples()  # what the job's exit does

    monkeypatch.setattr(executor, "best_times", lambda *a, **k: 1 / 0)  # not timed again
    second = jit(layernorm, cache_dir=str(tmp_path)).lower(*args()).compile()
    second.executor.run_calls = 1
    decided(second, 1)  # the trial checks the candidate, then the samples come back
    assert second.executor.info.state == "timing"
    assert [len(s) for s in second.executor._samples.values()] == [2, 2]
    info, _ = decided(second, 2 * (executor.CONFIRM_ROUNDS - 2))
    assert info.state == "settled" and "after 2 runs of each in earlier runs" in info.why, info


def test_a_sample_runs_as_many_calls_as_fill_run_s():
    assert executor.calls_per_sample(0.5) == 2  # a long step: one timed after the cold one
    assert executor.calls_per_sample(0.02) == 4  # 3 timed calls fill RUN_S (50 ms)
    assert executor.calls_per_sample(1e-4) == executor.RUN_CALLS  # a short one: capped


def test_a_short_job_decides_in_runs_its_step_time_sets(monkeypatch):
    """A 20 ms step confirms in runs of 4 calls: decided within 50 of a 100-call job."""
    monkeypatch.setattr(executor, "best_times", lambda *a, **k: (0.02, 0.01))  # confirm it
    monkeypatch.setattr(executor, "CLEAR_ROUNDS", executor.CONFIRM_ROUNDS + 1)  # all rounds
    compiled = jit(layernorm, cache_dir=None).lower(*args()).compile()
    calls = 0
    while compiled.executor.decided() is None and calls < 100:
        compiled(*args())
        calls += 1
    assert compiled.executor.run_calls == 4
    assert calls == 1 + 2 * executor.CONFIRM_ROUNDS * 4 <= 50, calls
    assert "in runs of 4 calls" in compiled.executor.info.why


def test_a_step_called_between_other_work_is_timed_by_single_calls(monkeypatch):
    """A confirmation run whose calls are not back to back (Keras calls a partial last
    batch's step once an epoch) times the job's work between them: once a sample reads
    CALLS_APART times the trial's time of the step, its calls are timed one by one."""
    monkeypatch.setattr(executor, "best_times", lambda *a, **k: (1e-3, 1e-3))  # promising
    compiled = jit(layernorm, cache_dir=None).lower(*args()).compile()
    timing = compiled.executor
    np.asarray(compiled(*args()))  # the trial's call
    assert timing.info.state == "timing" and timing.run_calls > 1, timing.info
    for _ in range(timing.run_calls + 2 * executor.CONFIRM_ROUNDS):
        time.sleep(0.03)  # the job's other work between two calls
        np.testing.assert_allclose(np.asarray(compiled(*args())), expected(*args()),
                                   rtol=1e-5, atol=1e-5)
        if timing.info.state == "settled":
            break
    info = timing.info
    assert timing.run_calls == 1 and info.state == "settled", info
    assert "each running one executable" in info.why, info.why
    assert info.xla_us < 30000 and info.stitched_us < 30000, info  # the calls alone


def test_a_single_call_is_timed_without_the_work_queued_before_it(monkeypatch):
    """Timed by single calls, a call's sample starts once its inputs are ready: a training
    loop dispatches ahead, and the call would otherwise wait for the work before it."""
    monkeypatch.setattr(executor, "best_times", lambda *a, **k: (1e-3, 1e-3))  # promising
    compiled = jit(layernorm, cache_dir=None).lower(*args()).compile()
    timing = compiled.executor
    np.asarray(compiled(*args()))  # the trial's call
    timing.run_calls = 1

    @jax.jit
    def queued(x, m):  # work ahead of the step's call that leaves its input as it was
        for _ in range(8):
            m = jnp.tanh(m @ m)
        return x + 0.0 * m[0, 0]

    x, scale, bias = args()
    big = jnp.full((512, 512), 1 / 512, jnp.float32)
    queued(x, big).block_until_ready()  # compiled
    started = time.perf_counter()
    queued(x, big).block_until_ready()
    queued_s = time.perf_counter() - started
    for _ in range(2 * executor.CONFIRM_ROUNDS):
        out = compiled(queued(x, big), scale, bias)  # dispatched behind the queued work
        np.testing.assert_allclose(np.asarray(out), expected(x, scale, bias), rtol=1e-5,
                                   atol=1e-5)
        if timing.info.state == "settled":
            break
    info = timing.info
    assert info.state == "settled", info
    assert max(info.xla_us, info.stitched_us) < 0.5 * queued_s * 1e6, (info, queued_s)
