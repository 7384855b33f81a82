"""Timed runs of a step function: n calls on the same inputs, or a training loop that carries
its state (parameters, optimizer state) from one step to the next. Neither waits between
steps, as a job does not; both wait for the last step's outputs. ``waited_calls`` waits for
each call, as a predict loop does. ``paired_ratio`` sums up alternating runs of two
functions."""
from __future__ import annotations

import math
import statistics

import jax


def repeated_calls(fn, args):
    """``run(n)``: n calls of ``fn(*args)``, then a wait for the last."""
    def run(n: int) -> None:
        out = None
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)
    return run


def waited_calls(fn, args):
    """``run(n)``: n calls of ``fn(*args)``, each waited for."""
    def run(n: int) -> None:
        for _ in range(n):
            jax.block_until_ready(fn(*args))
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


def training_loop(fn, args, feedback: dict[int, int], start=None):
    """``run(n)``: n steps from ``args`` (`stepper`), then a wait for the last; returns the
    last step's outputs. ``start()``, if given, makes each run's first arguments (copies,
    for a step that donates them)."""
    def run(n: int) -> None:
        step, out = stepper(fn, start() if start else args, feedback), None
        for _ in range(n):
            out = step()
        return jax.block_until_ready(out)
    return run


def stepper(fn, args, feedback: dict[int, int]):
    """``step()``: one call, taking the state the last call returned (the same inputs each
    time when ``feedback`` is empty); never waits."""
    state = list(args)

    def step():
        out = fn(*state)
        outs = out if isinstance(out, tuple) else (out,)
        for j, i in feedback.items():
            state[j] = outs[i]
        return out
    return step


def loss_path(fn, args, feedback: dict[int, int]) -> tuple | None:
    """Where a training step's loss is among its outputs: ``(i,)`` for a float scalar output
    that is not state, ``(i, "loss")`` for a dict of logs with a float scalar "loss" (Keras's
    train_step returns its logs and its state); read it with `loss_at`."""
    out = jax.eval_shape(fn, *args)
    outs = out if isinstance(out, tuple) else (out,)
    for i, o in enumerate(outs):
        if i in feedback.values():
            continue
        if isinstance(o, dict) and _float_scalar(o.get("loss")):
            return (i, "loss")
        if _float_scalar(o):
            return (i,)
    return None


def loss_at(out, path: tuple):
    """The loss in a step's outputs ``out``, at `loss_path`'s ``path``."""
    value = out if isinstance(out, tuple) else (out,)
    for key in path:
        value = value[key]
    return value


def _float_scalar(x) -> bool:
    return getattr(x, "shape", None) == () and jax.numpy.issubdtype(x.dtype, jax.numpy.floating)


def paired_ratio(first: list[float], second: list[float]) -> tuple[float, float, float]:
    """(median, low, high) of the ratios first[i] / second[i] of alternating runs, low and high
    bounding the median with about 90% confidence (order statistics of the ratios: the
    binomial interval needs no assumption about their spread). Pairs, not two medians: this
    CPU's speed drifts by 1.5x over seconds, and runs next to each other see the same speed;
    fewer than 5 pairs bound nothing (low 0, high inf)."""
    ratios = sorted(a / b for a, b in zip(first, second, strict=True))
    n = len(ratios)
    # the largest k with P(Binomial(n, 1/2) < k) <= 5%: [ratios[k-1], ratios[n-k]] holds the
    # median with probability at least 90%
    k, below = 0, 0.0
    while k < n // 2 and below + math.comb(n, k) / 2 ** n <= 0.05:
        below += math.comb(n, k) / 2 ** n
        k += 1
    if k == 0:
        return statistics.median(ratios), 0.0, math.inf
    return statistics.median(ratios), ratios[k - 1], ratios[n - k]
