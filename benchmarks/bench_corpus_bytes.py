"""Stitched global-memory bytes against compulsory bytes on the XLA:GPU corpus, and why they
differ (the goal: within 15% summed over models).

    python benchmarks/bench_corpus_bytes.py [--jobs 1] [--timeout 900] [--out FILE]

Modules: every workload of tests/data/hlo/manifest.json for XLA:GPU H100 (default plan).
Each runs in its own process: ``pipeline.stitch_module(Options())``, as the pipeline runs by
default (with ptxas, which the explorer asks about patterns at the register model's cap), gives the
Report's ``fs.bytes`` (the stitched plan) and ``compulsory_bytes`` (one kernel per connected
memory-intensive region; both counted by ``graph.traffic``). One kernel per region is not
always possible: two of its kernels with an opaque kernel (GEMM, convolution) on a path
between them cannot share one. So the excess is attributed region by region: first the
excess of a cycle-free plan, one kernel per region and *opaque depth* (the most opaque
kernels on a path to the node; kernels of equal depth have no opaque kernel between them),
which is not a lower bound (another cut can move fewer bytes) but one no cycle forbids; then,
for each depth the stitched plan splits, the reason: the code generator's refusal of the
depth's kernels as one (names and numbers blanked so that equal causes group), else the
pipeline's fallback, else the explorer's choice by modeled time (one kernel builds, and its
schedule is named), then the rest (stitched kernels spanning depths). The plan is
restricted to the region first: a kernel that packs several regions counts in each only with
that region's nodes, and what such packing saves on shared reads is reported apart (before
2026-11-23 each region was charged the whole packed kernel, which put ~1.2 MB of other
regions' traffic into "the rest"). A refusal names only
the first op the code generator rejects, so the second table lists every XLA kernel the code
generator cannot build even alone, by reason, with the bytes it reads and writes: each is a
boundary no stitched plan removes, and the to-do list for the code generator.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.corpus_table import DATA, run_child  # noqa: E402

TARGET = "h100"
BOUND = 0.15  # the goal: stitched bytes within 15% of compulsory bytes

_CHILD = """
import json, sys
from fusionstitching import codegen
from fusionstitching.graph.traffic import (acyclic_lower_bound_bytes, memory_intensive_regions,
                                          opaque_depth, pattern_traffic, plan_bytes)
from fusionstitching.hlo.parser import parse_file
from fusionstitching.pipeline import Options, stitch_module
module = parse_file(sys.argv[1])
result = stitch_module(module, Options())
graph, report = result.graph, result.report
pattern_of = {n: k.pattern.nodes for k in result.kernels for n in k.pattern.nodes}
fallback_of = {n: f"{f.stage}: {f.reason}" for f in report.fallbacks for n in f.nodes}
depth = opaque_depth(graph)
causes, levelled, region_excess = [], 0, 0
for region in memory_intensive_regions(graph):
    levels = {}
    for n in region:
        levels.setdefault(depth[n], []).append(n)
    levelled += plan_bytes(graph, levels.values())
    # The plan restricted to the region: a kernel packing several regions is charged to each
    # only for the region's own nodes (what it saves on shared reads is reported apart).
    inside_region = set(region)
    patterns = list({tuple(n for n in pattern_of.get(m, [m]) if n in inside_region)
                     for m in region})
    excess = plan_bytes(graph, patterns) - plan_bytes(graph, [region])
    region_excess += excess
    if excess <= 0:
        continue
    forced = plan_bytes(graph, levels.values()) - plan_bytes(graph, [region])
    if forced:
        causes.append({"excess": forced, "reason": "cycle through an opaque kernel: one kernel "
                       "per region and opaque depth (cycle-free) moves this much more than one "
                       "per region"})
    explained = forced
    for level in levels.values():
        inside = set(level)
        parts = {tuple(n for n in pattern_of.get(m, [m]) if n in inside) for m in level}
        level_excess = plan_bytes(graph, parts) - plan_bytes(graph, [level])
        if level_excess <= 0:
            continue
        explained += level_excess
        try:
            spec = codegen.generate(module, level, "level")
        except codegen.CodegenError as e:
            reason = str(e)
        else:
            reason = next((fallback_of[n] for n in level if n in fallback_of),
                          f"explorer's choice by modeled time: one kernel builds "
                          f"({spec.why.split(':')[0]}, {spec.modeled_us:.0f} us modeled)")
        causes.append({"excess": level_excess, "reason": reason})
    if excess != explained:
        causes.append({"excess": excess - explained, "reason": "kernels spanning opaque depths "
                       "(the rest of the region's excess)"})
alone = []
for node in graph.memory_intensive_nodes():
    refusal = codegen.can_stitch(module, [node.name])
    if refusal is not None:
        alone.append({"bytes": sum(pattern_traffic(graph, [node.name])), "reason": str(refusal)})
print(json.dumps({"fs_bytes": report.fs.bytes, "compulsory": report.compulsory_bytes,
                  "levelled": levelled, "bound": acyclic_lower_bound_bytes(graph),
                  "xla_bytes": report.xla.bytes, "causes": causes, "alone": alone,
                  "region_excess": region_excess}))
"""


def workload_files() -> list[str]:
    manifest = json.loads((DATA / "manifest.json").read_text())
    return sorted(name for name, e in manifest.items()
                  if "skipped" not in e and e["target"] == TARGET and not e["classic"]
                  and e.get("kind") == "workload")


def cause_key(reason: str) -> str:
    """A refusal with the instruction names, shapes and numbers blanked."""
    reason = re.sub(r"%?[\w.\-]+\.\d+\b", "N", reason)  # instruction names (fusion.12)
    reason = re.sub(r"\[[\d, ()x\[\]]*\]", "[..]", reason)
    return re.sub(r"\d+(\.\d+)?", "#", reason)[:150]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", help="also write the table to this file")
    opts = ap.parse_args(argv)
    names = workload_files()
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(opts.jobs) as pool:
        results = dict(zip(names, pool.map(lambda n: run_child(_CHILD, n, opts.timeout), names)))
    lines = [f"{'module':42s} {'XLA bytes':>12s} {'stitched':>12s} {'compulsory':>12s} "
             f"{'stitched/compulsory':>20s} {'cycle-free':>12s} {'lower bound':>12s}"]
    totals = [0, 0, 0, 0, 0]
    region_excess = 0
    causes: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    alone: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for name in names:
        r = results[name]
        if "error" in r:
            lines.append(f"{name:42s} failed: {r['error']}")
            continue
        lines.append(f"{name:42s} {r['xla_bytes']:>12,d} {r['fs_bytes']:>12,d} "
                     f"{r['compulsory']:>12,d} {r['fs_bytes'] / r['compulsory']:>20.3f} "
                     f"{r['levelled']:>12,d} {r['bound']:>12,d}")
        for i, key in enumerate(("xla_bytes", "fs_bytes", "compulsory", "levelled", "bound")):
            totals[i] += r[key]
        region_excess += r["region_excess"]
        for c in r["causes"]:
            entry = causes[cause_key(c["reason"])]
            entry[0] += c["excess"]
            entry[1] += 1
        for a in r["alone"]:
            entry = alone[cause_key(a["reason"])]
            entry[0] += a["bytes"]
            entry[1] += 1
    ratio = totals[1] / max(totals[2], 1)
    lines.append(f"{'sum':42s} {totals[0]:>12,d} {totals[1]:>12,d} {totals[2]:>12,d} "
                 f"{ratio:>20.3f} {totals[3]:>12,d} {totals[4]:>12,d}")
    lines.append(f"\nstitched bytes are {100 * (ratio - 1):.1f}% above compulsory bytes "
                 f"(the goal: at most {100 * BOUND:.0f}%); "
                 f"{time.perf_counter() - started:.0f} s")
    lines.append(f"cycle-free: one kernel per region and opaque depth, a plan without cycles "
                 f"through opaque kernels: {100 * (totals[3] / max(totals[2], 1) - 1):.1f}% "
                 f"above compulsory")
    lines.append(f"lower bound: no plan of acyclic kernels moves fewer bytes "
                 f"(graph.traffic.acyclic_lower_bound_bytes): "
                 f"{100 * (totals[4] / max(totals[2], 1) - 1):+.1f}% against compulsory; "
                 f"stitched bytes are {100 * (totals[1] / max(totals[4], 1) - 1):.1f}% above it")
    lines.append(f"\nThe regions' excess (the stitched plan restricted to each region, against "
                 f"one kernel for it) sums to {region_excess:,d} B; the plan's is "
                 f"{totals[1] - totals[2]:,d} B: kernels packing several regions save "
                 f"{region_excess - (totals[1] - totals[2]):,d} B of shared reads.")
    lines.append("Excess bytes by cause (per region: cycles, then each opaque depth not "
                 "stitched into one kernel; the rest can be negative where a kernel spanning "
                 "depths moves less than the cycle-free plan):")
    for key, (excess, cases) in sorted(causes.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"  {excess:>12,d} B in {cases:3d} cases: {key}")
    lines.append("\nXLA kernels the code generator cannot build even alone (their read + "
                 "written bytes):")
    for key, (traffic, kernels) in sorted(alone.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"  {traffic:>12,d} B in {kernels:3d} kernels: {key}")
    text = "\n".join(lines)
    print(text)
    if opts.out:
        Path(opts.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
