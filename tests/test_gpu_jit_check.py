"""benchmarks/gpu_jit_check.py without a GPU: the exit, and how workloads are named."""
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


def test_a_training_steps_state_is_carried_to_the_next_step():
    import jax.numpy as jnp

    def step(params, opt, x):
        loss = jnp.sum(params["w"] * x)
        return loss, {"w": params["w"] - 0.1, "b": params["b"]}, (opt[0] + 1, opt[1])

    params = {"w": jnp.ones(3), "b": jnp.zeros(3)}
    opt = (jnp.zeros(()), jnp.ones(3))
    args = (params, opt, jnp.ones(3))
    assert gpu_jit_check.state_feedback(step, args) == {0: 1, 1: 2}  # x is data, not state
    calls, outs = [], []

    def recorded(*a):
        calls.append(a)
        outs.append(step(*a))
        return outs[-1]

    gpu_jit_check.training_loop(recorded, args, {0: 1, 1: 2})(3)
    assert calls[0] == args
    for before, after in zip(outs, calls[1:]):  # the state a step returned, the data again
        assert after[0] is before[1] and after[1] is before[2] and after[2] is args[2]


def test_planning_children_report_a_failure_and_a_deadline(tmp_path):
    failed = gpu_jit_check.plan_all(["flax:nope_train"], "small", str(tmp_path), 1, 600.0)
    assert failed["flax:nope_train"]["error"] == "exit status 1"
    stopped = gpu_jit_check.plan_all(["bert/infer"], "small", str(tmp_path), 1, 0.0)
    assert stopped["bert/infer"]["error"] == "still planning after 0.0 s"
