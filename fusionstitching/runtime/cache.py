"""Kernel cache: host kernels' native object code on disk, shared by the processes of a job.

LLVM's compile dominates the JIT time and every process of a job compiles the same kernels, so
the object code is stored under a sha256 of the kernel's LLVM IR, target, CPU features and
compiler versions, and loaded with MCJIT's ``add_object_file``; plans (runtime/build.py) are
entries too, keyed by XLA's optimized HLO. An entry is one JSON header line and the raw
payload (no pickle), published by ``os.replace``; its size and checksum catch damage (it is
rebuilt). Write access is trust: see ``KernelCache``.
"""
from __future__ import annotations

import dataclasses
import enum
import grp
import hashlib
import json
import os
import stat
import threading
import time
from dataclasses import dataclass, field

import llvmlite
import llvmlite.binding as llvm

from costmodel.host import default_dir  # noqa: F401 - the runtime's cache dir, one definition

from ..logs import log
from .cache_files import (MAX_BYTES, clean, create_entry_file, private_group, touch,
                          why)
from .cache_redis import BadSignature, RedisTier, Unavailable, redacted

# 2: fast host kernels (vectorized); 3: with kernel_parts; 4: host plans of modules with
# their small integer loops unrolled (a plan cached before would keep the loops rolled);
# 5: object code checked against the build without the loop vectorizer (LLVM miscompiled
# kernels that format 4 stored), and host plans with XLA kernels replaced alone
FORMAT = "fusionstitching.kernel/5"


class CorruptEntry(ValueError):
    """A cache entry failed its size/checksum/format check."""


@dataclass
class CacheStats:
    """What the cache did for one compiled function (goes into the Report)."""

    dir: str | None
    remote: str | None = None  # the remote tier's URL, without its password
    hits: int = 0
    misses: int = 0
    corrupt: list[str] = field(default_factory=list)  # keys rebuilt, with the reason
    plan: str = "miss"  # "hit": plan, kernels and rewritten HLO all came from the cache
    compile_s: float = 0.0  # LLVM time spent on misses
    load_s: float = 0.0  # time spent loading hits
    refused: dict | None = None  # the cache was not used: Refusal (kind, path, detail)
    remote_hits: int = 0  # entries (plans, kernels, schedules) read from the remote tier
    remote_refused: dict | None = None  # the remote tier was not used: Refusal


def _package_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("fusionstitching")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "source"


def host_features() -> str:
    return llvm.get_host_cpu_features().flatten()


def fingerprint(*parts: str) -> str:
    """sha256 of ``parts`` (e.g. a kernel's LLVM IR) with the target and compiler versions."""
    h = hashlib.sha256()
    # The CPU and its features are part of the key: a cache directory shared by machines of
    # different CPUs must not hand one the other's instructions.
    for part in (FORMAT, llvm.get_process_triple(), llvm.get_host_cpu_name(), host_features(),
                 _package_version(), llvmlite.__version__, *parts):
        h.update(str(part).encode())
        h.update(b"\0")
    return h.hexdigest()


class RefusalKind(str, enum.Enum):
    """Why the cache is not used (a str, so the Report's JSON carries the value)."""

    OCCUPIED = "occupied"  # a file, symlink or other non-directory where a directory belongs
    UNWRITABLE = "unwritable"  # the directory or an entry cannot be created or written
    UNREADABLE = "unreadable"  # an entry we may not read (0600 of another user)
    WRITABLE_BY_OTHERS = "writable-by-others"  # a directory or entry others could have written
    FOREIGN_OWNER = "foreign-owner"  # owned by another uid, outside the group opted into
    # the remote tier (cache_redis.Unavailable's kinds)
    UNREACHABLE = "unreachable"  # no connection, a timeout, refused credentials, no client
    NO_SECRET = "no-secret"  # FUSIONSTITCHING_CACHE_SECRET unset: nothing to check entries by
    REMOTE_FAILED = "remote-failed"  # the server answered a command with an error


@dataclass(frozen=True)
class Refusal:
    kind: RefusalKind
    path: str
    detail: str


class CacheRefused(Exception):
    def __init__(self, kind: RefusalKind, path: str, detail: str):
        super().__init__(f"{path}: {detail}")
        self.refusal = Refusal(kind, path, detail)


# Per process: directories refused (one warning each, then no cache there for the rest of
# the process), groups opted into, and when each directory was last cleaned.
_refused: dict = {}
_groups: dict = {}
_maintained: dict = {}
_state_lock = threading.Lock()



def share_with_group(directory: str, group) -> None:
    """Trust ``group`` (name or gid) for the cache at ``directory``: its directories are
    created group-writable (setgid, so entries get the group) and entries group-readable, and
    entries and directories of other members are loaded. Without it the cache is private:
    directories 0700, and anything another uid owns or others could write is refused."""
    gid = group if isinstance(group, int) else (
        int(group) if str(group).isdigit() else grp.getgrnam(group).gr_gid)
    with _state_lock:
        _groups[os.path.realpath(directory)] = gid


class KernelCache:
    """Entries in ``directory`` (None: no cache, always compile): host kernels' object code,
    and plans (runtime/build.py) that name their kernels by key.

    Write access is trust (as in ccache or ssh): an entry is object code this process will
    run. Before anything is read, every directory from ``/`` to the entry must be owned by
    this user or root (or, in the cache, by the group opted into with ``share_with_group``)
    and writable by nobody else (ancestors may be sticky, like /tmp); so must the entry. A
    cache that fails this, or cannot be created or written, is switched off for the process
    with one warning (``refusal`` says why); functions are then built in memory.

    ``remote`` (a ``redis://`` URL) adds a tier shared by a job's hosts, behind the directory:
    an entry missing here is read from it (its signature checked, cache_redis.py) and kept
    here; a stored entry goes to both. It is switched off the same way (``remote_refusal``)."""

    def __init__(self, directory: str | None, max_bytes: int | None = None,
                 remote: str | None = None):
        self.directory = None
        self.refusal: Refusal | None = None
        self.remote: RedisTier | None = None
        self.remote_refusal: Refusal | None = None
        self.max_bytes = MAX_BYTES if max_bytes is None else max_bytes
        self._noted: set = set()  # keys already noted corrupt (rebuilt once)
        self._validated: dict = {}  # kernel key -> entry read while validating a plan
        if remote is not None:
            self._open_remote(remote)
        if directory is None:
            return
        self.root = os.path.realpath(directory)
        self.gid = _groups.get(self.root)
        self.refusal = _refused.get(self.root)
        if self.refusal is None:
            try:
                self._open_root()
            except CacheRefused as exc:
                self._refuse(exc.refusal)
                return
            self.directory = self.root

    @property
    def enabled(self) -> bool:
        """Entries are read and stored somewhere (a tier not refused)."""
        return self.directory is not None or self.remote is not None

    def path(self, key: str) -> str:
        return os.path.join(self.root, key[:2], key + ".kernel")

    def _open_remote(self, url: str) -> None:
        with _state_lock:
            self.remote_refusal = _refused.get(url)
        if self.remote_refusal is None:
            try:
                self.remote = RedisTier(url)
            except Unavailable as exc:
                self._refuse_remote(url, exc)

    def _refuse_remote(self, url: str, exc: Unavailable) -> None:
        """No remote tier at ``url`` for the rest of the process: one warning."""
        refusal = Refusal(RefusalKind(exc.kind), redacted(url), exc.detail)
        with _state_lock:
            first = url not in _refused
            _refused.setdefault(url, refusal)
        self.remote, self.remote_refusal = None, refusal
        if first:
            log.warning("running without the remote kernel cache %s (%s: %s)",
                        refusal.path, refusal.kind.value, refusal.detail)

    def note_refusals(self, stats: CacheStats) -> None:
        """Put why a tier is off into ``stats`` (the Report's ``cache`` field)."""
        if self.refusal is not None:
            stats.refused = dataclasses.asdict(self.refusal)
        if self.remote_refusal is not None:
            stats.remote_refused = dataclasses.asdict(self.remote_refusal)

    # -- trust ---------------------------------------------------------------------------
    def _open_root(self) -> None:
        """Check ``/`` .. the cache directory, creating what is missing (private, or group
        with setgid when shared)."""
        parts = self.root.strip(os.sep).split(os.sep)
        for depth in range(len(parts) + 1):
            path = os.sep + os.path.join(*parts[:depth]) if depth else os.sep
            inside = depth == len(parts)
            if not os.path.lexists(path):
                self._make_directory(path, private=inside)
            self._check_directory(path, inside)

    def _make_directory(self, path: str, private: bool) -> None:
        try:
            if not private:
                os.mkdir(path)  # a parent the user named: the usual mode
            elif self.gid is None:
                os.mkdir(path, 0o700)
            else:
                os.mkdir(path, 0o2770)
                os.chown(path, -1, self.gid)
                os.chmod(path, 0o2770)  # the umask took g+w
        except FileExistsError:
            pass  # another process made it first: checked like any other
        except OSError as exc:
            raise CacheRefused(RefusalKind.UNWRITABLE, path, why(exc)) from None

    def _check_directory(self, path: str, inside: bool) -> None:
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise CacheRefused(RefusalKind.UNWRITABLE, path, why(exc)) from None
        if not stat.S_ISDIR(st.st_mode):
            raise CacheRefused(RefusalKind.OCCUPIED, path,
                               "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory")
        # Outside the cache a sticky world-writable directory (/tmp) is fine: others may
        # create names there but not replace ours, and the next component is checked.
        self._check_owner_and_mode(path, st, sticky_ok=not inside)

    def _check_owner_and_mode(self, path: str, st, sticky_ok: bool = False) -> None:
        uid = os.geteuid()
        group_ok = self.gid is not None and st.st_gid == self.gid
        if st.st_uid not in (uid, 0) and not group_ok:
            raise CacheRefused(RefusalKind.FOREIGN_OWNER, path, f"owned by uid {st.st_uid}")
        if sticky_ok and st.st_mode & stat.S_ISVTX:
            return
        if st.st_mode & stat.S_IWOTH:
            raise CacheRefused(RefusalKind.WRITABLE_BY_OTHERS, path, "writable by everyone")
        if st.st_mode & stat.S_IWGRP and not group_ok and not private_group(st.st_gid):
            raise CacheRefused(RefusalKind.WRITABLE_BY_OTHERS, path,
                               f"writable by group {st.st_gid} (not opted into)")

    def _read_entry(self, key: str) -> bytes | None:
        """The entry's bytes after the trust checks of its shard and itself; None: absent."""
        if self.directory is None:
            return None
        shard = os.path.dirname(self.path(key))
        if not os.path.lexists(shard):
            return None
        self._check_directory(shard, inside=True)
        try:
            fd = os.open(self.path(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except PermissionError as exc:
            raise CacheRefused(RefusalKind.UNREADABLE, self.path(key), why(exc)) from None
        except OSError as exc:  # ELOOP: a symlink
            raise CacheRefused(RefusalKind.OCCUPIED, self.path(key), why(exc)) from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CacheRefused(RefusalKind.OCCUPIED, self.path(key), "not a regular file")
            self._check_owner_and_mode(self.path(key), st)
            data = f.read()
            touch(fd)  # recently used: eviction takes the oldest first
        return data

    def _refuse(self, refusal: Refusal, stats: CacheStats | None = None) -> None:
        """No cache for this directory for the rest of the process: one warning."""
        with _state_lock:
            first = self.root not in _refused
            _refused.setdefault(self.root, refusal)
        self.refusal, self.directory = refusal, None
        if stats is not None:
            stats.refused = dataclasses.asdict(refusal)
        if first:
            log.warning("running without the kernel cache %s (%s: %s); "
                        "kernels are built in memory. See --cache_dir/--cache_group in "
                        "README.md", self.root, refusal.kind.value, refusal.detail)

    # -- entries -------------------------------------------------------------------------
    def load(self, key: str, stats: CacheStats | None = None) -> tuple[dict, bytes] | None:
        """(header, object bytes), None when absent; raises CorruptEntry when unreadable or
        badly signed, CacheRefused when the entry or its directory is not to be trusted. An
        entry read from the remote tier is kept in the directory (counted in ``stats``)."""
        if key in self._validated:
            return self._validated.pop(key)
        data, remote = self._read_entry(key), False
        if data is None and self.remote is not None:
            data, remote = self._read_remote(key), True
        if data is None:
            return None
        entry = _parse_entry(key, data)
        if remote:
            if stats is not None:
                stats.remote_hits += 1
            if self.directory is not None:
                self._write_local(key, data)
        return entry

    def _read_remote(self, key: str) -> bytes | None:
        try:
            return self.remote.get(key)
        except BadSignature as exc:
            raise CorruptEntry(str(exc)) from None
        except Unavailable as exc:
            self._refuse_remote(self.remote.url, exc)
            return None



    def lookup(self, key: str, stats: CacheStats) -> tuple[dict, bytes] | None:
        """``load`` for callers that rebuild on any problem: a corrupt entry is noted in
        ``stats`` once and reads as absent (it is overwritten by the rebuild); an untrusted
        one switches the cache off. A plan is returned only when all its kernels are intact
        (a plan whose kernel was evicted is a quiet miss)."""
        try:
            if not self.enabled:
                return None
            entry = self.load(key, stats)
            if entry is not None and entry[0].get("kind") == "plan":
                entry = self._plan_with_kernels(key, entry, stats)
            return entry
        except CacheRefused as exc:
            self._refuse(exc.refusal, stats)
        except (CorruptEntry, OSError) as exc:
            self._note(key, exc, stats)
        finally:
            self.note_refusals(stats)
        return None

    def _plan_with_kernels(self, key, entry, stats):
        try:
            plan = json.loads(entry[1])
            keys = [k["key"] for k in plan["kernels"] if "key" in k]
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptEntry(f"plan is not readable ({exc})") from None
        for kernel_key in keys:
            try:
                kernel = self.load(kernel_key, stats)
            except CorruptEntry as exc:
                self._note(kernel_key, exc, stats)
                return None
            if kernel is None:
                return None
            self._validated[kernel_key] = kernel  # read once, checked once
        return entry

    def _note(self, key: str, exc: Exception, stats: CacheStats) -> None:
        if key not in self._noted:
            self._noted.add(key)
            stats.corrupt.append(f"{key[:16]}: {exc}")

    def store(self, key: str, payload: bytes, **about) -> None:
        """Publish ``payload`` under ``key`` in each tier; ``about`` goes into the header (JSON
        values). A failure switches that tier off (one warning), it never fails the build."""
        if not self.enabled:
            return
        header = {"format": FORMAT, "key": key, "size": len(payload),
                  "sha256": hashlib.sha256(payload).hexdigest(), **about,
                  "llvmlite": llvmlite.__version__, "package": _package_version(),
                  "triple": llvm.get_process_triple(), "created": time.time()}
        data = json.dumps(header).encode() + b"\n" + payload
        if self.directory is not None:
            self._write_local(key, data)
        if self.remote is not None:
            try:
                self.remote.put(key, data)
            except Unavailable as exc:
                self._refuse_remote(self.remote.url, exc)

    def _write_local(self, key: str, data: bytes) -> None:
        directory = os.path.dirname(self.path(key))
        try:
            if not os.path.lexists(directory):
                self._make_directory(directory, private=True)
            self._check_directory(directory, inside=True)
            temp = create_entry_file(directory, key, self.gid)
            try:
                with open(temp, "wb") as f:
                    f.write(data)
                os.replace(temp, self.path(key))
            except BaseException:
                os.unlink(temp)
                raise
        except CacheRefused as exc:
            self._refuse(exc.refusal)
            return
        except OSError as exc:
            self._refuse(Refusal(RefusalKind.UNWRITABLE, directory, why(exc)))
            return
        self._maintain(len(data))

    # -- leftovers and size ----------------------------------------------------------------
    def _maintain(self, stored: int) -> None:
        """Remove temporary files of killed stores and evict the least recently used entries
        past ``max_bytes``: once per process, then after every tenth of the cap stored."""
        with _state_lock:
            since = _maintained.get(self.root)
            due = since is None or since + stored >= self.max_bytes // 10
            _maintained[self.root] = 0 if due else since + stored
        if due:
            clean(self.root, self.max_bytes)


def _parse_entry(key: str, data: bytes) -> tuple[dict, bytes]:
    """(header, payload) of an entry's bytes; raises CorruptEntry."""
    line, newline, payload = data.partition(b"\n")
    try:
        header = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptEntry(f"header is not JSON ({exc})") from None
    if not newline or not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CorruptEntry(f"not a {FORMAT} entry")
    if header.get("key") != key:
        raise CorruptEntry("entry was written under another key")
    if len(payload) != header.get("size") or \
            hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise CorruptEntry("payload does not match its size/checksum")
    return header, payload
