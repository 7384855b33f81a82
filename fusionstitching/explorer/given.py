"""A plan given from outside: the patterns the explorer chose for a module of the same
structure at other sizes (a partial last batch, another sequence length), each asked of the
code generator again at this module's sizes. The whole plan is taken or refused: a node it
names that the graph lacks, a pattern that forms a cycle here, or one the code generator now
refuses, and the explorer plans the module afresh (a pattern alone could be a worse plan).
"""
from __future__ import annotations

import enum

from ..graph import OpGraph
from ..graph.refusal import Refusal
from .index import KernelDag
from .plan import CanStitch, Decision, FusionPlan, Pattern


class GivenRefusal(enum.Enum):
    """Why a given plan is not this module's."""
    UNKNOWN_NODE = "a node of the given plan is not in this module"
    CYCLE = "a given pattern forms a cycle in this module"
    REFUSED = "the code generator refuses a given pattern at this module's sizes"


def given_plan(graph: OpGraph, patterns: list[list[str]], can_stitch: CanStitch,
               source: str) -> FusionPlan | Refusal:
    """``patterns`` as this graph's plan, or why not. ``source`` says whose plan it was."""
    dag = KernelDag(graph)
    for nodes in patterns:
        missing = [n for n in nodes if n not in graph.nodes or not graph.nodes[n].is_kernel]
        if missing:
            return Refusal(GivenRefusal.UNKNOWN_NODE, f"{missing[0]} ({len(nodes)} kernels)")
        if dag.creates_cycle(frozenset(nodes)):
            return Refusal(GivenRefusal.CYCLE, ", ".join(nodes[:4]))
    decisions = []
    for nodes in patterns:
        refusal = can_stitch(list(nodes))
        if refusal is not None:
            return Refusal(GivenRefusal.REFUSED, f"{', '.join(nodes[:4])}: {refusal}")
        decisions.append(Decision(tuple(nodes), None, f"given: {source}"))
    return FusionPlan("given", [Pattern(list(nodes), f"given: {source}") for nodes in patterns],
                      decisions=decisions, notes=[f"given: the patterns of {source}"])
