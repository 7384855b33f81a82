"""How many delta-evaluator calls per second the explorer can afford (not a test).

    PYTHONPATH=. python benchmarks/bench_costmodel.py   (or after pip install -e .)

Scores a rotating set of LayerNorm-like patterns of different sizes and launch shapes on each
target, once through a DeltaEvaluator (what the explorer holds) and once through the
module-level delta_evaluate (which looks the evaluator up per call), and the full
latency-evaluator for comparison.
"""
from __future__ import annotations

import time

import costmodel
from costmodel.delta import DeltaEvaluator, PatternSummary, delta_evaluate
from costmodel.latency import KernelProfile, kernel_latency_us


def patterns() -> list[PatternSummary]:
    out = []
    for rows in (8, 64, 512, 4096, 32768):
        for cols in (128, 1024, 8192):
            for threads in (64, 256, 1024):
                tensor = 4 * rows * cols
                per_thread = -(-cols // threads)
                out.append(PatternSummary(
                    register_bytes=4 * tensor, shared_bytes=2 * tensor, kernels_merged=5,
                    grid_blocks=rows, threads_per_block=threads,
                    max_shared_memory=min(4 * cols, 48 * 1024),
                    instructions={"ld_global": per_thread, "st_global": per_thread,
                                  "fp32": 7 * per_thread, "int": 3 * per_thread, "sfu": 1,
                                  "shfl": 10, "barrier": 4, "st_shared": per_thread + 2,
                                  "ld_shared": 2 * per_thread + 2},
                    global_bytes=2 * tensor))
    return out


def rate(fn, items, seconds=0.5) -> float:
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for item in items:
            fn(item)
        calls += len(items)
    return calls / (time.perf_counter() - start)


def main() -> None:
    items = patterns()
    print(f"{len(items)} distinct patterns per round")
    print(f"{'target':8} {'DeltaEvaluator.score':>22} {'delta_evaluate':>16} {'kernel_latency_us':>19}")
    for target in sorted(costmodel.TARGETS):
        device = costmodel.load_device(target)
        evaluator = DeltaEvaluator(device)
        profiles = [KernelProfile(p.grid_blocks, p.threads_per_block, 32, p.max_shared_memory,
                                  p.instructions, p.global_bytes // 2, p.global_bytes // 2)
                    for p in items]
        print(f"{target:8} {rate(evaluator.score, items):>18,.0f}/s "
              f"{rate(lambda p: delta_evaluate(p, device), items):>14,.0f}/s "
              f"{rate(lambda k: kernel_latency_us(k, device), profiles):>17,.0f}/s")


if __name__ == "__main__":
    main()
