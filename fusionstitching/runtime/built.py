"""What a build hands the runtime: the stitched executable with its plans (``Built``), or a
``BuildError`` naming the stage that failed.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..report import Report
from .cache import CacheStats


class BuildError(RuntimeError):
    def __init__(self, stage: str, reason: str):
        super().__init__(f"[{stage}] {reason}")
        self.stage, self.reason = stage, reason


@dataclass
class Built:
    stitched: object  # jax.stages.Compiled running the rewritten module; None: nothing stitched
    stitched_report: Report  # the plan with the kernels that made it into the executable
    xla_report: Report  # XLA's own plan counted the same way (what runs after a fallback)
    cache: CacheStats
    rewritten_hlo: str | None
    plan_key: str = ""  # the plan's key in the cache (runtime/decisions.py keys on it)


def reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
