"""FusionPlan: disjoint patterns of op-graph nodes, each to become one stitched kernel."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)  # slots: a 10^5-node exploration makes ~10^6 of them
class Decision:
    """One fusion decision with its reason, as XLA's FusionDecision: ``explain`` shows these."""

    nodes: tuple[str, ...]  # the candidate pattern
    ok: bool
    reason: str


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
