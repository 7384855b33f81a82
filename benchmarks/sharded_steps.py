"""The zoo's BERT and Transformer training steps sharded over 8 host devices, under
``FUSIONSTITCHING=1 --keep=stitched`` against XLA alone: the losses of N steps, the stitched
kernels, and milliseconds per step.

    python benchmarks/sharded_steps.py [--steps 20] [--json /tmp/sharded.json]

Layouts (the small size, batch 8): data parallel (the batch over 8 devices, weights
replicated: gradients all-reduced) and tensor parallel (a 2x4 mesh: the batch over 2, every
2-D weight's columns over 4, and its optimizer state with it). Each (model, layout, side) runs
in a child process of its own (``XLA_FLAGS=--xla_force_host_platform_device_count=8``, the
hook on or off), as a job would.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.models import training, zoo  # noqa: E402

MODELS, LAYOUTS = ("bert", "transformer"), ("data parallel", "tensor parallel")


def sharded_step(model: str, layout: str, devices=None, abstract: bool = False):
    """(step, arguments placed on ``devices`` (default: jax's) as ``layout`` says) of the
    model's training step at batch 8; ``abstract``: ShapeDtypeStructs (deviceless capture)."""
    module = zoo.MODELS[model]
    config = dataclasses.replace(module.CONFIGS["small"], batch=8)
    params = zoo.params(model, "small", abstract=False)
    opt_state = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype),
                             training.opt_state_like(params))
    batch = module.batch(config, "jax")
    devices = np.array(jax.devices() if devices is None else devices)
    if layout == "data parallel":
        mesh, data = Mesh(devices, ("data",)), 8

        def weight(x):
            return P()
    else:
        mesh, data = Mesh(devices.reshape(2, 4), ("data", "model")), 2

        def weight(x):
            return P(None, "model") if np.ndim(x) == 2 and np.shape(x)[1] % 4 == 0 else P()

    def example(x):
        return P("data") if np.ndim(x) and np.shape(x)[0] % data == 0 else P()

    args = (params, opt_state, batch)
    specs = (jax.tree.map(weight, params), jax.tree.map(weight, opt_state),
             jax.tree.map(example, batch))
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    if abstract:
        return module.jax_train, jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=s),
            args, shardings)
    return module.jax_train, jax.device_put(args, shardings)


def child(model: str, layout: str, steps: int) -> dict:
    """Train ``steps`` steps with ``jax.jit`` (stitched when the hook is on)."""
    fn, (params, opt_state, batch) = sharded_step(model, layout)
    step = jax.jit(fn)
    losses, times = [], []
    for _ in range(steps):
        started = time.perf_counter()
        loss, params, opt_state = step(params, opt_state, batch)
        losses.append(float(loss))
        times.append(time.perf_counter() - started)
    row = {"model": model, "layout": layout, "losses": losses,
           "first_s": times[0], "ms_per_step": 1e3 * float(np.median(times[len(times) // 2:]))}
    reports = getattr(step, "reports", None)
    if reports is not None:  # one per input signature: the steps after the first run the last
        *_, report = reports(wait_s=300)
        row.update(signatures=len(reports()), kept=report.runtime["kept"], kernels=len(report.kernels),
                   xla_kernels=report.xla.kernels, stitched_kernels=report.fs.kernels,
                   fallbacks=[f"{f.stage}: {f.reason}"[:160] for f in report.fallbacks])
    return row


def run_side(model: str, layout: str, steps: int, stitched: bool) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8",
               FUSIONSTITCHING="1" if stitched else "0",
               FUSIONSTITCHING_FLAGS="--keep=stitched")
    run = subprocess.run([sys.executable, __file__, "--child", model, layout,
                          "--steps", str(steps)], capture_output=True, text=True, env=env)
    if run.returncode != 0:
        return {"model": model, "layout": layout, "error": run.stderr.strip()[-400:]}
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        print(json.dumps(child(*opts.child, opts.steps)))
        return
    rows = []
    print("| model | layout | kept | XLA -> stitched kernels | fallbacks | final loss XLA | "
          "stitched | max loss diff | ms/step XLA | stitched |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in MODELS:
        for layout in LAYOUTS:
            xla = run_side(model, layout, opts.steps, stitched=False)
            ours = run_side(model, layout, opts.steps, stitched=True)
            rows.append({"xla": xla, "stitched": ours})
            if "error" in xla or "error" in ours:
                print(f"| {model} | {layout} | error: {xla.get('error') or ours.get('error')}")
                continue
            diff = max(abs(a - b) for a, b in zip(xla["losses"], ours["losses"]))
            print(f"| {model} | {layout} | {ours['kept']} | {ours['xla_kernels']} -> "
                  f"{ours['stitched_kernels']} | {len(ours['fallbacks'])} | "
                  f"{xla['losses'][-1]:.6f} | {ours['losses'][-1]:.6f} | {diff:.2e} | "
                  f"{xla['ms_per_step']:.2f} | {ours['ms_per_step']:.2f} |", flush=True)
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
