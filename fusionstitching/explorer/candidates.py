"""Candidate patterns (paper 5.2, search.py's point 1): PatternReduction per vertex, the top-k
by the delta-evaluator's f with its bound, and the ones the code generator builds. A part of
the Explorer (search.py), which holds the state it reads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from operator import itemgetter

import costmodel

from .plan import ExplorerRefusal

TOP_K = 3  # paper 5.2
BUILD_TRIES = 2 * TOP_K  # can_stitch queries per vertex beyond the accepted ones


@dataclass(frozen=True, slots=True)
class Candidate:
    nodes: frozenset[str]
    score: float  # delta-evaluator f, us (modeled)


class CandidatePatterns:
    """Point 1 of the Explorer: its index, cost model, caches and decisions are the
    Explorer's (search.py)."""

    def _top_k(self, joins: list[tuple[frozenset[str], frozenset[str], frozenset[str]]],
               cache: dict) -> list[Candidate]:
        """The top-k acyclic candidates among ``joins`` by f, scoring in order of f's bound.
        A join (s, a, b) is a set s = a | b of two acyclic patterns, a one whose facts are
        known (a kept candidate or one kernel), so s's facts and cycle check only look at
        what b adds. ``cache`` holds, per set, [bound, traffic, f or None, a, b, facts or
        None]. Every set holds the vertex and kernels after it, so ties in the bound are
        broken by size alone (then by the order of ``joins``: the sort is stable)."""
        bounded = []
        listed = set()
        for s, a, b in joins:
            if s in listed:
                continue
            listed.add(s)
            entry = cache.get(s)
            if entry is None:
                if len(s) > self.max_pattern:
                    self.decide(s, ExplorerRefusal.TOO_LARGE,
                                f"more than {self.max_pattern} kernels")
                    entry = cache[s] = None
                    continue
                traffic = self.index.traffic(s, a, self._traffic[a])
                bound = (self.evaluator.reduced_mem_us(traffic[2], traffic[3])
                         + (len(s) - 1) * costmodel.LAUNCH_US)
                entry = cache[s] = [bound, traffic, None, a, b, None]
            bounded.append((-entry[0], len(s), s))
        bounded.sort(key=itemgetter(0, 1))
        kept: list[Candidate] = []
        for position, (negative_bound, _, s) in enumerate(bounded):
            if len(kept) == self.top_k and -negative_bound <= kept[-1].score:
                for _, _, rest in bounded[position:]:
                    if rest not in self._latest:
                        self.decide(rest, ExplorerRefusal.NOT_TOP_K,
                                    f"not in the top {self.top_k}: f <= {cache[rest][0]:.3f} "
                                    f"us (bound) <= {kept[-1].score:.3f}")
                break
            entry = cache[s]
            score = entry[2]
            if score is None:
                score = entry[2] = self._score(s, entry)
            if score == float("-inf"):
                continue
            if len(kept) == self.top_k and score <= kept[-1].score:
                self.decide(s, ExplorerRefusal.NOT_TOP_K,
                            f"not in the top {self.top_k}: f = {score:.3f} us")
                continue
            kept.append(Candidate(s, score))
            self._traffic[s], self._facts[s] = entry[1], entry[5]  # later joins start here
            kept.sort(key=lambda c: -c.score)
            self.decide(s, None, f"candidate: f = {score:+.3f} us (delta-evaluator)")
            if len(kept) > self.top_k:
                dropped = kept.pop()
                self.decide(dropped.nodes, ExplorerRefusal.NOT_TOP_K,
                            f"not in the top {self.top_k}: f = {dropped.score:.3f} us")
        return kept

    def _score(self, s: frozenset[str], entry: list) -> float:
        """f of one candidate, -inf when it is cyclic: T_reduced_mem + T_reduced_calls -
        max(0, T_penalty(P) - sum of T_penalty({v})), the penalty relative to the kernels
        alone (their own time above the memory floor is not fusion's cost), so f is at most
        the bound that needs only the pattern's bytes."""
        bound, traffic, _, a, b, _ = entry
        if self.index.joins_cycle(a, b, s):
            self.decide(s, ExplorerRefusal.CYCLE, "cycle: a path leaves the pattern and "
                                                  "re-enters it through an outside kernel")
            return float("-inf")
        facts = entry[5] = self.model.gather(s, a, self._facts[a])
        # fsum: exact, so the score does not depend on the set's iteration order (string
        # hashing differs per process) and plans are the same on every run.
        alone_penalty = math.fsum(map(self._alone.__getitem__, s))
        # the bound is T_reduced_mem + T_reduced_calls
        return bound - max(0.0, self._penalty_us(traffic, facts) - alone_penalty)

    def pattern_reduction(self, vertex: str) -> list[Candidate]:
        """PatternReduction(C_vertex): top-k candidates with ``vertex`` as producer; every
        candidate kept at any level of the divide and conquer is returned (best first)."""
        consumers = self.index.consumers[vertex]
        cache: dict = {}
        pool: dict[frozenset[str], Candidate] = {}
        alone = frozenset((vertex,))

        def reduce(group: list[str]) -> list[Candidate]:
            if len(group) == 1:
                c = frozenset(group)
                joins = [(c | alone, c, alone)] + [(cand.nodes | alone, cand.nodes, alone)
                                                   for cand in self.growth.get(group[0], ())]
            else:
                half = len(group) // 2
                left, right = reduce(group[:half]), reduce(group[half:])
                # already in ``cache``: each joined with itself
                joins = [(x.nodes, x.nodes, x.nodes) for x in left + right]
                for x in left:
                    for y in right:
                        a, b = (x.nodes, y.nodes) if len(x.nodes) >= len(y.nodes) \
                            else (y.nodes, x.nodes)
                        joins.append((a | b, a, b))
            kept = self._top_k(joins, cache)
            pool.update((c.nodes, c) for c in kept)
            return kept

        self.growth[vertex] = reduce(consumers) if consumers else []
        return sorted(pool.values(), key=lambda c: -c.score)

    def speculative_candidates(self, vertex: str) -> list[frozenset[str]]:
        """The candidates ``buildable_candidates`` would ask first of a vertex not reached yet,
        as far as the growth of its consumers is known now: ``pattern_reduction`` without
        its decisions or growth."""
        self._deciding = False
        try:
            pool = self.pattern_reduction(vertex)
        finally:
            self._deciding = True
            del self.growth[vertex]
        return [c.nodes for c in pool if c.score > 0][:self.top_k]

    def buildable_candidates(self, vertex: str, pool: list[Candidate]) -> list[Candidate]:
        """The best ``top_k`` of ``pool`` with f > 0 that the code generator can build; when
        fewer, refused candidates without their reductions in other spaces (``other_space``)
        make up the rest."""
        ready: list[Candidate] = []
        refused: list[Candidate] = []
        tries = 0
        # the most that may be asked, in the order they would be
        asked = [c.nodes for c in pool if c.score > 0][:self.top_k + BUILD_TRIES]
        for cand in pool:
            if len(ready) == self.top_k or tries >= self.top_k + BUILD_TRIES:
                break
            if cand.score <= 0:
                self.decide(cand.nodes, ExplorerRefusal.NO_GAIN,
                            f"no gain: f = {cand.score:+.3f} us <= 0")
                continue
            tries += 1
            self._ahead(asked[tries - 1:])
            refusal = self.can_stitch(cand.nodes)
            if refusal is None:
                ready.append(cand)
                self.decide(cand.nodes, None, f"buildable, f = {cand.score:+.3f} us")
            else:
                refused.append(cand)
                self.decide(cand.nodes, refusal.kind, f"code generator: {refusal.detail}")
        self._ahead([])  # the rest will not be asked
        listed = {c.nodes for c in pool}
        for cand in refused:
            if len(ready) == self.top_k or self.other_space is None:
                break
            part = self._without_other_spaces(vertex, cand.nodes)
            if part is None or part.nodes in listed:
                continue
            listed.add(part.nodes)
            refusal = self.can_stitch(part.nodes)
            if refusal is None:
                ready.append(part)
                self.decide(part.nodes, None, f"buildable without the reductions in other "
                                              f"spaces, f = {part.score:+.3f} us")
            else:
                self.decide(part.nodes, refusal.kind, f"code generator: {refusal.detail}")
        return ready

    def _ahead(self, patterns: list[frozenset[str]], next_up: bool = True) -> None:
        """Tell ``ask_ahead`` patterns to be asked (those not asked before): ``next_up``, the
        ones asked next, else ones asked later."""
        if self.ask_ahead is not None:
            self.ask_ahead([list(self._names(p)) for p in patterns
                            if p not in self._buildable], next_up)

    def _without_other_spaces(self, vertex: str, nodes: frozenset[str]) -> Candidate | None:
        """The part of ``nodes`` joined to ``vertex`` once the nodes reducing outside the main
        reduction space are left out (a row-wise loss's sum over rows beside the rows' own
        reductions); None when nothing is left out, or the part gains nothing."""
        drop = set(self.other_space(list(self._names(nodes))))
        if not drop or vertex in drop:
            return None
        kept = nodes - drop
        part, stack = {vertex}, [vertex]
        while stack:
            n = stack.pop()
            for m in (*self.index.succs[n], *self.index.preds[n]):
                if m in kept and m not in part:
                    part.add(m)
                    stack.append(m)
        part = frozenset(part)
        if len(part) < 2 or self.index.creates_cycle(part):
            return None
        score = self.score(part)
        return Candidate(part, score) if score > 0 else None

    def score(self, nodes: frozenset[str]) -> float:
        """f of any acyclic pattern, counted from scratch (``_score`` counts a join)."""
        traffic = self.traffic(nodes)
        if nodes not in self._facts:
            self._facts[nodes] = self.model.gather(nodes)
        bound = (self.evaluator.reduced_mem_us(traffic[2], traffic[3])
                 + (len(nodes) - 1) * costmodel.LAUNCH_US)
        alone_penalty = math.fsum(map(self._alone.__getitem__, nodes))
        return bound - max(0.0, self._penalty_us(traffic, self._facts[nodes]) - alone_penalty)
