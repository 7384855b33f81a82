"""What producer duplication could free among the explorer's candidates refused for a cycle
(a path leaves the pattern and re-enters it through an outside kernel), not a test.

    python benchmarks/cycle_duplication.py [--out FILE] [files...]
    (default: the third-party tier's H100 training steps)

For each refused candidate: the outside kernels on a path from it back into it, and the
pattern's kernels that feed them (its sources). Duplicating the sources (XLA keeps computing
them for the outside path, the pattern recomputes them) breaks the cycle when no source reads
the pattern or anything the pattern reaches. Counted per module: candidates refused for a
cycle, those duplication would free, those it would free by recomputing only elementwise
or data-movement kernels (a reduction recomputed reads its whole input again), and the op
classes of the sources to duplicate. Candidates overlap: the explorer asks many per kernel.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.manifest import run_manifest  # noqa: E402
from benchmarks.tier_table import tier_files  # noqa: E402
from fusionstitching import pipeline  # noqa: E402
from fusionstitching.explorer import ExplorerRefusal, KernelDag  # noqa: E402
from fusionstitching.graph import OpClass  # noqa: E402

CHEAP = {OpClass.LIGHT_ELEMENTWISE, OpClass.EXPENSIVE_ELEMENTWISE, OpClass.DATA_MOVEMENT}
from fusionstitching.hlo.parser import parse_file  # noqa: E402


def cycle_candidates(path: str) -> dict:
    started = time.perf_counter()
    result = pipeline.stitch_module(parse_file(path), pipeline.Options(ptxas=False))
    graph, dag = result.graph, KernelDag(result.graph)
    refused = {frozenset(d.nodes) for d in result.plan.decisions
               if d.kind is ExplorerRefusal.CYCLE}
    freed, cheaply, classes = 0, 0, collections.Counter()
    between_classes = collections.Counter()
    for pattern in refused:
        ahead, behind = dag.reachable(pattern, True), dag.reachable(pattern, False)
        between = ahead & behind
        sources = [n for n in pattern if any(s in between for s in dag.succs[n])]
        if all(not set(dag.preds[s]) & (pattern | ahead) for s in sources):
            freed += 1
            cheaply += all(graph.nodes[s].op_class in CHEAP for s in sources)
            classes.update(graph.nodes[s].op_class.name for s in sources)
        between_classes.update(graph.nodes[n].op_class.name for n in between)
    return {"module": os.path.basename(path), "refused_for_cycle": len(refused),
            "freed_by_duplication": freed, "freed_recomputing_no_reduction": cheaply,
            "source_classes": dict(classes),
            "between_classes": dict(between_classes),
            "mem_kernels": result.report.xla.mem_kernels,
            "stitched_mem_kernels": result.report.fs.mem_kernels,
            "wall_s": round(time.perf_counter() - started, 1)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*")
    parser.add_argument("--out", help="a JSON file for the rows and the manifest")
    args = parser.parse_args(argv)
    files = args.files or [str(p) for p in tier_files() if "_train_" in p.name]
    rows = []
    for path in files:
        row = cycle_candidates(path)
        rows.append(row)
        print(json.dumps(row), flush=True)
    total = sum(r["refused_for_cycle"] for r in rows)
    freed = sum(r["freed_by_duplication"] for r in rows)
    cheaply = sum(r["freed_recomputing_no_reduction"] for r in rows)
    print(f"{freed} of {total} candidates refused for a cycle would be freed by duplicating "
          f"their sources, {cheaply} without recomputing a reduction")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"manifest": run_manifest(vars(args)), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
