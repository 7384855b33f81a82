"""A job's planning process (runtime/planning.py): one process plans every module the job's
lifecycles queue, in order, and a module queued as a process ends is queued again."""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402

from fusionstitching import cli  # noqa: E402
from fusionstitching.hlo.xla_runner import optimized_hlo_text  # noqa: E402
from fusionstitching.runtime import planning  # noqa: E402
from fusionstitching.stitched_jit import jit  # noqa: E402
from helpers import args, layernorm  # noqa: E402


def softmax(x, g, b):
    return jax.nn.softmax(x * g + b, axis=-1)


def compiled_without_plan(fn, cache_dir: str):
    """A signature compiled with a cache, its plan not made yet (as a young job's)."""
    compiled = jit(fn, cache_dir=cache_dir, async_compile=False,
                   keep="stitched").lower(*args()).compile()
    lifecycle = compiled.lifecycle
    lifecycle.cache_dir = cache_dir + "-planned"  # an empty cache: nothing planned there yet
    return lifecycle


@pytest.fixture
def planning_lock():
    """Held, the planning lock keeps a planning process waiting before it plans."""
    if not shutil.which("flock"):
        pytest.skip("no flock program: a planning process cannot be held")
    path = os.path.join(tempfile.gettempdir(), f"fusionstitching-planning-{os.getuid()}")
    with open(path, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield held
        fcntl.flock(held, fcntl.LOCK_UN)


def test_the_modules_of_a_job_are_planned_by_one_process(tmp_path, planning_lock):
    first = compiled_without_plan(layernorm, str(tmp_path / "a"))
    second = compiled_without_plan(softmax, str(tmp_path / "a"))
    second.cache_dir = first.cache_dir
    child = first._plan_in_child()
    assert child is not None and second._plan_in_child() is child  # queued with it
    assert first._plan_in_child() is None  # once per lifecycle
    [folder] = [p.folder for p in planning._processes.values() if p.child is child]
    assert sorted(os.listdir(folder))[0].startswith("0") and len(os.listdir(folder)) == 2
    fcntl.flock(planning_lock, fcntl.LOCK_UN)
    assert child.wait(300) == 0
    assert not first._needs_planning() and not second._needs_planning()
    assert not os.path.exists(folder)


def test_a_module_queued_as_its_process_ended_is_queued_again(tmp_path, planning_lock):
    lifecycle = compiled_without_plan(layernorm, str(tmp_path / "a"))
    child = lifecycle._plan_in_child()
    os.killpg(child.pid, signal.SIGKILL)  # ended before it planned the module
    child.wait(60)
    fcntl.flock(planning_lock, fcntl.LOCK_UN)
    lifecycle._wait_for_plan(child)
    assert not lifecycle._needs_planning()


def test_prewarm_drain_plans_and_removes_each_module(tmp_path):
    folder = tmp_path / "queue"
    folder.mkdir()
    for i, fn in enumerate((layernorm, softmax)):
        text = optimized_hlo_text(jax.jit(fn).lower(*args()).compile())
        (folder / f"{i:05d}.{fn.__name__}.xla.hlo.txt").write_text(text)
    assert cli.main(["prewarm", str(folder), "--drain", "--cache_dir", str(tmp_path / "c"),
                     "--keep", "stitched", "--workers", "1"]) == 0
    assert list(folder.iterdir()) == []
    again = jit(softmax, cache_dir=str(tmp_path / "c"), async_compile=False,
                keep="stitched").lower(*args()).compile()
    assert again.report().cache["plan"] == "hit"
    assert jnp.allclose(again(*args()), jax.jit(softmax)(*args()), rtol=1e-5, atol=1e-6)
