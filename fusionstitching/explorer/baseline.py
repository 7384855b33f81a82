"""The baseline strategy ("greedy"): one pattern per connected memory-intensive region.

Each connected region of memory-intensive kernels becomes one pattern if the code generator
can build it and it creates no cycle; otherwise the region is cut at its opaque depths (the
kernels with as many GEMMs on their paths; `graph.traffic.opaque_depth`), a cut no cycle
through a GEMM crosses, and each part that still cannot be one pattern greedily in
topological order into the longest buildable runs. The paper's explorer (approximate DP + beam search)
replaces this; the baseline stays selectable for comparison.
"""
from __future__ import annotations

from collections.abc import Callable

from ..graph import OpGraph
from ..graph.traffic import memory_intensive_regions, opaque_depth
from .index import KernelDag
from .plan import Decision, FusionPlan, Pattern

CanStitch = Callable[[list[str]], tuple[bool, str]]


def connected_region_plan(graph: OpGraph, can_stitch: CanStitch,
                          dag: KernelDag | None = None) -> FusionPlan:
    """``dag`` is the graph's kernel DAG when the caller already has one (the beam explorer
    does)."""
    dag = dag or KernelDag(graph)

    def _check(nodes: list[str]) -> tuple[bool, str]:
        if dag.creates_cycle(frozenset(nodes)):
            return False, "cycle: a path leaves the pattern and re-enters it through another kernel"
        return can_stitch(nodes)

    patterns: list[Pattern] = []
    decisions: list[Decision] = []
    depth = opaque_depth(graph)
    parts: list[list[str]] = []  # parts of regions that are not one pattern
    for region in memory_intensive_regions(graph):
        if len(region) < 2:
            continue
        ok, reason = _check(region)
        decisions.append(Decision(tuple(region), ok, reason))
        if ok:
            patterns.append(Pattern(region, f"connected memory-intensive region: {reason}"))
            continue
        levels: dict[int, list[str]] = {}
        for name in region:
            levels.setdefault(depth[name], []).append(name)
        if len(levels) == 1:
            parts.append(region)
            continue
        for level in levels.values():
            if len(level) < 2:
                continue
            ok, reason = _check(level)
            decisions.append(Decision(tuple(level), ok, reason))
            if ok:
                patterns.append(Pattern(level, f"the kernels of its region with as many "
                                               f"opaque kernels before them: {reason}"))
            else:
                parts.append(level)
    for part in parts:
        current: list[str] = []
        for name in part:  # in topological order
            candidate = current + [name]
            ok, reason = _check(candidate) if current else (True, "")
            if current:
                decisions.append(Decision(tuple(candidate), ok, reason))
            if ok:
                current = candidate
                continue
            if len(current) > 1:
                patterns.append(Pattern(current, "longest buildable run of its region"))
            current = [name]
        if len(current) > 1:
            patterns.append(Pattern(current, "longest buildable run of its region"))
    patterns.sort(key=lambda p: dag.order[p.nodes[0]])
    # Each pattern is acyclic; runs of different regions can still interlock. Where they do,
    # a run is cut in two where it can be built so, else left to XLA.
    reasons: dict[frozenset[str], str] = {frozenset(p.nodes): p.reason for p in patterns}

    def buildable(nodes: frozenset[str]) -> bool:
        ok, reason = _check(sorted(nodes, key=dag.order.__getitem__))
        reasons[nodes] = ("part of a run cut where the plan's kernels formed a cycle (a path "
                          f"from each to the next): {reason}")
        return ok

    kernels, split = dag.split_cycles(list(reasons), [[k] for k in reasons], buildable)
    for nodes in split:
        decisions.append(Decision(tuple(sorted(nodes, key=dag.order.__getitem__)), False,
                                  "cut: with other kernels of the plan it forms a cycle (a "
                                  "path from each to the next)"))
    # each run in its place, or the parts it was cut into (each inside one run)
    run_of = {n: i for i, p in enumerate(patterns) for n in p.nodes}
    parts: dict[int, list[list[str]]] = {}
    for kernel in kernels:
        if len(kernel) > 1:
            nodes = sorted(kernel, key=dag.order.__getitem__)
            parts.setdefault(run_of[nodes[0]], []).append(nodes)
    patterns = [Pattern(nodes, reasons[frozenset(nodes)])
                for i in range(len(patterns))
                for nodes in sorted(parts.get(i, ()), key=lambda n: dag.order[n[0]])]
    return FusionPlan("greedy", patterns, decisions)
