"""fusionstitching.jit against jax.jit on a GPU: the product's own route, end to end.

    python benchmarks/gpu_jit_check.py [--size small] [--workloads bert/train,flax:flax_vit_train]
                                       [--jobs N]

A workload is a zoo step (benchmarks/models/zoo.py) or PART:STEP of the third-party tier
(bench_plan_time.tier_steps). Each is compiled with ``jax.jit`` and ``fusionstitching.jit``
(keep="fastest", verify=True: plans on the CPU, launches the kernels' PTX, keeps whichever
executable its timing finds faster). Printed: what was kept and why, interleaved step times of
jax.jit, keep="stitched" (also without the wrapper) and keep="fastest", on the same inputs and,
for a training step, as a loop carrying its state; the largest output difference. ``--jobs N`` first plans every workload in N processes into one
plan cache (their cold first calls are recorded), then measures one at a time from it.
Without a GPU it says so and exits 0; results go to DIR/gpu_jit_check.json.gz.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # the tier's modules import each other plainly

import jax  # noqa: E402
import numpy as np  # noqa: E402

import fusionstitching  # noqa: E402
from bench_cpu_speed import concrete  # noqa: E402
from bench_plan_time import tier_steps  # noqa: E402
from benchmarks.gpu_check import find_gpu, interleaved_seconds  # noqa: E402
from benchmarks.models import zoo  # noqa: E402
from step_loops import repeated_calls, state_feedback, training_loop  # noqa: E402

DECIDING_CALLS = 1000  # calls after the first within which keep="fastest" must decide
# Runs of n back-to-back calls of one executable (waiting for the last) in the ranking probe:
# which n ranks XLA's and the stitched executable as the loop carrying the state does.
RUN_LENGTHS = (1, 4, 16, 64)
PROBE_ROUNDS = 7
WORKLOADS = ["bert/train", "transformer/train", "dien/train", "bert/infer", "crnn/infer"]


def workload(name: str, size: str):
    """(fn, args) of a zoo workload ("bert/train") or a tier step ("flax:flax_vit_train")."""
    if ":" not in name:
        model, mode = name.split("/")
        return zoo.jax_workload(model, mode, size, abstract=False)
    part, step = name.split(":")
    for found, kind, fn, args in tier_steps(part, [step.rsplit("_", 1)[0]]):
        if found == step and kind == "jax":
            return fn, concrete(args)
    raise LookupError(f"no JAX step {step} in part {part} here")


def plan_cold(name: str, size: str, cache_dir: str) -> dict:
    """In a process of its own: the workload's first call with an empty plan cache (plans,
    builds, verifies, times), which leaves its plan in ``cache_dir``."""
    fn, args = workload(name, size)
    started = time.perf_counter()
    jax.block_until_ready(fusionstitching.jit(fn, cache_dir=cache_dir)(*args))
    return dict(workload=name, cold_first_call_s=time.perf_counter() - started)


def plan_all(names: list[str], size: str, cache_dir: str, jobs: int, deadline_s: float
             ) -> dict[str, dict]:
    """Each workload's cold first call in a child process (``--plan-one``), ``jobs`` at a time;
    a child still planning at the deadline is stopped and reported."""
    waiting, running, done = list(names), {}, {}
    stop = time.perf_counter() + deadline_s
    while waiting or running:
        while waiting and len(running) < jobs:
            name = waiting.pop(0)
            # a file, not a pipe: a child that prints more than a pipe holds would block
            out = tempfile.TemporaryFile("w+")
            running[name] = (subprocess.Popen(
                [sys.executable, __file__, "--plan-one", name, "--size", size,
                 "--cache_dir", cache_dir], stdout=out, text=True), out)
        for name, (child, out) in list(running.items()):
            if child.poll() is None and time.perf_counter() < stop:
                continue
            if child.poll() is None:
                child.kill()
                done[name] = dict(workload=name, error=f"still planning after {deadline_s} s")
            else:
                out.seek(0)
                lines = out.read().splitlines()
                done[name] = json.loads(lines[-1]) if child.returncode == 0 and lines else \
                    dict(workload=name, error=f"exit status {child.returncode}")
            child.wait()
            out.close()
            del running[name]
            print(f"planned {name}: {done[name]}", flush=True)
        time.sleep(0.5)
    return done


def ranking_by_run_length(executables: dict, args) -> dict[str, dict[str, list[float]]]:
    """{n: {label: [min, median] us per call}} of runs of n calls of each executable, in
    rounds that alternate which goes first."""
    probe = {}
    for n in RUN_LENGTHS:
        samples = {label: [] for label in executables}
        for r in range(PROBE_ROUNDS):
            order = list(executables.items())
            for label, executable in (order if r % 2 == 0 else order[::-1]):
                run = repeated_calls(executable, args)
                started = time.perf_counter()
                run(n)
                samples[label].append((time.perf_counter() - started) / n * 1e6)
        probe[str(n)] = {label: [min(s), float(np.median(s))] for label, s in samples.items()}
    return probe


def check_workload(name: str, size: str, device, cache_dir: str | None = None,
                   dump_to: str | None = None) -> dict:
    fn, args = workload(name, size)
    args = jax.device_put(args, device)
    row = dict(workload=f"{name} ({size})")
    reference = jax.jit(fn)
    expected = jax.block_until_ready(reference(*args))
    started = time.perf_counter()
    fastest = fusionstitching.jit(fn, verify=True, cache_dir=cache_dir, dump_to=dump_to)
    got = jax.block_until_ready(fastest(*args))  # plans, builds, verifies and times
    row["first_call_s"] = time.perf_counter() - started
    (compiled,) = fastest._compiled.values()
    # A trial that found the stitched executable faster is confirmed on the next real calls,
    # made as a loop makes them, without waiting for each (on a GPU the executor times runs of
    # them); the decision comes before the step times.
    deciding_calls, out = 0, None
    while compiled.executor.decided() is None and deciding_calls < DECIDING_CALLS:
        out = fastest(*args)
        deciding_calls += 1
    jax.block_until_ready(out)
    (report,) = fastest.reports()
    # the deciding calls' own times (private: a benchmark reads what the executor weighed)
    row["deciding_samples_us"] = {k: [round(t * 1e6, 1) for t in v]
                                  for k, v in compiled.executor._samples.items()}
    runtime = report.runtime or {}
    row.update(kept=("stitched" if compiled.executor.runs_stitched() else "xla")
               if compiled.executor.decided() is not None else "undecided",
               deciding_calls=deciding_calls,
               state=runtime.get("state"), why=runtime.get("why"),
               xla_mem_kernels=report.xla.mem_kernels, fs_mem_kernels=report.fs.mem_kernels,
               fallbacks=[f"{f.stage}: {f.reason}"[:300] for f in report.fallbacks])
    leaves = lambda tree: [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(tree)]
    row["max_abs_diff"] = max((float(np.nanmax(np.abs(a - b), initial=0.0))
                               for a, b in zip(leaves(expected), leaves(got))), default=0.0)
    row["nan_mismatches"] = sum(int(np.sum(np.isnan(a) != np.isnan(b)))
                                for a, b in zip(leaves(expected), leaves(got)))
    stitched = fusionstitching.jit(fn, keep="stitched", cache_dir=cache_dir)
    jax.block_until_ready(stitched(*args))
    runs = {"jax": repeated_calls(reference, args), "fs": repeated_calls(stitched, args),
            "fastest": repeated_calls(fastest, args)}
    feedback = state_feedback(fn, args)
    if feedback:  # a training step: also as a loop that carries its state
        row["state_arguments"] = sorted(feedback)
        runs.update({f"{k}_loop": training_loop(f, args, feedback)
                     for k, f in (("jax", reference), ("fs", stitched), ("fastest", fastest))})
    row["planned_mem_kernels"] = stitched.reports()[0].fs.mem_kernels
    (own,) = stitched._compiled.values()
    if own.executor.runs_stitched():  # the same executable without our wrapper's dispatch
        runs["fs_direct"] = repeated_calls(own.executor.active, args)
        row["ranking_us"] = ranking_by_run_length(
            {"xla": compiled.executor.xla, "stitched": own.executor.active}, args)
    seconds = interleaved_seconds(runs)
    row.update({f"{k}_us": v * 1e6 for k, v in seconds.items()})
    row["speedup"] = seconds["jax"] / seconds["fs"]
    if feedback:
        row["loop_speedup"] = seconds["jax_loop"] / seconds["fs_loop"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small", choices=zoo.SIZES)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    ap.add_argument("--cpu", action="store_true",
                    help="run on the CPU instead (the host route: checks this script)")
    ap.add_argument("--jobs", type=int, default=0,
                    help="plan the workloads first in this many processes, into one cache")
    ap.add_argument("--plan_s", type=float, default=600.0,
                    help="with --jobs: stop a workload's planning after this many seconds")
    ap.add_argument("--budget_s", type=float, default=float("inf"),
                    help="measure no workload after this many seconds")
    ap.add_argument("--dump", help="keep each build's HLO (XLA's, rewritten) in this folder")
    ap.add_argument("--plan-one", help=argparse.SUPPRESS)  # a child of --jobs
    ap.add_argument("--cache_dir", help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if opts.plan_one:
        print(json.dumps(plan_cold(opts.plan_one, opts.size, opts.cache_dir)))
        return 0
    began = time.perf_counter()
    names = opts.workloads.split(",")
    if opts.jobs:  # several processes share the GPU: none may take 75% of its memory first
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    device, about = (jax.devices("cpu")[0], "CPU") if opts.cpu else find_gpu()
    if device is None:
        print(f"no GPU here ({about}): nothing to run")
        return 0
    print(f"GPU: {about}", flush=True)
    result = dict(device=about, rows=[], errors=[], cold={})
    opts.out.mkdir(parents=True, exist_ok=True)
    cache_dir = None
    if opts.jobs:
        cache_dir = tempfile.mkdtemp(prefix="gpu_jit_check_plans_")
        result["cold"] = plan_all(names, opts.size, cache_dir, opts.jobs, opts.plan_s)
    for name in names:
        if time.perf_counter() - began > opts.budget_s:
            result["errors"].append(f"{name}: not measured (past --budget_s)")
            continue
        try:
            row = check_workload(name, opts.size, device, cache_dir, opts.dump)
        except Exception as exc:
            result["errors"].append(f"{name}: {type(exc).__name__}: {exc}"[:600])
            traceback.print_exc()
            continue
        row["cold_first_call_s"] = result["cold"].get(name, {}).get("cold_first_call_s")
        result["rows"].append(row)
        direct = f"  direct {row['fs_direct_us']:.1f} us" if "fs_direct_us" in row else ""
        loop = (f"\n    carrying the state: jax {row['jax_loop_us']:.1f} us  stitched "
                f"{row['fs_loop_us']:.1f} us ({row['loop_speedup']:.2f}x)  fastest "
                f"{row['fastest_loop_us']:.1f} us" if "loop_speedup" in row else "")
        for label, times in row["deciding_samples_us"].items():
            if times:
                print(f"    deciding calls, {label}: min {min(times):.1f} us  median "
                      f"{float(np.median(times)):.1f} us  ({len(times)} calls)", flush=True)
        for n, times in row.get("ranking_us", {}).items():
            print(f"    runs of {n:>2}: xla {times['xla'][0]:.1f}/{times['xla'][1]:.1f} us  "
                  f"stitched {times['stitched'][0]:.1f}/{times['stitched'][1]:.1f} us "
                  f"(min/median)", flush=True)
        print(f"{row['workload']:<24} mem kernels {row['xla_mem_kernels']}->"
              f"{row['planned_mem_kernels']}  jax {row['jax_us']:.1f} us  stitched "
              f"{row['fs_us']:.1f} us ({row['speedup']:.2f}x){direct}  fastest {row['fastest_us']:.1f}"
              f" us  kept {row['kept']}{loop}  max|diff| {row['max_abs_diff']:.3g}  first call "
              f"{row['first_call_s']:.1f} s\n    why: {row['why']}\n    fallbacks: "
              f"{row['fallbacks'][:3]}", flush=True)
        (opts.out / "gpu_jit_check.json.gz").write_bytes(
            gzip.compress(json.dumps(result).encode()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
