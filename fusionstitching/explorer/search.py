"""The paper's fusion explorer (section 5): candidate patterns, beam search, remote fusion.

1. Candidate patterns (5.2, candidates.py): per vertex in post-order, PatternReduction's top-k
   by the delta-evaluator's f (its penalty taken relative to the unfused kernels), cyclic ones
   dropped, the buildable ones asked of the code generator (``can_stitch``).
2. Beam search (5.3): vertices in topological order, ``beam_width`` beams of disjoint patterns.
3. Remote fusion (Figure 5): launch-bound kernels packed left to right where that is faster.
4. Choice: the beams', XLA's, the connected-region and the mixed plan by modeled time, then the
   neighbour merge (neighbours.py). Every candidate gets a Decision (``explain``).
"""
from __future__ import annotations

import enum
import gc
import math
from bisect import bisect_left
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from operator import itemgetter

import costmodel
from costmodel import GpuPricing, KernelProfile

from ..graph import OpGraph
from ..graph.refusal import Refusal
from ..graph.traffic import connected_components
from .baseline import connected_region_plan, sure_queries
from .candidates import TOP_K, Candidate, CandidatePatterns
from .index import GraphIndex
from .neighbours import merge_neighbours
from .plan import CanStitch, Decision, ExplorerRefusal, FusionPlan, Pattern
from .pattern_model import PatternModel

ProfileOf = Callable[[list[str]], KernelProfile]
# The nodes of a pattern whose reductions lie outside its main reduction space.
OtherSpace = Callable[[list[str]], list[str]]
# Told patterns the explorer will ask ``can_stitch``, in order (they may be built side by side
# before they are asked): with True, the ones asked next; with False, ones asked later.
AskAhead = Callable[[list[list[str]], bool], None]

BEAM_WIDTH = 3  # paper 5.3
# Vertices whose candidates are looked ahead at (``speculative_candidates``) while one's are
# asked, so that query workers have patterns to build.
SPECULATED_VERTICES = 2
MAX_PATTERN_KERNELS = 16  # bounds each candidate's cost (the synthetic bench's best cap)


@contextmanager
def _collector_paused():
    """The cyclic collector paused while the explorer runs: its millions of small objects
    are freed by reference counting, and the collector would only rescan the growing heap.
    On resuming, ``gc.freeze`` then ``gc.unfreeze`` hand them to the oldest generation at
    once, instead of a first collection scanning them all (a process's own frozen
    generation, from ``gc.freeze`` before a fork, is kept: then the collector scans)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


@dataclass
class _Beam:
    score: float
    # Topological positions of the covered nodes at or after the vertex where the beam last
    # took a candidate, sorted: the nodes at or after any later vertex are a suffix found by
    # bisection, and the tuple itself identifies the state.
    pending: tuple[int, ...]
    chosen: tuple | None  # (Candidate, parent chain)

    def patterns(self) -> list[Candidate]:
        out, link = [], self.chosen
        while link is not None:
            out.append(link[0])
            link = link[1]
        return out[::-1]


class Explorer(CandidatePatterns):
    def __init__(self, graph: OpGraph, can_stitch: CanStitch, device, top_k: int = TOP_K,
                 beam_width: int = BEAM_WIDTH, max_pattern: int = MAX_PATTERN_KERNELS,
                 profile_of: ProfileOf | None = None, other_space: OtherSpace | None = None,
                 ask_ahead: AskAhead | None = None, pricing=None):
        self.graph, self.device = graph, device
        # what prices kernels and packs: the latency-evaluator of ``device``, or a CPU's model
        self.pricing = pricing or GpuPricing(device)
        self.top_k, self.beam_width, self.max_pattern = top_k, beam_width, max_pattern
        self.profile_of = profile_of
        self.other_space = other_space
        self.ask_ahead = ask_ahead
        self.evaluator = costmodel.delta.delta_evaluator(device)
        self._can_stitch = can_stitch
        self._buildable: dict[frozenset[str], Refusal | None] = {}
        self._named: dict[frozenset[str], tuple[str, ...]] = {}
        # GraphIndex.traffic and PatternModel.gather of the patterns later ones grow from
        # (each kernel alone, kept candidates) and, for traffic, of the kernels of every plan
        # priced (every beam's, XLA's and the connected-region baseline's).
        self._traffic: dict[frozenset[str], tuple[int, int, int, int]] = {}
        self._facts: dict[frozenset[str], tuple] = {}
        self._profiles: dict[frozenset[str], KernelProfile] = {}  # of kernels in plans
        self._latency: dict[frozenset[str], float] = {}
        self._packs: dict[tuple, tuple[bool, float, str]] = {}  # remote fusion's verdicts
        # The kernels each candidate or pack reaches and is reached from (``cycle_with``).
        self._reach: dict[frozenset[str], tuple[frozenset[str], frozenset[str]]] = {}
        # T_penalty by (bytes read, bytes written, gathered facts): the penalty depends on
        # nothing else, and layers of a model repeat the same kernels (8 in 10 of the
        # synthetic bench's penalties are repeats).
        self._penalties: dict[tuple, float] = {}
        with _collector_paused():
            self.index = GraphIndex(graph)
            self.model = PatternModel(self.index)
            # The delta-evaluator's penalty of each kernel alone (f is relative to it).
            self._alone = {}
            for n in self.index.participants:
                single = frozenset((n,))
                facts = self._facts[single] = self.model.gather(single)
                self._alone[n] = self._penalty_us(self.traffic(single), facts)
        # Decisions as (pattern, kind, reason), kind None when accepted: the latest per
        # pattern and all of them in order; ``run`` turns them into ``Decision``s (nodes in
        # topological order) once.
        self._latest: dict[frozenset[str], tuple[enum.Enum | None, str]] = {}
        self._history: list[tuple[frozenset[str], enum.Enum | None, str]] = []
        self.decisions: dict[frozenset[str], Decision] = {}  # the latest, after ``run``
        self._deciding = True  # False while candidates are only looked ahead at
        self._sure: list[frozenset[str]] = []  # patterns asked whatever the search finds
        self.growth: dict[str, list[Candidate]] = {}
        self.ready: dict[str, list[Candidate]] = {}

    # -- helpers ---------------------------------------------------------------------------

    def _names(self, nodes: frozenset[str]) -> tuple[str, ...]:
        """``nodes`` in topological order, sorted once per pattern (the code generator's
        query and the pattern's decisions both name it so)."""
        names = self._named.get(nodes)
        if names is None:
            names = self._named[nodes] = tuple(sorted(nodes, key=self.index.order.__getitem__))
        return names

    def decide(self, nodes: frozenset[str], kind: enum.Enum | None, reason: str) -> None:
        """Record a decision on ``nodes``: accepted when ``kind`` is None, else refused."""
        if not self._deciding:
            return
        self._latest[nodes] = (kind, reason)
        self._history.append((nodes, kind, reason))

    def can_stitch(self, nodes: frozenset[str]) -> Refusal | None:
        """The code generator's answer (None: it builds ``nodes``), asked once per pattern."""
        if nodes in self._buildable:
            return self._buildable[nodes]
        refusal = self._buildable[nodes] = self._can_stitch(list(self._names(nodes)))
        return refusal

    def refused(self, nodes: frozenset[str]) -> bool:
        """Whether the code generator was asked about ``nodes`` and refused."""
        return self._buildable.get(nodes) is not None

    def latency_us(self, nodes: frozenset[str]) -> float:
        """Modeled time of one kernel made of ``nodes`` (``pricing``)."""
        t = self._latency.get(nodes)
        if t is None:
            t = self._latency[nodes] = self.pricing.kernel_us(self._profile(nodes))
        return t

    def _profile(self, nodes: frozenset[str]) -> KernelProfile:
        profile = self._profiles.get(nodes)
        if profile is None:
            profile = self._profiles[nodes] = (
                self.model.profile(nodes, self.traffic(nodes), self._facts.get(nodes))
                if self.profile_of is None
                else self.profile_of(list(self._names(nodes))))
        return profile

    def traffic(self, nodes: frozenset[str]) -> tuple[int, int, int, int]:
        """``GraphIndex.traffic`` of ``nodes``, computed once per pattern."""
        traffic = self._traffic.get(nodes)
        if traffic is None:
            traffic = self._traffic[nodes] = self.index.traffic(nodes)
        return traffic

    def _penalty_us(self, traffic, facts) -> float:
        """The delta-evaluator's T_penalty of the kernel with ``traffic`` and gathered
        ``facts`` (PatternModel.gather)."""
        key = (traffic[0], traffic[1], facts)
        penalty = self._penalties.get(key)
        if penalty is None:
            grid, block, smem, instructions = self.model.launch(facts, traffic[0], traffic[1])
            penalty = self._penalties[key] = self.evaluator.penalty_us(
                grid, block, smem, instructions, traffic[0] + traffic[1])
        return penalty

    # -- 2. beam search ---------------------------------------------------------------------

    def beam_search(self) -> list[list[Candidate]]:
        order = self.index.order
        beams = [_Beam(0.0, (), None)]
        for vertex in self.index.participants:
            options = self.ready.get(vertex)
            if not options:
                continue
            here = order[vertex]
            placed = [tuple(sorted(map(order.__getitem__, cand.nodes))) for cand in options]
            grown: dict = {}
            for beam in beams:
                grown.setdefault((beam.pending, round(beam.score, 9)), beam)
                first = bisect_left(beam.pending, here)
                live = beam.pending[first:]
                if live and live[0] == here:
                    continue  # the beam already covers the vertex
                taken = set(live)
                for cand, positions in zip(options, placed):
                    if taken.isdisjoint(positions) and not self.cycle_with(
                            cand.nodes, (c.nodes for c in beam.patterns())):
                        new = _Beam(beam.score + cand.score, tuple(sorted(live + positions)),
                                    (cand, beam.chosen))
                        grown.setdefault((new.pending, round(new.score, 9)), new)
            beams = sorted(grown.values(), key=lambda b: -b.score)[:self.beam_width]
        return [b.patterns() for b in beams]

    def cycle_with(self, nodes: frozenset[str], others) -> bool:
        """Whether a pattern or pack (acyclic alone) and one of the plan's ``others`` kernels
        each reach the other: the plan would have to split one of them again (``_acyclic``),
        at a cost the scores do not see (on Transformer train TF, 5 of every beam's patterns;
        on Transformer train JAX, 11 of a beam's kernels in packs). Cycles through three or
        more kernels are left to that split. Each search costs O(V + E), so it is cached and
        asked only of candidates and of packs the latency-evaluator accepted."""
        if len(nodes) < 2:  # a kernel on a cycle with an acyclic pattern enters and leaves it
            return False
        if nodes not in self._reach:
            self._reach[nodes] = (self.index.reachable(nodes),
                                  self.index.reachable(nodes, forward=False))
        below, above = self._reach[nodes]
        return any(not below.isdisjoint(k) and not above.isdisjoint(k) for k in others)

    # -- 3. remote fusion -------------------------------------------------------------------

    def remote_fusion(self, units: list[frozenset[str]]) -> list[list[frozenset[str]]]:
        """Pack launch-bound kernels (units in topological order) left to right."""
        if self.ask_ahead is not None:
            self._ahead(self._likely_packs(units) + self._sure, next_up=False)
        packs: list[list[frozenset[str]]] = []
        current: list[frozenset[str]] = []
        current_us = 0.0
        for unit in units:
            if not self._launch_bound(unit):
                continue
            unit_us = self.latency_us(unit)
            if not current:
                current, current_us = [unit], unit_us
                continue
            parts = (*current, unit)
            verdict = self._packs.get(parts)  # beams share most of their units
            if verdict is None:
                union = frozenset().union(*parts)
                packed_us = self.pricing.packed_us([self._profile(u) for u in parts])
                kind, reason, packed_us = self._pack_check(union, packed_us,
                                                           current_us + unit_us)
                self.decide(union, kind, reason)
                verdict = self._packs[parts] = (kind is None, packed_us, reason)
            ok, packed_us, reason = verdict
            if ok:
                union = frozenset().union(*parts)
                others = [u for u in units if len(u) > 1 and not u <= union] + \
                         [frozenset().union(*pack) for pack in packs]
                if self.cycle_with(union, others):
                    ok = False
                    self.decide(union, ExplorerRefusal.PLAN_CYCLE, "remote fusion: a cycle "
                                "with another kernel of the plan")
                elif self._latest[union][0] is not None:  # refused for a cycle in another plan
                    self.decide(union, None, reason)
            if ok:
                current.append(unit)
                current_us = packed_us
            else:
                if len(current) > 1:
                    packs.append(current)
                current, current_us = [unit], unit_us
        if len(current) > 1:
            packs.append(current)
        return packs

    def _launch_bound(self, unit: frozenset[str]) -> bool:
        """Whether the unit runs for less than its own launch (remote fusion packs these)."""
        return self.latency_us(unit) - self.pricing.launch_us < self.pricing.launch_us

    def _likely_packs(self, units: list[frozenset[str]]) -> list[frozenset[str]]:
        """The packs of two neighbouring launch-bound units that ``remote_fusion`` may ask
        the code generator about: modeled faster than the two apart, and acyclic."""
        bound = [u for u in units if self._launch_bound(u)]
        likely = []
        for a, b in zip(bound, bound[1:]):
            union = a | b
            if (a, b) in self._packs or len(union) > self.max_pattern or union in self._buildable:
                continue
            separate_us = self.latency_us(a) + self.latency_us(b)
            packed_us = self.pricing.packed_us([self._profile(a), self._profile(b)])
            if packed_us < separate_us and not self.index.creates_cycle(union):
                likely.append(union)
        return likely

    def _pack_check(self, union, packed_us, separate_us
                    ) -> tuple[enum.Enum | None, str, float]:
        """(refusal kind or None, reason, modeled us of the pack): ``packed_us`` is the
        estimate from the parts' profiles; once the code generator has built the pack and
        ``profile_of`` prices it, the built kernel's time decides instead."""
        if len(union) > self.max_pattern:
            return (ExplorerRefusal.TOO_LARGE,
                    f"remote fusion: more than {self.max_pattern} kernels", packed_us)
        if packed_us >= separate_us:
            return ExplorerRefusal.NOT_FASTER, (
                f"remote fusion: packed {packed_us:.3f} us >= separate {separate_us:.3f} us "
                "(modeled)"), packed_us
        if self.index.creates_cycle(union):
            return (ExplorerRefusal.CYCLE, "remote fusion: cycle through an outside kernel",
                    packed_us)
        refusal = self.can_stitch(union)
        if refusal is not None:
            return (refusal.kind, f"remote fusion: code generator: {refusal.detail}",
                    packed_us)
        if self.profile_of is not None:
            packed_us = self.latency_us(union)
            if packed_us >= separate_us:
                return ExplorerRefusal.NOT_FASTER, (
                    f"remote fusion: the built pack {packed_us:.3f} us >= separate "
                    f"{separate_us:.3f} us (modeled)"), packed_us
        return None, (f"remote fusion (kernel packing): {packed_us:.3f} us < "
                      f"{separate_us:.3f} us separate (modeled)"), packed_us

    # -- 4. the plan ------------------------------------------------------------------------

    def plan_cost(self, kernels: list[frozenset[str]]) -> tuple[float, int]:
        """(modeled us, bytes) of a plan given as all of its memory-intensive kernels."""
        # fsum: a plan's time does not depend on the order its kernels are listed in
        us = math.fsum(self.latency_us(k) for k in kernels)
        nbytes = sum(sum(self.traffic(k)[:2]) for k in kernels)
        return us, nbytes

    def run(self) -> FusionPlan:
        with _collector_paused():
            return self._explore()

    def _explore(self) -> FusionPlan:
        # The connected-region plan's first queries, asked whatever the search finds.
        self._sure = sure = sure_queries(self.graph, self.index)
        vertices = list(reversed(self.index.participants))
        for i, vertex in enumerate(vertices):
            pool = self.pattern_reduction(vertex)
            if self.ask_ahead is not None:
                upcoming = vertices[i + 1:i + 1 + SPECULATED_VERTICES]
                self._ahead([p for u in upcoming for p in self.speculative_candidates(u)]
                            + sure, next_up=False)
            self.ready[vertex] = self.buildable_candidates(vertex, pool)
            # Producers also grow from what the code generator can build: when every top-k
            # candidate holds an op it refuses, growing only from those would never yield
            # a buildable pattern through this vertex.
            growth = self.growth[vertex]
            growth += [c for c in self.ready[vertex] if c not in growth]
        participants = self.index.participants
        xla = [frozenset((n,)) for n in participants]
        xla_us, xla_bytes = self.plan_cost(xla)
        notes = [f"XLA's plan: {len(xla)} memory-intensive kernels, {xla_bytes} bytes, "
                 f"{xla_us:.3f} us (modeled)"]
        # Every plan as (modeled us, bytes, kernels, label, patterns); the least by that key
        # wins. XLA's plan is one of them ("no negative optimization"), and so is the
        # connected-region plan: the search is approximate, and with it the explorer is never
        # worse than the baseline it replaces, by the model that prices the plans.
        plans = [(xla_us, xla_bytes, len(xla), "XLA's plan", [])]
        for i, chosen in enumerate(self.beam_search()):
            plans.append(self._packed_plan(
                f"beam {i}", [c.nodes for c in chosen], {}, notes,
                f", f = {sum(c.score for c in chosen):+.3f} us"))
        greedy = connected_region_plan(  # its code generator queries are cached with ours
            self.graph, lambda nodes: self.can_stitch(frozenset(nodes)), self.index,
            lambda patterns: self._ahead([frozenset(p) for p in patterns], next_up=False))
        greedy_patterns = [frozenset(p.nodes) for p in greedy.patterns]
        greedy_kernels = self._units(greedy_patterns)
        greedy_us, greedy_bytes = self.plan_cost(greedy_kernels)
        notes.append(f"connected-region plan: {len(greedy_kernels)} kernels, {greedy_bytes} "
                     f"bytes, {greedy_us:.3f} us (modeled)")
        plans.append((greedy_us, greedy_bytes, len(greedy_kernels), "connected-region plan",
                      greedy.patterns))
        # Remote fusion applies to any choice of patterns: the baseline's too.
        plans.append(self._packed_plan(
            "connected-region plan, packed", greedy_patterns,
            {frozenset(p.nodes): p.reason for p in greedy.patterns}, notes))
        mixed = self._mixed_plan(plans, notes)
        if mixed is not None:
            plans.append(mixed)
        us, nbytes, _, label, patterns = min(
            (p for p in plans if p[1] <= xla_bytes), key=itemgetter(0, 1, 2))
        notes.append(f"chose {label}: {us:.3f} us, {nbytes} bytes (modeled)")
        patterns = self._merged(patterns, us, notes)
        decisions = self._all_decisions() + (greedy.decisions if "connected-region plan"
                                             in label else [])
        return FusionPlan("beam", patterns, decisions, notes)

    def _merged(self, patterns: list[Pattern], chosen_us: float, notes: list[str]
                ) -> list[Pattern]:
        """The chosen plan after the neighbour merge (neighbours.py), when it is faster."""
        units = self._units([frozenset(p.nodes) for p in patterns])
        kernels, parts = merge_neighbours(self, units)
        if len(kernels) == len(units):
            return patterns
        kernels, split = self._acyclic(kernels, parts)
        us, nbytes = self.plan_cost(kernels)
        if us >= chosen_us:
            return patterns
        notes.append(f"neighbour merge: {len(units)} -> {len(kernels)} kernels, {nbytes} "
                     f"bytes, {us:.3f} us (modeled){split}")
        reasons = {frozenset(p.nodes): p.reason for p in patterns}
        plan = [Pattern(list(self._names(k)), reasons.get(k) or self._latest[k][1])
                for k in kernels if len(k) > 1]
        plan.sort(key=lambda p: self.index.order[p.nodes[0]])
        return plan

    def _mixed_plan(self, plans: list[tuple], notes: list[str]) -> tuple | None:
        """The plans mixed group by group. A group is a set of kernels that the plans' kernels
        join (a connected component of "some plan's kernel holds both"), so each plan's
        kernels cover every group exactly and a plan's time and bytes add up over the groups:
        each group takes the plan fastest there among those moving no more bytes there than
        XLA's kernels (``plans[0]``). None when that is no faster than the best plan, or when
        the mixed kernels form a cycle through each other."""
        kernels_of = [self._units([frozenset(p.nodes) for p in plan[4]]) for plan in plans]
        components = connected_components(
            self.index.participants,
            ((min(kernel), n) for kernels in kernels_of for kernel in kernels for n in kernel))
        group_of = {n: g for g, component in enumerate(components) for n in component}
        groups = [[[] for _ in plans] for _ in components]  # group -> plan -> its kernels
        for i, kernels in enumerate(kernels_of):
            for kernel in kernels:
                groups[group_of[min(kernel)]][i].append(kernel)
        # Ties go to the plan that is best as a whole, so that the others are named only
        # where they differ.
        rank = sorted(range(len(plans)), key=lambda i: plans[i][:3])
        chosen: list[tuple[int, frozenset[str]]] = []
        for per_plan in groups:
            costs = [self.plan_cost(kernels) for kernels in per_plan]
            best = min((i for i in rank if costs[i][1] <= costs[0][1]),
                       key=lambda i: (*costs[i], len(per_plan[i]), rank.index(i)))
            chosen += [(best, kernel) for kernel in per_plan[best]]
        kernels = [kernel for _, kernel in chosen]
        us, nbytes = self.plan_cost(kernels)
        if us >= min(plan[0] for plan in plans if plan[1] <= plans[0][1]) or \
                self.index.split_cycles(kernels, [[k] for k in kernels])[1]:
            return None
        used = sorted({i for i, _ in chosen})
        label = f"mixed plan ({', '.join(plans[i][3] for i in used)})"
        notes.append(f"{label}: {len(kernels)} kernels, {nbytes} bytes, {us:.3f} us (modeled), "
                     f"the fastest plan in each of {len(groups)} groups")
        pattern_of = [{frozenset(p.nodes): p for p in plan[4]} for plan in plans]
        patterns = [pattern_of[i][kernel] for i, kernel in chosen if len(kernel) > 1]
        patterns.sort(key=lambda p: self.index.order[p.nodes[0]])
        return us, nbytes, len(kernels), label, patterns

    def _packed_plan(self, label: str, patterns: list[frozenset[str]],
                     reasons: dict[frozenset[str], str], notes: list[str], note: str = ""):
        """``patterns`` (disjoint), the other kernels alone, remote fusion over them and the
        split of joint cycles: the plan as (modeled us, bytes, kernels, label, patterns).
        A kernel's reason is ``reasons``' or its latest decision's."""
        units = self._units(patterns)
        packs = self.remote_fusion(units)
        packed = {u for pack in packs for u in pack}
        kernels, split = self._acyclic(
            [u for u in units if u not in packed] + [frozenset().union(*p) for p in packs],
            [[u] for u in units if u not in packed] + packs)
        us, nbytes = self.plan_cost(kernels)
        notes.append(f"{label}: {len(kernels)} kernels, {nbytes} bytes, {us:.3f} us "
                     f"(modeled){note}{split}")
        # every other kernel of two or more was decided buildable (a candidate or a pack)
        plan = [Pattern(list(self._names(k)), reasons.get(k) or self._latest[k][1])
                for k in kernels if len(k) > 1]
        plan.sort(key=lambda p: self.index.order[p.nodes[0]])
        return us, nbytes, len(kernels), label, plan

    def _units(self, patterns: list[frozenset[str]]) -> list[frozenset[str]]:
        """``patterns`` (disjoint) and every other memory-intensive kernel alone: all kernels
        of a plan, in topological order of their first XLA kernels."""
        order = self.index.order
        covered = {n for p in patterns for n in p}
        firsts = [(min(map(order.__getitem__, p)), p) for p in patterns] + [
            (order[n], frozenset((n,))) for n in self.index.participants if n not in covered]
        firsts.sort(key=itemgetter(0))
        return [unit for _, unit in firsts]

    def _acyclic(self, kernels: list[frozenset[str]], parts: list[list[frozenset[str]]]
                 ) -> tuple[list[frozenset[str]], str]:
        """``kernels`` split where they form a cycle through each other
        (``KernelDag.split_cycles``), and a note of what was split."""
        def buildable(nodes: frozenset[str]) -> bool:
            refusal = self.can_stitch(nodes)
            if refusal is None:
                self.decide(nodes, None, "part of a kernel split where the plan's kernels "
                                         "formed a cycle")
            else:
                self.decide(nodes, refusal.kind, f"code generator: {refusal.detail}")
            return refusal is None

        kernels, split = self.index.split_cycles(kernels, parts, buildable)
        return kernels, (f"; {len(split)} kernel(s) split where the plan's kernels formed a "
                         f"cycle: {', '.join(self._names(k)[0] for k in split[:5])}"
                         + (" ..." if len(split) > 5 else "") if split else "")

    def _all_decisions(self) -> list[Decision]:
        """Every decision in order (for ``explain``); fills ``self.decisions``."""
        # a pattern's latest decision is its last in order; keys stay in first-decision order
        latest: dict[frozenset[str], Decision] = {}
        history = []
        names = self._names
        for nodes, kind, reason in self._history:
            decision = latest[nodes] = Decision(names(nodes), kind, reason)
            history.append(decision)
        self.decisions = latest
        return history


def beam_plan(graph: OpGraph, can_stitch: CanStitch, device=None, **options) -> FusionPlan:
    """The paper's explorer; ``device`` defaults to the H100 (costmodel.load_device)."""
    return Explorer(graph, can_stitch, device or costmodel.load_device("h100"), **options).run()
