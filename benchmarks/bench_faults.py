"""The fault matrix against a small training loop (not a test).

    python benchmarks/bench_faults.py [--steps 20] [--only CASE ...]

Each case runs the same unchanged JAX training script (an MLP with LayerNorm and a softmax
cross-entropy, SGD) in a fresh process under FUSIONSTITCHING=1 --verify with one fault set
up: forged, truncated and foreign cache entries; a kernel that crashes and one that computes
wrong numbers; a ptxas that hangs; an unusable dump folder, report and cache; 8 processes
sharing one cache; a process SIGKILLed mid-build. Per case: the exit code, the final loss
against plain XLA's (FUSIONSTITCHING unset), and the warnings the job printed. The promise is
exit 0, the same loss, at most one warning per fault. First, the peak memory of replay on
synthetic modules of 10^9 and 10^11 elements (at most 2 GB).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OTHER_UID = 12345

TRAIN = '''
import os, sys
import numpy as np
INJECT = os.environ.get("BENCH_FAULT_INJECT", "")
if INJECT:  # the fault is in our code, set up before jax is imported
    from fusionstitching.runtime import kernel_objects
    real_ir = kernel_objects.host_ir
    if INJECT == "crash":
        kernel_objects.host_ir = lambda spec: real_ir(spec).replace(
            "entry:\\n", "entry:\\n  store volatile i32 7, ptr null\\n", 1)
    elif INJECT == "wrong":
        kernel_objects.host_ir = lambda spec: real_ir(spec).replace(
            "0x3f80000000000000", "0x3f90000000000000")
import jax, jax.numpy as jnp

def layernorm(x):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)

def loss(params, x, y):
    h = jax.nn.gelu(layernorm(x @ params["w1"] + params["b1"]))
    logits = h @ params["w2"]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, -1))

@jax.jit
def step(params, x, y):
    value, grads = jax.value_and_grad(loss)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), value

rng = np.random.default_rng(0)
params = {"w1": rng.standard_normal((64, 128)).astype(np.float32) * 0.1,
          "b1": np.zeros(128, np.float32),
          "w2": rng.standard_normal((128, 16)).astype(np.float32) * 0.1}
x = rng.standard_normal((256, 64)).astype(np.float32)
y = np.eye(16, dtype=np.float32)[rng.integers(0, 16, 256)]
for _ in range(int(sys.argv[1])):
    params, value = step(params, x, y)
print("final loss", repr(float(value)))
'''


def run_job(work: Path, steps: int, flags: str | None, env: dict | None = None,
            wait: bool = True):
    """The training script in a fresh process, stitched with ``flags`` (None: plain XLA);
    (exit code, final loss, warnings), or the Popen when ``wait`` is False."""
    script = work / "train.py"
    script.write_text(TRAIN)
    environ = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), **(env or {}))
    if flags is not None:
        environ.update(FUSIONSTITCHING="1", FUSIONSTITCHING_FLAGS=flags)
    proc = subprocess.Popen([sys.executable, str(script), str(steps)], cwd=work, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return finish(proc) if wait else proc


def finish(proc) -> tuple[int, float | None, list[str]]:
    out, err = proc.communicate(timeout=900)
    loss = next((float(line.split()[-1]) for line in out.splitlines()
                 if line.startswith("final loss")), None)
    # Ours start with "fusionstitching:"; Python's warnings name their category.
    warnings = [line for line in err.splitlines()
                if line.startswith("fusionstitching:") or "Warning:" in line]
    if proc.returncode != 0:  # what killed it, for the table's reader
        warnings.append("exit: " + " | ".join(err.strip().splitlines()[-3:]))
    return proc.returncode, loss, warnings


def foreign(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        os.chown(p, OTHER_UID, OTHER_UID)


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".tmp"))


def cases(work: Path, steps: int):
    """(name, function returning (exit code, final loss or one per process, warnings)) per
    fault."""
    base = f"--verify --cache_dir={work / 'cache'}"
    counter = iter(range(1000))

    def fresh():  # a cache of the case's own, so earlier cases do not answer for it
        return f"--verify --cache_dir={work / f'cache{next(counter)}'}"

    def warm():
        shutil.rmtree(work / "cache", ignore_errors=True)
        return run_job(work, steps, base)

    def forged():
        warm()
        for entry in entries(work / "cache"):  # another user's kernel, planted
            entry.write_bytes(entry.read_bytes()[:-16] + b"\0" * 16)
            os.chown(entry, OTHER_UID, OTHER_UID)
        return run_job(work, steps, base)

    def truncated():
        warm()
        for entry in entries(work / "cache"):
            entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
        return run_job(work, steps, base)

    def foreign_cache():
        warm()
        foreign(work / "cache")
        return run_job(work, steps, base)

    def hanging_ptxas():
        tools = work / "bin"
        tools.mkdir(exist_ok=True)
        (tools / "ptxas").write_text("#!/bin/sh\nsleep 600\n")
        (tools / "ptxas").chmod(0o755)
        return run_job(work, steps, fresh(),
                       {"PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"})

    def shared_by_8():
        shutil.rmtree(work / "cache", ignore_errors=True)
        procs = [run_job(work, steps, base, wait=False) for _ in range(8)]
        results = [finish(p) for p in procs]
        return (max(r[0] for r in results), [r[1] for r in results],
                [w for r in results for w in r[2]])

    def killed_mid_build():
        shutil.rmtree(work / "cache", ignore_errors=True)
        proc = run_job(work, steps, base, wait=False)
        time.sleep(6)  # inside the first step's build
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        return run_job(work, steps, base)

    (work / "a_file").write_text("")
    yield "none (cache cold)", warm
    yield "cache warm", lambda: run_job(work, steps, base)
    yield "forged entries (other uid)", forged
    yield "truncated entries", truncated
    yield "foreign cache (other uid)", foreign_cache
    yield "kernel crashes", lambda: run_job(work, steps, fresh(), {"BENCH_FAULT_INJECT": "crash"})
    yield "kernel wrong", lambda: run_job(work, steps, fresh(), {"BENCH_FAULT_INJECT": "wrong"})
    yield "ptxas hangs", hanging_ptxas
    yield "dump_to is a file", lambda: run_job(work, steps, f"{fresh()} "
                                                            f"--dump_to={work / 'a_file'}")
    yield "report under a file", lambda: run_job(work, steps, f"{fresh()} --report="
                                                              f"{work / 'a_file' / 'r.json'}")
    yield "cache_dir is a file", lambda: run_job(work, steps, f"--verify "
                                                              f"--cache_dir={work / 'a_file'}")
    yield "8 processes, one cache", shared_by_8
    yield "SIGKILL mid-build, rerun", killed_mid_build


def row_sums(rows: int, cols: int) -> str:
    """x * 2 + 1 over f32[rows, cols], returned and summed per row: 2 XLA kernels."""
    shape = f"f32[{rows},{cols}]"
    return f"""HloModule huge_rows

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

scaled {{
  p = {shape}{{1,0}} parameter(0)
  two = f32[] constant(2)
  twos = {shape}{{1,0}} broadcast(two), dimensions={{}}
  one = f32[] constant(1)
  ones = {shape}{{1,0}} broadcast(one), dimensions={{}}
  m = {shape}{{1,0}} multiply(p, twos)
  ROOT y = {shape}{{1,0}} add(m, ones)
}}

rows {{
  q = {shape}{{1,0}} parameter(0)
  z = f32[] constant(0)
  ROOT r = f32[{rows}]{{0}} reduce(q, z), dimensions={{1}}, to_apply=add
}}

ENTRY main {{
  x = {shape}{{1,0}} parameter(0)
  y = {shape}{{1,0}} fusion(x), kind=kLoop, calls=scaled
  c = f32[{rows}]{{0}} fusion(y), kind=kInput, calls=rows
  ROOT t = ({shape}{{1,0}}, f32[{rows}]{{0}}) tuple(y, c)
}}
"""


def replay_memory(work: Path) -> None:
    """Peak RSS of ``fusionstitching replay --no-ptxas`` on the largest synthetic shapes
    (the bound: at most 2 GB whatever the shapes)."""
    print(f"\n{'replay of':34} {'peak RSS':>10} {'wall':>7}  result")
    for rows, cols in ((10**6, 1000), (10**8, 1000)):
        path = work / f"rows_{rows}x{cols}.hlo"
        path.write_text(row_sums(rows, cols))
        t0 = time.perf_counter()
        done = subprocess.run(
            # VmHWM: the replay's own peak (ru_maxrss after exec counts the forked parent too)
            [sys.executable, "-c", "import re, sys; from fusionstitching.cli import main; "
             "code = main(['replay', sys.argv[1], '--no-ptxas']); print('peak_kb', re.search("
             "r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read())[1]); sys.exit(code)",
             str(path)],
            capture_output=True, text=True, timeout=900, cwd=work,
            env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT)))
        peak = next((int(line.split()[1]) for line in done.stdout.splitlines()
                     if line.startswith("peak_kb")), 0)
        plan = next((line.strip() for line in done.stdout.splitlines()
                     if "stitched plan:" in line), done.stderr.strip()[-120:])
        print(f"f32[{rows},{cols}] ({rows * cols:.0e} elements) {peak / 1024:8.0f} MB "
              f"{time.perf_counter() - t0:6.1f}s  exit {done.returncode}: {plan}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--only", nargs="*", help="substrings of the case names to run")
    parser.add_argument("--no-memory", action="store_true", help="skip the replay memory rows")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not args.no_memory:
            replay_memory(work)
        _, plain, _ = run_job(work, args.steps, None)
        print(f"plain XLA final loss {plain!r}\n")
        print(f"{'case':30} {'exit':>4} {'final loss':>22} {'same':>5} {'warnings':>8}  "
              f"first warning")
        for name, case in cases(work, args.steps):
            if args.only and not any(s in name for s in args.only):
                continue
            t0 = time.perf_counter()
            code, losses, warnings = case()
            losses = losses if isinstance(losses, list) else [losses]  # one per process
            loss = max(losses, key=lambda v: float("inf") if v is None else abs(v - plain))
            same = loss is not None and abs(loss - plain) <= 1e-5 * max(1.0, abs(plain))
            first = warnings[0].split("fusionstitching:", 1)[-1].strip()[:90] if warnings else ""
            print(f"{name:30} {code:4d} {loss!r:>22} {'yes' if same else 'NO':>5} "
                  f"{len(warnings):8d}  {first}  ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
