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
from .plan import CanStitch, Decision, ExplorerRefusal, FusionPlan, Pattern


def connected_region_plan(graph: OpGraph, can_stitch: CanStitch,
                          dag: KernelDag | None = None,
                          ask_ahead: Callable[[list[list[str]]], None] | None = None
                          ) -> FusionPlan:
    """``dag`` is the graph's kernel DAG when the caller already has one (the beam explorer
    does). ``ask_ahead``, when given, is told the patterns a run asks next if the pattern
    being asked builds, and if not (query workers start on them meanwhile)."""
    dag = dag or KernelDag(graph)

    def _check(nodes: list[str]) -> Decision:
        if dag.creates_cycle(frozenset(nodes)):
            return Decision(tuple(nodes), ExplorerRefusal.CYCLE, "cycle: a path leaves the "
                            "pattern and re-enters it through another kernel")
        refusal = can_stitch(nodes)
        if refusal is None:
            return Decision(tuple(nodes), None, "buildable")
        return Decision(tuple(nodes), refusal.kind, f"code generator: {refusal.detail}")

    patterns: list[Pattern] = []
    decisions: list[Decision] = []
    depth = opaque_depth(graph)
    parts: list[list[str]] = []  # parts of regions that are not one pattern
    for region in memory_intensive_regions(graph):
        if len(region) < 2:
            continue
        decision = _check(region)
        decisions.append(decision)
        if decision.ok:
            patterns.append(Pattern(region, "connected memory-intensive region"))
            continue
        levels = _levels(region, depth)
        if len(levels) == 1:
            parts.append(region)
            continue
        for level in levels:
            if len(level) < 2:
                continue
            decision = _check(level)
            decisions.append(decision)
            if decision.ok:
                patterns.append(Pattern(level, "the kernels of its region with as many "
                                               "opaque kernels before them"))
            else:
                parts.append(level)
    for part in parts:
        patterns += [Pattern(run, "longest buildable run of its region")
                     for run in _buildable_runs(part, _check, dag, decisions, ask_ahead)]
    patterns.sort(key=lambda p: dag.order[p.nodes[0]])
    # Each pattern is acyclic; runs of different regions can still interlock. Where they do,
    # a run is cut in two where it can be built so, else left to XLA.
    reasons: dict[frozenset[str], str] = {frozenset(p.nodes): p.reason for p in patterns}

    def buildable(nodes: frozenset[str]) -> bool:
        decision = _check(sorted(nodes, key=dag.order.__getitem__))
        reasons[nodes] = ("part of a run cut where the plan's kernels formed a cycle (a path "
                          f"from each to the next): {decision.reason}")
        return decision.ok

    kernels, split = dag.split_cycles(list(reasons), [[k] for k in reasons], buildable)
    for nodes in split:
        decisions.append(Decision(tuple(sorted(nodes, key=dag.order.__getitem__)),
                                  ExplorerRefusal.PLAN_CYCLE,
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


def _buildable_runs(part: list[str], check: Callable[[list[str]], Decision], dag: KernelDag,
                    decisions: list[Decision],
                    ask_ahead: Callable[[list[list[str]]], None] | None) -> list[list[str]]:
    """``part`` (in topological order) cut greedily into the longest buildable runs of two or
    more kernels. A run grows by a step that doubles while the grown run builds and halves
    when it does not, down to one kernel: a run of k kernels is asked about O(k log k)
    kernels in all (O(k) where it builds to the part's end), where growing one kernel at a
    time asked O(k^2) (a chain of 1,100 unrolled key derivations of paper-size BERT was still
    growing after 20 minutes)."""
    runs: list[list[str]] = []
    current, i, step = part[:1], 1, 1
    while i < len(part):
        take = part[i:i + step]
        if ask_ahead is not None:  # what is asked next, whether this builds or not
            following = [current + part[i:i + len(take) + 2 * step]] \
                if i + len(take) < len(part) else []
            if len(take) > 1:
                following.append(current + take[:len(take) // 2])
            elif i + 1 < len(part):
                following.append(part[i:i + 2])
            ask_ahead([p for p in following if not dag.creates_cycle(frozenset(p))])
        decision = check(current + take)
        decisions.append(decision)
        if decision.ok:
            current, i, step = current + take, i + len(take), 2 * step
        elif len(take) > 1:
            step = len(take) // 2
        else:
            if len(current) > 1:
                runs.append(current)
            current, i, step = [part[i]], i + 1, 1
    if len(current) > 1:
        runs.append(current)
    return runs


def _levels(region: list[str], depth: dict[str, int]) -> list[list[str]]:
    """The kernels of ``region`` grouped by opaque depth, each group in topological order."""
    levels: dict[int, list[str]] = {}
    for name in region:
        levels.setdefault(depth[name], []).append(name)
    return list(levels.values())


def sure_queries(graph: OpGraph, dag: KernelDag) -> list[frozenset[str]]:
    """Patterns ``connected_region_plan`` asks the code generator about whatever it answers:
    each region of two or more kernels, or where the region has a cycle, each of its levels
    of two or more kernels that has none."""
    depth = opaque_depth(graph)
    sure = []
    for region in memory_intensive_regions(graph):
        if len(region) < 2:
            continue
        if not dag.creates_cycle(frozenset(region)):
            sure.append(frozenset(region))
            continue
        levels = _levels(region, depth)
        if len(levels) > 1:
            sure += [frozenset(level) for level in levels
                     if len(level) > 1 and not dag.creates_cycle(frozenset(level))]
    return sure
