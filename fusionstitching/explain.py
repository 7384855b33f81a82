"""Why kernels were or were not stitched: the chosen plan as text and as a picture.

``explain_text`` prints the plan (each stitched kernel and why), what stops further fusion
(``blocked_edges``: every producer -> consumer edge between memory-intensive kernels left in
different kernels, counted by the kind of verdict on the smallest candidate that held both)
and, for one node, every decision involving it and each of its neighbours in the kernel DAG.
``plan_dot`` draws XLA's kernels as nodes and each stitched kernel as a cluster around them,
like the paper's Figure 1; ``write_svg`` renders it with Graphviz's ``dot`` when installed.
"""
from __future__ import annotations

import collections
import enum
import shutil

from . import child_processes
from .explorer import FusionPlan
from .explorer.index import GraphIndex
from .graph import OpClass, OpGraph
from .graph.refusal import kind_text


def explain_text(graph: OpGraph, plan: FusionPlan, node: str | None = None) -> str:
    lines = [f"plan ({plan.strategy}): {len(plan.patterns)} stitched kernels"]
    lines += [f"  note: {note}" for note in plan.notes]
    for i, pattern in enumerate(plan.patterns):
        lines.append(f"  kernel {i}: {', '.join(pattern.nodes)}")
        lines.append(f"    why: {pattern.reason}")
    index = GraphIndex(graph)
    blocked = blocked_edges(index, plan)
    if blocked:
        lines.append(f"edges between memory-intensive kernels left unfused: "
                     f"{sum(blocked.values())}, by kind of reason")
        lines += [f"  {count:4d}  {kind_text(kind)}" for kind, count in blocked.most_common()]
    if node is None:
        return "\n".join(lines)
    if node not in graph.nodes:
        raise KeyError(f"no node {node!r} in {graph.computation.name if graph.computation else 'the graph'}")
    owner = {n: i for i, p in enumerate(plan.patterns) for n in p.nodes}
    lines.append("")
    lines.append(f"{node}: {_describe(graph, node)}; "
                 + (f"in stitched kernel {owner[node]}" if node in owner else "left to XLA"))
    if node not in index.preds:
        lines.append("  launches no kernel (a no-op instruction): nothing to stitch")
        return "\n".join(lines)
    neighbours = [(p, "producer") for p in index.preds[node]] + [
        (c, "consumer") for c in index.succs[node]]
    for other, role in neighbours:
        together = node in owner and owner.get(other) == owner[node]
        lines.append(f"  {role} {other} ({_describe(graph, other)}): "
                     + ("stitched together" if together else "not stitched together"))
        if graph.nodes[other].op_class == OpClass.OPAQUE:
            lines.append("    opaque kernels (dot, convolution, library calls, ...) are "
                         "never stitched")
            continue
        related = [d for d in plan.decisions if node in d.nodes and other in d.nodes]
        if not related:
            lines.append("    no candidate held both (outside the explored patterns)")
        for d in sorted(related, key=lambda d: len(d.nodes)):
            verdict = "accepted" if d.ok else "rejected"
            lines.append(f"    {verdict} {{{', '.join(d.nodes)}}}: {d.reason}")
    return "\n".join(lines)


class Unrefused(enum.Enum):
    """Why two kernels, or a kernel and its neighbours, stay apart when no refusal says why."""
    NOT_CHOSEN = "in a buildable candidate, but the plan took other patterns (by modeled time)"
    NEVER_TOGETHER = "never in one candidate (pruned before the two met)"
    NO_NEIGHBOUR = "no memory-intensive producer or consumer to stitch with"


def blocked_edges(index: GraphIndex, plan: FusionPlan) -> collections.Counter:
    """Why each producer -> consumer edge between memory-intensive kernels crosses kernels,
    counted by kind: the latest verdict on the smallest candidate holding both ends -- its
    refusal's kind when it was rejected, or ``Unrefused.NOT_CHOSEN`` when it was accepted
    (the plan preferred other patterns)."""
    owner = {n: i for i, p in enumerate(plan.patterns) for n in p.nodes}
    verdict = _PairVerdicts(plan)
    counts: collections.Counter = collections.Counter()
    for producer in index.participants:
        for consumer in index.consumers[producer]:
            if producer in owner and owner.get(consumer) == owner[producer]:
                continue
            counts[verdict(producer, consumer)] += 1
    return counts


def unstitched_kinds(index: GraphIndex, plan: FusionPlan) -> dict[str, enum.Enum]:
    """Why each memory-intensive kernel outside every stitched kernel was left to XLA, as a
    kind: of the verdicts on it with each memory-intensive producer and consumer (as in
    ``blocked_edges``), a refusal's kind first, then not chosen, then never together."""
    stitched = plan.stitched_nodes()
    participants = set(index.participants)
    verdict = _PairVerdicts(plan)
    rank = {Unrefused.NOT_CHOSEN: 1, Unrefused.NEVER_TOGETHER: 2}
    kinds = {}
    for node in index.participants:
        if node in stitched:
            continue
        neighbours = [p for p in index.preds[node] if p in participants] + \
            index.consumers[node]
        verdicts = [verdict(node, other) for other in neighbours]
        kinds[node] = (min(verdicts, key=lambda v: rank.get(v, 0)) if verdicts
                       else Unrefused.NO_NEIGHBOUR)
    return kinds


class _PairVerdicts:
    """The kind of the latest verdict on the smallest candidate pattern holding two given
    nodes (``Unrefused.NOT_CHOSEN`` when it was accepted)."""

    def __init__(self, plan: FusionPlan):
        self.holding: dict[str, list] = {}
        for d in {d.nodes: d for d in plan.decisions}.values():
            for n in d.nodes:
                self.holding.setdefault(n, []).append(d)

    def __call__(self, a: str, b: str) -> enum.Enum:
        both = [d for d in self.holding.get(a, ()) if b in d.nodes]
        if not both:
            return Unrefused.NEVER_TOGETHER
        smallest = min(both, key=lambda d: len(d.nodes))
        return Unrefused.NOT_CHOSEN if smallest.ok else smallest.kind


def _describe(graph: OpGraph, name: str) -> str:
    node = graph.nodes[name]
    return f"{node.op_class.name.lower()}, {_shape(node)}"


def _shape(node) -> str:
    shape = node.shape
    if shape.is_tuple:
        return "(" + ", ".join(_dims(s) for s in shape.tuple_shapes) + ")"
    return _dims(shape)


def _dims(shape) -> str:
    return f"{shape.dtype}[{','.join(map(str, shape.dims))}]"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def plan_dot(graph: OpGraph, plan: FusionPlan) -> str:
    """The plan in Graphviz DOT: XLA's kernels as nodes, stitched kernels as clusters."""
    index = GraphIndex(graph)
    owner = {n: i for i, p in enumerate(plan.patterns) for n in p.nodes}
    colors = {OpClass.LIGHT_ELEMENTWISE: "#d9ead3", OpClass.EXPENSIVE_ELEMENTWISE: "#fce5cd",
              OpClass.REDUCTION: "#f4cccc", OpClass.DATA_MOVEMENT: "#d9d2e9",
              OpClass.OPAQUE: "#cccccc"}
    name = graph.computation.name if graph.computation is not None else "graph"
    lines = [f"digraph {_quote(name)} {{", "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];']

    def node_line(n: str) -> str:
        node = graph.nodes[n]
        label = f"{n}\\n{node.op_class.name.lower()}\\n{_shape(node)}"
        return f'{_quote(n)} [label="{label}", fillcolor="{colors[node.op_class]}"];'

    for i, pattern in enumerate(plan.patterns):
        lines.append(f"  subgraph cluster_{i} {{")
        lines.append(f'    label="stitched kernel {i} ({len(pattern.nodes)} XLA kernels)"; '
                     'style=dashed; color="#3c78d8";')
        lines += [f"    {node_line(n)}" for n in pattern.nodes]
        lines.append("  }")
    lines += [f"  {node_line(n)}" for n in index.kernels if n not in owner]
    for n in index.kernels:
        for user in index.succs[n]:
            lines.append(f"  {_quote(n)} -> {_quote(user)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_svg(dot_text: str, path: str) -> tuple[bool, str]:
    """Render DOT to SVG with Graphviz's ``dot``; (False, why) when it cannot."""
    dot = shutil.which("dot")
    if dot is None:
        return False, "Graphviz's `dot` program is not installed (apt-get install graphviz)"
    try:
        done = child_processes.run([dot, "-Tsvg", "-o", path], child_processes.TOOL_TIMEOUT_S,
                                   input=dot_text)
    except child_processes.ChildTimeout as exc:
        return False, str(exc)
    if done.returncode != 0:
        return False, f"dot failed: {done.stderr.strip()}"
    return True, f"wrote {path}"
