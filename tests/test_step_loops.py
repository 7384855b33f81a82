"""benchmarks/step_loops.py: which outputs a training step hands to the next one; an inference
step's calls, each waited for."""
import math

import jax.numpy as jnp

from benchmarks import step_loops


def test_a_training_steps_state_is_carried_to_the_next_step():
    def step(params, opt, x):
        loss = jnp.sum(params["w"] * x)
        return loss, {"w": params["w"] - 0.1, "b": params["b"]}, (opt[0] + 1, opt[1])

    params = {"w": jnp.ones(3), "b": jnp.zeros(3)}
    opt = (jnp.zeros(()), jnp.ones(3))
    args = (params, opt, jnp.ones(3))
    assert step_loops.state_feedback(step, args) == {0: 1, 1: 2}  # x is data, not state
    calls, outs = [], []

    def recorded(*a):
        calls.append(a)
        outs.append(step(*a))
        return outs[-1]

    step_loops.training_loop(recorded, args, {0: 1, 1: 2})(3)
    assert calls[0] == args
    for before, after in zip(outs, calls[1:]):  # the state a step returned, the data again
        assert after[0] is before[1] and after[1] is before[2] and after[2] is args[2]


def test_a_stepper_carries_the_state_from_call_to_call():
    def step(params, x):
        return params + x, jnp.sum(params)

    args = (jnp.zeros(3), jnp.ones(3))
    calls = []

    def recorded(*a):
        calls.append(a)
        return step(*a)

    one = step_loops.stepper(recorded, args, {0: 0})
    first, second = one(), one()
    assert calls[0] == args and calls[1][0] is first[0] and calls[1][1] is args[1]
    assert float(second[1]) == 3.0  # the second step saw the first one's parameters
    same = step_loops.stepper(recorded, args, {})
    same(), same()
    assert calls[2] == args and calls[3] == args  # no state: the same inputs each call


def test_the_loss_is_the_float_scalar_that_is_not_state():
    def step(params, x):
        return {"w": params["w"] * 2, "b": params["b"]}, jnp.int32(3), jnp.sum(params["w"] * x)

    args = ({"w": jnp.ones(3), "b": jnp.zeros(3)}, jnp.ones(3))
    feedback = step_loops.state_feedback(step, args)
    assert feedback == {0: 0} and step_loops.loss_path(step, args, feedback) == (2,)
    last = step_loops.training_loop(step, args, feedback)(3)
    assert last[2] == step(step(step(*args)[0], args[1])[0], args[1])[2]  # the third step's
    assert step_loops.loss_at(last, (2,)) == last[2]


def test_a_keras_steps_loss_is_in_its_logs():
    """Keras's train_step returns (logs, state); the loss is logs["loss"]."""
    def step(state, x):
        (w,) = state
        return {"loss": jnp.sum(w * x), "accuracy": jnp.float32(1)}, (w * 2,)

    args = ((jnp.ones(3),), jnp.ones(3))
    feedback = step_loops.state_feedback(step, args)
    assert step_loops.loss_path(step, args, feedback) == (0, "loss")
    assert step_loops.loss_at(step(*args), (0, "loss")) == 3


def test_paired_ratio_bounds_the_median_by_order_statistics():
    first = [float(i) for i in range(20, 0, -1)]  # runs of one function, in call order
    median, low, high = step_loops.paired_ratio(first, [1.0] * 20)
    assert median == 10.5
    # P(Binomial(20, 1/2) <= 5) = 2.1% and <= 6 is 5.8%: the 6th and 15th smallest ratios
    assert (low, high) == (6.0, 15.0)
    assert step_loops.paired_ratio([2.0] * 4, [1.0] * 4) == (2.0, 0.0, math.inf)
    assert step_loops.paired_ratio([1.0, 2.0, 3.0, 4.0, 5.0], [2.0] * 5) == (1.5, 0.5, 2.5)


def test_waited_calls_wait_for_each_call_on_the_same_inputs(monkeypatch):
    waited, calls = [], []
    monkeypatch.setattr(step_loops.jax, "block_until_ready", lambda out: waited.append(out))

    def step(x):
        calls.append(x)
        return len(calls)

    step_loops.waited_calls(step, (7,))(3)
    assert calls == [7, 7, 7] and waited == [1, 2, 3]  # each call's own outputs, in turn
