"""A step --keras_jit=auto gave XLA, before it is planned: XLA:CPU's time for it against plain
TF's. Stitching replaces XLA's memory-bound kernels and leaves its convolutions and dots as
they are, so a step whose XLA executable runs far slower than plain TF cannot catch up, and
planning, building and timing it only tax the job: it settles on plain TF, the two times its
why, and the decision is kept for the next run: under XLA's plan, and under TF's own module,
where the next run finds it before compiling the module with XLA:CPU.
"""
from __future__ import annotations

import collections
import re
import threading
import time

# A step whose XLA:CPU executable takes more than this many times plain TF's time is left to
# plain TF unplanned. The most stitching recovered of XLA:CPU's time on a whole step here was
# 2.6x (a Keras convnet's train step: XLA:CPU 59 ms, stitched 23 ms, plain TF about 10 ms).
XLA_BEYOND_REACH = 3.0
PLAIN_SAMPLES = 3  # plain calls timed before the comparison (the best one counts)
SAMPLES_WAIT_S = 10.0  # how long the comparison waits for them (a step called rarely)
XLA_ROUNDS = 3  # XLA runs timed after one untimed (the best one counts) ...
XLA_BUDGET_S = 2.0  # ... or fewer once they have taken this long
_TRACE_NUMBER = re.compile(r"(_inference_\w*?)_\d+(__)")


class PlainTimes:
    """Wall times of the step's recent calls that ran plain TF (recorded on the call path,
    read by the build thread)."""

    def __init__(self):
        self._times: collections.deque = collections.deque(maxlen=8)
        self._added = threading.Condition()

    def add(self, seconds: float) -> None:
        with self._added:
            self._times.append(seconds)
            self._added.notify_all()

    def best(self, wait_s: float = SAMPLES_WAIT_S) -> tuple[float | None, int]:
        """The fastest of the recorded calls once PLAIN_SAMPLES are in, or after ``wait_s``
        with what there is (None: no call ran plain), and how many there were."""
        deadline = time.monotonic() + wait_s
        with self._added:
            while len(self._times) < PLAIN_SAMPLES and time.monotonic() < deadline:
                self._added.wait(max(0.0, deadline - time.monotonic()))
            return (min(self._times) if self._times else None), len(self._times)


def xla_best_s(reference, in_avals) -> float:
    """XLA's executable's best wall time on zeros of its inputs (made before each clock
    starts: it may donate them), after one untimed run."""
    import jax
    import jax.numpy as jnp

    best, spent = float("inf"), 0.0
    for run in range(XLA_ROUNDS + 1):
        args = [jnp.zeros(a.shape, a.dtype) for a in in_avals]
        jax.block_until_ready(args)
        started = time.perf_counter()
        jax.block_until_ready(reference(*args))
        seconds = time.perf_counter() - started
        spent += seconds
        if run:
            best = min(best, seconds)
            if spent > XLA_BUDGET_S:
                break
    return best


def beyond_reach(xla_s: float, plain_s: float | None, samples: int) -> str | None:
    """Why the step stays plain TF unplanned, or None when stitching might win."""
    if plain_s is None or xla_s <= XLA_BEYOND_REACH * plain_s:
        return None
    return (f"XLA:CPU ran it in {xla_s * 1e3:.2f} ms, plain TF in {plain_s * 1e3:.2f} ms "
            f"(best of {samples} calls): more than the {XLA_BEYOND_REACH:g}x stitching "
            "could recover, so it was not planned")


def tf_module_decisions(lifecycle, tf_hlo: str):
    """Where a step's plain-TF decision is kept under TF's own module too (None: no cache):
    a later run finds it before compiling the module with XLA:CPU, which cost the switch of
    a 300-epoch Keras job 4-5 s of CPU beside it."""
    import tensorflow as tf

    from fusionstitching.runtime.cache import KernelCache, fingerprint
    from fusionstitching.runtime.decisions import DecisionStore
    from fusionstitching.runtime.plan_key import without_source_locations

    if lifecycle.cache_dir is None:
        return None
    # TF names a function's module by its trace's number (a_inference_step_23__), which
    # another trace of the same step has another of
    module = _TRACE_NUMBER.sub(r"\1\2", without_source_locations(tf_hlo))
    key = fingerprint("plain-tf", module, tf.__version__)
    return DecisionStore(KernelCache(lifecycle.cache_dir, remote=lifecycle.remote_cache), key)


def remember_plain(lifecycle, tf_hlo: str, plain_us: float, why: str) -> None:
    """Keep the decision for plain TF under TF's module (``tf_module_decisions``)."""
    from fusionstitching.runtime.decisions import Decision

    store = tf_module_decisions(lifecycle, tf_hlo)
    if store is not None:
        store.save(Decision("reference", plain_us, None, why))
