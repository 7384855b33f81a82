"""A job's first step after ``fusionstitching prewarm``, against a cold one (issue 29).

    python benchmarks/bench_prewarm.py                         # zoo BERT train, paper size
    python benchmarks/bench_prewarm.py --model transformer --size small

Three fresh processes, as three runs of a job (``fusionstitching.jit``, sync build, the
default ``keep="fastest"``):

1. cold: no cache, ``dump_to`` a folder (what an earlier run of the job leaves);
2. ``fusionstitching prewarm`` of that folder into an empty cache directory (timed);
3. prewarmed: the job with that cache directory.

Each job times its first call (XLA's compile, the stitched build, the call) and reports the
build's explore seconds and the cache counts.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.bench_cpu_speed import concrete  # noqa: E402
from benchmarks.models import zoo  # noqa: E402
from fusionstitching.stitched_jit import jit  # noqa: E402


def job(opts, cache_dir: str | None, dump_to: str | None) -> dict:
    """One run of the job: its first call."""
    fn, args = zoo.jax_workload(opts.model, opts.mode, opts.size)
    args = concrete(args)
    step = jit(fn, cache_dir=cache_dir, dump_to=dump_to)
    started = time.perf_counter()
    jax.block_until_ready(step(*args))
    first = time.perf_counter() - started
    (report,) = step.reports(wait_s=600)
    report = report.to_json()
    return {"first_call_s": first, "build_s": report["runtime"]["build_s"],
            "explore_s": report["times_s"]["explore"], "plan": report["cache"]["plan"],
            "kernels_built": report["cache"]["misses"], "kernels_loaded": report["cache"]["hits"]}


def run(opts, argv: list[str]) -> dict:
    command = [sys.executable, __file__, "--model", opts.model, "--mode", opts.mode,
               "--size", opts.size, *argv]
    done = subprocess.run(command, capture_output=True, text=True, check=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="bert")
    parser.add_argument("--mode", default="train")
    parser.add_argument("--size", default="paper")
    parser.add_argument("--job", nargs=2, metavar=("CACHE_DIR", "DUMP_TO"),
                        help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.job:
        cache_dir, dump_to = (None if v == "-" else v for v in opts.job)
        print(json.dumps(job(opts, cache_dir, dump_to)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        dumps, cache = f"{scratch}/dumps", f"{scratch}/cache"
        cold = run(opts, ["--job", "-", dumps])
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "fusionstitching.cli", "prewarm", dumps,
                        "--cache_dir", cache], check=True, cwd=REPO,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
        prewarm_s = time.perf_counter() - started
        warm = run(opts, ["--job", cache, "-"])
    print(json.dumps({"model": f"{opts.model} {opts.mode} {opts.size}", "cold": cold,
                      "prewarm_s": prewarm_s, "prewarmed": warm}, indent=1))


if __name__ == "__main__":
    main()
