"""FusionPlan: disjoint patterns of op-graph nodes, each to become one stitched kernel."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..graph import OpGraph


@dataclass(frozen=True)
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


def creates_cycle(graph: OpGraph, pattern: Iterable[str]) -> bool:
    """Would making ``pattern`` one kernel create a cycle (paper Figure 6)? True when a path
    leaves the pattern and comes back through an outside node."""
    inside = set(pattern)
    # A bitcast or get-tuple-element of pattern values launches nothing: it is part of the
    # pattern, not an outside node a path could leave through.
    for node in graph.nodes.values():  # topological order
        if not node.is_kernel and node.operands and all(o in inside for o in node.operands):
            inside.add(node.name)
    frontier = [u for n in inside for u in graph.nodes[n].users if u not in inside]
    seen = set(frontier)
    while frontier:
        name = frontier.pop()
        for user in graph.nodes[name].users:
            if user in inside:
                return True
            if user not in seen:
                seen.add(user)
                frontier.append(user)
    return False
