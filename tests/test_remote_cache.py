"""The kernel cache's remote tier against a real redis-server started here (nothing mocked):
a second host reads the first's entries, and its first build loads the first's plan; a
planted or foreign-signed entry is rebuilt, never loaded; no secret, no server, a wrong
password or a server gone mid-run is one warning and the build goes on."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fusionstitching import jit  # noqa: E402
from fusionstitching.runtime import cache  # noqa: E402
from fusionstitching.runtime.cache_redis import (PREFIX, SECRET_VARIABLE, RedisTier,  # noqa: E402
                                                 redacted)
from helpers import args, expected, free_port, layernorm  # noqa: E402

REDIS_SERVER = shutil.which("redis-server")
# CI installs redis-server (.ci/run) and sets this, so a missing server fails there.
if REDIS_SERVER is None and not os.environ.get("FUSIONSTITCHING_REQUIRE_REDIS"):
    pytest.skip("redis-server is not installed (apt-get install redis-server)",
                allow_module_level=True)


def start_server(port: int, *options: str) -> subprocess.Popen:
    assert REDIS_SERVER, "redis-server is not on PATH (apt-get install redis-server)"
    server = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", *options],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise AssertionError(f"redis-server did not listen on port {port}")


@pytest.fixture(scope="module")
def server():
    port = free_port()
    process = start_server(port)
    yield port
    process.kill()
    process.wait()


@pytest.fixture
def url(server, monkeypatch):
    """A fresh database of the module's server, and the job's secret set."""
    monkeypatch.setenv(SECRET_VARIABLE, "the job's secret")
    address = f"redis://127.0.0.1:{server}/0"
    RedisTier(address)._client.flushdb()
    yield address
    cache._refused.pop(address, None)  # refusals are per process: not the next test's


def test_second_host_reads_the_first_hosts_entries_and_keeps_them(tmp_path, url):
    key = cache.fingerprint("kernel", "define void @k() { ret void }")
    cache.KernelCache(str(tmp_path / "a"), remote=url).store(key, b"\x7fELF object", kind="kernel")
    second = cache.KernelCache(str(tmp_path / "b"), remote=url)
    stats = cache.CacheStats(str(tmp_path / "b"), url)
    header, payload = second.lookup(key, stats)
    assert payload == b"\x7fELF object" and header["key"] == key
    assert stats.remote_hits == 1 and not stats.corrupt
    assert os.path.exists(second.path(key))  # kept in host b's directory: read there next time
    alone = cache.KernelCache(str(tmp_path / "b"))
    assert alone.load(key)[1] == b"\x7fELF object"


@pytest.mark.parametrize("planted", ["unsigned", "other secret"])
def test_planted_entry_is_rebuilt_not_loaded(tmp_path, url, planted):
    key = cache.fingerprint("kernel", "planted")
    ours = cache.KernelCache(None, remote=url)
    ours.store(key, b"ours", kind="kernel")
    genuine = ours.remote._client.get(PREFIX + key.encode())
    if planted == "unsigned":  # the entry's bytes without the tag: same length, no secret
        ours.remote._client.set(PREFIX + key.encode(), b"\0" * 32 + genuine[32:])
    else:
        RedisTier(url, secret="another job's secret").put(key, genuine[32:])
    stats = cache.CacheStats(None, url)
    assert ours.lookup(key, stats) is None
    assert len(stats.corrupt) == 1 and "not signed with this job's secret" in stats.corrupt[0]
    assert stats.remote_refused is None  # one bad entry does not switch the tier off
    ours.store(key, b"ours", kind="kernel")  # the rebuild overwrites it
    assert cache.KernelCache(None, remote=url).lookup(key, cache.CacheStats(None))[1] == b"ours"


def test_without_a_secret_the_remote_tier_is_off_with_one_warning(tmp_path, url, monkeypatch,
                                                                   caplog):
    monkeypatch.delenv(SECRET_VARIABLE)
    key = cache.fingerprint("kernel", "no secret")
    with caplog.at_level("WARNING", logger="fusionstitching"):
        for _ in range(2):
            store = cache.KernelCache(str(tmp_path), remote=url)
            stats = cache.CacheStats(str(tmp_path), url)
            store.store(key, b"local only", kind="kernel")
            assert store.lookup(key, stats)[1] == b"local only"  # the directory still works
            assert stats.remote_refused["kind"] == cache.RefusalKind.NO_SECRET
    assert len([r for r in caplog.records if "remote kernel cache" in r.getMessage()]) == 1
    assert RedisTier(url, secret="x")._client.dbsize() == 0  # nothing went to the server


def test_wrong_password_and_a_server_gone_mid_run(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(SECRET_VARIABLE, "the job's secret")
    port = free_port()
    process = start_server(port, "--requirepass", "sesame")
    wrong = f"redis://:open-up@127.0.0.1:{port}/0"
    right = f"redis://:sesame@127.0.0.1:{port}/0"
    try:
        with caplog.at_level("WARNING", logger="fusionstitching"):
            stats = cache.CacheStats(None, redacted(wrong))
            assert cache.KernelCache(None, remote=wrong).lookup("0" * 64, stats) is None
            assert stats.remote_refused["kind"] == cache.RefusalKind.UNREACHABLE
            assert "open-up" not in str(stats.remote_refused) + caplog.text

            store = cache.KernelCache(str(tmp_path), remote=right)
            key = cache.fingerprint("kernel", "gone")
            store.store(key, b"before", kind="kernel")
            assert store.remote is not None
            process.kill()
            process.wait()
            started = time.monotonic()
            store.store(key, b"after", kind="kernel")  # no exception: the tier goes off
            assert time.monotonic() - started < 15
            assert store.remote is None
            assert store.remote_refusal.kind == cache.RefusalKind.UNREACHABLE
            assert store.load(key)[1] == b"after"  # the directory kept working
            assert "sesame" not in caplog.text
    finally:
        process.kill()
        for address in (wrong, right):
            cache._refused.pop(address, None)


def test_redacted_url_hides_only_the_password():
    assert redacted("redis://:pw@host:6379/0") == "redis://:***@host:6379/0"
    assert redacted("redis://user:pw@host/1") == "redis://user:***@host/1"
    assert redacted("redis://host:6379/0") == "redis://host:6379/0"


def test_second_hosts_first_step_loads_the_first_hosts_plan(tmp_path, url):
    """Two hosts, each with a directory of its own, one server: the second plans nothing."""
    a = args(rows=8)
    reports = []
    for host in ("a", "b"):
        fn = jit(layernorm, keep="stitched", cache_dir=str(tmp_path / host), remote_cache=url)
        np.testing.assert_allclose(np.asarray(fn(*a)), expected(*a), rtol=1e-5, atol=1e-5)
        (report,) = fn.reports(wait_s=60)
        reports.append(report.to_json())
    first, second = reports
    assert first["cache"]["plan"] == "miss" and first["cache"]["misses"] >= 1
    assert first["cache"]["remote_hits"] == 0
    assert second["cache"]["plan"] == "hit" and second["cache"]["misses"] == 0
    assert second["cache"]["remote_hits"] >= 2  # the plan and its kernels
    assert second["cache"]["remote"] == url and second["cache"]["remote_refused"] is None
    assert second["fs"] == first["fs"] and second["runtime"]["kept"] == "stitched"
