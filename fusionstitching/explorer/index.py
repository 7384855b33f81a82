"""What the explorer precomputes once per op graph so that each candidate costs O(its size).

The kernel DAG (XLA's kernels, edges seen through no-ops, topological order and levels) and
per-kernel traffic facts, so that a pattern's bytes are summed over its own edges and a grown
pattern recounts only what its new kernels touch. The cycle check (paper Figure 6) searches
from a pattern's outside successors only up to the highest level where a path can re-enter
it: local in a layered graph, O(V + E) at worst.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from ..graph import OpClass, OpGraph, classify_instruction
from ..graph.traffic import Value, read_bytes, resolve, value_bytes

# Per-element instructions of one op by class (cpi.json "classes"), for the latency model.
# expf is FMUL + EX2 (cpi.json); index-only ops (broadcast, reshape, iota) cost integer work.
_CLASS_MIX = {
    OpClass.LIGHT_ELEMENTWISE: {"fp32": 1.0},
    OpClass.EXPENSIVE_ELEMENTWISE: {"sfu": 1.0, "fp32": 1.0},
    OpClass.REDUCTION: {"fp32": 1.0},
    OpClass.DATA_MOVEMENT: {"int": 2.0},
}
_INDEX_ONLY = {"broadcast", "reshape", "iota"}


class KernelDag:
    """XLA's kernels with edges seen through no-ops, in topological order, with levels; the
    cycle check of every strategy (one pass over the graph to build, then local checks)."""

    def __init__(self, graph: OpGraph):
        self.graph = graph
        nodes = graph.nodes
        self.kernels = [n.name for n in nodes.values() if n.is_kernel]
        self.order = {name: i for i, name in enumerate(self.kernels)}
        sources: dict[str, tuple[str, ...]] = {}
        for node in nodes.values():  # dict order is topological order
            if node.is_kernel:
                sources[node.name] = (node.name,)
            elif len(node.operands) == 1:
                sources[node.name] = sources[node.operands[0]]
            else:  # tuple (or a parameter/constant: no operands): every operand's kernels
                sources[node.name] = tuple(dict.fromkeys(
                    s for op in node.operands for s in sources[op]))
        self.preds: dict[str, list[str]] = {}
        self.succs: dict[str, list[str]] = {k: [] for k in self.kernels}
        self.level: dict[str, int] = {}
        for name in self.kernels:
            preds = list(dict.fromkeys(s for op in nodes[name].operands for s in sources[op]))
            self.preds[name] = preds
            for p in preds:
                self.succs[p].append(name)
            self.level[name] = 1 + max((self.level[p] for p in preds), default=-1)

    # -- reachability --------------------------------------------------------------------

    def reachable(self, pattern: frozenset[str], forward: bool = True) -> frozenset[str]:
        """The kernels outside ``pattern`` that a path from it reaches (``forward``), or that
        reach it: two patterns form a cycle between them when each holds a kernel of the
        other's set. A search over the graph beyond the pattern, O(V + E) at worst."""
        edges = self.succs if forward else self.preds
        stack = [u for n in pattern for u in edges[n] if u not in pattern]
        seen = set(stack)
        while stack:
            for w in edges[stack.pop()]:
                if w not in seen and w not in pattern:
                    seen.add(w)
                    stack.append(w)
        return frozenset(seen)

    def creates_cycle(self, pattern: frozenset[str]) -> bool:
        """Does a path leave ``pattern`` and come back through an outside kernel?"""
        return self._comes_back(pattern, pattern, pattern)

    def split_cycles(self, kernels: list[frozenset[str]], parts: list[list[frozenset[str]]],
                     buildable: Callable[[frozenset[str]], bool] | None = None
                     ) -> tuple[list[frozenset[str]], list[frozenset[str]]]:
        """``kernels`` (each made of ``parts``: a pack's units, or itself) split until none is
        on a cycle through the others; and the kernels split. Each kernel alone may be acyclic
        while several together are not: a path from one to the next and from the last back,
        between nodes that share a kernel without a path between them (packs of independent
        kernels, sibling consumers, runs of different regions). A topological sort of the
        kernels that, whenever every kernel left waits on another, finds a cycle among them
        and splits a kernel on it: a pack before a pattern, else the latest kernel listed.

        The split is in two where it can be (``_halves``): what the kernel's nodes entered by
        the cycle feed inside it, and the rest, if ``buildable`` accepts each half of two or
        more parts; else the kernel goes back to its parts (a pack's units were built alone; a
        pattern's part is each XLA kernel). One pass over the graph, plus the edges of each
        cycle's kernels."""
        owner: dict[str, int] = {}
        groups: dict[int, tuple[frozenset[str], list[frozenset[str]]]] = {}
        ids = itertools.count()

        def add(kernel: frozenset[str], kernel_parts: list[frozenset[str]]) -> int:
            i = next(ids)
            groups[i] = (kernel, kernel_parts)
            owner.update((n, i) for n in kernel)
            return i

        for kernel, kernel_parts in zip(kernels, parts):
            add(kernel, kernel_parts)
        unit = lambda n: owner.get(n, n)  # a kernel's index, or an XLA kernel's own name
        done: set[str] = set()

        def waiting_of(nodes) -> int:
            return sum(1 for n in nodes for p in self.preds[n]
                       if p not in done and unit(p) != unit(n))

        waiting = {}
        for name in self.kernels:
            u = unit(name)
            if u not in waiting:
                waiting[u] = waiting_of(groups[u][0] if isinstance(u, int) else (name,))
        ready = [u for u, count in waiting.items() if count == 0]
        final: list[frozenset[str]] = []
        split: list[frozenset[str]] = []
        earliest = 0  # into self.kernels, topological order
        while True:
            while ready:
                u = ready.pop()
                if isinstance(u, int):
                    nodes = groups.pop(u)[0]
                    final.append(nodes)
                else:
                    nodes = (u,)
                done.update(nodes)
                for n in nodes:
                    for s in self.succs[n]:
                        v = unit(s)
                        if v != u:
                            waiting[v] -= 1
                            if waiting[v] == 0:
                                ready.append(v)
            while earliest < len(self.kernels) and self.kernels[earliest] in done:
                earliest += 1
            if earliest == len(self.kernels):
                return final, split
            # Every unit left waits on a producer left: walking producers from the earliest
            # node's kernel repeats, and the loop is a cycle of kernels. Split a pack on it
            # (its units were built alone), else the latest kernel listed.
            cycle, u = [], unit(self.kernels[earliest])
            while u not in cycle:
                cycle.append(u)
                nodes = groups[u][0] if isinstance(u, int) else (u,)
                u = min((unit(p) for n in nodes for p in self.preds[n]
                         if p not in done and unit(p) != u),
                        key=lambda v: self.order[min(groups[v][0], key=self.order.get)]
                        if isinstance(v, int) else self.order[v])
            loop = cycle[cycle.index(u):]  # each waits on the next, the last on the first
            kernels_on_cycle = [v for v in loop if isinstance(v, int) and len(groups[v][0]) > 1]
            packs = [v for v in kernels_on_cycle if len(groups[v][1]) > 1]
            chosen = max(packs or kernels_on_cycle)
            producer = loop[(loop.index(chosen) + 1) % len(loop)]
            entered = [n for n in groups[chosen][0] if any(unit(p) == producer
                                                             for p in self.preds[n])]
            kernel, kernel_parts = groups.pop(chosen)
            split.append(kernel)
            units = (kernel_parts if len(kernel_parts) > 1
                     else [frozenset((n,)) for n in kernel])
            halves = self._halves(units, entered)
            whole = [frozenset().union(*half) for half in halves]
            if buildable is not None and len(halves) == 2 and all(
                    len(half) == 1 or buildable(nodes) for half, nodes in zip(halves, whole)):
                new = [add(nodes, half if len(kernel_parts) > 1 else [nodes])
                       for half, nodes in zip(halves, whole)]
            else:
                new = [add(part, [part]) for part in units]
            for u in new:
                waiting[u] = waiting_of(groups[u][0])
                if waiting[u] == 0:
                    ready.append(u)

    def _halves(self, units: list[frozenset[str]], entered: list[str]
                ) -> list[list[frozenset[str]]]:
        """``units`` (a kernel's) in two: the rest first, then those holding what ``entered``
        feeds inside the kernel. No edge inside the kernel goes from the second half to the
        first, and the first holds the node the cycle leaves by (a node it enters by cannot
        feed that one, or the graph itself had a cycle). One list when every unit is fed."""
        unit_of = {n: i for i, unit in enumerate(units) for n in unit}
        fed, stack = set(), [unit_of[n] for n in entered]
        while stack:
            i = stack.pop()
            if i not in fed:
                fed.add(i)
                stack.extend(unit_of[s] for n in units[i] for s in self.succs[n]
                             if s in unit_of)
        rest = [unit for i, unit in enumerate(units) if i not in fed]
        return [rest, [units[i] for i in sorted(fed)]] if rest else [units]

    def joins_cycle(self, a: frozenset[str], b: frozenset[str], union: frozenset[str]) -> bool:
        """``creates_cycle(union)`` for ``union = a | b`` of two acyclic patterns. A path
        that leaves the union and comes back to the side it left would make that side
        cyclic, so it goes from a's own kernels to b's or back: only those two searches
        run, and joining one earlier vertex to a pattern searches from that vertex alone
        (nothing in the pattern reaches back to it)."""
        only_a, only_b = a - b, b - a
        return (self._comes_back(only_a, only_b, union)
                or self._comes_back(only_b, only_a, union))

    def _comes_back(self, sources: frozenset[str], targets: frozenset[str],
                    pattern: frozenset[str]) -> bool:
        """Does a path from ``sources`` leave ``pattern`` and re-enter it at ``targets``?

        A path can only come back into a target that has a producer outside, and only from
        a lower level: the search from the sources' outside consumers stops at the highest
        such target's level."""
        level, succs, preds = self.level, self.succs, self.preds
        top = -1
        for n in targets:
            if level[n] > top:
                for p in preds[n]:
                    if p not in pattern:
                        top = level[n]
                        break
        if top < 0:  # no target has a producer outside: nothing can come back
            return False
        stack = [u for n in sources if level[n] + 1 < top
                 for u in succs[n] if u not in pattern and level[u] < top]
        seen = set(stack)
        while stack:
            for w in succs[stack.pop()]:
                if w in targets:
                    return True
                if w not in seen and w not in pattern and level[w] < top:
                    seen.add(w)
                    stack.append(w)
        return False


class GraphIndex(KernelDag):
    """The kernel DAG plus the per-kernel facts the explorer's cost model reads."""

    def __init__(self, graph: OpGraph):
        super().__init__(graph)
        nodes = graph.nodes
        self.participants = [k for k in self.kernels if nodes[k].memory_intensive]
        stitchable = set(self.participants)
        self.consumers = {k: [s for s in self.succs[k] if s in stitchable]
                          for k in self.participants}

        # Traffic facts, as graph.traffic identifies values.
        self.consumes: dict[str, list[Value]] = {}
        self.value_users: dict[Value, list[str]] = {}
        for name in self.kernels:
            values = list(dict.fromkeys(resolve(graph, op) for op in nodes[name].operands))
            self.consumes[name] = values
            for v in values:
                self.value_users.setdefault(v, []).append(name)
        self.outputs = {resolve(graph, o) for o in graph.outputs}
        self.produced: dict[str, list[Value]] = {k: [] for k in self.kernels}
        for v in list(self.value_users) + sorted(self.outputs, key=str):
            if v[0] in self.produced and v not in self.produced[v[0]]:
                self.produced[v[0]].append(v)
        self.bytes = {v: value_bytes(graph, v)
                      for v in set(self.value_users) | self.outputs}
        # Values some kernel reads only in part (a gather's operand): bytes read per user.
        self.read_by: dict[Value, dict[str, int]] = {}
        for name in self.kernels:
            for op in nodes[name].partial_reads:
                self.read_by.setdefault(resolve(graph, op), {})
        for v, per_user in self.read_by.items():
            for u in self.value_users[v]:
                per_user[u] = min(self.bytes[v], sum(
                    read_bytes(graph, nodes[u], op, self.bytes[v])
                    for op in nodes[u].operands if resolve(graph, op) == v))
        # The same facts flat, for ``traffic``'s inner loops: per value (producer, bytes,
        # users, returned?, via shared?); per kernel the values it reads or writes.
        self._values = {v: (v[0], size, tuple(self.value_users.get(v, ())), v in self.outputs,
                            v[0] in nodes and nodes[v[0]].op_class == OpClass.REDUCTION)
                        for v, size in self.bytes.items()}
        self._touches = {k: tuple(dict.fromkeys(self.consumes[k] + self.produced[k]))
                         for k in self.kernels}

        # Per-kernel facts for the kernel profile.
        self.elements: dict[str, int] = {}  # the iteration space a kernel's threads cover
        self.rows: dict[str, int] = {}  # reductions: output elements (one row per result)
        self.mix: dict[str, dict[str, float]] = {}
        instructions = ({i.name: i for i in graph.computation.instructions}
                        if graph.computation is not None else {})
        for name in self.participants:
            node = nodes[name]
            out = max((_elements(s) for s in node.shape.leaves()), default=1)
            if node.op_class == OpClass.REDUCTION:
                ins = max((_elements(nodes[op].shape) for op in node.operands
                           if not nodes[op].shape.is_tuple), default=out)
                self.elements[name] = max(ins, out)
                self.rows[name] = out
            else:
                self.elements[name] = out
            inst = instructions.get(name)
            fused = (graph.module.computation(inst.called_computations[0])
                     if inst is not None and inst.opcode == "fusion" else None)
            self.mix[name] = _instruction_mix(graph, name, fused)

    # -- traffic ---------------------------------------------------------------------------

    def traffic(self, pattern: Iterable[str], base: frozenset[str] = frozenset(),
                base_traffic: tuple[int, int, int, int] = (0, 0, 0, 0)
                ) -> tuple[int, int, int, int]:
        """(bytes read, bytes written, register bytes, shared bytes) of one kernel made of
        ``pattern``: reads and writes as ``traffic.pattern_traffic``; register/shared bytes
        are the global accesses the unfused kernels spent on the values the pattern keeps on
        chip (every access counted, as ``costmodel.delta.PatternSummary`` wants). A value a
        reduction produces crosses threads, so it goes through shared memory; every other
        value stays in the registers of the thread that computed it.

        Each value counts on its own, through its producer and users alone, so when
        ``base``, a subset of ``pattern``, has ``base_traffic``, only the values the other
        kernels read or write are recounted: the explorer grows candidates by a vertex or
        by another candidate and pays for what changed."""
        inside = pattern if isinstance(pattern, (set, frozenset)) else set(pattern)
        touches, values = self._touches, self._values
        reads, writes, register, shared = base_traffic
        for value in {v for n in (inside - base if base else inside) for v in touches[n]}:
            producer, size, users, returned, via_shared = values[value]
            read_by = self.read_by.get(value)
            if producer not in inside and read_by is not None:  # read in part: recounted
                reads += self._read(read_by, size, [u for u in users if u in inside]) - \
                    self._read(read_by, size, [u for u in users if u in base])
                continue
            if producer not in inside:  # read once, unless ``base`` already reads it
                for u in users:
                    if u in base:
                        break
                else:
                    reads += size
                continue
            internal = internal_before = 0
            for u in users:
                if u in inside:
                    internal += 1
                    if u in base:
                        internal_before += 1
            if producer in base:  # recounted: take back what ``base`` counted
                written, kept = _written_and_kept(size, len(users), returned, internal_before)
                writes -= written
                if via_shared:
                    shared -= kept
                else:
                    register -= kept
            elif internal_before:  # ``base`` read it from the added kernel that makes it
                reads -= size if read_by is None else \
                    self._read(read_by, size, [u for u in users if u in base])
            written, kept = _written_and_kept(size, len(users), returned, internal)
            writes += written
            if via_shared:
                shared += kept
            else:
                register += kept
        return reads, writes, register, shared

    @staticmethod
    def _read(read_by: dict[str, int], size: int, users: list[str]) -> int:
        """Bytes of a value that ``users`` together read (at most all of it)."""
        return min(size, sum(read_by[u] for u in users))


def _written_and_kept(size: int, users: int, returned: bool, internal: int) -> tuple[int, int]:
    """A value made inside a pattern, ``internal`` of its ``users`` inside too: (bytes
    written to global memory, bytes of the unfused kernels' global accesses kept on chip).
    It is written when something outside needs it; each use inside, and the write when
    nothing outside needs it, stays on chip."""
    escapes = returned or internal < users
    written = size if escapes else 0
    return written, (size * internal + size - written if internal else 0)


def _elements(shape) -> int:
    count = 1
    for d in shape.dims:
        count *= d
    return count


def _instruction_mix(graph: OpGraph, name: str, fused) -> dict[str, float]:
    """Instructions per element of one kernel: an XLA fusion's fused ops by class, an
    unfused op by its own class."""
    node = graph.nodes[name]
    if fused is None:
        return dict(_CLASS_MIX[node.op_class])
    mix: dict[str, float] = {}
    for inst in fused.instructions:
        if inst.opcode in _INDEX_ONLY:
            mix["int"] = mix.get("int", 0.0) + 1.0
            continue
        for cls, count in _CLASS_MIX.get(classify_instruction(inst, graph.module), {}).items():
            mix[cls] = mix.get(cls, 0.0) + count
    return mix or {"int": 1.0}  # a fusion of only no-ops still copies
