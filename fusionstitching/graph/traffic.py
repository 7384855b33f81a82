"""Global-memory traffic of a set of kernels, and the memory-intensive regions of a graph.

A value is identified by the kernel node that produces it and, for multi-output fusions, the
tuple index its get-tuple-element selects; bitcasts are views and add nothing. Scalar
constants are immediates in any kernel and cost no traffic. A kernel that reads a value only
in part (the operand of a gather: graph/demand.py) reads those bytes.
"""
from __future__ import annotations

from collections.abc import Iterable

from .demand import elements
from .opgraph import Node, OpClass, OpGraph

Value = tuple[str, int | None]  # (producing node, tuple index or None)


def resolve(graph: OpGraph, name: str) -> Value:
    """The value a node's result refers to, looking through bitcast and get-tuple-element."""
    node = graph.nodes[name]
    index: int | None = None
    while node.opcode in ("bitcast", "get-tuple-element"):
        if node.opcode == "get-tuple-element":
            index = node.tuple_index  # the one nearest the producer selects its output
        node = graph.nodes[node.operands[0]]
    return node.name, index


def value_bytes(graph: OpGraph, value: Value) -> int:
    node = graph.nodes[value[0]]
    if node.opcode == "constant" and node.shape.rank == 0:
        return 0
    shape = node.shape
    if value[1] is not None and shape.is_tuple:
        shape = shape.tuple_shapes[value[1]]
    return shape.byte_size


def _consumed_values(graph: OpGraph, node: Node) -> list[Value]:
    return list(dict.fromkeys(resolve(graph, op) for op in node.operands))


def pattern_traffic(graph: OpGraph, pattern: Iterable[str]) -> tuple[int, int]:
    """(bytes read, bytes written) of one kernel made of ``pattern``'s nodes.

    Reads count each distinct outside value once; writes count each value produced inside
    that is used by a kernel outside or returned by the computation.
    """
    inside = set(pattern)
    reads: dict[Value, int] = {}
    for name in inside:
        node = graph.nodes[name]
        for operand in node.operands:
            value = resolve(graph, operand)
            if value[0] not in inside:
                size = value_bytes(graph, value)
                reads[value] = min(size, reads.get(value, 0) + read_bytes(graph, node, operand,
                                                                          size))
    # A value made inside is written when the computation returns it or a kernel outside
    # reads it.
    consumers, returned = _value_consumers(graph)
    writes = {v for v in returned if v[0] in inside}
    for name in inside:
        writes.update(v for v, readers in consumers.get(name, {}).items()
                      if not readers <= inside)
    return (sum(reads.values()), sum(value_bytes(graph, v) for v in writes))


def _value_consumers(graph: OpGraph) -> tuple[dict[str, dict[Value, set[str]]], set[Value]]:
    """(producer -> each of its values -> the kernel nodes reading it, the values the
    computation returns), built once per graph: every kernel's traffic asks it."""
    derived = graph.derived.get("value_consumers")
    if derived is None:
        consumers: dict[str, dict[Value, set[str]]] = {}
        for node in graph.kernel_nodes():
            for value in _consumed_values(graph, node):
                consumers.setdefault(value[0], {}).setdefault(value, set()).add(node.name)
        returned = {resolve(graph, o) for o in graph.outputs}
        derived = graph.derived["value_consumers"] = (consumers, returned)
    return derived


def read_bytes(graph: OpGraph, node: Node, operand: str, size: int) -> int:
    """Bytes of ``operand`` (a view of a value of ``size`` bytes) that ``node`` reads: all,
    unless it reads it in part (``Node.partial_reads``: the operand of a gather)."""
    part = node.partial_reads.get(operand)
    if part is None:
        return size
    return -(-size * part // max(1, elements(graph.nodes[operand].shape)))


def connected_components(items: Iterable[str], links: Iterable[tuple[str, str]]
                         ) -> list[list[str]]:
    """The items joined by the links (pairs of items) into groups, each group in the items'
    order (union-find)."""
    parent = {x: x for x in items}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in links:
        parent[find(a)] = find(b)
    groups: dict[str, list[str]] = {}
    for x in parent:
        groups.setdefault(find(x), []).append(x)
    return list(groups.values())


def memory_intensive_regions(graph: OpGraph) -> list[list[str]]:
    """Connected components of memory-intensive kernels (edges seen through no-ops), each in
    topological order: the ideal plan's kernels for ``compulsory_bytes``."""
    names = [n.name for n in graph.memory_intensive_nodes()]  # topological order
    memory_intensive = set(names)
    return connected_components(names, (
        (producer, name) for name in names
        for producer, _ in _consumed_values(graph, graph.nodes[name])
        if producer in memory_intensive))


def opaque_depth(graph: OpGraph) -> dict[str, int]:
    """The most opaque kernels (GEMMs, convolutions) on a path to each node. Along a path the
    depth never falls, so two kernels of one depth have no opaque kernel between them: one
    kernel per region and depth is a plan without cycles through opaque kernels."""
    depth: dict[str, int] = {}
    for name, node in graph.nodes.items():  # topological order
        depth[name] = max((depth[p] + int(graph.nodes[p].op_class == OpClass.OPAQUE)
                           for p in node.operands), default=0)
    return depth


def plan_bytes(graph: OpGraph, patterns: Iterable[Iterable[str]]) -> int:
    return sum(sum(pattern_traffic(graph, p)) for p in patterns)


def acyclic_lower_bound_bytes(graph: OpGraph) -> int:
    """Bytes no plan of acyclic kernels can go below; ``compulsory_bytes`` can be below it.

    Compulsory bytes price one kernel per connected memory-intensive region, which a path
    through an opaque kernel (a GEMM) between two of the region's kernels forbids. Each value
    a region makes and one of its own kernels reads *after* such a path is written by its
    producer's kernel and read by another: its read, and its write unless something outside
    needs it anyway, are bytes every plan moves beyond compulsory. Packing regions into one
    kernel can read a value two regions share once instead of twice, so those reads are
    taken back. Each value is counted on its own, so the sum bounds every plan."""
    nodes = graph.nodes
    regions = memory_intensive_regions(graph)
    region_of = {n: i for i, region in enumerate(regions) for n in region}
    bit = {name: 1 << i for i, name in enumerate(nodes)}
    below: dict[str, int] = {}  # every node a path from the node reaches
    after_opaque: dict[str, int] = {}  # the nodes a path through an opaque kernel reaches
    for name in reversed(nodes):  # dict order is topological order
        reach = through = 0
        for user in dict.fromkeys(nodes[name].users):
            reach |= bit[user] | below[user]
            if nodes[user].op_class == OpClass.OPAQUE:
                through |= bit[user] | below[user]
            else:
                through |= after_opaque[user]
        below[name], after_opaque[name] = reach, through
    consumers: dict[Value, set[str]] = {}
    for node in graph.kernel_nodes():
        for v in _consumed_values(graph, node):
            consumers.setdefault(v, set()).add(node.name)
    returned = {resolve(graph, o) for o in graph.outputs}
    bound = plan_bytes(graph, regions)
    for value, users in consumers.items():
        size = value_bytes(graph, value)
        producer = value[0]
        readers = {region_of[u] for u in users if u in region_of}
        if producer not in region_of:  # read once per region it feeds, once if packed
            bound -= size * max(0, len(readers) - 1)
        elif any(after_opaque[producer] & bit[u] for u in users if u in region_of):
            needed_anyway = value in returned or any(u not in region_of for u in users)
            bound += size if needed_anyway else 2 * size
    return bound
