"""XLA's own test modules (../shared/xla_suite/{gpu,cpu}) replayed with ``--verify``, with a
manifest: the conformance run.

    python benchmarks/xla_suite.py --out benchmarks/results/xla_suite_DATE [--reports DIR]
    python benchmarks/xla_suite.py --table benchmarks/results/xla_suite_DATE   # README table

Per folder: ``fusionstitching replay DIR --verify --workers 2 --json-dir OUT/DIR`` (for cpu
with ``--cpu-schedule``: the kernels as the runtime builds them for a CPU, checked too) in a child
process (its Reports, one JSON a module, go to --reports/DIR, outside the repository: they
name XLA's test modules' instructions), its exit status, wall time and the largest resident
memory of any of its processes; then each module's verdict, into OUT/summary.json beside
OUT/manifest.json.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.manifest import run_manifest  # noqa: E402

SUITE = Path(__file__).resolve().parents[2] / "shared" / "xla_suite"
FOLDERS = ("gpu", "cpu")


def verdict(report: dict) -> str:
    """One module's outcome in a word or two: verified, not run, vacuous, mismatch, error."""
    if report.get("outcome") != "planned":
        return report.get("outcome", "error")
    check = report.get("verify") or {}
    if check.get("error"):
        return "error in check"
    if not check.get("ran"):
        return "not run"
    if check.get("vacuous"):
        return "vacuous"
    return "verified" if check.get("ok") else "mismatch"


def run(out: Path, reports_dir: Path, workers: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    manifest = run_manifest({"workers": workers, "verify": True, "suite": str(SUITE),
                             "cpu_schedule": ["cpu"]})
    summary = {}
    for folder in FOLDERS:
        shutil.rmtree(reports_dir / folder, ignore_errors=True)  # an earlier run's
        started = time.perf_counter()
        # XLA:CPU's modules: the CPU schedule the runtime would run is verified too
        cpu = ["--cpu-schedule"] if folder == "cpu" else []
        proc = subprocess.run([sys.executable, "-m", "fusionstitching.cli", "replay",
                               str(SUITE / folder), "--verify", "--workers", str(workers),
                               "--json-dir", str(reports_dir / folder)] + cpu,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # the largest of any process waited for so far (replay and its workers): kB on Linux
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        reports = [json.loads(p.read_text())
                   for p in sorted((reports_dir / folder).glob("*.json"))]
        counts = collections.Counter(verdict(r) for r in reports)
        summary[folder] = {"files": len(list((SUITE / folder).glob("*.hlo.txt"))),
                           "reports": len(reports), "exit_status": proc.returncode,
                           "wall_s": round(time.perf_counter() - started, 1),
                           "peak_rss_mb": round(peak_mb), "verdicts": dict(counts),
                           "not_verified": {r.get("file", "?"): verdict(r) for r in reports
                                            if verdict(r) != "verified"},
                           "stderr_tail": proc.stderr[-2000:]}
        print(folder, json.dumps({k: v for k, v in summary[folder].items()
                                  if k != "stderr_tail"}), flush=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


def table(out: Path) -> str:
    """A markdown table of verdicts per folder, and the manifest's line."""
    summary = json.loads((out / "summary.json").read_text())
    m = json.loads((out / "manifest.json").read_text())
    kinds = ["verified", "not run", "vacuous", "mismatch", "error in check", "error"]
    # ru_maxrss of RUSAGE_CHILDREN: the largest process of the run up to that folder's end
    lines = ["| folder | modules | " + " | ".join(kinds)
             + " | verified % | largest process so far | wall |",
             "|---" * (len(kinds) + 5) + "|"]
    for folder, s in summary.items():
        v = s["verdicts"]
        lines.append(f"| {folder} | {s['reports']} of {s['files']} | "
                     + " | ".join(str(v.get(k, 0)) for k in kinds)
                     + f" | {100 * v.get('verified', 0) / max(s['reports'], 1):.1f}% | "
                       f"{s['peak_rss_mb']:,} MB | {s['wall_s']:.0f} s |")
    host = m["host"]
    lines.append("")
    lines.append(f"Commit {m['commit'][:7]}{'' if m['tree_clean'] else ' (modified)'}, "
                 f"{m['date']}, {host['processor']} ({host['cores']} cores), jax "
                 f"{m['versions']['jax']}, jaxlib {m['versions']['jaxlib']}, "
                 f"`replay --verify --workers {m['flags']['workers']}`"
                 + "".join(f", {f} with `--cpu-schedule`"
                           for f in m["flags"].get("cpu_schedule", [])) + ".")
    for folder, s in summary.items():
        for name, what in s["not_verified"].items():
            lines.append(f"- {folder}: `{Path(name).name}`: {what}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/xla_suite"))
    parser.add_argument("--reports", type=Path, default=Path("/tmp/xla_suite_reports"),
                        help="where each module's Report JSON goes")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--table", type=Path, metavar="RESULT",
                        help="print the table of a result folder")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
    elif not SUITE.is_dir():
        print(f"no XLA suite at {SUITE}: nothing to run")
    else:
        run(args.out, args.reports, args.workers)


if __name__ == "__main__":
    main()
