"""Kernel cache: entry format and checks, corrupted entries rebuilt, two processes sharing
one directory (the second reuses the first's plan and kernels)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fusionstitching import cli, codegen, pipeline, query_workers  # noqa: E402
from fusionstitching.hlo.xla_runner import optimized_hlo_text  # noqa: E402
from fusionstitching.runtime import build, cache  # noqa: E402
from helpers import REPO, args, layernorm  # noqa: E402


def test_entry_round_trip_and_corruption_detected(tmp_path):
    store = cache.KernelCache(str(tmp_path))
    key = cache.fingerprint("kernel", "define void @k() { ret void }")
    store.store(key, b"\x7fELF object bytes", kind="kernel", symbol="k")
    header, payload = store.load(key)
    assert payload == b"\x7fELF object bytes" and header["symbol"] == "k"
    assert not [p for p in tmp_path.rglob("*.tmp")]  # published by rename, nothing left over

    path = store.path(key)
    data = open(path, "rb").read()
    for broken, why in ((data[:-3], "checksum"), (data[:-1] + b"X", "checksum"),
                        (b"garbage", "not JSON"), (b"{}\n", "not a")):
        with open(path, "wb") as f:
            f.write(broken)
        with pytest.raises(cache.CorruptEntry, match=why):
            store.load(key)
    with open(path, "wb") as f:  # an intact entry of another key copied under this name
        f.write(data.replace(key.encode(), key[::-1].encode()))
    with pytest.raises(cache.CorruptEntry, match="another key"):
        store.load(key)


def test_key_covers_ir_and_compiler():
    assert cache.fingerprint("kernel", "a") != cache.fingerprint("kernel", "b")
    assert cache.fingerprint("kernel", "a") != cache.fingerprint("plan", "a")
    assert cache.fingerprint("kernel", "a") == cache.fingerprint("kernel", "a")


CHILD = """
import json, os, sys
os.environ["JAX_PLATFORMS"] = "cpu"
import numpy as np
import jax
import fusionstitching
sys.path.insert(0, {tests!r})
from helpers import args, layernorm
fn = fusionstitching.jit(layernorm, cache_dir=sys.argv[1], keep="stitched")
a = args()
out = np.asarray(fn(*a))
np.testing.assert_allclose(out, np.asarray(jax.jit(layernorm)(*a)), rtol=1e-5, atol=1e-5)
(report,) = fn.reports()
print(json.dumps(report.to_json()))
"""


def run_child(cache_dir: str) -> dict:
    code = CHILD.format(tests=os.path.join(REPO, "tests"))
    run = subprocess.run([sys.executable, "-c", code, cache_dir], capture_output=True,
                         text=True, timeout=300, cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two fresh processes importing jax and compiling: ~20 s here
def test_two_processes_share_one_cache_dir(tmp_path):
    first = run_child(str(tmp_path))
    second = run_child(str(tmp_path))
    assert first["cache"]["plan"] == "miss" and first["cache"]["misses"] >= 1
    assert first["times_s"]["codegen"] > 0
    assert second["cache"]["plan"] == "hit" and second["cache"]["misses"] == 0
    assert second["cache"]["hits"] == first["cache"]["misses"]
    assert second["times_s"]["codegen"] == second["times_s"]["explore"] == 0.0
    assert second["fs"] == first["fs"] and second["kernels"] == first["kernels"]
    assert not first["fallbacks"] and not second["fallbacks"]


def test_corrupted_cache_file_is_rebuilt(tmp_path, caplog):
    import jax

    from fusionstitching.stitched_jit import jit
    from helpers import args, layernorm

    a = args(rows=8)
    want = np.asarray(jax.jit(layernorm)(*a))
    first = jit(layernorm, cache_dir=str(tmp_path), keep="stitched")
    first(*a)
    entries = sorted(tmp_path.rglob("*.kernel"))
    assert len(entries) >= 2  # a plan and its kernel(s)
    for path in entries:  # flip one byte in the middle of every entry
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    again = jit(layernorm, cache_dir=str(tmp_path), keep="stitched")
    with caplog.at_level("WARNING", logger="fusionstitching"):
        results = [np.asarray(again(*a)) for _ in range(2)]
    for got in results:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    (report,) = again.reports()
    assert {f.stage for f in report.fallbacks} == {"cache"}
    assert all("corrupt entry rebuilt" in f.reason for f in report.fallbacks)
    assert report.cache["plan"] == "miss" and report.cache["misses"] >= 1
    assert report.runtime["kept"] == "stitched"  # rebuilt kernels run
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    # the rebuild was stored intact (the plan of keep='stitched', whose kernels are not measured)
    third = jit(layernorm, cache_dir=str(tmp_path), keep="stitched")
    third(*a)
    assert third.reports()[0].cache["plan"] == "hit"


PREWARMED = """
import json, os, sys, time
os.environ["JAX_PLATFORMS"] = "cpu"
import numpy as np
import jax
import fusionstitching
sys.path.insert(0, {tests!r})
from helpers import args, expected, layernorm
a = args()
if sys.argv[2] == "dump":  # the job's first run, with --dump_to but no cache
    fn = fusionstitching.jit(layernorm, cache_dir=None, dump_to=sys.argv[1], keep="stitched")
else:
    fn = fusionstitching.jit(layernorm, cache_dir=sys.argv[1], keep="stitched")
out = np.asarray(fn(*a))
np.testing.assert_allclose(out, expected(*a), rtol=1e-5, atol=1e-5)
(report,) = fn.reports(wait_s=60)
print(json.dumps(report.to_json()))
"""


def test_prewarm_from_a_jobs_dumps_makes_its_first_step_plan_nothing(tmp_path):
    """``fusionstitching prewarm DUMP_DIR``: the job's next first step loads the plan."""
    def job(*argv) -> dict:
        code = PREWARMED.format(tests=os.path.join(REPO, "tests"))
        run = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                             text=True, timeout=300, cwd=REPO,
                             env=dict(os.environ, PYTHONPATH=REPO))
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.strip().splitlines()[-1])

    job(str(tmp_path / "dumps"), "dump")
    cache_dir = tmp_path / "cache"
    run = subprocess.run([sys.executable, "-m", "fusionstitching.cli", "prewarm",
                          str(tmp_path / "dumps"), "--cache_dir", str(cache_dir),
                          "--keep", "stitched"], capture_output=True, text=True, timeout=300,
                         cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
    assert run.returncode == 0, run.stderr[-3000:]
    assert ": stored (" in run.stdout
    report = job(str(cache_dir), "cached")
    assert report["cache"]["plan"] == "hit" and report["cache"]["misses"] == 0
    assert report["times_s"]["explore"] == 0.0 and report["runtime"]["kept"] == "stitched"


def test_a_plan_with_a_kernel_the_code_generator_refuses_is_remembered(tmp_path, monkeypatch):
    """A kernel the code generator refuses (a rule, the same every run) is a decision like a
    kernel measured slower: the plan without it is kept, so the next run loads it instead of
    planning again (a flax MLP's plan was planned at every exit: one kernel had 265216 points,
    over a block's 262144)."""
    def refuse(module, spec):
        raise codegen.CodegenError(codegen.Refusal.TOO_LARGE_FOR_BLOCK, "too many points")

    monkeypatch.setattr(codegen, "add_host_kernel", refuse)
    optimized = optimized_hlo_text(jax.jit(layernorm).lower(*args()).compile())
    options = pipeline.Options(target="h100", ptxas=False)
    outcome, _ = build.prewarm(optimized, options, str(tmp_path), measure=False)
    assert outcome == "stored"
    assert build.prewarm(optimized, options, str(tmp_path), measure=False)[0] == "hit"


@pytest.mark.parametrize("workers, asked", [("1", []), ("2", [2])])
def test_prewarm_workers_1_plans_without_worker_processes(tmp_path, monkeypatch, workers, asked):
    """A job's planning process runs ``prewarm --workers 1``: beside the job, query workers
    only took the cores it needed (``--workers 2`` asks for two)."""
    seen = []

    def record(module, target, ptxas, chosen, count, pricing):
        seen.append(count)
        raise query_workers.WorkersFailed("planned in this process instead")

    monkeypatch.setattr(pipeline, "QueryWorkers", record)
    folder = tmp_path / "dumps"
    folder.mkdir()
    (folder / "layernorm.xla.hlo.txt").write_text(
        optimized_hlo_text(jax.jit(layernorm).lower(*args()).compile()))
    assert cli.main(["prewarm", str(folder), "--cache_dir", str(tmp_path / "cache"),
                     "--keep", "stitched", "--workers", workers]) == 0
    assert seen == asked
