"""The kernel cache directory's files: creating an entry's temporary file, trusting a
user-private group, and cleaning (leftover temporary files out, least recently used entries
evicted past the size cap). Plain file-system work below runtime/cache.py.
"""
from __future__ import annotations

import grp
import os
import pwd
import tempfile
import time

MAX_BYTES = 2 << 30  # the cache's size cap: least recently used entries are evicted past it
TMP_MAX_AGE_S = 3600.0  # a temporary file this old was left by a killed store


def clean(directory: str, max_bytes: int = MAX_BYTES) -> None:
    """Old ``.tmp`` files out, then least recently used entries until the cache holds at
    most 90% of ``max_bytes``. Best effort: what cannot be removed stays."""
    now, kept, total = time.time(), [], 0
    for shard in _scandir(directory):
        if not shard.is_dir(follow_symlinks=False):
            continue
        for entry in _scandir(shard.path):
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if entry.name.endswith(".tmp"):
                if now - st.st_mtime > TMP_MAX_AGE_S:
                    _unlink_quietly(entry.path)
            elif entry.name.endswith(".kernel"):
                kept.append((st.st_mtime, st.st_size, entry.path))
                total += st.st_size
    if total <= max_bytes:
        return
    for _, size, path in sorted(kept):  # oldest use first
        if total <= max_bytes * 0.9:
            break
        if _unlink_quietly(path):
            total -= size


def create_entry_file(directory: str, key: str, gid: int | None) -> str:
    """A new temporary file for an entry: private, or group-readable in a shared cache."""
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{key[:16]}.", suffix=".tmp")
    try:
        if gid is not None:
            os.fchown(fd, -1, gid)
            os.fchmod(fd, 0o640)  # others of the group read it; replace needs only the dir
    except BaseException:
        os.close(fd)
        os.unlink(temp)
        raise
    os.close(fd)
    return temp


def private_group(gid: int) -> bool:
    """A user-private group (this user's primary group with no other members): group write
    then means this user (Debian's default umask 002 makes ~/.cache group-writable)."""
    try:
        user = pwd.getpwuid(os.geteuid())
        members = grp.getgrgid(gid).gr_mem
    except KeyError:
        return False
    return user.pw_gid == gid and set(members) <= {user.pw_name}


def touch(fd: int) -> None:
    try:
        os.utime(fd)
    except OSError:  # another member's entry in a shared cache: its age stays
        pass


def _scandir(path: str) -> list:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []


def _unlink_quietly(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def why(exc: OSError) -> str:
    return f"{type(exc).__name__}: {exc.strerror or exc}"
