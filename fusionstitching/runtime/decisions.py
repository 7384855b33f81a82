"""keep="fastest" decisions kept in the plan cache, so the next run of a job starts with them.

A job that ends while its confirmation is still open keeps the samples taken so far, and the
next run goes on from them, so a short job's decision settles over a few runs.

A decision holds for one plan on one machine: its key is the plan's (XLA's optimized module,
target, explorer, this CPU) with the CPUs the process may use, ``XLA_FLAGS`` and jaxlib's
version, which change XLA's executable or the time it takes. A run that finds its decision
runs the same executable for the same calls as every other such run (reproducible losses).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from . import cache as kernel_cache


@dataclass(frozen=True)
class Decision:
    kept: str  # "stitched", "reference" (XLA's executable, or TF's own function), or "open"
    reference_us: float | None  # the best times of the measurement that decided
    stitched_us: float | None
    where: str  # how they were measured (the Report's ``runtime.why``)
    # an open confirmation's samples so far ({"xla": [s], "stitched": [s]}) and their runs'
    # length in calls
    samples: dict = field(default_factory=dict)
    run_calls: int = 0

    @property
    def settled(self) -> bool:
        return self.kept in ("stitched", "reference")


def decision_key(plan_key: str) -> str:
    from importlib import metadata

    try:
        jaxlib = metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        jaxlib = "none"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return kernel_cache.fingerprint("decision", plan_key, f"cpus={cpus}", f"jaxlib={jaxlib}",
                                    os.environ.get("XLA_FLAGS", ""))


class DecisionStore:
    """The stored decision of one plan: ``load`` it, ``save`` a new one. Any problem with
    the cache reads as no decision (the run measures again), never as an error."""

    def __init__(self, cache: kernel_cache.KernelCache, plan_key: str):
        self.cache, self.key = cache, decision_key(plan_key)

    def load(self) -> Decision | None:
        if not self.cache.enabled:
            return None
        try:
            entry = self.cache.load(self.key)
            if entry is None:
                return None
            fields = json.loads(entry[1])
            decision = Decision(**fields)
        except (kernel_cache.CorruptEntry, kernel_cache.CacheRefused, OSError, ValueError,
                TypeError):
            return None
        return decision if decision.kept in ("stitched", "reference", "open") else None

    def save(self, decision: Decision) -> None:
        self.cache.store(self.key, json.dumps(asdict(decision)).encode(), kind="decision")
