"""Training and inference steps on this CPU: plain jax.jit against fusionstitching.jit with the
default keep="fastest", in one process and one run.

Per step (the zoo's JAX workloads and the third-party tier's JAX steps, each part in a child
process with its library's environment, as bench_plan_time.py runs them): both functions
are called on the same seeded inputs (the zoo's own values; the tier's arguments are shapes,
filled with seeded normal floats and 0/1 integers as verification does). The first call of
fusionstitching.jit plans, builds, measures each kernel against XLA:CPU and tries the
stitched executable; the next calls confirm a faster one ("deciding calls", made as a job
makes them: a training step's calls carry its state and none is waited for; an inference
step's are each waited for). The table then
shows the median wall time of CALLS alternating calls of each, after the decision, the median
of their pair ratios with a 90% interval (step_loops.paired_ratio),
which executable was kept, how many patterns run stitched and how many were measured slower
than XLA's, the largest difference between the two functions' outputs, and the share of
XLA's traced thunk time in memory-intensive kernels (thunk_share.py; above half:
"memory-bound"). Those calls use the same inputs each time, so "max output diff" is one step's.
Each step is also run in LOOP_ROUNDS alternating runs of LOOP_STEPS calls of one function
("loop" columns; step_loops.py): a training step as a loop that carries its state from the
same start, no waiting between steps (with the loss of the last step); an inference step as
calls each waited for, as a predict loop makes them. The median time per call of each.
``--donate``: training steps donate their state, as most training loops call them.

    python benchmarks/bench_cpu_speed.py [--parts zoo flax ...] [--only MODEL ...] [--calls 20]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import jax
import numpy as np
from bench_plan_time import PARTS, ZOO, markdown_table, run_parts, tier_steps
from step_loops import (loss_at, loss_path, paired_ratio, state_feedback, stepper, training_loop,
                        waited_calls)
from thunk_share import memory_share

from fusionstitching.stitched_jit import jit
from fusionstitching.hlo.inputs import random_array

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.models import zoo  # noqa: E402


def concrete(args):
    """Seeded values for every ShapeDtypeStruct leaf (concrete leaves are kept)."""
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda x: random_array(rng, x.shape, x.dtype)
                        if isinstance(x, jax.ShapeDtypeStruct) else x, args)


def steps(part: str, only):
    if part == ZOO:
        for model, mode, _ in zoo.WORKLOADS:
            if not only or model in only:
                fn, args = zoo.jax_workload(model, mode, "small", abstract=False)
                yield f"zoo_{model}_{mode}", "jax", fn, args
        return
    for name, kind, fn, args in tier_steps(part, only):
        yield name, kind, fn, concrete(args) if kind == "jax" else args


MAX_DECIDING_CALLS = 1000  # the trial's call, then 2 x CONFIRM_ROUNDS runs of RUN_CALLS
# (executor.py)


# Alternating runs of a loop carrying the training state: 15 rounds, not 5. With 5 the loop's
# ratio for one and the same executable on both sides ranged 0.83-1.53 (keras_hub Mistral
# train, two runs), and pairs bound their median ratio only from 5 up. 100 steps a run, not
# 10: a job runs one executable for thousands of steps, and the first steps after the other
# executable's run are slow (cold caches); zoo Transformer train read about 1.0 in runs of 10
# and 1.3 in runs of 200 (benchmarks/README.md).
LOOP_ROUNDS, LOOP_STEPS = 15, 100


def max_difference(a, b) -> float:
    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        same = (x == y) | (np.isnan(x) & np.isnan(y))
        if not same.all():
            worst = max(worst, float(np.max(np.abs(x - y)[~same])))
    return worst


def in_turn(i: int, *sides):
    """The sides of pair ``i``, each first in every other pair: the second call of a pair ran
    faster (the first one's buffers freed, the pool's threads awake), so a fixed order gave
    XLA's executable against itself ratios of 1.00-1.59."""
    return sides if i % 2 == 0 else sides[::-1]


def measure(name: str, fn, args, calls: int, cache_dir: str, donate: bool = False,
            cost_model: str = "auto") -> dict:
    """``donate``: a training step donates its state, as Keras 3's JAX trainer and flax's
    loops call theirs (``jax.jit(step, donate_argnums=...)``); each call then gets fresh
    copies of the state, made before its timer starts."""
    row = dict(step=name)
    args = jax.device_put(args)  # as a training loop's state is: arrays already on the device
    feedback = state_feedback(fn, args)
    donated = tuple(sorted(feedback)) if donate else ()
    row["donated"] = len(donated)
    reference = jax.jit(fn, donate_argnums=donated)
    stitched = jit(fn, cache_dir=cache_dir, donate_argnums=donated, cost_model=cost_model)

    def fresh():
        return [jax.tree.map(lambda x: x.copy(), a) if j in donated else a
                for j, a in enumerate(args)]

    started = time.perf_counter()
    want = jax.block_until_ready(reference(*fresh()))
    row["xla_first_s"] = time.perf_counter() - started
    # it calls on the same arguments again and again
    row["memory_share"] = memory_share(jax.jit(fn) if donated else reference, args)
    started = time.perf_counter()
    jax.block_until_ready(stitched(*fresh()))  # builds and decides (it runs XLA's executable)
    row["fs_first_s"] = time.perf_counter() - started
    row["max_diff"] = max_difference(jax.block_until_ready(stitched(*fresh())), want)
    (compiled,) = stitched._compiled.values()
    # Real calls confirming a faster candidate, made as a job makes them (the executor times
    # runs of them, with whatever the job does between calls): a training step as a loop that
    # carries its state and waits for no step; an inference step as calls each waited for,
    # as Keras' predict converts each batch's outputs, and as the calls below time it (not
    # waited for, keras_hub RoBERTa inference was kept at 41 against 63 us per call in runs
    # and then read 0.80x in waited calls).
    deciding, out = stepper(stitched, fresh(), feedback), None
    row["deciding_calls"] = 2  # the trial's and the one above
    while compiled.executor.decided() is None and row["deciding_calls"] < MAX_DECIDING_CALLS:
        out = deciding() if feedback else jax.block_until_ready(deciding())
        row["deciding_calls"] += 1
    jax.block_until_ready(out)
    times = {"xla": [], "fs": []}
    for i in range(calls):
        for label, function in in_turn(i, ("xla", reference), ("fs", stitched)):
            inputs = fresh()
            started = time.perf_counter()
            jax.block_until_ready(function(*inputs))
            times[label].append(time.perf_counter() - started)
    row.update({f"{k}_ms": statistics.median(v) * 1e3 for k, v in times.items()})
    row["ratio"], row["ratio_low"], row["ratio_high"] = paired_ratio(times["xla"], times["fs"])
    # Also in runs of one executable, as a job runs it: a training step as a loop that carries
    # its state; an inference step as a predict loop's calls, each waited for. The single
    # calls above alternate, so each pays for caches the other executable cooled.
    if feedback:
        loops = {"xla": training_loop(reference, args, feedback, fresh),
                 "fs": training_loop(stitched, args, feedback, fresh)}
    else:
        loops = {"xla": waited_calls(reference, args), "fs": waited_calls(stitched, args)}
    per_step, last = {"xla": [], "fs": []}, {}
    for i in range(LOOP_ROUNDS):
        for label, run in in_turn(i, *loops.items()):
            started = time.perf_counter()
            last[label] = run(LOOP_STEPS)
            per_step[label].append((time.perf_counter() - started) / LOOP_STEPS)
    row.update({f"loop_{k}_ms": statistics.median(v) * 1e3 for k, v in per_step.items()})
    row["loop_ratio"], row["loop_ratio_low"], row["loop_ratio_high"] = paired_ratio(
        per_step["xla"], per_step["fs"])
    loss = loss_path(fn, args, feedback) if feedback else None
    if loss is not None:  # the loss of step LOOP_STEPS, from the same start
        row.update({f"loop_{k}_loss": float(loss_at(out, loss)) for k, out in last.items()})
    (report,) = stitched.reports()
    row.update(kept=report.runtime.get("kept"), why=report.runtime.get("why"),
               patterns=report.fs.patterns,
               measured_slower=sum(f.stage == "measured" for f in report.fallbacks),
               other_fallbacks=sorted({f.stage for f in report.fallbacks} - {"measured"}))
    return row


def run_part(part: str, only, calls: int, donate: bool = False, cost_model: str = "auto"
             ) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        for name, kind, fn, args in steps(part, only):
            if kind != "jax":
                rows.append(dict(step=name, error="a TF step (bench_tf_step.py times those)"))
                continue
            try:
                rows.append(measure(name, fn, args, calls, cache_dir, donate, cost_model))
            except Exception as err:  # reported in the table, never stops the run
                traceback.print_exc()
                rows.append(dict(step=name, error=f"{type(err).__name__}: {err}"[:200]))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def ratio(r: dict, prefix: str = "") -> str:
    """The median of the pair ratios XLA / ours and its 90% interval."""
    return (f"{r[prefix + 'ratio']:.2f} ({r[prefix + 'ratio_low']:.2f}-"
            f"{r[prefix + 'ratio_high']:.2f})")


def verdict(r: dict) -> str:
    """"slower" where the kept executable is stitched and the whole 90% interval of a
    measure (single calls, or the loop) lies below 1."""
    if r.get("kept") != "stitched":
        return "-"
    slower = [what for what, prefix in (("calls", ""), ("loop", "loop_"))
              if r.get(prefix + "ratio_high", 1.0) < 1.0]
    return "slower (" + ", ".join(slower) + ")" if slower else "not slower"


def table(rows: list[dict]) -> str:
    columns = ["step", "XLA ms", "stitched ms", "XLA / stitched (90% interval)", "kept",
               "patterns stitched", "measured slower", "max output diff",
               "first call s (XLA, ours)", "deciding calls",
               "XLA's thunk time in memory kernels (traced)", "loop: XLA ms", "loop: ours ms",
               "loop: XLA / ours (90% interval)", f"loss after {LOOP_STEPS} steps (XLA, ours)",
               "kept and slower?"]

    def loop(r):
        if "loop_xla_ms" not in r:
            return ["-"] * 4
        losses = (f"{r['loop_xla_loss']:.7g}, {r['loop_fs_loss']:.7g}"
                  if "loop_xla_loss" in r else "-")
        return [f"{r['loop_xla_ms']:.2f}", f"{r['loop_fs_ms']:.2f}", ratio(r, "loop_"), losses]

    return "\n".join(markdown_table(columns, rows, lambda r: [
        r["step"], f"{r['xla_ms']:.2f}", f"{r['fs_ms']:.2f}", ratio(r),
        str(r["kept"]), str(r["patterns"]), str(r["measured_slower"]), f"{r['max_diff']:.2e}",
        f"{r['xla_first_s']:.1f}, {r['fs_first_s']:.1f}", str(r.get("deciding_calls", "-")),
        f"{r['memory_share']:.0%}" if r.get("memory_share") is not None else "-", *loop(r),
        verdict(r)]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS)
    parser.add_argument("--only", nargs="+")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--donate", action="store_true",
                        help="training steps donate their state, as Keras 3's JAX trainer "
                        "and flax's loops call theirs")
    parser.add_argument("--cost_model", choices=("auto", "gpu", "cpu"), default="auto",
                        help="fusionstitching.jit's (auto: the host CPU's model)")
    parser.add_argument("--json")
    opts = parser.parse_args(argv)
    only = set(opts.only) if opts.only else None
    run_parts(opts, __file__,
              lambda part: run_part(part, only, opts.calls, opts.donate, opts.cost_model),
              ["--calls", str(opts.calls), "--cost_model", opts.cost_model]
              + (["--donate"] if opts.donate else []), table)


if __name__ == "__main__":
    main()
