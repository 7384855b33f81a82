"""How often keep="fastest" keeps the slower executable, on this CPU.

Per step (as bench_cpu_speed.py finds them): ROUNDS times, a fresh fusionstitching.jit with
the default keep="fastest" (the plan cached after the first) is called until it decides; its
deciding samples (executor ``_samples``: each real call timed running one executable) and its
choice are recorded. Then the step's "true" ratio is measured as bench_cpu_speed.py does:
CALLS alternating calls of jax.jit and of keep="stitched", medians. Rules for the decision
can then be compared offline on the recorded samples (``--rules``) against that ratio.

    python benchmarks/decision_check.py --part transformers --only bert --rounds 6 --json F
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import jax
from bench_cpu_speed import MAX_DECIDING_CALLS, steps
from bench_plan_time import PARTS

from fusionstitching.runtime import executor as executor_module
from fusionstitching.runtime.executor import Executor
from fusionstitching.stitched_jit import jit

_settle = Executor._settle


def _settle_noting_candidate(executor, kept: str, why: str) -> None:
    executor.decided_candidate = executor.candidate  # the settle forgets it
    _settle(executor, kept, why)


Executor._settle = _settle_noting_candidate


def timed(function, args) -> float:
    started = time.perf_counter()
    jax.block_until_ready(function(*args))
    return time.perf_counter() - started


def decide(fn, args, cache_dir: str) -> tuple[dict, object]:
    """(the decision, the stitched executable it was about: per-kernel measurement may have
    left patterns to XLA, so keep="stitched" would time another one)."""
    stitched = jit(fn, cache_dir=cache_dir)
    for _ in range(max(MAX_DECIDING_CALLS, 2 * executor_module.CONFIRM_ROUNDS + 5)):
        jax.block_until_ready(stitched(*args))
        (compiled,) = stitched._compiled.values()
        executor = compiled.executor
        if executor is not None and executor.decided() is not None:
            break
    return dict(kept=executor.info.kept, why=executor.info.why,
                samples={k: list(v) for k, v in executor._samples.items()}), \
        getattr(executor, "decided_candidate", None)


def true_ratio(fn, args, stitched, calls: int) -> dict:
    reference = jax.jit(fn)
    for function in (reference, stitched):
        for _ in range(3):
            jax.block_until_ready(function(*args))
    times = {"xla": [], "stitched": []}
    for _ in range(calls):
        times["xla"].append(timed(reference, args))
        times["stitched"].append(timed(stitched, args))
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=PARTS, required=True)
    parser.add_argument("--only", nargs="+")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--confirm_rounds", type=int, default=executor_module.CONFIRM_ROUNDS,
                        help="real calls per executable in the confirmation (more, to judge "
                             "rules on fewer: a prefix of the samples is a smaller decision)")
    parser.add_argument("--json", required=True)
    options = parser.parse_args(argv)
    executor_module.CONFIRM_ROUNDS = options.confirm_rounds
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        for name, kind, fn, args in steps(options.part, options.only):
            if kind != "jax":
                continue
            args = jax.device_put(args)
            for round_ in range(options.rounds):
                decision, candidate = decide(fn, args, cache_dir)
                row = dict(step=name, round=round_, **decision)
                if candidate is not None:
                    row["true"] = true_ratio(fn, args, candidate, options.calls)
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(options.json, "w") as out:
                    json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
