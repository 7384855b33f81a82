"""Training loop under plain jax.jit, fusionstitching.jit and FUSIONSTITCHING=1, side by side.

The loop is the issue's: an MLP with LayerNorm, GELU and softmax cross-entropy, trained with
plain SGD for 50 steps on fixed random data. Each mode trains from the same initial
parameters; the table shows every mode's losses against jax.jit's (max abs difference), the
first step (which includes compiling) and the median / max of the remaining step times, all
measured on this CPU in this run. The stitched kernels run as host code here (no GPU), so
step times say how our host kernels compare with XLA:CPU's, not what a GPU would do.

    python benchmarks/bench_training_loop.py [--steps 50] [--batch 256 --hidden 512 ...]

Modes: ``jax.jit``; ``fs.jit keep=stitched`` (the stitched executable forced, to time it);
``fs.jit`` (default: the faster executable is kept after timing both on a real call);
``fs.jit async`` (XLA runs until the stitched executable is built and verified);
``FUSIONSTITCHING=1 --async`` (this script, unchanged, in a child process with the hook;
needs the package installed: ``pip install -e .``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    batch: int = 256
    features: int = 256
    hidden: int = 512
    classes: int = 128
    lr: float = 0.05


def init_params(sizes: Sizes, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    normal = lambda *shape: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
    return {"w1": normal(sizes.features, sizes.hidden),
            "b1": np.zeros(sizes.hidden, np.float32),
            "gamma": np.ones(sizes.hidden, np.float32),
            "beta": np.zeros(sizes.hidden, np.float32),
            "w2": normal(sizes.hidden, sizes.classes),
            "b2": np.zeros(sizes.classes, np.float32)}


def batches(sizes: Sizes, steps: int, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        x = rng.standard_normal((sizes.batch, sizes.features)).astype(np.float32)
        labels = rng.integers(0, sizes.classes, sizes.batch)
        out.append((x, np.eye(sizes.classes, dtype=np.float32)[labels]))
    return out


def layernorm(h, gamma, beta):
    mean = h.mean(-1, keepdims=True)
    centered = h - mean
    var = (centered * centered).mean(-1, keepdims=True)
    return centered * jax.lax.rsqrt(var + 1e-5) * gamma + beta


def gelu(h):
    return 0.5 * h * (1.0 + jnp.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))


def loss_fn(params, x, onehot):
    h = gelu(layernorm(x @ params["w1"] + params["b1"], params["gamma"], params["beta"]))
    logits = h @ params["w2"] + params["b2"]
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - jnp.log(jnp.exp(shifted).sum(-1, keepdims=True))
    return -(onehot * log_probs).sum(-1).mean()


def train_step(params, x, onehot, lr):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, onehot)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), loss


def train(step, sizes: Sizes, steps: int, between_steps=None) -> dict:
    """Run ``steps`` SGD steps with ``step(params, x, onehot, lr)``; losses and step times.
    ``between_steps(i)`` is called after step i (tests use it to watch the swap)."""
    params = jax.tree_util.tree_map(jnp.asarray, init_params(sizes))
    losses, times = [], []
    for i, (x, onehot) in enumerate(batches(sizes, steps)):
        t0 = time.perf_counter()
        params, loss = step(params, x, onehot, sizes.lr)
        losses.append(float(loss))  # waits for the step
        times.append(time.perf_counter() - t0)
        if between_steps is not None:
            between_steps(i)
    return {"losses": losses, "times": times}


def stitched_step(**opts):
    import fusionstitching

    return fusionstitching.jit(train_step, static_argnums=3, **opts)


def run_with_hook(sizes: Sizes, steps: int, flags: str, python: list[str] | None = None) -> dict:
    """This script, unchanged (plain jax.jit), in a child process with FUSIONSTITCHING=1.
    ``python`` is the interpreter command (default: this one; tests pass one that loads the
    repository's .pth without installing the package)."""
    with tempfile.TemporaryDirectory() as tmp:
        report_path = os.path.join(tmp, "report.json")
        env = dict(os.environ, FUSIONSTITCHING="1",
                   FUSIONSTITCHING_FLAGS=f"{flags} --report={report_path}")
        command = (python or [sys.executable]) + [
            os.path.abspath(__file__), "--child", "--steps", str(steps),
            "--sizes", json.dumps(asdict(sizes))]
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if run.returncode != 0:
            raise RuntimeError(f"child failed ({run.returncode}):\n{run.stderr[-3000:]}")
        result = json.loads(run.stdout.strip().splitlines()[-1])
        with open(report_path) as f:
            result["reports"] = json.load(f)
        result["stderr"] = run.stderr
    return result


def child(sizes: Sizes, steps: int) -> None:
    if not hasattr(jax.jit, "fusionstitching_original"):
        sys.exit("FUSIONSTITCHING=1 had no effect: the hook is not installed "
                 "(pip install -e . installs fusionstitching_hook.pth)")
    result = train(jax.jit(train_step, static_argnums=3), sizes, steps)
    print(json.dumps(result))


def summarize(name: str, result: dict, reference: list[float]) -> str:
    times = [t * 1e3 for t in result["times"]]
    rest = times[1:] or times
    diff = max(abs(a - b) for a, b in zip(result["losses"], reference))
    return (f"{name:28s} {result['losses'][-1]:12.7f} {diff:10.2e} {times[0]:10.1f} "
            f"{statistics.median(rest):10.2f} {max(rest):10.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--sizes", type=json.loads, default={}, help="JSON of Sizes fields")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = Sizes(**args.sizes)
    if args.child:
        child(sizes, args.steps)
        return
    cache_dir = tempfile.mkdtemp(prefix="fs-bench-cache-")
    print(f"MLP training loop, {args.steps} SGD steps, {sizes}; CPU (XLA:CPU and host "
          f"kernels), kernel cache {cache_dir}")
    results = {"jax.jit": train(jax.jit(train_step, static_argnums=3), sizes, args.steps)}
    forced = stitched_step(keep="stitched", cache_dir=cache_dir)
    results["fs.jit keep=stitched"] = train(forced, sizes, args.steps)
    fastest = stitched_step(cache_dir=cache_dir)
    results["fs.jit (keep fastest)"] = train(fastest, sizes, args.steps)
    background = stitched_step(async_compile=True, verify=True, cache_dir=cache_dir)
    results["fs.jit async verify"] = train(background, sizes, args.steps)
    hook = run_with_hook(sizes, args.steps, f"--async --verify --cache_dir={cache_dir}")
    results["FUSIONSTITCHING=1 --async"] = hook

    reference = results["jax.jit"]["losses"]
    print(f"\n{'mode':28s} {'last loss':>12s} {'max |dL|':>10s} {'step 1 ms':>10s} "
          f"{'median ms':>10s} {'max ms':>10s}   (steps 2..N; step 1 includes compiling)")
    for name, result in results.items():
        print(summarize(name, result, reference))
    print()
    for name, fn in (("fs.jit keep=stitched", forced), ("fs.jit (keep fastest)", fastest),
                     ("fs.jit async verify", background)):
        (report,) = fn.reports()
        describe(name, report.to_json())
    for report in hook["reports"]:
        describe("FUSIONSTITCHING=1 --async", report)


def describe(name: str, report: dict) -> None:
    runtime = report.get("runtime") or {}
    cache = report.get("cache") or {}
    print(f"{name}: XLA plan {report['xla']['mem_kernels']} memory-intensive kernels, running "
          f"plan {report['fs']['mem_kernels']} ({runtime.get('stitched_plan')} built); kept "
          f"{runtime.get('kept')} ({runtime.get('why')}); swapped at call "
          f"{runtime.get('swapped_at_call')}; build {runtime.get('build_s')} s; cache hits "
          f"{cache.get('hits')} misses {cache.get('misses')}; verify {report['verify']}; "
          f"fallbacks {[(f['stage'], f['reason'][:60]) for f in report['fallbacks']]}")


if __name__ == "__main__":
    main()
