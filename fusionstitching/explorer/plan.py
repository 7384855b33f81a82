"""FusionPlan: disjoint patterns of op-graph nodes, each to become one stitched kernel; the
decisions that led to it, each refusal with its kind."""
from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from ..graph.refusal import Refusal

# The code generator's capability query, as XLA's CanFuse: None when it can build ``nodes`` as
# one kernel, else why not (the kind is its own enum's).
CanStitch = Callable[[list[str]], Refusal | None]


class ExplorerRefusal(enum.Enum):
    """Why the explorer itself rejects a candidate pattern or pack."""
    CYCLE = "a path leaves the pattern and re-enters it through an outside kernel"
    PLAN_CYCLE = "a cycle with another kernel of the plan"
    TOO_LARGE = "more kernels than a pattern may hold"
    NOT_TOP_K = "not among the top-k candidates (delta-evaluator)"
    NO_GAIN = "no gain by the delta-evaluator (f <= 0)"
    NOT_FASTER = "modeled no faster than its parts apart"


@dataclass(frozen=True, slots=True)  # slots: a 10^5-node exploration makes ~10^6 of them
class Decision:
    """One fusion decision, as XLA's FusionDecision: ``explain`` shows these."""

    nodes: tuple[str, ...]  # the candidate pattern
    kind: enum.Enum | None  # None: accepted; else the refusal's kind (``explain`` groups by it)
    reason: str  # the decision in words, with its numbers

    @property
    def ok(self) -> bool:
        return self.kind is None


@dataclass
class Pattern:
    nodes: list[str]  # op-graph node names in topological order
    reason: str  # why these nodes are one kernel


@dataclass
class FusionPlan:
    strategy: str
    patterns: list[Pattern]  # only patterns of two or more kernels: the rest stays XLA's
    decisions: list[Decision] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # plan-level choices (beams, modeled times)

    def stitched_nodes(self) -> set[str]:
        return {n for p in self.patterns for n in p.nodes}
