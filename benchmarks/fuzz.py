"""The differential fuzzer at scale: seeded random JAX programs on every route, with a manifest.

    python benchmarks/fuzz.py --count 2000 --workers 2 --out benchmarks/results/fuzz_DATE/fuzz.json
    python benchmarks/fuzz.py --table benchmarks/results/fuzz_DATE/fuzz.json   # the README's table

The JSON holds the manifest, the summary, the verdict counts per route and, in full (with
its source), every program that was not ok; it is rewritten after each program, so a
stopped run keeps them.
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
from fusionstitching.fuzz.differential import PLAN_LIMIT_S, Verdict, fuzz_summary  # noqa: E402
from fusionstitching.fuzz.pool import fuzz_in_workers  # noqa: E402


def run(args) -> None:
    manifest = run_manifest({"count": args.count, "seed": args.seed, "routes": args.routes,
                             "workers": args.workers})
    routes = tuple(args.routes.split(","))
    seeds = list(range(args.seed, args.seed + args.count))
    done, started = [], time.perf_counter()

    def record(outcome) -> None:
        done.append(outcome)
        if outcome.failed:
            print(outcome.describe(), flush=True)
        if len(done) % 50 == 0:
            print(f"{len(done)} of {len(seeds)} programs", flush=True)
        _write(args.out, manifest, done, time.perf_counter() - started)

    outcomes = fuzz_in_workers(seeds, routes, args.workers, record)
    wall = time.perf_counter() - started
    _write(args.out, manifest, outcomes, wall)
    print(fuzz_summary(outcomes, wall))


def _write(path: str, manifest: dict, outcomes: list, wall_s: float) -> None:
    """The run's manifest, summary and verdict counts, and in full only the programs that
    were not ok (a run's every verdict would be megabytes of "ok")."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    programs = [o.to_json() for o in sorted(outcomes, key=lambda o: o.program.seed)]
    body = {"manifest": manifest, "wall_s": round(wall_s, 1),
            "summary": fuzz_summary(outcomes, wall_s).splitlines(),
            "counts": tally(programs),
            "plan_s": plan_times(programs),
            "not_ok": [p for p in programs if p["verdict"] != "ok"]}
    with open(path + ".partial", "w") as f:
        json.dump(body, f, indent=1)
    os.replace(path + ".partial", path)


def tally(programs: list[dict]) -> dict:
    """Per route (and "program"): verdict -> count, and programs with stitched kernels."""
    counts: dict = collections.defaultdict(lambda: {"verdicts": collections.Counter(),
                                                    "stitched": 0})
    for p in programs:
        counts["program"]["verdicts"][p["verdict"]] += 1
        for r in p["routes"]:
            counts[r["route"]]["verdicts"][r["verdict"]] += 1
            counts[r["route"]]["stitched"] += r["stitched"] > 0
    return {route: {"verdicts": dict(c["verdicts"]), "stitched": c["stitched"]}
            for route, c in counts.items()}


def plan_times(programs: list[dict]) -> dict:
    """Per route: the longest planning, the 99th percentile, and how many routes planned
    for longer than ten, twenty and PLAN_LIMIT_S seconds."""
    by_route: dict[str, list[float]] = collections.defaultdict(list)
    for p in programs:
        for r in p["routes"]:
            if r.get("plan_s"):
                by_route[r["route"]].append(r["plan_s"])
    out = {}
    for route, times in by_route.items():
        times.sort()
        out[route] = {"max": times[-1], "p99": times[min(len(times) - 1, int(0.99 * len(times)))],
                      **{f"over_{int(limit)}": sum(t > limit for t in times)
                         for limit in (10, 20, PLAN_LIMIT_S)}}
    return out


def table(path: str) -> str:
    """A markdown table of verdicts per route, from a result file, and the manifest's line."""
    with open(path) as f:
        body = json.load(f)
    m, counts = body["manifest"], body["counts"]
    verdicts = [v.value for v in Verdict]
    lines = ["| | " + " | ".join(verdicts) + " | with stitched kernels |",
             "|---" * (len(verdicts) + 2) + "|"]
    for route, c in counts.items():
        total = sum(c["verdicts"].values())
        lines.append(f"| {route} ({total}) | "
                     + " | ".join(str(c["verdicts"].get(v, 0)) for v in verdicts)
                     + f" | {c['stitched'] if route != 'program' else ''} |")
    for route, t in body.get("plan_s", {}).items():
        lines.append("")
        lines.append(f"{route}: planned in at most {t['max']:.1f} s (99th percentile "
                     f"{t['p99']:.1f} s); over 10 s: {t['over_10']}, over 20 s: {t['over_20']}, "
                     f"over {PLAN_LIMIT_S:g} s: {t[f'over_{int(PLAN_LIMIT_S)}']}.")
    host = m["host"]
    lines.append("")
    lines.append(f"Commit {m['commit'][:7]}{'' if m['tree_clean'] else ' (modified)'}, "
                 f"{m['date']}, {host['processor']} ({host['cores']} cores), Python "
                 f"{m['python']}, jax {m['versions']['jax']}, jaxlib {m['versions']['jaxlib']}, "
                 f"flags {m['flags']}, {body['wall_s']:.0f} s wall.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0, help="the first program's seed")
    parser.add_argument("--routes", default="cpu,h100")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default="benchmarks/results/fuzz/fuzz.json")
    parser.add_argument("--table", metavar="RESULT", help="print the table of a result file")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
    else:
        run(args)


if __name__ == "__main__":
    main()
