"""fusionstitching.jit against jax.jit on a GPU: the product's own route, end to end.

    python benchmarks/gpu_jit_check.py [--size paper] [--workloads bert/train,...]

For each zoo workload (benchmarks/models/zoo.py, pure JAX) the step is compiled with
``jax.jit`` and with ``fusionstitching.jit`` (defaults: keep="fastest", verify=True), which
plans on this machine's CPU, launches the stitched kernels' PTX on the GPU (runtime/gpu.py
through runtime/build.py) and keeps whichever executable its own timing finds faster. It
prints which one was kept and why, the step times of jax.jit and of the stitched executable
(keep="stitched", interleaved rounds), and how far the outputs are from jax.jit's. Without a
GPU it says so and exits 0; results go to DIR/gpu_jit_check.json.gz.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import fusionstitching  # noqa: E402
from benchmarks.gpu_check import find_gpu, interleaved_seconds  # noqa: E402
from benchmarks.models import zoo  # noqa: E402

WORKLOADS = ["bert/train", "transformer/train", "dien/train", "bert/infer", "crnn/infer"]


def steps(fn, args):
    """``run(n)``: n calls of ``fn(*args)``, then a wait for the last."""
    def run(n: int) -> None:
        out = None
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)
    return run


def check_workload(name: str, size: str, device) -> dict:
    model, mode = name.split("/")
    fn, args = zoo.jax_workload(model, mode, size, abstract=False)
    args = jax.device_put(args, device)
    row = dict(workload=f"{name} ({size})")
    reference = jax.jit(fn)
    expected = jax.block_until_ready(reference(*args))
    started = time.perf_counter()
    fastest = fusionstitching.jit(fn, verify=True, cache_dir=None)
    got = jax.block_until_ready(fastest(*args))  # plans, builds, verifies and times
    row["first_call_s"] = time.perf_counter() - started
    (report,) = fastest.reports()
    runtime = report.runtime or {}
    (compiled,) = fastest._compiled.values()
    row.update(kept="stitched" if compiled.executor.runs_stitched() else "xla",
               state=runtime.get("state"), why=runtime.get("why"),
               xla_mem_kernels=report.xla.mem_kernels, fs_mem_kernels=report.fs.mem_kernels,
               fallbacks=[f"{f.stage}: {f.reason}"[:300] for f in report.fallbacks])
    leaves = lambda tree: [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]
    row["max_abs_diff"] = max((float(np.max(np.abs(a - b), initial=0.0))
                               for a, b in zip(leaves(expected), leaves(got))), default=0.0)
    stitched = fusionstitching.jit(fn, keep="stitched", cache_dir=None)
    jax.block_until_ready(stitched(*args))
    seconds = interleaved_seconds({"jax": steps(reference, args), "fs": steps(stitched, args),
                                   "fastest": steps(fastest, args)})
    row.update({f"{k}_us": v * 1e6 for k, v in seconds.items()})
    row["speedup"] = seconds["jax"] / seconds["fs"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="paper", choices=zoo.SIZES)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    ap.add_argument("--cpu", action="store_true",
                    help="run on the CPU instead (the host route: checks this script)")
    opts = ap.parse_args(argv)
    device, about = (jax.devices("cpu")[0], "CPU") if opts.cpu else find_gpu()
    if device is None:
        print(f"no GPU here ({about}): nothing to run")
        return 0
    print(f"GPU: {about}", flush=True)
    result = dict(device=about, rows=[], errors=[])
    opts.out.mkdir(parents=True, exist_ok=True)
    for name in opts.workloads.split(","):
        try:
            row = check_workload(name, opts.size, device)
        except Exception as exc:
            result["errors"].append(f"{name}: {type(exc).__name__}: {exc}"[:600])
            traceback.print_exc()
            continue
        result["rows"].append(row)
        print(f"{row['workload']:<24} mem kernels {row['xla_mem_kernels']}->"
              f"{row['fs_mem_kernels']}  jax {row['jax_us']:.1f} us  stitched "
              f"{row['fs_us']:.1f} us ({row['speedup']:.2f}x)  fastest {row['fastest_us']:.1f}"
              f" us  kept {row['kept']}  max|diff| {row['max_abs_diff']:.3g}  first call "
              f"{row['first_call_s']:.1f} s\n    why: {row['why']}\n    fallbacks: "
              f"{row['fallbacks'][:3]}", flush=True)
        (opts.out / "gpu_jit_check.json.gz").write_bytes(
            gzip.compress(json.dumps(result).encode()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
