"""The beam explorer against the greedy baseline through the whole pipeline, on every XLA:GPU
H100 workload module of the corpus (not a test).

    nice -n 10 python benchmarks/bench_explorer_vs_greedy.py
    nice -n 10 python benchmarks/bench_explorer_vs_greedy.py --only bert_train

For each module and explorer, ``pipeline.stitch_module(parse_file(f), Options(ptxas=False,
explorer=E))`` runs in its own process (one after the other: the machine is shared), and
the Report's memory-intensive kernels, bytes and modeled time (latency-evaluator, modeled,
not measured) are printed with XLA's own plan, as the Report counts them. Modules where beam
is worse than greedy in modeled time, kernels or bytes are listed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "hlo"
EXPLORERS = ("greedy", "beam")

CHILD = """
import json, sys, time
from fusionstitching.hlo.parser import parse_file
from fusionstitching.pipeline import Options, stitch_module
cpu = time.process_time()
report = stitch_module(parse_file(sys.argv[1]), Options(ptxas=False, explorer=sys.argv[2])).report
print(json.dumps({"xla": [report.xla.mem_kernels, report.xla.bytes, report.xla.modeled_us],
                  "fs": [report.fs.mem_kernels, report.fs.bytes, report.fs.modeled_us],
                  "fallbacks": len(report.fallbacks), "explore_s": report.times_s.explore,
                  "cpu_s": time.process_time() - cpu}))
"""


def workload_modules(only: str) -> list[tuple[str, bool]]:
    manifest = json.loads((DATA / "manifest.json").read_text())
    return [(name, bool(entry.get("classic"))) for name, entry in sorted(manifest.items())
            if entry.get("kind") == "workload" and entry.get("target") == "h100"
            and only in name]


def run(name: str, explorer: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(DATA / name), explorer],
                          cwd=ROOT, capture_output=True, text=True, check=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu",
                               "PYTHONPATH": str(ROOT)})
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="modules whose name contains this")
    args = parser.parse_args()
    print(f"{'module':42} {'cl':>2} | {'kernels XLA/greedy/beam':>23} | "
          f"{'bytes XLA/greedy/beam':>29} | {'modeled us XLA/greedy/beam':>26} | "
          f"{'explore s greedy/beam':>21}   (H100, modeled)", flush=True)
    totals = {key: [0, 0, 0.0] for key in ("xla", *EXPLORERS)}
    worse = []
    for name, classic in workload_modules(args.only):
        results = {e: run(name, e) for e in EXPLORERS}
        xla = results["greedy"]["xla"]
        rows = {"xla": xla, **{e: results[e]["fs"] for e in EXPLORERS}}
        for key, (kernels, nbytes, us) in rows.items():
            totals[key][0] += kernels
            totals[key][1] += nbytes
            totals[key][2] += us
        g, b = rows["greedy"], rows["beam"]
        what = [label for label, i in (("kernels", 0), ("bytes", 1), ("modeled us", 2))
                if b[i] > g[i]]
        if what:
            worse.append(f"{name}: beam worse in {', '.join(what)}")
        print(f"{name:42} {'y' if classic else 'n':>2} | "
              f"{xla[0]:>7}/{g[0]:>7}/{b[0]:>7} | {xla[1]:>9}/{g[1]:>9}/{b[1]:>9} | "
              f"{xla[2]:>8.1f}/{g[2]:>8.1f}/{b[2]:>8.1f} | "
              f"{results['greedy']['explore_s']:>10.1f}/{results['beam']['explore_s']:>10.1f}"
              f"{'  WORSE' if what else ''}", flush=True)
    x = totals["xla"]
    print(f"{'sum':45} | {x[0]:>7}/{totals['greedy'][0]:>7}/{totals['beam'][0]:>7} | "
          f"{x[1]:>9}/{totals['greedy'][1]:>9}/{totals['beam'][1]:>9} | "
          f"{x[2]:>8.1f}/{totals['greedy'][2]:>8.1f}/{totals['beam'][2]:>8.1f} |")
    for e in EXPLORERS:
        k, nbytes, us = totals[e]
        print(f"{e}: {k} kernels = {100 * k / x[0]:.1f}% of XLA's {x[0]}; bytes "
              f"{100 * nbytes / x[1]:.1f}% of XLA's; modeled {us:.1f} us vs XLA's {x[2]:.1f} us")
    print("beam worse than greedy:", "; ".join(worse) if worse else "on no module")
    return 0


if __name__ == "__main__":
    sys.exit(main())
