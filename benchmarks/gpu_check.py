"""Run the GPU kit (benchmarks/gpu_kit.py prepares it) on a machine with an NVIDIA GPU.

    python benchmarks/gpu_check.py [--stages kernels,modules|profile] [--budget_s 300] [--only A,B]
    python benchmarks/gpu_check.py --table RESULT.json.gz...

Measured against XLA:GPU on the same card, printed and written to DIR/gpu_check_STAGES.json.gz:
  kernels: every stitched kernel loaded from its PTX (CuPy), timed with CUDA events;
  modules: XLA's module and the stitched one (runtime/gpu.py) compiled by XLA:GPU, checked
           against XLA's f64 result, step times in interleaved rounds;
  profile: GPU time per step of both, through CUPTI (PyTorch's profiler);
  variants: step times with our calls in or out of XLA's command buffers (CUDA graphs).
Without a GPU it says so and exits 0. CuPy and PyTorch are imported only where used: they
exist on the GPU machine, not in the package's dependencies.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import math
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from fusionstitching import verification  # noqa: E402
from fusionstitching.hlo.ir import NUMPY_DTYPES  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402
from fusionstitching.hlo.drift import drift_problems, widened_to_f64  # noqa: E402
from fusionstitching.runtime import gpu, xla  # noqa: E402
from fusionstitching.runtime.rewrite import RewriteError  # noqa: E402

ROUNDS = 5  # interleaved timing rounds per executable
ROUND_S = 0.02  # each round runs at least this long


# -- the kit ------------------------------------------------------------------------------------

def load_kit(kit: Path, only: set[str] | None = None) -> list[dict]:
    """The kit's modules in the order gpu_kit planned them (file names sort as it wrote)."""
    entries = []
    for path in sorted(kit.glob("*.json.gz"), key=lambda p: p.stat().st_mtime):
        name = path.name.removesuffix(".json.gz")
        if only is None or name in only:
            entries.append(json.loads(gzip.decompress(path.read_bytes())))
    return entries


def priority(entry: dict) -> int:
    """Run order: the large micro models (bandwidth-bound), the third-party tier, the zoo."""
    source = entry["source"]
    return 0 if source.startswith("[") else 1 if "third_party" in source else 2


def launch_of(kernel: dict, compute_capability: int) -> gpu.Launch:
    """The launcher's description of a kit kernel (runtime/gpu.Launch)."""
    block = math.prod(kernel["block"])
    params = ([gpu.LaunchParameter(f"in{i}", None, False) for i in range(len(kernel["inputs"]))]
              + [gpu.LaunchParameter(f"out{i}", None, True)
                 for i in range(len(kernel["outputs"]))])
    return gpu.Launch(target=kernel["name"], kernel_name=kernel["entry"],
                      grid=(math.prod(kernel["grid"]), 1, 1), num_warps=block // gpu.WARP,
                      dynamic_smem_bytes=0, static_smem_bytes=0,
                      compute_capability=compute_capability, parameters=params,
                      ptx=kernel["ptx"])


_CONFIG = re.compile(r'backend_config=("(?:[^"\\]|\\.)*")')


def with_launch_configs(text: str, kernels: list[dict], compute_capability: int) -> str:
    """The stitched module with every launcher call's attribute made again by this process's
    jaxlib (the kit was written by another jaxlib version) for this GPU."""
    lines = text.split("\n")
    for kernel in kernels:
        config = gpu.backend_config(launch_of(kernel, compute_capability))
        marker = f'custom_call_target="{kernel["name"]}"'
        hits = [i for i, line in enumerate(lines) if marker in line]
        if len(hits) != 1:
            raise RewriteError(f"{kernel['name']}: {len(hits)} custom calls in the module")
        lines[hits[0]] = _CONFIG.sub(lambda _: "backend_config=" + config, lines[hits[0]])
    return "\n".join(lines)


# -- timing -------------------------------------------------------------------------------------

def interleaved_seconds(runs: dict, rounds: int = ROUNDS, round_s: float = ROUND_S,
                        clock=time.perf_counter) -> dict[str, float]:
    """Median seconds per call of each ``runs[name](n)`` (runs n calls and waits for them),
    in rounds that alternate between the runs, so that clock and thermal drift hit all."""
    calls = {}
    for name, run in runs.items():  # warm up, then size each round
        run(2)
        start = clock()
        run(3)
        once = max((clock() - start) / 3, 1e-7)
        calls[name] = max(3, min(10_000, math.ceil(round_s / once)))
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = clock()
            run(calls[name])
            samples[name].append((clock() - start) / calls[name])
    return {name: statistics.median(s) for name, s in samples.items()}


# -- kernels (CuPy) -----------------------------------------------------------------------------

def buffer_bytes(spec: list) -> int:
    dtype, dims = spec
    return math.prod(dims) * np.dtype(NUMPY_DTYPES[dtype]).itemsize


def time_kernel(cupy, kernel: dict, workdir: str) -> dict:
    """Load one kernel's PTX, run it on random inputs and time it with CUDA events. Integer
    and predicate buffers are zero (valid indices); floats standard normal. The launches are
    replayed as one CUDA graph where CuPy can capture them, so that small kernels are timed on
    the GPU and not at Python's launch rate."""
    path = os.path.join(workdir, kernel["name"] + ".ptx")
    Path(path).write_text(kernel["ptx"])
    function = cupy.RawModule(path=path).get_function(kernel["entry"])
    buffers = []
    for spec in kernel["inputs"] + kernel["outputs"]:
        size = buffer_bytes(spec)
        if spec[0] == "f32":
            buffers.append(cupy.random.standard_normal(max(size // 4, 1), dtype=np.float32))
        else:
            buffers.append(cupy.zeros(max(size, 1), dtype=np.uint8))
    grid, block = (math.prod(kernel["grid"]),), (math.prod(kernel["block"]),)
    args = tuple(buffers)
    launches = 20

    def run_launches() -> None:
        for _ in range(launches):
            function(grid, block, args)

    run_launches()
    cupy.cuda.Device().synchronize()
    run, graphed = run_launches, False
    stream = cupy.cuda.Stream(non_blocking=True)
    try:
        with stream:
            stream.begin_capture()
            run_launches()
            graph = stream.end_capture()
        run, graphed = (lambda: graph.launch(stream)), True
    except Exception:  # no graph capture here: plain launches
        stream = cupy.cuda.Stream.null
    with stream:
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for _ in range(5):
            start.record(stream)
            run()
            stop.record(stream)
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3 / launches)
    us = statistics.median(times)
    moved = kernel["read_bytes"] + kernel["write_bytes"]
    return dict(kernel=kernel["name"], measured_us=us, modeled_us=kernel["modeled_us"],
                bytes=moved, gb_per_s=moved / us / 1e3, regs=kernel.get("regs"),
                why=kernel["why"], graphed=graphed)


def time_module_kernels(entry: dict) -> tuple[list[dict], list[str]]:
    """Every kernel of one module timed (in a worker process: a kernel that takes the process
    down loses this module's rows only)."""
    import cupy

    rows, errors = [], []
    with tempfile.TemporaryDirectory() as workdir:
        for kernel in entry["kernels"]:
            try:
                row = time_kernel(cupy, kernel, workdir)
            except Exception as exc:
                errors.append(f"kernel {kernel['name']} of {entry['name']}: {exc!r}"[:500])
                continue
            rows.append(dict(row, module=entry["name"]))
    return rows, errors


def time_all_kernels(entries: list[dict], result: dict) -> None:
    """Kernel timings of every module, one worker process at a time, restarted after a crash."""
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(1, mp_context=context)
    try:
        for entry in entries:
            try:
                rows, errors = pool.submit(time_module_kernels, entry).result(timeout=120)
            except (BrokenProcessPool, TimeoutError) as exc:
                result["errors"].append(f"kernels of {entry['name']}: the worker died "
                                        f"({type(exc).__name__})")
                pool.shutdown(wait=False, cancel_futures=True)
                pool = ProcessPoolExecutor(1, mp_context=context)
                continue
            result["kernels"] += rows
            result["errors"] += errors
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


# -- modules (XLA:GPU) --------------------------------------------------------------------------

CHAOTIC = 0.1  # XLA's own f32 result this far from its f64 one, relative to the output's scale


def verdict(actual: list, expected: list, exact: list, finite: float
            ) -> tuple[str, list[str], int]:
    """(check, problems, outputs rounding decides): the stitched outputs against XLA's f64
    result within XLA's own f32 distance (xla_runner.drift_problems). An f32 output where XLA
    itself is CHAOTIC-far from f64 says nothing about a kernel and is left out; so are steps
    whose outputs are mostly NaN/inf (vacuous)."""
    if finite < verification.VACUOUS_BELOW:
        return "vacuous", [f"{finite:.1%} of XLA's outputs finite on every input kind"], 0
    kept = [list(v) for v in (actual, expected, exact)]
    chaotic = 0
    for i, (w, x) in enumerate(zip(expected, exact)):
        if np.asarray(w).dtype != np.float32:
            continue
        both = np.isfinite(w) & np.isfinite(x)
        scale = np.abs(x[both]).max(initial=0.0)
        if scale and np.abs(w[both] - x[both]).max(initial=0.0) > CHAOTIC * scale:
            chaotic += 1
            for v in kept:  # equal stand-ins keep the output numbering of the messages
                v[i] = np.zeros(0, np.float32)
    problems = drift_problems(*kept)
    if problems:
        return "MISMATCH", problems, chaotic
    return ("no verdict" if chaotic == len(expected) else "f64"), [], chaotic


def executions(executable, buffers):
    """``run(n)``: n asynchronous executions on the device buffers, then a wait for the last."""
    def run(n: int) -> None:
        out = None
        for _ in range(n):
            out = executable.execute_sharded(buffers)
        jax.block_until_ready(out.disassemble_into_single_device_arrays())
    return run


def run_module(entry: dict, device, compute_capability: int) -> dict:
    """XLA's and the stitched module on the same inputs: checked, then timed."""
    row = dict(module=entry["name"], kernels=len(entry["kernels"]),
               modeled_xla_us=entry["modeled"]["xla_us"], modeled_fs_us=entry["modeled"]["fs_us"],
               xla_mem_kernels=entry["modeled"]["xla_mem_kernels"],
               fs_mem_kernels=entry["modeled"]["fs_mem_kernels"])
    started = time.perf_counter()
    baseline, stitched, module = compiled_pair(entry, device, compute_capability)
    row["compile_s"] = time.perf_counter() - started
    best = None
    for kind in verification.INPUT_KINDS:  # inputs that keep the step finite, as real data does
        args = verification.random_inputs(module, seed=0, kind=kind)
        with jax.enable_x64(True):
            buffers = jax.device_put(args, device)
        expected = [np.asarray(a) for a in xla.execute(baseline, buffers)]
        finite = verification.finite_fraction(expected)
        if best is None or finite > best[0]:
            best = (finite, kind, args, buffers, expected)
        if finite == 1.0:
            break
    row["finite"], row["inputs"], args, buffers, expected = best
    actual = [np.asarray(a) for a in xla.execute(stitched, buffers)]
    try:
        wide = xla.compile_hlo(widened_to_f64(entry["baseline_hlo"]), device)
        with jax.enable_x64(True):
            exact = [np.asarray(a) for a in xla.execute(
                wide, [np.asarray(a, np.float64) if a.dtype == np.float32 else a
                       for a in args])]
        row["check"], row["problems"], row["chaotic"] = verdict(actual, expected, exact,
                                                                row["finite"])
    except Exception as exc:  # no f64 yardstick: say so, compare with XLA's f32 alone
        ok, max_abs, _ = verification.compare(expected, actual, rtol=1e-4, atol=1e-4)
        row["problems"] = [f"no f64 reference ({type(exc).__name__})"]
        row["check"] = ("f32 1e-4" if ok else f"MISMATCH f32 (max abs {max_abs:.3g})")

    # XLA's executable twice: how far two timings of the same executable are apart.
    seconds = interleaved_seconds({"xla": executions(baseline, buffers),
                                   "fs": executions(stitched, buffers),
                                   "xla_again": executions(baseline, buffers)})
    row["xla_us"], row["fs_us"] = seconds["xla"] * 1e6, seconds["fs"] * 1e6
    row["speedup"] = seconds["xla"] / seconds["fs"]
    row["noise"] = abs(seconds["xla_again"] / seconds["xla"] - 1)
    return row


def compiled_pair(entry: dict, device, compute_capability: int):
    """(XLA's executable, the stitched one, the module as parsed)."""
    stitched_text = with_launch_configs(entry["stitched_hlo"], entry["kernels"],
                                        compute_capability)
    if entry["kernels"]:
        gpu.register_launch_targets([k["name"] for k in entry["kernels"]])
    baseline = xla.compile_hlo(entry["baseline_hlo"], device)
    stitched = xla.compile_hlo(stitched_text, device)
    return baseline, stitched, parse_module(entry["baseline_hlo"])


# Command buffers (CUDA graphs) with XLA's default command kinds minus custom calls, as in
# XLA's DebugOptions on jax 0.10-0.11: our launcher calls then run between the graphs.
WITHOUT_CUSTOM_CALLS = "FUSION,CUBLAS,CUBLASLT,CUDNN,CONDITIONAL,DYNAMIC_SLICE_FUSION"


def variant_executables(entry: dict, device, compute_capability: int) -> tuple[dict, object]:
    """XLA's and the stitched module compiled the ways that change how XLA's executable
    dispatches our launcher calls (see ``run_variants``), and the parsed module. (The FFI
    trait that declares a call graph-safe cannot be set through the CUDA plugin: "The plugin
    does not support custom call traits", jax 0.10.2.)"""
    text = with_launch_configs(entry["stitched_hlo"], entry["kernels"], compute_capability)
    gpu.register_launch_targets([k["name"] for k in entry["kernels"]])
    no_graphs = {"xla_gpu_enable_command_buffer": ""}
    compiles = {
        "xla": (entry["baseline_hlo"], None),
        "fs": (text, None),
        "fs_calls_outside_graphs": (text, {"xla_gpu_enable_command_buffer":
                                           WITHOUT_CUSTOM_CALLS}),
        "xla_no_graphs": (entry["baseline_hlo"], no_graphs),
        "fs_no_graphs": (text, no_graphs),
    }
    executables = {name: xla.compile_hlo(hlo, device, debug_options=options)
                   for name, (hlo, options) in compiles.items()}
    return executables, parse_module(entry["baseline_hlo"])


def run_variants(entry: dict, device, compute_capability: int) -> dict:
    """Step time of each variant, interleaved, and whether its outputs equal the default
    stitched executable's (the same kernels run; only the dispatch differs)."""
    executables, module = variant_executables(entry, device, compute_capability)
    with jax.enable_x64(True):
        buffers = jax.device_put(verification.random_inputs(module, seed=0), device)
    reference = [np.asarray(a) for a in xla.execute(executables["fs"], buffers)]
    same = {}
    for name, executable in executables.items():
        if name.startswith("fs"):
            outputs = [np.asarray(a) for a in xla.execute(executable, buffers)]
            same[name] = all(np.array_equal(a, b, equal_nan=True)
                             for a, b in zip(outputs, reference))
    seconds = interleaved_seconds({name: executions(e, buffers)
                                   for name, e in executables.items()})
    return dict(module=entry["name"], us={k: v * 1e6 for k, v in seconds.items()},
                same_as_fs=same)


def gpu_kernel_times(executable, buffers, calls: int = 3) -> dict:
    """GPU activity of ``calls`` executions, from CUPTI through PyTorch's profiler: per
    activity name (kernels, copies) its count and microseconds, per execution."""
    from torch.profiler import ProfilerActivity, profile

    run = executions(executable, buffers)
    run(1)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run(1)
    return {a.key: dict(count=a.count / calls, us=a.self_device_time_total / calls)
            for a in prof.key_averages() if a.self_device_time_total > 0}


def profile_module(entry: dict, device, compute_capability: int) -> dict:
    """XLA's kernels and ours as the GPU ran them inside the two executables."""
    baseline, stitched, module = compiled_pair(entry, device, compute_capability)
    with jax.enable_x64(True):
        buffers = jax.device_put(verification.random_inputs(module, seed=0), device)
    xla_side, fs_side = gpu_kernel_times(baseline, buffers), gpu_kernel_times(stitched, buffers)
    ours = {k: v for k, v in fs_side.items() if k.startswith("fusionstitching")}
    return dict(module=entry["name"],
                xla_gpu_us=sum(v["us"] for v in xla_side.values()),
                xla_launches=sum(v["count"] for v in xla_side.values()),
                fs_gpu_us=sum(v["us"] for v in fs_side.values()),
                fs_launches=sum(v["count"] for v in fs_side.values()),
                ours_us=sum(v["us"] for v in ours.values()), ours=ours,
                xla_activities=xla_side, fs_activities=fs_side)


def dispatch_floor_us(device) -> float:
    """Step time of a module with one tiny kernel: the host's dispatch cost per call."""
    text = ("HloModule floor\n\nENTRY main {\n  p = f32[4] parameter(0)\n"
            "  ROOT n = f32[4] negate(p)\n}\n")
    executable = xla.compile_hlo(text, device)
    buffers = [jax.device_put(np.zeros(4, np.float32), device)]

    return interleaved_seconds({"floor": executions(executable, buffers)})["floor"] * 1e6


# -- main ---------------------------------------------------------------------------------------

def table(results: list[dict]) -> str:
    """The measured table of benchmarks/README.md from gpu_check JSON files (later files win)."""
    modules, profiles, kernels = {}, {}, {}
    for result in results:
        modules.update({r["module"]: r for r in result.get("modules", [])})
        profiles.update({r["module"]: r for r in result.get("profiles", [])})
        kernels.update({r["kernel"] + "@" + r["module"]: r for r in result.get("kernels", [])})
    lines = [f"{'module':<40} {'mem kernels':>11} {'XLA us':>8} {'FS us':>8} {'speedup':>7} "
             f"{'A/A':>5} {'GPU us XLA':>10} {'GPU us FS':>9}  check"]
    for name, r in modules.items():
        p = profiles.get(name)
        gpu_us = f"{p['xla_gpu_us']:>10.1f} {p['fs_gpu_us']:>9.1f}" if p else f"{'':>10} {'':>9}"
        lines.append(f"{name:<40} {r['xla_mem_kernels']:>5}->{r['fs_mem_kernels']:<5} "
                     f"{r['xla_us']:>8.1f} {r['fs_us']:>8.1f} {r['speedup']:>6.2f}x "
                     f"{r['noise']:>5.1%} {gpu_us}  "
                     f"{'vacuous' if r['finite'] < verification.VACUOUS_BELOW else r['check']}"
                     + (f" (finite {r['finite']:.0%})" if r["finite"] < 1 else ""))
    ratios = sorted(k["measured_us"] / k["modeled_us"] for k in kernels.values()
                    if k["modeled_us"] > 0)
    if ratios:
        within = sum(0.8 <= x <= 1.25 for x in ratios)
        lines.append(f"\n{len(ratios)} stitched kernels timed alone: measured/modeled median "
                     f"{statistics.median(ratios):.2f}, {within} within 25% "
                     f"(quartiles {ratios[len(ratios) // 4]:.2f}..{ratios[3 * len(ratios) // 4]:.2f})")
    return "\n".join(lines)


def find_gpu():
    """(jax CUDA device, description) or (None, why not)."""
    try:
        devices = jax.devices("gpu")
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if not devices:
        return None, "jax sees no GPU"
    return devices[0], f"{devices[0].device_kind}, jax {jax.__version__}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kit", type=Path, default=ROOT / ".gpu_kit")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    ap.add_argument("--budget_s", type=float, default=300.0,
                    help="start no module after this many seconds")
    ap.add_argument("--only", help="comma-separated module names")
    ap.add_argument("--stages", default="kernels,modules",
                    help="kernels (CuPy), modules (XLA:GPU), profile (CUPTI through PyTorch), "
                         "variants (how our calls are dispatched: command buffers)")
    ap.add_argument("--table", nargs="+", type=Path, metavar="JSON",
                    help="print the measured table of these result files and exit")
    opts = ap.parse_args(argv)
    if opts.table:
        print(table([json.loads(gzip.decompress(p.read_bytes())) for p in opts.table]))
        return 0
    device, about = find_gpu()
    if device is None:
        print(f"no GPU here ({about}): nothing to run")
        return 0
    started = time.perf_counter()
    entries = [e for e in load_kit(opts.kit, set(opts.only.split(",")) if opts.only else None)
               if "error" not in e and e["kernels"]]  # else nothing to compare
    entries.sort(key=priority)
    print(f"GPU: {about}; {len(entries)} modules in the kit", flush=True)
    opts.out.mkdir(parents=True, exist_ok=True)
    cc = int(float(getattr(device, "compute_capability", "9.0")) * 10)
    stages = opts.stages.split(",")
    result = dict(device=about, kernels=[], modules=[], profiles=[], variants=[], errors=[])
    path = opts.out / f"gpu_check_{'_'.join(stages)}.json.gz"

    def save() -> None:
        path.write_bytes(gzip.compress(json.dumps(result).encode()))

    if "kernels" in stages:
        if importlib.util.find_spec("cupy") is None:
            result["errors"].append("CuPy not installed: kernels not timed one by one")
        else:
            time_all_kernels(entries, result)
            print(f"kernels: {len(result['kernels'])} timed in "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
        save()
    if "modules" in stages:
        result["dispatch_floor_us"] = dispatch_floor_us(device)
    for entry in entries if {"modules", "profile", "variants"} & set(stages) else []:
        if time.perf_counter() - started > opts.budget_s:
            result["errors"].append(f"{entry['name']}: not run (budget)")
            continue
        try:
            if "modules" in stages:
                row = run_module(entry, device, cc)
                result["modules"].append(row)
                print(f"{row['module']:<44} {row['xla_mem_kernels']:>4}->"
                      f"{row['fs_mem_kernels']:<4} xla {row['xla_us']:>9.1f} us  fs "
                      f"{row['fs_us']:>9.1f} us  {row['speedup']:>5.2f}x (A/A "
                      f"{row['noise']:.1%})  {row['check']}", flush=True)
            if "variants" in stages:
                row = run_variants(entry, device, cc)
                result["variants"].append(row)
                print(f"{row['module']:<44} " + "  ".join(
                    f"{k} {v:.1f}" for k, v in row["us"].items())
                    + f"  same {row['same_as_fs']}", flush=True)
            if "profile" in stages:
                row = profile_module(entry, device, cc)
                result["profiles"].append(row)
                print(f"{row['module']:<44} GPU us xla {row['xla_gpu_us']:>8.1f} "
                      f"({row['xla_launches']:.0f} activities)  fs {row['fs_gpu_us']:>8.1f} "
                      f"({row['fs_launches']:.0f}), ours {row['ours_us']:.1f}", flush=True)
        except Exception as exc:
            result["errors"].append(f"module {entry['name']}: {type(exc).__name__}: "
                                    f"{str(exc)[:400]}")
        save()
    save()
    print(f"done in {time.perf_counter() - started:.0f} s; errors: {len(result['errors'])}")
    for line in result["errors"][:20]:
        print("  " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
