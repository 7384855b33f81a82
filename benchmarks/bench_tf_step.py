"""TF's own step time and the stitched step time on this CPU, side by side.

For each function (the custom loop's Adam train step and the BERT-like encoder from
benchmarks/tf_scripts/), the same tf.function(jit_compile=True) is called in one process:
first with TF's own XLA executable, then through the FUSIONSTITCHING hook with
``keep="stitched"`` (the stitched executable forced, to time it: TF's own kind of step, our
host kernels inside the XLA cluster TF compiles, the variables read and assigned by TF). The
table shows the median and best of the timed calls (compile and the deciding call excluded)
and the hook's own decision with ``keep=fastest`` (stitched vs XLA, measured on one call).
The stitched kernels run as host code here (no GPU): the numbers say how our host kernels
compare with TF's XLA:CPU, not what a GPU would do.

A second table is what a training loop feels with ``--async`` and ``keep=fastest``: every
step's time, grouped by the executor's state when the step started (building: TF runs while
the stitched executable is built on a background thread; pending: the step that TF answers
and whose inputs the trial copies; trial: TF runs while the trial verifies and times on a
background thread; timing: confirmation steps, each running TF or the stitched executable;
settled: the decision's executable), median and max next to TF alone's. No step should pay
for the decision: the max of each state is the number to compare with TF's max. The async
run follows the two above, so its build finds their plans in the cache (the compiles of TF's
module and of the stitched one still run on the background thread).

    python benchmarks/bench_tf_step.py [--calls 30] [--cache_dir DIR]
"""
from __future__ import annotations

import argparse
import os
import runpy
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from tf_hooks import flags as flag_parsing  # noqa: E402
from tf_hooks import tf_hook  # noqa: E402

# script -> (name of its tf.function, names of its argument globals)
FUNCTIONS = {"custom_loop.py": ("train_step", ("x", "y")),
             "bert_inference.py": ("encode", ("tokens", "mask"))}


def step_times(function, args, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        out = function(*args)
        (out[0] if isinstance(out, (list, tuple)) else out).numpy()  # wait for the result
        times.append(time.perf_counter() - t0)
    return times


def steps_by_state(function, args, calls: int, limit_s: float) -> dict[str, list[float]]:
    """Hooked steps with --async until the executor has settled (or ``limit_s``), then
    ``calls`` more; each step's time under the executor state it started in."""
    by_state: dict[str, list[float]] = {}
    compiled, after, started = None, 0, time.perf_counter()
    while after < calls:
        info = compiled.info if compiled is not None else None
        state = "first call (TF's HLO, build starts)" if info is None else \
            f"settled ({info.kept})" if info.state == "settled" else info.state
        by_state.setdefault(state, []).extend(step_times(function, args, 1))
        compiled = tf_hook.last_compiled(function)
        if compiled.info.state in ("settled", "fallback") or \
                time.perf_counter() - started > limit_s:
            after += 1
    return by_state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--cache_dir", default=None)
    parser.add_argument("--limit_s", type=float, default=600,
                        help="async run: stop waiting for the executor to settle after this")
    opts = parser.parse_args()
    import tensorflow as tf  # noqa: F401  (the hook wraps TF's class below)

    rows, async_rows = [], []
    for script, (name, arg_names) in FUNCTIONS.items():
        # Run the script once (one call / one step) to get its function and arguments.
        path = os.path.join(HERE, "tf_scripts", script)
        sys.argv = [path, "1"]
        scope = runpy.run_path(path, run_name="bench")
        function, args = scope[name], [scope[a] for a in arg_names]
        tf_times = step_times(function, args, 2 + opts.calls)[2:]
        for keep in ("stitched", "fastest"):
            flags = flag_parsing.Flags(keep=keep, cache_dir=opts.cache_dir, async_compile=False)
            tf_hook.install(flags)
            try:
                t0 = time.perf_counter()
                function(*args)  # build (sync) on the first call
                build_s = time.perf_counter() - t0
                hooked = step_times(function, args, 2 + opts.calls)
            finally:
                tf_hook.uninstall()
            report = tf_hook.last_compiled(function).report()
            if keep == "stitched":
                rows.append((script, name, tf_times, hooked[2:], build_s, report))
            else:
                rows[-1] += (report.runtime,)
        tf_hook.install(flag_parsing.Flags(keep="fastest", async_compile=True,
                                           cache_dir=opts.cache_dir))
        try:
            by_state = steps_by_state(function, args, opts.calls, opts.limit_s)
        finally:
            tf_hook.uninstall()
        async_rows.append((script, name, tf_times, by_state,
                           tf_hook.last_compiled(function).info))
    print(f"{'function':<28}{'TF ms (median/best)':>22}{'stitched ms (median/best)':>28}"
          f"{'XLA kernels':>13}{'stitched':>10}{'build s':>9}   keep=fastest decides")
    for script, name, tf_times, fs_times, build_s, report, fastest in rows:
        print(f"{script + ':' + name:<28}"
              f"{statistics.median(tf_times) * 1e3:>13.2f} / {min(tf_times) * 1e3:<6.2f}"
              f"{statistics.median(fs_times) * 1e3:>19.2f} / {min(fs_times) * 1e3:<6.2f}"
              f"{report.xla.mem_kernels:>13}{report.fs.mem_kernels:>10}{build_s:>9.1f}   "
              f"{fastest['kept']} ({fastest['why']})")
    print("(mem kernels = memory-intensive kernels of the entry computation; times measured "
          "on this CPU, host kernels)")
    print("\n--async, keep=fastest: step times by executor state (ms)")
    print(f"{'function':<28}{'state':<38}{'steps':>6}{'median':>9}{'max':>9}")
    for script, name, tf_times, by_state, info in async_rows:
        label = script + ":" + name
        for state, times in [("TF alone", tf_times), *by_state.items()]:
            print(f"{label:<28}{state:<38}{len(times):>6}"
                  f"{statistics.median(times) * 1e3:>9.2f}{max(times) * 1e3:>9.2f}")
            label = ""
        print(f"{'':<28}decision: {info.kept} ({info.why})")


if __name__ == "__main__":
    main()
