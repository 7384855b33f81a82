"""Neighbour merge: the chosen plan's kernels joined in pairs where one feeds the other.

Candidates grow from a kernel towards its consumers only, so two patterns that meet at a
consumer never become one candidate: a softmax's forward reductions and the backward kernel
that reads both the logits and their row maximum stay two kernels that each read the logits.
After the choice, every pair of the plan's kernels joined by an edge is tried, the most
global bytes saved first; the union is taken when it closes no cycle, the code generator
builds it and the latency-evaluator models it faster than the pair. Repeats until no pair
merges.
"""
from __future__ import annotations

from .plan import ExplorerRefusal


def merge_neighbours(explorer, kernels: list[frozenset[str]]
                     ) -> tuple[list[frozenset[str]], list[list[frozenset[str]]]]:
    """The plan's ``kernels`` (every memory-intensive kernel, disjoint) after merging, and
    for each the kernels of ``kernels`` it is made of. ``explorer``: the search.Explorer
    that chose the plan (its traffic, cycle checks, code generator queries and prices)."""
    parts = {kernel: [kernel] for kernel in kernels}
    tried: set[frozenset[str]] = set()
    while True:
        for a, b in _pairs_by_saving(explorer, list(parts), tried):
            union = a | b
            tried.add(union)
            if _merge(explorer, a, b, union, [k for k in parts if k not in (a, b)]):
                parts[union] = parts.pop(a) + parts.pop(b)
                break
        else:
            return list(parts), list(parts.values())


def _pairs_by_saving(explorer, kernels: list[frozenset[str]],
                     tried: set[frozenset[str]]) -> list[tuple[frozenset[str], frozenset[str]]]:
    """Kernels joined by an edge whose union moves fewer global bytes, most saved first."""
    owner = {n: k for k in kernels for n in k}
    pairs = {}
    for a in kernels:
        for n in a:
            for succ in explorer.index.succs[n]:
                b = owner.get(succ)
                if b is None or b is a or (a | b) in tried or (a | b) in pairs \
                        or explorer.refused(a | b):  # its reason is already decided
                    continue
                if len(a) + len(b) > explorer.max_pattern:
                    continue
                saved = sum(explorer.traffic(a)[:2]) + sum(explorer.traffic(b)[:2]) \
                    - sum(explorer.traffic(a | b)[:2])
                if saved > 0:
                    pairs[a | b] = (saved, a, b)
    ordered = sorted(pairs.values(), key=lambda p: (-p[0], sorted(p[1] | p[2])))
    return [(a, b) for _, a, b in ordered]


def _merge(explorer, a: frozenset[str], b: frozenset[str], union: frozenset[str],
           others: list[frozenset[str]]) -> bool:
    if explorer.index.creates_cycle(union):
        explorer.decide(union, ExplorerRefusal.CYCLE,
                        "neighbour merge: a cycle through an outside kernel")
        return False
    if explorer.cycle_with(union, others):
        explorer.decide(union, ExplorerRefusal.PLAN_CYCLE,
                        "neighbour merge: a cycle with another kernel of the plan")
        return False
    refusal = explorer.can_stitch(union)
    if refusal is not None:
        explorer.decide(union, refusal.kind,
                        f"neighbour merge: code generator: {refusal.detail}")
        return False
    merged_us = explorer.latency_us(union)
    separate_us = explorer.latency_us(a) + explorer.latency_us(b)
    if merged_us >= separate_us:
        explorer.decide(union, ExplorerRefusal.NOT_FASTER, f"neighbour merge: {merged_us:.3f} "
                        f"us >= separate {separate_us:.3f} us (modeled)")
        return False
    explorer.decide(union, None, f"neighbour merge: {merged_us:.3f} us < {separate_us:.3f} us "
                                 "separate (modeled)")
    return True
