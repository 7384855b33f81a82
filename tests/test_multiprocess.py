"""A data-parallel job of 4 processes on localhost (jax.distributed, gloo collectives), 50
steps: every replica ends with the same weights, bit for bit, without the hook, with
FUSIONSTITCHING=1 and keep=fastest (process 0's timing decides for all), and with
keep=stitched (the stitched executable, its collectives between the processes, runs every
step). One decision for all replicas: runtime/coordination.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROCESSES, STEPS = 4, 50

WORKER = """
import hashlib, json, os, sys
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
process, count, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=count,
                           process_id=process)
import jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

def layernorm(x):
    m = x.mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)

def loss(w, x):
    return (jnp.tanh(layernorm(x @ w)) ** 2).mean()

@jax.jit
def step(w, x):
    value, grad = jax.value_and_grad(loss)(w, x)
    return w - 0.1 * grad, value

mesh = Mesh(np.array(jax.devices()), ("data",))
rng = np.random.default_rng(0)
w0 = rng.standard_normal((64, 128), np.float32) / 8
x0 = rng.standard_normal((32 * count, 64), np.float32)
w = jax.make_array_from_callback(w0.shape, NamedSharding(mesh, P()), lambda i: w0[i])
x = jax.make_array_from_callback(x0.shape, NamedSharding(mesh, P("data")), lambda i: x0[i])
for _ in range(int(sys.argv[4])):
    w, value = step(w, x)
local = np.asarray(w.addressable_shards[0].data)
row = {"process": process, "weights": hashlib.sha256(local.tobytes()).hexdigest(),
       "loss": float(np.asarray(value.addressable_shards[0].data))}
if hasattr(step, "reports"):
    reports = step.reports(wait_s=60)
    row["stages"] = sorted({f.stage for r in reports for f in r.fallbacks})
    row["kept"] = [r.runtime["kept"] for r in reports]
    row["why"] = [r.runtime["why"] for r in reports]
print(json.dumps(row), flush=True)
"""


def train(keep: str | None) -> list[dict]:
    """One row per process; ``keep`` None: without the hook."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=REPO, FUSIONSTITCHING="0" if keep is None else "1",
               FUSIONSTITCHING_FLAGS=f"--keep={keep or 'fastest'}")
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(i), str(PROCESSES),
                                 str(port), str(STEPS)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
               for i in range(PROCESSES)]
    rows = []
    try:
        for worker in workers:
            out, err = worker.communicate(timeout=300)
            assert worker.returncode == 0, err[-3000:]
            rows.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for worker in workers:
            worker.kill()
    return rows


@pytest.mark.parametrize("keep", [None, "fastest", "stitched"])
def test_four_replicas_end_with_the_same_weights(keep):
    rows = train(keep)
    assert len({r["weights"] for r in rows}) == 1, rows
    if keep is None:
        return
    assert all(not r["stages"] for r in rows), rows  # no fallback in any process
    assert len({tuple(r["kept"]) for r in rows}) == 1  # one executable everywhere
    if keep == "stitched":
        assert rows[0]["kept"] == ["stitched"]
        plain = train(None)[0]["loss"]  # XLA's loss after 50 steps, within f32 rounding
        assert abs(rows[0]["loss"] - plain) <= 1e-5 * abs(plain)
