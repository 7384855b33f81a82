"""Timed runs of a step function: n calls on the same inputs, or a training loop that carries
its state (parameters, optimizer state) from one step to the next. Neither waits between
steps, as a job does not; both wait for the last step's outputs."""
from __future__ import annotations

import jax


def repeated_calls(fn, args):
    """``run(n)``: n calls of ``fn(*args)``, then a wait for the last."""
    def run(n: int) -> None:
        out = None
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)
    return run


def state_feedback(fn, args) -> dict[int, int]:
    """{argument index: output index} for a training step's state: an output of several
    leaves with the same tree, shapes and dtypes as an argument (parameters, optimizer
    state) is what the next step takes there. Empty for a step that returns no state."""
    out = jax.eval_shape(fn, *args)
    outs = out if isinstance(out, tuple) else (out,)

    def avals(tree):
        return jax.tree.structure(tree), [(x.shape, x.dtype) for x in jax.tree.leaves(tree)]

    feedback, used = {}, set()
    for j, arg in enumerate(args):
        if jax.tree.structure(arg).num_leaves < 2:
            continue
        wanted = avals(jax.eval_shape(lambda a: a, arg))
        for i, o in enumerate(outs):
            if i not in used and avals(o) == wanted:
                feedback[j] = i
                used.add(i)
                break
    return feedback


def training_loop(fn, args, feedback: dict[int, int]):
    """``run(n)``: n steps, each taking the state the last one returned, then a wait for the
    last; returns the last step's outputs."""
    def run(n: int) -> None:
        state = list(args)
        out = None
        for _ in range(n):
            out = fn(*state)
            outs = out if isinstance(out, tuple) else (out,)
            for j, i in feedback.items():
                state[j] = outs[i]
        return jax.block_until_ready(out)
    return run


def loss_index(fn, args, feedback: dict[int, int]) -> int | None:
    """The output that is a training step's loss: a float scalar that is not state."""
    out = jax.eval_shape(fn, *args)
    outs = out if isinstance(out, tuple) else (out,)
    for i, o in enumerate(outs):
        if i not in feedback.values() and getattr(o, "shape", None) == () \
                and jax.numpy.issubdtype(o.dtype, jax.numpy.floating):
            return i
    return None
