"""Exploration time vs graph size (V + E) on synthetic layered graphs, and explorer vs greedy
on the HLO corpus (not a test).

    python benchmarks/bench_explorer.py                    # 1k, 10k, 100k nodes + corpus
    python benchmarks/bench_explorer.py --sizes 1000 --no-corpus
    python benchmarks/bench_explorer.py --sizes --codegen real --only _h100.hlo

Synthetic graphs are built as OpGraphs directly (no HLO text): layers of 100 kernels, each
taking one operand from the previous layer and, with probability 0.3, a second one from one
of the layer's "hub" kernels (every 8th), so fan-out ranges from 0 to 16 (capped); 80% light
elementwise f32[64,256], 15% row reductions to f32[64], 5% dots (opaque). The code
generator is a stub that accepts connected patterns of light elementwise ops and row
reductions: the real one is too slow for 10^5 candidates.

Corpus: every module of tests/data/hlo (or those whose name contains ``--only``), XLA's plan,
the greedy baseline and the beam explorer, priced by the explorer's latency-evaluator
(modeled, not measured). ``--codegen stub`` (default) accepts every connected pattern, so the
times are the explorer's own; ``--codegen real`` asks the code generator
(``codegen.can_stitch``) and shows how many queries it made and the seconds they took.

Times: wall seconds and CPU seconds of this process (the machine is shared: CPU time is the
stable number).
"""
from __future__ import annotations

import argparse
import enum
import glob
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import costmodel  # noqa: E402
from fusionstitching.explorer import Explorer, explore  # noqa: E402
from fusionstitching.graph import Edge, Node, OpClass, OpGraph  # noqa: E402
from fusionstitching.graph.refusal import Refusal  # noqa: E402
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


class Stub(enum.Enum):
    NOT_LIGHT = "stub: only light elementwise ops and row reductions"
    NOT_CONNECTED = "stub: not connected"


def stub_can_stitch(graph: OpGraph):
    allowed = (OpClass.LIGHT_ELEMENTWISE, OpClass.REDUCTION)

    def can_stitch(names: list[str]) -> Refusal | None:
        inside = set(names)
        if any(graph.nodes[n].op_class not in allowed for n in names):
            return Refusal(Stub.NOT_LIGHT, "")
        seen, stack = {names[0]}, [names[0]]
        while stack:
            node = graph.nodes[stack.pop()]
            for m in node.operands + node.users:
                if m in inside and m not in seen:
                    seen.add(m)
                    stack.append(m)
        return None if seen == inside else Refusal(Stub.NOT_CONNECTED, "")

    return can_stitch


def _timed(run):
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def bench_sizes(sizes: list[int], device) -> None:
    print(f"{'nodes':>8} {'V+E':>9} {'wall s':>8} {'cpu s':>7} {'cpu us/(V+E)':>13} "
          f"{'patterns':>9} {'kernels':>8} {'XLA kernels':>12}")
    for size in sizes:
        graph = layered_graph(size)
        v_plus_e = len(graph.nodes) + len(graph.edges)
        plan, wall, cpu = _timed(lambda: Explorer(graph, stub_can_stitch(graph), device).run())
        mem = [n for n in graph.nodes.values() if n.memory_intensive]
        covered = sum(len(p.nodes) for p in plan.patterns)
        print(f"{size:>8} {v_plus_e:>9} {wall:>8.2f} {cpu:>7.2f} {cpu / v_plus_e * 1e6:>13.1f} "
              f"{len(plan.patterns):>9} {len(mem) - covered + len(plan.patterns):>8} "
              f"{len(mem):>12}")


def accept_every_pattern(nodes: list[str]) -> Refusal | None:
    return None


def bench_corpus(device, codegen_kind: str, only: str) -> None:
    from fusionstitching import codegen
    from fusionstitching.graph import build_graph
    from fusionstitching.hlo.parser import parse_file

    print(f"\n{'module':46} {'XLA us':>8} {'greedy us':>10} {'beam us':>8} {'XLA k':>6} "
          f"{'greedy k':>8} {'beam k':>6} {'wall s':>7} {'cpu s':>6} {'queries':>8} "
          f"{'query s':>8}   (modeled, {device.name}; code generator: {codegen_kind})")
    slowest = (0.0, "")
    for path in sorted(glob.glob("tests/data/hlo/*.hlo*")):
        if only not in Path(path).name:
            continue
        module = parse_file(path)
        graph = build_graph(module)
        queries = [0, 0.0]

        def can_stitch(nodes, module=module):
            if codegen_kind == "stub":
                return accept_every_pattern(nodes)
            t0 = time.perf_counter()
            try:
                return codegen.can_stitch(module, nodes)
            finally:
                queries[0] += 1
                queries[1] += time.perf_counter() - t0

        def run():
            explorer = Explorer(graph, can_stitch, device)
            return explorer, explorer.run()

        (explorer, beam), wall, cpu = _timed(run)
        slowest = max(slowest, (cpu, Path(path).name))
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
              f"{len(mem):>6} {len(kernels(greedy)):>8} {len(kernels(beam)):>6} {wall:>7.2f} "
              f"{cpu:>6.2f} {queries[0]:>8} {queries[1]:>8.2f}{flag}")
    print(f"slowest exploration: {slowest[1]}, {slowest[0]:.2f} s CPU")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000, 10000, 100000])
    parser.add_argument("--target", default="h100")
    parser.add_argument("--no-corpus", action="store_true")
    parser.add_argument("--codegen", choices=["stub", "real"], default="stub",
                        help="code generator queries on the corpus (see above)")
    parser.add_argument("--only", default="", help="corpus files whose name contains this")
    args = parser.parse_args()
    device = costmodel.load_device(args.target)
    if args.sizes:
        bench_sizes(args.sizes, device)
    if not args.no_corpus:
        bench_corpus(device, args.codegen, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
