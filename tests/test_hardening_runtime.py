"""Issue "Hardening", runtime items: dumps and reports (never through a symlink, an I/O failure
is one warning and the job goes on), the kernel cache's trust checks (write access is trust),
an unusable cache (runs without it, one warning), the environment variables, leftovers.

Tests run as root here: "another uid" is an os.chown to 12345, "writable by others" the
g+w / o+w mode bits."""
from __future__ import annotations

import grp
import itertools
import json
import os
import subprocess
import sys
import threading

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fusionstitching.stitched_jit import jit  # noqa: E402
from fusionstitching.runtime import cache, files, kernel_objects, lifecycle  # noqa: E402
from tf_hooks import flags  # noqa: E402

from helpers import args, expected, layernorm  # noqa: E402

OTHER_UID = 12345


def give_away(path, uid: int, gid: int) -> None:
    """chown ``path`` as another user's or group's file would be; only root can (the test
    then has nothing to set up and is skipped, saying so)."""
    if os.geteuid() != 0:
        pytest.skip("handing a file to another uid or group needs root")
    os.chown(path, uid, gid)


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch):
    """Each test is a fresh process as far as once-per-process warnings and refusals go."""
    monkeypatch.setattr(files, "_warned", set())
    for name in ("_refused", "_groups", "_maintained"):  # cache.py's per-process state
        if hasattr(cache, name):
            monkeypatch.setattr(cache, name, {})
    monkeypatch.setattr(lifecycle, "_dump_counter", itertools.count())


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelname == "WARNING" and r.name == "fusionstitching"]


def run_stitched(caplog, **options):
    a = args(rows=8)
    fn = jit(layernorm, keep="stitched", verify=False, **options)  # settled when built
    with caplog.at_level("WARNING", logger="fusionstitching"):
        got = [np.asarray(fn(*a)) for _ in range(2)]
        (report,) = fn.reports(wait_s=60)
    for out in got:
        np.testing.assert_allclose(out, expected(*a), rtol=1e-5, atol=1e-5)
    return report


# -- item 3: a dump or report we cannot write is one warning, the job goes on ----------------

@pytest.mark.parametrize("where", ["file", "under-a-file"])
@pytest.mark.parametrize("async_compile", [False, True])
def test_unusable_dump_to_is_one_warning_and_stitching_goes_on(tmp_path, caplog, monkeypatch,
                                                               where, async_compile):
    thread_errors = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    occupied = tmp_path / "occupied"
    occupied.write_text("not a directory")
    dump_to = occupied if where == "file" else occupied / "sub"
    report = run_stitched(caplog, dump_to=str(dump_to), cache_dir=None,
                          async_compile=async_compile)
    assert not thread_errors
    assert report.runtime["kept"] == "stitched" and not report.fallbacks
    (warning,) = warnings_of(caplog)
    assert "dump" in warning and str(dump_to) in warning
    assert occupied.read_text() == "not a directory"


def test_unwritable_report_is_one_warning(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(flags, "_functions", [])
    occupied = tmp_path / "occupied"
    occupied.write_text("x")
    with caplog.at_level("WARNING", logger="fusionstitching"):
        flags.write_reports(str(occupied / "fs.json"))
        flags.write_reports(str(tmp_path))  # a directory
    assert len(warnings_of(caplog)) == 2 and occupied.read_text() == "x"


# -- item 2: --dump_to and --report replace symlinks, never write through them ---------------

def test_dump_to_does_not_follow_symlinks(tmp_path, caplog):
    dump, victims = tmp_path / "dump", tmp_path / "victims"
    dump.mkdir()
    victims.mkdir()
    names = [f"layernorm.0.{suffix}" for suffix in
             ("report.json", "xla.hlo.txt", "rewritten.hlo.txt", "kernels")]
    for name in names:
        (victims / name).write_text("precious")
        (dump / name).symlink_to(victims / name)
    run_stitched(caplog, dump_to=str(dump), cache_dir=None)
    for name in names:
        assert (victims / name).read_text() == "precious"
        assert not (dump / name).is_symlink()
    assert json.loads((dump / names[0]).read_text())["module"].startswith("jit_layernorm")
    assert (dump / names[1]).read_text().startswith("HloModule")
    assert (dump / "layernorm.0.kernels").is_dir()
    assert sorted(p.name for p in dump.iterdir()) == sorted(names)  # no staging left over
    assert not warnings_of(caplog)


def test_report_does_not_follow_symlinks(tmp_path, monkeypatch):
    monkeypatch.setattr(flags, "_functions", [])
    victim, path = tmp_path / "victim", tmp_path / "fs.json"
    victim.write_text("precious")
    path.symlink_to(victim)
    flags.write_reports(str(path))
    assert victim.read_text() == "precious"
    assert not path.is_symlink() and json.loads(path.read_text()) == []


# -- items 6 and 1: the kernel cache; write access is trust ----------------------------------

def entries(directory, kind=None) -> list:
    """The cache's entries (of one kind: "kernel" or "plan")."""
    found = sorted(directory.rglob("*.kernel"))
    if kind is None:
        return found
    return [p for p in found if json.loads(p.read_bytes().partition(b"\n")[0])["kind"] == kind]


def populate(tmp_path, caplog, name="cache", **options):
    directory = tmp_path / name
    first = run_stitched(caplog, cache_dir=str(directory), **options)
    assert first.cache["plan"] == "miss" and entries(directory, "kernel")
    caplog.clear()
    return directory


def assert_ran_without_cache(report, caplog, kind):
    """Stitched kernels built in memory and kept; one warning; nothing "corrupt"."""
    assert report.runtime["kept"] == "stitched" and not report.fallbacks
    assert report.cache["refused"]["kind"] == kind
    assert report.cache["plan"] == "miss" and report.cache["hits"] == 0
    (warning,) = warnings_of(caplog)
    assert "without the kernel cache" in warning and "corrupt" not in warning


def loads_nothing(monkeypatch, directory) -> list:
    """Records every entry the cache hands out (none may be, before the trust checks pass)
    and every planted byte string that reaches the loader (it may crash, so it is not run)."""
    from_cache = {p.read_bytes().partition(b"\n")[2] for p in entries(directory)}
    loaded, real_lookup, real_object = [], cache.KernelCache.lookup, kernel_objects.load_object

    def lookup(self, key, stats):
        entry = real_lookup(self, key, stats)
        if entry is not None:
            loaded.append(key)
        return entry

    def load_object(spec, symbol, payload, *args):
        if payload in from_cache and b"planted" in payload:
            loaded.append(symbol)
            raise cache.CorruptEntry("the test runs no planted code")
        return real_object(spec, symbol, payload, *args)

    monkeypatch.setattr(cache.KernelCache, "lookup", lookup)
    monkeypatch.setattr(kernel_objects, "load_object", load_object)
    return loaded


def test_new_cache_directory_is_private(tmp_path, caplog):
    directory = populate(tmp_path, caplog)
    assert directory.stat().st_mode & 0o777 == 0o700
    for shard in directory.iterdir():
        assert shard.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_occupied_cache_dir_runs_without_cache_one_warning(tmp_path, caplog, where):
    occupied = tmp_path / "occupied"
    occupied.write_text("x")
    directory = occupied if where == "file" else occupied / "cache"
    report = run_stitched(caplog, cache_dir=str(directory))
    assert_ran_without_cache(report, caplog, cache.RefusalKind.OCCUPIED)
    assert occupied.read_text() == "x"


def test_unwritable_cache_runs_without_cache_one_warning(tmp_path, caplog, monkeypatch):
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache, "create_entry_file", denied)
    report = run_stitched(caplog, cache_dir=str(tmp_path / "cache"))
    assert report.runtime["kept"] == "stitched" and not report.fallbacks
    assert report.cache["refused"]["kind"] == cache.RefusalKind.UNWRITABLE
    (warning,) = warnings_of(caplog)
    assert "without the kernel cache" in warning


def test_entries_of_another_uid_are_refused_not_rebuilt(tmp_path, caplog, monkeypatch):
    directory = populate(tmp_path, caplog)
    for path in entries(directory):
        give_away(path, OTHER_UID, -1)
    before = {p: p.read_bytes() for p in entries(directory)}
    loaded = loads_nothing(monkeypatch, directory)
    report = run_stitched(caplog, cache_dir=str(directory))
    assert_ran_without_cache(report, caplog, cache.RefusalKind.FOREIGN_OWNER)
    assert not loaded
    assert {p: p.read_bytes() for p in entries(directory)} == before  # not overwritten
    assert all(p.stat().st_uid == OTHER_UID for p in before)


@pytest.mark.parametrize("target, bits", [("entry", 0o002), ("entry", 0o020),
                                          ("shard", 0o002), ("cache", 0o020),
                                          ("parent", 0o022)])
def test_anything_others_could_have_written_is_refused_before_loading(tmp_path, caplog,
                                                                      monkeypatch, target, bits):
    directory = populate(tmp_path, caplog, name="parent/cache")
    kernel = entries(directory, "kernel")[0]  # read on every hit, so its shard is checked
    path = {"entry": kernel, "shard": kernel.parent, "cache": directory,
            "parent": directory.parent}[target]
    if bits & 0o020:  # group-writable, by a group that is not this user's private one
        give_away(path, -1, OTHER_UID)
    path.chmod(path.stat().st_mode | bits)
    loaded = loads_nothing(monkeypatch, directory)
    report = run_stitched(caplog, cache_dir=str(directory))
    assert_ran_without_cache(report, caplog, cache.RefusalKind.WRITABLE_BY_OTHERS)
    assert not loaded


def test_planted_kernel_through_store_is_refused(tmp_path, caplog, monkeypatch):
    """Someone else's process writes a "kernel" with the cache's own store: the entry is
    intact (its checksum matches), but its owner is not trusted."""
    directory = populate(tmp_path, caplog)
    (kernel,) = entries(directory, "kernel")[:1]
    key = kernel.stem
    cache.KernelCache(str(directory)).store(key, b"\x7fELF planted", kind="kernel",
                                            symbol="evil")
    give_away(kernel, OTHER_UID, -1)
    loaded = loads_nothing(monkeypatch, directory)
    report = run_stitched(caplog, cache_dir=str(directory))
    assert_ran_without_cache(report, caplog, cache.RefusalKind.FOREIGN_OWNER)
    assert not loaded


def test_world_writable_sticky_ancestor_is_fine(tmp_path, caplog):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    directory = populate(tmp_path, caplog, name="tmp/mine")
    again = run_stitched(caplog, cache_dir=str(directory))
    assert again.cache["plan"] == "hit" and not warnings_of(caplog)


@pytest.fixture
def group():
    return grp.getgrall()[-1]


def test_group_shared_cache(tmp_path, caplog, group):
    """With the group opted into, a group-writable cache works, and entries other members
    wrote (owned by their uid, our group) are loaded."""
    directory = tmp_path / "shared"
    first = run_stitched(caplog, cache_dir=str(directory), cache_group=group.gr_name)
    assert first.cache["plan"] == "miss" and first.cache.get("refused") is None
    mode = directory.stat().st_mode
    assert mode & 0o2070 == 0o2070 and directory.stat().st_gid == group.gr_gid
    for path in entries(directory):
        assert path.stat().st_gid == group.gr_gid and path.stat().st_mode & 0o040  # readable
        give_away(path, OTHER_UID, -1)  # as if another member wrote them
    again = run_stitched(caplog, cache_dir=str(directory), cache_group=group.gr_gid)
    assert again.cache["plan"] == "hit" and not warnings_of(caplog)


def test_group_writable_cache_without_opting_in_is_refused(tmp_path, caplog, group):
    directory = tmp_path / "shared"
    run_stitched(caplog, cache_dir=str(directory), cache_group=group.gr_name)
    caplog.clear()
    cache._groups.clear()  # a process that did not opt into the group
    report = run_stitched(caplog, cache_dir=str(directory))
    assert_ran_without_cache(report, caplog, cache.RefusalKind.WRITABLE_BY_OTHERS)


@pytest.mark.parametrize("damage", ["truncate", "swap"])
def test_damaged_kernel_entry_is_rebuilt_with_one_warning(tmp_path, caplog, damage):
    directory = populate(tmp_path, caplog)
    kernel = entries(directory, "kernel")[0]
    if damage == "truncate":
        kernel.write_bytes(kernel.read_bytes()[:-7])
    else:  # another intact entry copied under this one's name
        kernel.write_bytes(entries(directory, "plan")[0].read_bytes())
    report = run_stitched(caplog, cache_dir=str(directory))
    assert report.runtime["kept"] == "stitched"
    assert [f.stage for f in report.fallbacks] == ["cache"]
    (warning,) = warnings_of(caplog)
    assert "corrupt" in warning and kernel.stem[:16] in warning
    caplog.clear()
    assert run_stitched(caplog, cache_dir=str(directory)).cache["plan"] == "hit"


def test_plan_whose_kernel_is_gone_is_a_quiet_miss(tmp_path, caplog):
    directory = populate(tmp_path, caplog)
    entries(directory, "kernel")[0].unlink()  # evicted, or cleaned by hand
    report = run_stitched(caplog, cache_dir=str(directory))
    assert report.cache["plan"] == "miss" and not report.fallbacks and not warnings_of(caplog)


# -- item 12: the environment variables ---------------------------------------------------

@pytest.mark.parametrize("value", ["disabled", "none", "2", "enable"])
def test_undocumented_fusionstitching_value_is_one_warning_and_off(value, caplog):
    with caplog.at_level("WARNING", logger="fusionstitching"):
        assert flags.enabled({"FUSIONSTITCHING": value}) is False
    (warning,) = warnings_of(caplog)
    assert repr(value) in warning and "FUSIONSTITCHING" in warning


def test_documented_values_are_silent(caplog):
    with caplog.at_level("WARNING", logger="fusionstitching"):
        for value in ("1", "true", "Yes", "ON", "0", "false", "no", "off", " "):
            flags.enabled({"FUSIONSTITCHING": value})
    assert not warnings_of(caplog)


def test_unbalanced_quote_keeps_the_other_flags():
    parsed, problems = flags.parse("--async --dump_to='/d d --cache_dir=/c --keep=stitched")
    assert parsed.async_compile and parsed.cache_dir == "/c" and parsed.keep == "stitched"
    assert parsed.dump_to is None
    assert any("unbalanced quote" in p and "--dump_to='/d" in p for p in problems)
    assert flags.parse("--dump_to='/d d' --async")[0] == flags.Flags(async_compile=True,
                                                                      dump_to="/d d")


# -- item 13: leftovers ------------------------------------------------------------------

def test_old_temporary_files_are_cleaned(tmp_path):
    store = cache.KernelCache(str(tmp_path / "cache"))
    key = cache.fingerprint("kernel", "a")
    store.store(key, b"object", kind="kernel", symbol="k")
    shard = os.path.dirname(store.path(key))
    old, fresh = os.path.join(shard, ".old.tmp"), os.path.join(shard, ".fresh.tmp")
    for path in (old, fresh):
        open(path, "wb").close()
    os.utime(old, (0, 0))  # left by a store killed long ago
    cache.clean(store.root)
    assert not os.path.exists(old) and os.path.exists(fresh)  # a store may still be writing


def test_cache_size_is_capped_least_recently_used_first(tmp_path):
    store = cache.KernelCache(str(tmp_path / "cache"))
    keys = [cache.fingerprint("kernel", str(i)) for i in range(5)]
    for age, key in enumerate(keys):
        store.store(key, bytes(1000), kind="kernel", symbol="k")
        os.utime(store.path(key), (1000 + age, 1000 + age))
    size = os.path.getsize(store.path(keys[0]))
    assert store.load(keys[0]) is not None  # used now: the most recent
    # Past the cap a store evicts down to 90% of it: here the two most recently used stay.
    capped = cache.KernelCache(store.root, max_bytes=int(2.5 * size))
    capped.store(keys[4], bytes(1000), kind="kernel", symbol="k")
    left = {k for k in keys if os.path.exists(store.path(k))}
    assert left == {keys[0], keys[4]}  # keys 1..3, the least recently used, evicted


REPORTER = """
import sys, time
from tf_hooks import flags

class Report:
    def __init__(self, name):
        self.name = name
    def to_json(self):
        return {"module": self.name}

class Function:
    def reports(self, wait_s):
        return [Report(sys.argv[2])]

flags.track(Function())
time.sleep(0.3)
flags.write_reports(sys.argv[1])
flags.write_reports(sys.argv[1])  # a process replaces its own Reports
"""


def test_processes_sharing_one_report_keep_all_reports(tmp_path):
    path = tmp_path / "fs.json"
    path.write_text('[{"module": "an earlier job"}]')
    os.utime(path, (0, 0))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    procs = [subprocess.Popen([sys.executable, "-c", REPORTER, str(path), f"m{i}"],
                              env=dict(os.environ, PYTHONPATH=repo)) for i in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    reports = json.loads(path.read_text())
    assert sorted(r["module"] for r in reports) == ["m0", "m1", "m2", "m3"]
    assert len({r["process"]["pid"] for r in reports}) == 4
