"""Training loop under plain jax.jit, fusionstitching.jit and FUSIONSTITCHING=1, side by side.

The loop: an MLP with LayerNorm, GELU and softmax cross-entropy, trained with
plain SGD on fixed random data. Each mode trains from the same initial parameters; the table
shows every mode's losses against jax.jit's (max abs difference), the first step (which
includes compiling) and the median / max of the remaining step times, all measured on this CPU
in this run. The stitched kernels run as host code here (no GPU), so step times say how our
host kernels compare with XLA:CPU's, not what a GPU would do.

    python benchmarks/bench_training_loop.py [--steps 200] [--sizes '{"batch": 256, ...}']

Modes: ``jax.jit``; ``fs.jit keep=stitched`` (the stitched executable forced, to time it);
``fs.jit`` (default: the faster executable is kept after timing both on the compiling call);
``fs.jit async`` (XLA runs until the stitched executable is built, verified and timed off the
call path); and this script's loop, unchanged (plain ``jax.jit``), in two child processes: one
without FUSIONSTITCHING and one with ``FUSIONSTITCHING=1 --async --verify`` (the hook from this
repository's ``tf_hooks/site``, as ``pip install`` would put it in site-packages).

For the async modes a second table splits the steps by what the executor was doing after
them (building, trial, timing, settled; runtime/executor.py): "no step slower than XLA's
plus noise" is read there, in particular the call that started the trial. The default of 200
steps lets the whole cycle (build from the kernel cache, trial, decision) happen inside the
loop; the machine is shared, so the load average is printed with each mode.
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
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

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
    """Run ``steps`` SGD steps with ``step(params, x, onehot, lr)``; losses, step times, and
    for a fusionstitching function the executor's state after each step. ``between_steps(i)``
    is called after step i (tests use it to watch the swap)."""
    params = jax.tree_util.tree_map(jnp.asarray, init_params(sizes))
    losses, times, states = [], [], []
    load = os.getloadavg()[0]
    for i, (x, onehot) in enumerate(batches(sizes, steps)):
        t0 = time.perf_counter()
        params, loss = step(params, x, onehot, sizes.lr)
        losses.append(float(loss))  # waits for the step
        times.append(time.perf_counter() - t0)
        states.append(executor_state(step))
        if between_steps is not None:
            between_steps(i)
    return {"losses": losses, "times": times, "states": states,
            "load": [load, os.getloadavg()[0]]}


def executor_state(step) -> str | None:
    """What the executor of a fusionstitching function's (single) signature is doing:
    building, pending, trial, timing, settled or fallback; None for plain jax.jit."""
    compiled = getattr(step, "_compiled", None)
    if not compiled:
        return None
    (signature,) = compiled.values()
    return signature.executor.info.state


def stitched_step(**opts):
    import fusionstitching

    return fusionstitching.jit(train_step, static_argnums=3, **opts)


# A Python whose start-up processes this repository's .pth as site.py does for each
# site-packages directory after `pip install .` (the benchmark measures this checkout).
WITH_REPOSITORY_HOOK = [
    "-c", "import runpy, site, sys; site.addsitedir(sys.argv[1]); "
          "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')",
    os.path.join(REPO, "tf_hooks", "site")]


def run_with_hook(sizes: Sizes, steps: int, flags: str | None) -> dict:
    """This script's loop, unchanged (plain jax.jit), in a child process started with the
    repository's hook: with ``FUSIONSTITCHING=1`` and ``flags``, or (``flags=None``) without
    the variable, as the baseline in identical process conditions."""
    with tempfile.TemporaryDirectory() as tmp:
        report_path = os.path.join(tmp, "report.json")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FUSIONSTITCHING")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
        if flags is not None:
            env.update(FUSIONSTITCHING="1",
                       FUSIONSTITCHING_FLAGS=f"{flags} --report={report_path}")
        command = [sys.executable, *WITH_REPOSITORY_HOOK, os.path.abspath(__file__), "--child",
                   "--steps", str(steps), "--sizes", json.dumps(asdict(sizes))]
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
        if run.returncode != 0:
            raise RuntimeError(f"child failed ({run.returncode}):\n{run.stderr[-3000:]}")
        result = json.loads(run.stdout.strip().splitlines()[-1])
        result["reports"] = []
        if flags is not None:
            with open(report_path) as f:
                result["reports"] = json.load(f)
        result["stderr"] = run.stderr
    return result


def child(sizes: Sizes, steps: int) -> None:
    if "FUSIONSTITCHING" in os.environ and not hasattr(jax.jit, "fusionstitching_original"):
        sys.exit("FUSIONSTITCHING=1 had no effect: the hook is not installed")
    result = train(jax.jit(train_step, static_argnums=3), sizes, steps)
    print(json.dumps(result))


def summarize(name: str, result: dict, reference: list[float]) -> str:
    times = [t * 1e3 for t in result["times"]]
    rest = times[1:] or times
    diff = max(abs(a - b) for a, b in zip(result["losses"], reference))
    return (f"{name:32s} {result['losses'][-1]:12.7f} {diff:10.2e} {times[0]:10.1f} "
            f"{statistics.median(rest):10.2f} {max(rest):10.2f}   "
            f"{result['load'][0]:4.1f}-{result['load'][1]:4.1f}")


def phases(result: dict, trial_call: int | None) -> list[tuple[str, list[float]]]:
    """Steps 2..N grouped by the executor's state after them, in order of first appearance;
    the call that started the trial (``trial_call``, 1-based, from the Report) on its own."""
    groups: dict[str, list[float]] = {}
    for i in range(1, len(result["states"])):
        label = "call starting the trial" if i + 1 == trial_call else result["states"][i]
        groups.setdefault(label, []).append(result["times"][i] * 1e3)
    return list(groups.items())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sizes", type=json.loads, default={}, help="JSON of Sizes fields")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = Sizes(**args.sizes)
    if args.child:
        child(sizes, args.steps)
        return
    cache_dir = tempfile.mkdtemp(prefix="fs-bench-cache-")
    print(f"MLP training loop, {args.steps} SGD steps, {sizes}; CPU (XLA:CPU and host "
          f"kernels; {os.cpu_count()} cores, shared), kernel cache {cache_dir}")
    results = {"jax.jit": train(jax.jit(train_step, static_argnums=3), sizes, args.steps)}
    forced = stitched_step(keep="stitched", cache_dir=cache_dir)
    results["fs.jit keep=stitched"] = train(forced, sizes, args.steps)
    fastest = stitched_step(cache_dir=cache_dir)
    results["fs.jit (keep fastest)"] = train(fastest, sizes, args.steps)
    background = stitched_step(async_compile=True, verify=True, cache_dir=cache_dir)
    results["fs.jit async verify"] = train(background, sizes, args.steps)
    results["child: FUSIONSTITCHING unset"] = run_with_hook(sizes, args.steps, None)
    hook = run_with_hook(sizes, args.steps, f"--async --verify --cache_dir={cache_dir}")
    results["child: FUSIONSTITCHING=1 --async"] = hook

    reference = results["jax.jit"]["losses"]
    print(f"\n{'mode':32s} {'last loss':>12s} {'max |dL|':>10s} {'step 1 ms':>10s} "
          f"{'median ms':>10s} {'max ms':>10s}   load avg   (steps 2..N; step 1 compiles)")
    for name, result in results.items():
        print(summarize(name, result, reference))
    print("\nasync modes, steps 2..N by the executor's state after the step:")
    (in_process,) = background.reports()
    (in_child,) = hook["reports"]
    for name, report in (("fs.jit async verify", in_process.to_json()),
                         ("child: FUSIONSTITCHING=1 --async", in_child)):
        for state, times in phases(results[name], report["runtime"]["trial_call"]):
            print(f"  {name:32s} {state:26s} {len(times):4d} steps  median "
                  f"{statistics.median(times):7.2f} ms  max {max(times):7.2f} ms")
    print()
    for name, fn in (("fs.jit keep=stitched", forced), ("fs.jit (keep fastest)", fastest),
                     ("fs.jit async verify", background)):
        (report,) = fn.reports()
        describe(name, report.to_json())
    for report in hook["reports"]:
        describe("child: FUSIONSTITCHING=1 --async", report)


def describe(name: str, report: dict) -> None:
    runtime = report.get("runtime") or {}
    cache = report.get("cache") or {}
    print(f"{name}: XLA plan {report['xla']['mem_kernels']} memory-intensive kernels, running "
          f"plan {report['fs']['mem_kernels']} ({runtime.get('stitched_plan')} built); state "
          f"{runtime.get('state')}, kept {runtime.get('kept')} ({runtime.get('why')}); trial "
          f"on call {runtime.get('trial_call')}; swapped at call "
          f"{runtime.get('swapped_at_call')}; build {runtime.get('build_s')} s; cache plan "
          f"{cache.get('plan')} hits {cache.get('hits')} misses {cache.get('misses')}; verify "
          f"{report['verify']}; fallbacks "
          f"{[(f['stage'], f['reason'][:60]) for f in report['fallbacks']]}")


if __name__ == "__main__":
    main()
