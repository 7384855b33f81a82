"""A training loop (MLP with LayerNorm, GELU, softmax cross-entropy; SGD) under
jax.jit, fusionstitching.jit, FUSIONSTITCHING=1 and async compilation: same losses, our
custom calls in the HLO XLA runs, fewer kernels than XLA's plan. The FUSIONSTITCHING=1 run
is marked slow (a child process importing jax and compiling the step: ~15 s here); the
async test reuses the first test's kernel cache (plan hit), so its build takes ~1 s."""
from __future__ import annotations

import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from benchmarks import bench_training_loop as loop  # noqa: E402
from fusionstitching.graph import build_graph  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402

SIZES = loop.Sizes(batch=32, features=64, hidden=128, classes=32)
STEPS = 10
# Loss tolerance: stitched reductions add in another order than XLA:CPU's (float32).
RTOL = 1e-5


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("kernel-cache"))


@pytest.fixture(scope="module")
def reference():
    return loop.train(jax.jit(loop.train_step, static_argnums=3), SIZES, STEPS)["losses"]


def kernels(hlo_text: str) -> int:
    return len(build_graph(parse_module(hlo_text)).kernel_nodes())


def test_fusionstitching_jit_same_losses_fewer_kernels(cache_dir, reference):
    step = loop.stitched_step(keep="stitched", verify=True, cache_dir=cache_dir)
    result = loop.train(step, SIZES, STEPS)
    np.testing.assert_allclose(result["losses"], reference, rtol=RTOL)
    (report,) = step.reports()
    assert report.verify.ran and report.verify.ok and not report.fallbacks
    assert report.runtime["kept"] == "stitched" and report.fs.patterns >= 3

    params = jax.tree_util.tree_map(np.asarray, loop.init_params(SIZES))
    x, onehot = loop.batches(SIZES, 1)[0]
    ours = step.lower(params, x, onehot, SIZES.lr).compile().as_text()
    xla = jax.jit(loop.train_step, static_argnums=3).lower(params, x, onehot,
                                                          SIZES.lr).compile().as_text()
    assert ours.count('custom_call_target="fusionstitching') == report.fs.patterns
    assert kernels(ours) < kernels(xla)


def test_a_donating_step_writes_its_updates_over_the_parameters(cache_dir):
    """jax.jit(step, donate_argnums=0), as Keras 3's and flax's training loops call it: the
    kernels write the new parameters into the donated buffers, so no copy of a kernel's
    output follows them (before, one per parameter), and the losses are those of the step
    without donation, bit for bit."""
    kept = loop.train(loop.stitched_step(keep="stitched", cache_dir=cache_dir), SIZES, STEPS)
    step = loop.stitched_step(keep="stitched", cache_dir=cache_dir, donate_argnums=0)
    donated = loop.train(step, SIZES, STEPS)
    assert donated["losses"] == kept["losses"]
    (report,) = step.reports()
    assert report.runtime["kept"] == "stitched" and not report.fallbacks
    params = jax.tree_util.tree_map(np.asarray, loop.init_params(SIZES))
    x, onehot = loop.batches(SIZES, 1)[0]
    text = step.lower(params, x, onehot, SIZES.lr).compile().as_text()
    calls = parse_module(text).entry.by_name()
    copied = [i for i in calls.values() if i.opcode == "copy"
              and calls[i.operands[0]].opcode == "get-tuple-element"
              and calls[calls[i.operands[0]].operands[0]].opcode == "custom-call"]
    assert 'output_to_operand_aliasing' in text and not copied


@pytest.mark.slow
def test_fusionstitching_env_var_same_losses(cache_dir, reference):
    result = loop.run_with_hook(SIZES, STEPS,
                                f"--async=false --keep=stitched --cache_dir={cache_dir}")
    np.testing.assert_allclose(result["losses"], reference, rtol=RTOL)
    (report,) = result["reports"]
    assert report["runtime"]["kept"] == "stitched" and not report["fallbacks"]
    assert report["fs"]["mem_kernels"] < report["xla"]["mem_kernels"]


def test_async_swap_during_the_loop(cache_dir):
    step = loop.stitched_step(async_compile=True, verify=True, keep="stitched",
                              cache_dir=cache_dir)
    params = jax.tree_util.tree_map(np.asarray, loop.init_params(SIZES))
    data = loop.batches(SIZES, 400)
    losses, states = [], []
    for x, onehot in data:
        params, loss = step(params, x, onehot, SIZES.lr)
        losses.append(float(loss))
        (compiled,) = step._compiled.values()
        states.append((compiled.executor.info.state, compiled.lifecycle.builder.is_alive()))
        if states[-1][0] != "building" and len(states) >= states.index(states[-1]) + 3:
            break
        time.sleep(0.2)  # a training step's worth of time: the build runs meanwhile
    # The first call returned while the compiler was still at work: no call waited for it.
    assert states[0] == ("building", True)
    (report,) = step.reports()
    runtime = report.runtime
    assert runtime["mode"] == "async" and runtime["state"] == "settled", runtime
    assert runtime["kept"] == "stitched" and report.verify.ran and report.verify.ok
    assert 1 < runtime["swapped_at_call"] <= len(losses) - 1  # stitched steps ran in the loop
    plain = jax.jit(loop.train_step, static_argnums=3)
    params = jax.tree_util.tree_map(np.asarray, loop.init_params(SIZES))
    want = []
    for x, onehot in data[:len(losses)]:
        params, loss = plain(params, x, onehot, SIZES.lr)
        want.append(float(loss))
    np.testing.assert_allclose(losses, want, rtol=RTOL)
