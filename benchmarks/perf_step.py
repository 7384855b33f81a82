"""Where a step's CPU time goes, sampled by Linux perf, for XLA's executable and the
stitched one: the runtime's parts (thread pool, thunk executor, malloc, Python dispatch, ...),
YNNPACK's dots, XLA's JIT-compiled fusions, and each stitched kernel, in CPU us per step.

A jax.profiler trace times each thunk with a few us of its own, so it ranks many small
thunks too high; sampling does not. Each side runs in a child process: the step (as
bench_cpu_speed.py finds it) as a loop that carries its state (step_loops.py; an inference
step: calls on the same inputs) for ``--seconds`` + 4, and `perf record` samples the last
``--seconds`` of it. Stitched kernels are told apart by their code addresses (perf sees JIT
code without names).

    python benchmarks/perf_step.py --part zoo --only bert [--mode infer] [--keep stitched]
"""
from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks import each other

import jax  # noqa: E402
from bench_cpu_speed import MAX_DECIDING_CALLS, steps  # noqa: E402
from step_loops import repeated_calls, state_feedback, stepper, training_loop  # noqa: E402

from fusionstitching.runtime import ffi  # noqa: E402
from fusionstitching.stitched_jit import jit  # noqa: E402

# Ordered: the first matching rule names a sample's category (dso and symbol of its frame).
CATEGORIES = (
    ("dots (YNNPACK)", lambda dso, sym: "ynn" in sym or "slinky" in sym),
    ("JIT code", lambda dso, sym: dso.startswith("[JIT]") or "perf-" in dso
     or dso == "[unknown]"),
    ("thread pool", lambda dso, sym: any(k in sym for k in ("ThreadPool", "RunQueue",
                                                             "EventCount", "Steal"))),
    ("thunk executor", lambda dso, sym: "Thunk" in sym),
    ("malloc/free/mem*", lambda dso, sym: any(k in sym for k in (
        "malloc", "free", "memalign", "unlink_chunk", "consolidate", "memset", "memmove",
        "memcpy"))),
    ("Python", lambda dso, sym: dso.startswith("libpython")),
    ("OS kernel", lambda dso, sym: dso == "[kernel.kallsyms]"),
)
OTHER = "other runtime (PJRT, jaxlib)"
SAMPLE_HZ = 1999
# A stitched kernel's code lies within this many bytes after its entry point.
KERNEL_SPAN = 256 * 1024
XLA_JIT = "XLA's JIT code"


def category(dso: str, sym: str) -> str:
    return next((name for name, rule in CATEGORIES if rule(dso, sym)), OTHER)


def parse_sample(line: str) -> tuple[int, str, str] | None:
    """(ip, symbol, dso) of a ``perf script -F ip,sym,dso`` line, None for other lines."""
    line = line.strip()
    if not line or "(" not in line:
        return None
    head, _, dso = line.rpartition("(")
    ip, _, sym = head.strip().partition(" ")
    dso = dso.rstrip(")")
    try:
        return int(ip, 16), sym.strip(), dso if dso.startswith("[") else os.path.basename(dso)
    except ValueError:
        return None


def kernel_of(ip: int, starts: list[tuple[int, str]]) -> str:
    """The stitched kernel whose code holds ``ip`` (``starts``: sorted (address, name))."""
    i = bisect.bisect_right(starts, (ip, "\uffff")) - 1
    if i >= 0 and ip - starts[i][0] < KERNEL_SPAN:
        return starts[i][1]
    return XLA_JIT


def attribute(lines, starts: list[tuple[int, str]]
              ) -> tuple[collections.Counter, collections.Counter, collections.Counter]:
    """(samples per category, per stitched kernel or XLA_JIT, per symbol outside JIT code)
    of perf script lines."""
    categories, kernels, symbols = (collections.Counter(), collections.Counter(),
                                    collections.Counter())
    for line in lines:
        sample = parse_sample(line)
        if sample is None:
            continue
        ip, sym, dso = sample
        name = category(dso, sym)
        categories[name] += 1
        if name == "JIT code":
            kernels[kernel_of(ip, starts)] += 1
        else:
            symbols[f"{sym[:70]} ({dso})"] += 1
    return categories, kernels, symbols


def child(part: str, model: str, mode: str, keep: str, seconds: float, out: str) -> None:
    """Warm the step, write the stitched kernels' addresses, print READY, loop."""
    for name, _, fn, args in steps(part, [model]):
        if not name.endswith(mode):
            continue
        args = jax.device_put(args)
        with tempfile.TemporaryDirectory() as cache_dir:
            step = jax.jit(fn) if keep == "xla" else jit(fn, keep=keep, cache_dir=cache_dir)
            jax.block_until_ready(step(*args))  # builds
            feedback = state_feedback(fn, args)
            if keep != "xla":  # keep="fastest" decides on calls made as a job makes them
                (compiled,) = step._compiled.values()
                call = stepper(step, args, feedback)
                for _ in range(MAX_DECIDING_CALLS):
                    if compiled.executor.decided() is not None:
                        break
                    call()
            run = training_loop(step, args, feedback) if feedback else repeated_calls(step,
                                                                                      args)
            run(10)
            starts = sorted((address, target.rsplit("_", 1)[0])
                            for target, owner in ffi._registered.items()
                            for address in (getattr(owner, "address", 0),
                                            getattr(owner, "parts_address", 0)) if address)
            loops, started = 0, time.perf_counter()
            print("READY", flush=True)
            while time.perf_counter() - started < seconds + 4:
                run(10)
                loops += 10
            elapsed = time.perf_counter() - started
        Path(out).write_text(json.dumps({"step": name, "starts": starts,
                                         "ms_per_step": elapsed / loops * 1e3}))
        return
    raise SystemExit(f"no {mode} step {model!r} in part {part!r}")


def profile(part: str, model: str, mode: str, keep: str, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out, data = f"{tmp}/child.json", f"{tmp}/perf.data"
        proc = subprocess.Popen([sys.executable, __file__, "--child", part, model, mode,
                                 keep, str(seconds), out], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "JAX_PLATFORMS": "cpu"})
        for line in proc.stdout:
            if line.startswith("READY"):
                break
        time.sleep(2)
        subprocess.run(["perf", "record", "-F", str(SAMPLE_HZ), "-p", str(proc.pid), "-o",
                        data, "--", "sleep", str(seconds)], capture_output=True, check=True)
        if proc.wait() != 0:
            raise RuntimeError(f"{model} {keep}: the step's process failed")
        info = json.loads(Path(out).read_text())
        script = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym,dso"],
                                capture_output=True, text=True, check=True).stdout
    categories, kernels, symbols = attribute(script.splitlines(),
                                    [tuple(s) for s in info["starts"]])
    steps_sampled = seconds / (info["ms_per_step"] / 1e3)
    us = lambda n: n / SAMPLE_HZ / steps_sampled * 1e6  # noqa: E731
    return dict(step=info["step"], keep=keep, ms_per_step=info["ms_per_step"],
                cpu_us_per_step=us(sum(categories.values())),
                categories={k: us(v) for k, v in categories.most_common()},
                kernels={k: us(v) for k, v in kernels.most_common()},
                symbols={k: us(v) for k, v in symbols.most_common(50)})


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        part, model, mode, keep, seconds, out = argv[1:]
        child(part, model, mode, keep, float(seconds), out)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", default="zoo")
    parser.add_argument("--only", required=True, help="the model whose step to sample")
    parser.add_argument("--mode", choices=("train", "infer"), default="train",
                        help="its training step (a loop carrying the state) or its inference "
                             "step (calls on the same inputs)")
    parser.add_argument("--keep", nargs="+", default=["xla", "stitched"],
                        help="xla (jax.jit), stitched or fastest (fusionstitching.jit)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--symbols", type=int, default=0,
                        help="also print this many of the most sampled symbols outside JIT code")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows = [profile(args.part, args.only, args.mode, keep, args.seconds) for keep in args.keep]
    for row in rows:
        print(f"{row['step']} keep={row['keep']}: {row['ms_per_step'] * 1e3:.0f} us per step "
              f"(wall), {row['cpu_us_per_step']:.0f} us of CPU")
        for name, value in row["categories"].items():
            print(f"  {name:30s} {value:7.0f} us")
        for name, value in list(row["kernels"].items())[:12]:
            print(f"    {name:40s} {value:7.0f} us")
        for name, value in list(row["symbols"].items())[:args.symbols]:
            print(f"      {value:6.1f} us  {name}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
