"""Exploration time vs graph size (V + E) on synthetic layered graphs, and explorer vs greedy
on the HLO corpus (not a test).

    python benchmarks/bench_explorer.py                    # 1k, 10k, 100k nodes + corpus
    python benchmarks/bench_explorer.py --sizes 1000 --no-corpus

Synthetic graphs are built as OpGraphs directly (no HLO text): layers of 100 kernels, each
taking one operand from the previous layer and, with probability 0.3, a second one from one
of the layer's "hub" kernels (every 8th), so fan-out ranges from 0 to 16 (capped); 80% light
elementwise f32[64,256], 15% row reductions to f32[64], 5% dots (opaque). The code
generator is a stub that accepts connected patterns of light elementwise ops and row
reductions: the real one is too slow for 10^5 candidates (and is what the corpus run uses).
Modeled times are the explorer's latency-evaluator model (modeled, not measured).
"""
from __future__ import annotations

import argparse
import glob
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import costmodel  # noqa: E402
from fusionstitching.explorer import Explorer, explore  # noqa: E402
from fusionstitching.graph import Edge, Node, OpClass, OpGraph  # noqa: E402
from fusionstitching.hlo.ir import Shape  # noqa: E402

WIDTH = 100
MAX_FANOUT = 16
FULL, ROWS = Shape("f32", (64, 256)), Shape("f32", (64,))


def layered_graph(num_nodes: int, seed: int = 0) -> OpGraph:
    rng = random.Random(seed)
    nodes: dict[str, Node] = {}
    previous = []
    for i in range(WIDTH):
        name = f"p{i}"
        nodes[name] = Node(name, "parameter", OpClass.NOOP, FULL, [])
        previous.append(name)
    count = 0
    while count < num_nodes:
        layer = []
        hubs = previous[::8]
        for _ in range(min(WIDTH, num_nodes - count)):
            name = f"n{count}"
            count += 1
            operands = [rng.choice(previous)]
            if rng.random() < 0.3:
                operands.append(rng.choice(hubs))
            operands = [op for op in dict.fromkeys(operands)
                        if len(nodes[op].users) < MAX_FANOUT] or [previous[0]]
            kind = rng.random()
            if kind < 0.05:
                node = Node(name, "dot", OpClass.OPAQUE, FULL, operands)
            elif kind < 0.20:
                node = Node(name, "reduce", OpClass.REDUCTION, ROWS, operands[:1])
            else:
                node = Node(name, "add", OpClass.LIGHT_ELEMENTWISE, FULL, operands)
            nodes[name] = node
            for op in node.operands:
                nodes[op].users.append(name)
            layer.append(name)
        previous = layer
    edges = [Edge(op, n.name, nodes[op].shape.byte_size)
             for n in nodes.values() for op in n.operands]
    return OpGraph(module=None, computation=None, nodes=nodes, edges=edges, outputs=previous)


def stub_can_stitch(graph: OpGraph):
    allowed = (OpClass.LIGHT_ELEMENTWISE, OpClass.REDUCTION)

    def can_stitch(names: list[str]) -> tuple[bool, str]:
        inside = set(names)
        if any(graph.nodes[n].op_class not in allowed for n in names):
            return False, "stub: only light elementwise ops and row reductions"
        seen, stack = {names[0]}, [names[0]]
        while stack:
            node = graph.nodes[stack.pop()]
            for m in node.operands + node.users:
                if m in inside and m not in seen:
                    seen.add(m)
                    stack.append(m)
        return (True, "stub: ok") if seen == inside else (False, "stub: not connected")

    return can_stitch


def bench_sizes(sizes: list[int], device) -> None:
    print(f"{'nodes':>8} {'V+E':>9} {'explore s':>10} {'us/(V+E)':>9} {'patterns':>9} "
          f"{'kernels':>8} {'XLA kernels':>12}")
    for size in sizes:
        graph = layered_graph(size)
        v_plus_e = len(graph.nodes) + len(graph.edges)
        t0 = time.perf_counter()
        plan = Explorer(graph, stub_can_stitch(graph), device).run()
        seconds = time.perf_counter() - t0
        mem = [n for n in graph.nodes.values() if n.memory_intensive]
        covered = sum(len(p.nodes) for p in plan.patterns)
        print(f"{size:>8} {v_plus_e:>9} {seconds:>10.2f} {seconds / v_plus_e * 1e6:>9.1f} "
              f"{len(plan.patterns):>9} {len(mem) - covered + len(plan.patterns):>8} "
              f"{len(mem):>12}")


def bench_corpus(device) -> None:
    from fusionstitching import codegen
    from fusionstitching.graph import build_graph
    from fusionstitching.hlo.parser import parse_file

    print(f"\n{'module':46} {'XLA us':>8} {'greedy us':>10} {'beam us':>8} "
          f"{'beam k':>6} {'explore s':>9}   (modeled, {device.name})")
    for path in sorted(glob.glob("tests/data/hlo/*.hlo")):
        module = parse_file(path)
        graph = build_graph(module)

        def can_stitch(nodes, module=module):
            return codegen.can_stitch(module, nodes)

        t0 = time.perf_counter()
        explorer = Explorer(graph, can_stitch, device)
        beam = explorer.run()
        seconds = time.perf_counter() - t0
        greedy = explore(graph, can_stitch, "greedy", device)
        mem = [n.name for n in graph.memory_intensive_nodes()]

        def kernels(plan):
            covered = {n for p in plan.patterns for n in p.nodes}
            return [frozenset(p.nodes) for p in plan.patterns] + [
                frozenset((n,)) for n in mem if n not in covered]

        xla_us = explorer.plan_cost([frozenset((n,)) for n in mem])[0]
        greedy_us = explorer.plan_cost(kernels(greedy))[0]
        beam_us = explorer.plan_cost(kernels(beam))[0]
        flag = " WORSE" if beam_us > greedy_us + 1e-9 else (
            " better" if beam_us < greedy_us - 1e-9 else "")
        print(f"{Path(path).name:46} {xla_us:>8.3f} {greedy_us:>10.3f} {beam_us:>8.3f} "
              f"{len(kernels(beam)):>6} {seconds:>9.2f}{flag}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--target", default="h100")
    parser.add_argument("--no-corpus", action="store_true")
    args = parser.parse_args()
    device = costmodel.load_device(args.target)
    bench_sizes(args.sizes, device)
    if not args.no_corpus:
        bench_corpus(device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
