"""Why a stage leaves part of a module to XLA instead of planning it: a kind and a detail.

Stages refuse what they do not understand (a module that breaks a rule of HLO a stage relies
on, a value too large to plan) rather than guess; the pipeline lists each refusal in
``Report.fallbacks`` with its stage, so the module still runs, as XLA planned it. The kind is
any stage's enum member (``RefusalKind`` here; the code generator and pipeline have theirs).
"""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

# Each defect stopped at a stage's boundary, with its traceback: at DEBUG, since the user
# already gets the fallback and its reason; the fuzz tests assert that none happens.
defects = logging.getLogger("fusionstitching.defects")


class RefusalKind(enum.Enum):
    MALFORMED = "malformed"  # breaks an HLO rule (XLA's verifier would reject it)
    UNSUPPORTED = "unsupported"  # valid HLO that the stage does not handle
    INTERNAL = "internal error"  # a defect of ours, stopped at the stage's boundary


@dataclass(frozen=True)
class Refusal:
    kind: enum.Enum  # a member of RefusalKind or of another stage's enum of kinds
    detail: str

    def __str__(self) -> str:
        return f"{kind_text(self.kind)}: {self.detail}"


def kind_text(kind: enum.Enum) -> str:
    """A kind of refusal in words: its value when that is text, else its name."""
    return kind.value if isinstance(kind.value, str) else kind.name.lower().replace("_", " ")


def internal(exc: BaseException) -> Refusal:
    """The refusal of a defect of ours (logged with its traceback)."""
    defects.debug("internal error: %s: %s", type(exc).__name__, exc, exc_info=exc)
    return Refusal(RefusalKind.INTERNAL, f"{type(exc).__name__}: {exc}")
