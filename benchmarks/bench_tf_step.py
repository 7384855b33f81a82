"""TF's own step time and the stitched step time on this CPU, side by side.

For each function (the custom loop's Adam train step and the BERT-like encoder from
benchmarks/tf_scripts/), the same tf.function(jit_compile=True) is called in one process:
first with TF's own XLA executable, then through the FUSIONSTITCHING hook with
``keep="stitched"`` (the stitched executable forced, to time it: reading the variables,
DLPack hand-over, our host kernels inside XLA:CPU's program, assigning the updates). The
table shows the median and best of the timed calls (compile and the deciding call excluded)
and the hook's own decision with ``keep=fastest`` (stitched vs XLA, measured on one call).
The stitched kernels run as host code here (no GPU): the numbers say how our host kernels and
the hand-over compare with TF's XLA:CPU, not what a GPU would do.

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--cache_dir", default=None)
    opts = parser.parse_args()
    import tensorflow as tf  # noqa: F401  (the hook wraps TF's class below)

    rows = []
    for script, (name, arg_names) in FUNCTIONS.items():
        # Run the script once (one call / one step) to get its function and arguments.
        path = os.path.join(HERE, "tf_scripts", script)
        sys.argv = [path, "1"]
        scope = runpy.run_path(path, run_name="bench")
        function, args = scope[name], [scope[a] for a in arg_names]
        tf_times = step_times(function, args, 2 + opts.calls)[2:]
        for keep in ("stitched", "fastest"):
            flags = flag_parsing.Flags(keep=keep, cache_dir=opts.cache_dir)
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


if __name__ == "__main__":
    main()
