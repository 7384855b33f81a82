"""Which executable runs a call: XLA's own, or the stitched one, swapped in without waiting.

One ``Executor`` per compiled signature. Calls always run ``active`` (first XLA's executable).
When a stitched executable is built (at once, or on a background thread with
``async_compile``), it becomes the *candidate*; the next call decides on its real inputs:

1. run XLA's executable (its outputs are this call's result: the reference);
2. run the candidate on the same inputs; with ``verify``, its outputs must match XLA's
   (``pipeline.compare``) or it is dropped (a ``verify`` fallback);
3. unless ``keep="stitched"``, time both a few times on these inputs and keep the faster
   ("never slower": on a CPU the host kernels can lose to XLA:CPU's own);
4. ``active`` is replaced by one assignment, so a concurrent call runs either executable
   whole.

A call never waits for a compiler: until the candidate exists, XLA's executable runs. A
stitched call that raises falls back to XLA's executable for good (an ``execute`` fallback)
and the same call is answered by XLA.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from .. import pipeline
from ..report import Fallback, Verify
from .build import BuildError, Built, reason

log = logging.getLogger("fusionstitching")

TIMING_ROUNDS = 3
KEEP_CHOICES = ("fastest", "stitched")


@dataclass
class RuntimeInfo:
    """Optional ``runtime`` field of the Report: what runs and why."""

    mode: str = "sync"  # "sync" or "async" compilation
    state: str = "building"  # building -> pending (built, not yet tried) -> settled | fallback
    kept: str = "xla"  # the executable calls run now: "xla" or "stitched"
    why: str = ""
    xla_us: float | None = None  # best of TIMING_ROUNDS on the deciding call's inputs
    stitched_us: float | None = None
    calls: int = 0
    swapped_at_call: int | None = None  # 1-based call number from which stitched ran
    build_s: float | None = None  # wall time of the stitched build
    stitched_plan: dict | None = None  # kernels of the built stitched executable
    timing_rounds: int = TIMING_ROUNDS


@dataclass
class Executor:
    xla: object  # jax.stages.Compiled of XLA's own plan
    name: str
    verify: bool = False
    keep: str = "fastest"
    rtol: float = 1e-5
    atol: float = 1e-5
    info: RuntimeInfo = field(default_factory=RuntimeInfo)
    fallbacks: list[Fallback] = field(default_factory=list)
    built: Built | None = None
    checked: Verify = field(default_factory=Verify)

    def __post_init__(self):
        if self.keep not in KEEP_CHOICES:
            raise ValueError(f"keep must be one of {KEEP_CHOICES}, got {self.keep!r}")
        self.active = self.xla  # what every call runs; replaced by one assignment
        self.candidate = None  # built stitched executable waiting for its first real call
        self._deciding = threading.Lock()

    # -- the build's outcome (from the compiling thread) ------------------------------------
    def built_ok(self, built: Built, seconds: float) -> None:
        self.built = built
        self.fallbacks = built.stitched_report.fallbacks
        self.info.build_s = round(seconds, 3)
        plan = built.stitched_report.fs
        self.info.stitched_plan = {"kernels": plan.kernels, "mem_kernels": plan.mem_kernels,
                                   "patterns": plan.patterns or 0}
        if built.stitched is None:
            failed = self.fallbacks[-1] if self.fallbacks else None
            self._settle_on_xla(f"{failed.stage}: {failed.reason}" if failed
                                else "nothing was stitched")
            return
        self.info.state = "pending"
        self.candidate = built.stitched  # last: the next call may pick it up at once

    def build_failed(self, error: Exception) -> None:
        stage, why = (error.stage, error.reason) if isinstance(error, BuildError) \
            else ("runtime", reason(error))
        self.fail(stage, [], why)

    def fail(self, stage: str, nodes: list[str], why: str) -> None:
        log.warning("fusionstitching: %s runs on XLA's own kernels (%s): %s",
                    self.name, stage, why)
        self.fallbacks.append(Fallback(stage, nodes, why))
        self.candidate = None
        self.active = self.xla
        self.info.state, self.info.kept, self.info.why = "fallback", "xla", f"{stage}: {why}"

    def _settle_on_xla(self, why: str) -> None:
        self.info.state, self.info.kept, self.info.why = "settled", "xla", why

    # -- calls ----------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        import jax

        self.info.calls += 1
        if self.candidate is not None and self._deciding.acquire(blocking=False):
            try:
                if self.candidate is not None:
                    return self._decide(self.candidate, args, kwargs)
            finally:
                self._deciding.release()
        active = self.active
        if active is self.xla:
            return active(*args, **kwargs)
        try:
            return active(*args, **kwargs)
        except jax.errors.JaxRuntimeError as exc:  # XLA or one of our kernels failed
            self.fail("execute", [], reason(exc))
            return self.xla(*args, **kwargs)

    def _decide(self, candidate, args, kwargs):
        import jax

        expected = jax.block_until_ready(self.xla(*args, **kwargs))
        try:
            got = jax.block_until_ready(candidate(*args, **kwargs))
        except jax.errors.JaxRuntimeError as exc:
            self.fail("execute", [], reason(exc))
            return expected
        if self.verify:
            leaves = lambda tree: jax.tree_util.tree_leaves(jax.device_get(tree))
            ok, max_abs, max_rel = pipeline.compare(leaves(expected), leaves(got), self.rtol,
                                                    self.atol)
            self.checked = Verify(ran=True, ok=ok, max_abs_err=max_abs, max_rel_err=max_rel,
                                  against=["xla (same call)"])
            if not ok:
                self.fail("verify", [], f"outputs differ from XLA's on call {self.info.calls} "
                                        f"(max abs err {max_abs:.3g}, max rel err {max_rel:.3g}, "
                                        f"rtol {self.rtol}, atol {self.atol})")
                return expected
        if settle(self.info, self.keep, self.xla, candidate, args, kwargs) == "stitched":
            self.active = candidate
        self.candidate = None
        return expected

    def runs_stitched(self) -> bool:
        """True when the stitched executable runs now or on the next call."""
        return self.candidate is not None or self.active is not self.xla


def settle(info, keep: str, reference, candidate, args, kwargs, reference_label: str = "xla",
           note: str = "") -> str:
    """Decide which executable keeps running, record why in ``info``; returns the label kept
    ("stitched" or ``reference_label``). ``keep="fastest"`` times both on the call's inputs."""
    kept = "stitched"
    if keep == "fastest":
        reference_s, stitched_s = best_times(reference, candidate, args, kwargs)
        info.xla_us, info.stitched_us = round(reference_s * 1e6, 1), round(stitched_s * 1e6, 1)
        if stitched_s >= reference_s:
            kept = reference_label
        info.why = (f"measured on call {info.calls}: stitched {info.stitched_us} us vs XLA "
                    f"{info.xla_us} us{note}")
    else:
        info.why = "keep='stitched'"
    info.state, info.kept = "settled", kept
    if kept == "stitched":
        info.swapped_at_call = info.calls + 1
    return kept


def best_times(xla, stitched, args, kwargs) -> tuple[float, float]:
    """Best wall time of each executable over TIMING_ROUNDS alternating runs."""
    import jax

    best = [float("inf"), float("inf")]
    for _ in range(TIMING_ROUNDS):
        for i, executable in enumerate((xla, stitched)):
            t0 = time.perf_counter()
            jax.block_until_ready(executable(*args, **kwargs))
            best[i] = min(best[i], time.perf_counter() - t0)
    return best[0], best[1]
