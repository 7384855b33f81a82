"""How often keep="fastest" keeps the slower executable, on this CPU.

Per step (as bench_cpu_speed.py finds them), ROUNDS fresh fusionstitching.jit decisions
(keep="fastest", plan cached after the first): the deciding samples (each real call timed
running one executable) and the choice; then CALLS alternating calls of jax.jit and of the
stitched executable decided on, medians. ``--replay`` judges decision rules on recorded
samples against those medians (a prefix of the samples is a decision with fewer rounds).

    python benchmarks/decision_check.py --part transformers --only bert --rounds 6 --json F
    python benchmarks/decision_check.py --replay F [F ...]
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks import each other

import jax  # noqa: E402
from bench_cpu_speed import MAX_DECIDING_CALLS, steps  # noqa: E402
from bench_plan_time import PARTS  # noqa: E402
from step_loops import paired_ratio, state_feedback, stepper  # noqa: E402

from fusionstitching.runtime import executor as executor_module  # noqa: E402
from fusionstitching.runtime.executor import Executor  # noqa: E402
from fusionstitching.stitched_jit import jit  # noqa: E402

_settle = Executor._settle


def _settle_noting_candidate(executor, kept: str, why: str) -> None:
    executor.decided_candidate = executor.candidate  # the settle forgets it
    _settle(executor, kept, why)


def timed(function, args) -> float:
    started = time.perf_counter()
    jax.block_until_ready(function(*args))
    return time.perf_counter() - started


def decide(fn, args, cache_dir: str) -> tuple[dict, object]:
    """(the decision, the stitched executable it was about: per-kernel measurement may have
    left patterns to XLA, so keep="stitched" would time another one)."""
    stitched = jit(fn, cache_dir=cache_dir)
    step, out = stepper(stitched, args, state_feedback(fn, args)), None
    for _ in range(MAX_DECIDING_CALLS):  # as a job calls it: state carried, no waiting
        out = step()
        (compiled,) = stitched._compiled.values()
        executor = compiled.executor
        if executor is not None and executor.decided() is not None:
            break
    jax.block_until_ready(out)
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


def rules(samples: dict) -> dict[str, bool]:
    """Whether each rule keeps the stitched executable on these deciding samples."""
    xla, stitched = samples["xla"], samples["stitched"]
    median, low, _ = paired_ratio(xla, stitched)
    return {"best of 5, 2% margin": min(stitched[:5]) < (1 - executor_module.SWAP_MARGIN)
            * min(xla[:5]),
            f"best of {len(xla)}, 2% margin": min(stitched) < (1 - executor_module.SWAP_MARGIN)
            * min(xla),
            f"median of {len(xla)} pair ratios over 1.02": median > 1.02,
            f"stop once apart (>= {executor_module.CLEAR_ROUNDS} each), else best of "
            f"{executor_module.CONFIRM_ROUNDS}": _sequential(xla, stitched)[0],
            "90% interval of the pair ratios above 1": low > 1.0}


def _sequential(xla: list, stitched: list) -> tuple[bool, int]:
    """(keeps stitched, samples of each used) under the executor's rule: alternate samples,
    stop at the first prefix ``clearly_apart``, else decide on CONFIRM_ROUNDS of each."""
    for n in range(1, min(len(xla), executor_module.CONFIRM_ROUNDS) + 1):
        if executor_module.clearly_apart(xla[:n], stitched[:n]):
            break
    return executor_module.stitched_wins(min(stitched[:n]), min(xla[:n])), n


def replay(paths: list[str]) -> None:
    """Per rule: decisions keeping a slower stitched executable, decisions missing a win
    over 1.05x, the rest."""
    counts: dict = {}
    used: list[int] = []
    for path in paths:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as file:
            for row in json.load(file):
                if not row["samples"]["xla"] or "true" not in row:
                    continue  # decided in the trial, before any real-call sample
                true = row["true"]["xla"] / row["true"]["stitched"]
                for rule, keeps in rules(row["samples"]).items():
                    count = counts.setdefault(rule, {"kept slower": 0, "missed win": 0,
                                                     "right": 0})
                    outcome = ("kept slower" if keeps and true < 1.0 else
                               "missed win" if not keeps and true > 1.05 else "right")
                    count[outcome] += 1
                used.append(_sequential(row["samples"]["xla"], row["samples"]["stitched"])[1])
    for rule, count in counts.items():
        print(f"{rule:45s} {count}")
    print(f"samples of each executable the early stop used: {sorted(used)}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replay", nargs="+", metavar="JSON")
    parser.add_argument("--part", choices=PARTS)
    parser.add_argument("--only", nargs="+")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--confirm_rounds", type=int, default=executor_module.CONFIRM_ROUNDS,
                        help="real calls per executable in the confirmation (more, to judge "
                             "rules on fewer: a prefix of the samples is a smaller decision)")
    parser.add_argument("--json")
    options = parser.parse_args(argv)
    if options.replay:
        replay(options.replay)
        return
    if not (options.part and options.json):
        parser.error("--part and --json, or --replay")
    executor_module.CONFIRM_ROUNDS = options.confirm_rounds
    Executor._settle = _settle_noting_candidate
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
