"""A job's first step after ``fusionstitching prewarm``, against a cold one.

    python benchmarks/bench_prewarm.py                         # zoo BERT train, paper size
    python benchmarks/bench_prewarm.py --model transformer --size small

Fresh processes, as runs of a job (``fusionstitching.jit``, sync build, the default
``keep="fastest"``):

1. XLA alone: ``jax.jit``, the first call the job would wait for without us;
2. cold: no cache, ``dump_to`` a folder (what an earlier run of the job leaves);
3. ``fusionstitching prewarm`` of that folder into an empty cache directory (timed);
4. prewarmed: the job with that cache directory.

Each job times its first call (XLA's compile, the stitched build, the call) and reports the
build's explore seconds, the cache counts and what the runtime decided. ``--async``: the
jobs build and try the stitched step off the call path (``async_compile=True``);
``--xla-only`` runs the first alone.
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
    if opts.plain:
        step = jax.jit(fn)
        started = time.perf_counter()
        jax.block_until_ready(step(*args))
        return {"first_call_s": time.perf_counter() - started, **later_steps(step, args, opts)}
    step = jit(fn, cache_dir=cache_dir, dump_to=dump_to, async_compile=opts.async_compile)
    started = time.perf_counter()
    jax.block_until_ready(step(*args))
    first = time.perf_counter() - started
    later = later_steps(step, args, opts)
    (report,) = step.reports(wait_s=600)
    report = report.to_json()
    runtime = report["runtime"]
    return {"first_call_s": first, "build_s": runtime["build_s"],
            "explore_s": report["times_s"]["explore"], "plan": report["cache"]["plan"],
            "kernels_built": report["cache"]["misses"], "kernels_loaded": report["cache"]["hits"],
            # after the first call (async: its build and trial waited for above)
            "state": runtime["state"], "kept": runtime["kept"], "xla_us": runtime["xla_us"],
            "stitched_us": runtime["stitched_us"], "swapped_at_call": runtime["swapped_at_call"],
            **later}


def later_steps(step, args, opts) -> dict:
    """Seconds of each call after the first (``--steps``), on the same arguments."""
    seconds = []
    for _ in range(opts.steps - 1):
        started = time.perf_counter()
        jax.block_until_ready(step(*args))
        seconds.append(round(time.perf_counter() - started, 3))
    return {"later_steps_s": seconds} if seconds else {}


def run(opts, argv: list[str]) -> dict:
    command = [sys.executable, __file__, "--model", opts.model, "--mode", opts.mode,
               "--size", opts.size, "--steps", str(opts.steps),
               *(["--async"] if opts.async_compile else []), *argv]
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
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=1,
                        help="calls per job (the same arguments each time), each timed")
    parser.add_argument("--async", dest="async_compile", action="store_true",
                        help="the jobs build and try the stitched step off the call path")
    parser.add_argument("--xla-only", action="store_true",
                        help="only XLA alone's first call (the baseline)")
    opts = parser.parse_args(argv)
    if opts.job:
        cache_dir, dump_to = (None if v == "-" else v for v in opts.job)
        print(json.dumps(job(opts, cache_dir, dump_to)))
        return
    xla = run(opts, ["--job", "-", "-", "--plain"])
    if opts.xla_only:
        print(json.dumps({"model": f"{opts.model} {opts.mode} {opts.size}", "xla": xla}))
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
    print(json.dumps({"model": f"{opts.model} {opts.mode} {opts.size}", "xla": xla, "cold": cold,
                      "prewarm_s": prewarm_s, "prewarmed": warm}, indent=1))


if __name__ == "__main__":
    main()
