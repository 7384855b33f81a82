"""Ordinary training scripts, unchanged, plainly and with FUSIONSTITCHING=1 (default flags).

Per script (each Keras one on both backends): a plain run at XLA's optimization level 0 (XLA's
own spread of the final loss: XLA_FLAGS=--xla_backend_optimization_level=0; JAX backends
only, plain TF runs no XLA); then three runs with the env var sharing one fresh cache
directory, each after a plain run: the first plans (at once or at exit), the next two start
from the cache (the same final loss bits in both: a reproducible job). A run's wall time is
compared with the median of the plain runs: this machine's speed drifts by 10-30% over
minutes. Wall time, final loss and each run's Reports (which functions ran stitched, from
which call, and why) go to the JSON with a manifest.

    python benchmarks/script_runs.py --out benchmarks/results/scripts_DATE/scripts.json.gz
    python benchmarks/script_runs.py --table benchmarks/results/scripts_DATE/scripts.json.gz
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.manifest import run_manifest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# (name, path, Keras backends: None for a script that is not a Keras one[, arguments])
SCRIPTS = (
    ("keras_tabular", os.path.join(HERE, "tf_scripts", "keras_tabular.py"),
     ("jax", "tensorflow")),
    ("keras_convnet", os.path.join(HERE, "scripts", "keras_convnet.py"), ("jax", "tensorflow")),
    ("keras_timeseries", os.path.join(HERE, "scripts", "keras_timeseries.py"),
     ("jax", "tensorflow")),
    ("keras_text_transformer", os.path.join(HERE, "scripts", "keras_text_transformer.py"),
     ("jax", "tensorflow")),
    ("keras_lstm", os.path.join(HERE, "scripts", "keras_lstm.py"), ("jax", "tensorflow")),
    ("flax_nnx_mnist", os.path.join(HERE, "scripts", "flax_nnx_mnist.py"), None),
    ("flax_linen_mlp", os.path.join(HERE, "scripts", "flax_linen_mlp.py"), None),
    # jobs long enough for stitching to start (job_clock.py STITCH_AFTER_S: 30 s);
    # 60 epochs ran 20-23 s here
    ("keras_convnet_300_epochs", os.path.join(HERE, "scripts", "keras_convnet.py"),
     ("jax", "tensorflow"), ("300",)),
)
HOOKED_RUNS = 3
TIMEOUT_S = 1800


def run_once(path: str, env: dict, args: tuple = ()) -> dict:
    """One run of a script in a child process: wall time, its last JSON line, stderr lines
    of ours."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, path, *args], capture_output=True, text=True,
                          env=env,
                          cwd=os.path.dirname(path), timeout=TIMEOUT_S)
    wall = time.perf_counter() - started
    result = {"wall_s": round(wall, 2), "returncode": done.returncode}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        result["output"] = json.loads(lines[-1])
    else:
        result["stderr_tail"] = done.stderr[-2000:]
    result["notes"] = [line for line in done.stderr.splitlines()
                       if "fusionstitching" in line][:20]
    return result


def base_env(backend: str | None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FUSIONSTITCHING") and k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([REPO, os.path.join(HERE, "tf_scripts")]))
    if backend:
        env["KERAS_BACKEND"] = backend
    return env


def runtime_summary(report_path: str) -> list[dict]:
    try:
        with open(report_path) as f:
            reports = json.load(f)
    except (OSError, ValueError):
        return []
    return [{"module": r.get("module"), "fallbacks": len(r.get("fallbacks", [])),
             **{k: (r.get("runtime") or {}).get(k) for k in
                ("state", "kept", "why", "calls", "swapped_at_call", "build_s", "xla_us",
                 "stitched_us")}} for r in reports]


def measure(name: str, path: str, backend: str | None, args: tuple = ()) -> dict:
    env = base_env(backend)
    row = {"script": name, "backend": backend or "jax", "args": list(args), "plains": []}
    if backend != "tensorflow":
        row["plain_o0"] = run_once(path, dict(env, XLA_FLAGS="--xla_backend_optimization_level=0"),
                                   args)
    with tempfile.TemporaryDirectory() as scratch:
        row["hooked"] = []
        for i in range(HOOKED_RUNS):
            row["plains"].append(run_once(path, env, args))
            report = os.path.join(scratch, f"report{i}.json")
            flags = f"--cache_dir={os.path.join(scratch, 'cache')} --report={report}"
            run = run_once(path, dict(env, FUSIONSTITCHING="1", FUSIONSTITCHING_FLAGS=flags),
                           args)
            run["functions"] = runtime_summary(report)
            # as a user running the script again later: its planning processes have finished
            run["planning_after_s"] = planners_done(os.path.join(scratch, "cache"))
            row["hooked"].append(run)
    walls = sorted(run["wall_s"] for run in row["plains"])
    row["plain"] = dict(row["plains"][0], wall_s=walls[len(walls) // 2])  # the median's wall
    return row


def loss(run: dict) -> float | None:
    """The script's final training loss (``loss``, or the last of its ``losses``)."""
    output = run.get("output") or {}
    return output.get("loss", (output.get("losses") or [None])[-1])


def planners_done(cache_dir: str, limit_s: float = 900.0) -> float:
    """Wait (at most ``limit_s``) for the planning processes a run left behind for the next
    one (runtime/lifecycle.py) to finish; returns the seconds waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        found = subprocess.run(["pgrep", "-f", f"prewarm .* --cache_dir {cache_dir}"],
                               capture_output=True, text=True).stdout.split()
        if not found:
            break
        time.sleep(2)
    return round(time.perf_counter() - started, 1)


def verdicts(row: dict) -> dict:
    """The bars for one script: wall time including builds within 1.1x plain (against the
    median plain run, and against the plain run just before: the machine drifts), final loss
    within twice XLA's own spread (or 1e-3), the later runs identical."""
    plain, hooked = row["plain"], row["hooked"]
    spread = abs(loss(row["plain_o0"]) - loss(plain)) if row.get("plain_o0") and \
        loss(row["plain_o0"]) is not None and loss(plain) is not None else None
    allowed = max(2 * spread, 1e-3) if spread is not None else 1e-3
    out = {"xla_spread": spread, "allowed": allowed}
    for i, run in enumerate(hooked):
        out[f"wall_ratio_{i + 1}"] = round(run["wall_s"] / plain["wall_s"], 3)
        if i < len(row.get("plains", [])):
            out[f"paired_ratio_{i + 1}"] = round(run["wall_s"] / row["plains"][i]["wall_s"], 3)
        out[f"loss_off_{i + 1}"] = None if loss(run) is None or loss(plain) is None else \
            abs(loss(run) - loss(plain))
        out[f"stitched_{i + 1}"] = sum(f["kept"] == "stitched" for f in run["functions"])
        # the call from which each stitched function ran stitched (calls after a decision go
        # through jax's own dispatch, uncounted)
        out[f"swapped_at_{i + 1}"] = [f["swapped_at_call"] for f in run["functions"]
                                      if f["kept"] == "stitched"]
    out["functions"] = len(hooked[-1]["functions"])
    out["reproducible"] = len(hooked) > 2 and loss(hooked[1]) is not None and \
        loss(hooked[1]) == loss(hooked[2])
    return out


def table(path: str) -> str:
    with _open(path, "rt") as f:
        data = json.load(f)
    lines = ["| script | backend | plain s (median; runs) | env var s (1st, 2nd, 3rd) | wall x plain | x the plain run before | loss: plain, env var (1st, 2nd) | XLA spread | stitched / functions (1st, 2nd, 3rd) | stitched from call | 2nd = 3rd |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    paired = []
    for row in data["rows"]:
        v = verdicts(row)
        hooked = row["hooked"]
        fmt = lambda x: "-" if x is None else f"{x:.6g}"  # noqa: E731
        name = row["script"] + (f" {' '.join(row['args'])}" if row.get("args") else "")
        lines.append(
            f"| {name} | {row['backend']} | {row['plain']['wall_s']:.1f} ("
            + ", ".join(f"{r['wall_s']:.1f}" for r in row.get("plains", [])) + ") | "
            + ", ".join(f"{r['wall_s']:.1f}" for r in hooked) + " | "
            + ", ".join(f"{v[f'wall_ratio_{i + 1}']:.2f}" for i in range(len(hooked))) + " | "
            + ", ".join(f"{v[f'paired_ratio_{i + 1}']:.2f}" for i in range(len(hooked))
                        if f"paired_ratio_{i + 1}" in v) + " | "
            + f"{fmt(loss(row['plain']))}, {fmt(loss(hooked[0]))}, {fmt(loss(hooked[1]))} | "
            + f"{fmt(v['xla_spread'])} | "
            + ", ".join(str(v[f"stitched_{i + 1}"]) for i in range(len(hooked)))
            + f" / {v['functions']} | "
            + "; ".join(",".join(map(str, v[f"swapped_at_{i + 1}"])) or "-"
                        for i in range(len(hooked)))
            + f" | {'yes' if v['reproducible'] else 'no'} |")
        paired += [v[k] for k in v if k.startswith("paired_ratio_")]
    if paired:
        lines.append(f"\nEnv-var runs against the plain run just before each: "
                     f"{sum(r <= 1.1 for r in paired)} of {len(paired)} at or below 1.10x, "
                     f"geometric mean {statistics.geometric_mean(paired):.3f}x.")
    return "\n".join(lines)


def _open(path: str, mode: str):
    """A results file, gzipped where its name ends in .gz (each run keeps its output)."""
    return (gzip.open if path.endswith(".gz") else open)(path, mode)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--only", nargs="+", help="script names")
    parser.add_argument("--backends", default="jax,tensorflow",
                        help="Keras backends to run the Keras scripts on")
    parser.add_argument("--table", metavar="JSON")
    options = parser.parse_args(argv)
    if options.table:
        print(table(options.table))
        return
    if not options.out:
        parser.error("--out or --table")
    backends = options.backends.split(",")
    data = {"manifest": run_manifest(vars(options)), "rows": []}
    os.makedirs(os.path.dirname(os.path.abspath(options.out)), exist_ok=True)
    for name, path, keras_backends, *args in SCRIPTS:
        if options.only and name not in options.only:
            continue
        for backend in (keras_backends and [b for b in keras_backends if b in backends]) \
                or [None]:
            row = measure(name, path, backend, *args)
            data["rows"].append(row)
            print(json.dumps({"script": name, "backend": backend, **verdicts(row)}),
                  flush=True)
            with _open(options.out, "wt") as f:
                json.dump(data, f, indent=1)


if __name__ == "__main__":
    main()
