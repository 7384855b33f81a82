"""benchmarks/gpu_jit_check.py without a GPU: the exit, how workloads are named, and the ranking
probe's runs."""
import time

import pytest

from benchmarks import gpu_jit_check


def test_without_a_gpu_it_says_so_and_exits_0(capsys, tmp_path):
    assert gpu_jit_check.main(["--workloads", "bert/infer", "--out", str(tmp_path)]) == 0
    assert "no GPU here" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())  # nothing planned, nothing written


def test_a_zoo_workload_and_a_tier_step_by_name():
    fn, args = gpu_jit_check.workload("bert/infer", "small")
    assert callable(fn) and args
    with pytest.raises(LookupError, match="no JAX step nope_train in part flax"):
        gpu_jit_check.workload("flax:nope_train", "small")


def test_planning_children_report_a_failure_and_a_deadline(tmp_path):
    failed = gpu_jit_check.plan_all(["flax:nope_train"], "small", str(tmp_path), 1, 600.0)
    assert failed["flax:nope_train"]["error"] == "exit status 1"
    stopped = gpu_jit_check.plan_all(["bert/infer"], "small", str(tmp_path), 1, 0.0)
    assert stopped["bert/infer"]["error"] == "still planning after 0.0 s"


def test_ranking_probe_times_runs_of_each_length(monkeypatch):
    monkeypatch.setattr(gpu_jit_check, "RUN_LENGTHS", (1, 4))
    monkeypatch.setattr(gpu_jit_check, "PROBE_ROUNDS", 3)
    calls = []
    sleeper = lambda label, s: (lambda *a: calls.append(label) or time.sleep(s))
    probe = gpu_jit_check.ranking_by_run_length(
        {"xla": sleeper("xla", 2e-3), "stitched": sleeper("stitched", 1e-3)}, ())
    assert sorted(probe) == ["1", "4"]
    for times in probe.values():
        assert times["stitched"][1] < times["xla"][1]  # medians rank the faster first
        assert all(lo <= med for lo, med in times.values())
    # rounds alternate which executable goes first
    assert calls[:2] == ["xla", "stitched"] and calls[2:4] == ["stitched", "xla"]
    assert calls.count("xla") == calls.count("stitched") == 3 * (1 + 4)
