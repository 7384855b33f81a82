"""keep="fastest" decisions kept in the plan cache, so the next run of a job starts with them.

A decision holds for one plan on one machine: its key is the plan's (XLA's optimized module,
target, explorer, this CPU) with the CPUs the process may use, ``XLA_FLAGS`` and jaxlib's
version, which change XLA's executable or the time it takes. A run that finds its decision
runs the same executable for the same calls as every other such run (reproducible losses).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from . import cache as kernel_cache


@dataclass(frozen=True)
class Decision:
    kept: str  # "stitched" or "reference" (XLA's executable, or TF's own function)
    reference_us: float  # the best times of the measurement that decided
    stitched_us: float
    where: str  # how they were measured (the Report's ``runtime.why``)


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
        return decision if decision.kept in ("stitched", "reference") else None

    def save(self, decision: Decision) -> None:
        self.cache.store(self.key, json.dumps(asdict(decision)).encode(), kind="decision")
