"""Why a stage leaves part of a module to XLA instead of planning it: a kind and a detail.

Stages refuse what they do not understand (a module that breaks a rule of HLO a stage relies
on, a value too large to plan) rather than guess; the pipeline lists each refusal in
``Report.fallbacks`` with its stage, so the module still runs, as XLA planned it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class RefusalKind(enum.Enum):
    MALFORMED = "malformed"  # breaks an HLO rule (XLA's verifier would reject it)
    UNSUPPORTED = "unsupported"  # valid HLO that the stage does not handle
    INTERNAL = "internal error"  # a defect of ours, stopped at the stage's boundary


@dataclass(frozen=True)
class Refusal:
    kind: RefusalKind
    detail: str

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}"


def internal(exc: BaseException) -> Refusal:
    return Refusal(RefusalKind.INTERNAL, f"{type(exc).__name__}: {exc}")
