"""Files we write into directories the user named (``--dump_to``, ``--report``, the kernel
cache), and the one-warning rule for our I/O.

A file is written to a fresh temporary name (``O_EXCL | O_NOFOLLOW``) and published with
``os.replace``: a planted symlink is replaced, never followed, and no reader sees half a file.
An I/O failure of ours is one warning per topic per process (``warn_once``), never the end of
the user's job. Kept free of heavy imports: the start-up hook (tf_hooks) uses it.
"""
from __future__ import annotations

import os
import secrets
import shutil
import threading

from ..logs import log

_warned: set = set()
_warned_lock = threading.Lock()


def warn_once(topic, message: str, *args) -> bool:
    """``log.warning(message, *args)`` the first time ``topic`` is seen in this process; True
    when it warned."""
    with _warned_lock:
        if topic in _warned:
            return False
        _warned.add(topic)
    log.warning(message, *args)
    return True


def temp_name(path: str) -> str:
    """A fresh hidden name next to ``path`` (same directory, so ``os.replace`` is atomic)."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name[:40]}.{secrets.token_hex(6)}.tmp")


def write_atomic(path: str, data: bytes | str, mode: int = 0o666) -> None:
    """Publish ``data`` at ``path`` atomically; ``mode`` is filtered by the umask as usual.
    The directory must exist. Raises OSError."""
    if isinstance(data, str):
        data = data.encode()
    temp = temp_name(path)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except BaseException:
        _unlink_quietly(temp)
        raise


def ensure_directory(path: str) -> None:
    """``path`` exists and is a directory (symlinks to one included: the user named it).
    Raises OSError (FileExistsError when a file is in the way, PermissionError, ...)."""
    os.makedirs(path, exist_ok=True)
    if not os.path.isdir(path):
        raise NotADirectoryError(f"{path} is not a directory")


def publish_tree(source: str, target: str) -> None:
    """Move ``source`` (a file or directory we wrote in a private staging directory) to
    ``target`` by rename: an earlier file or directory of ours there is replaced, a symlink
    there is replaced rather than followed. Raises OSError."""
    if os.path.isdir(source) and os.path.lexists(target):
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)  # an earlier dump of the same name (does not follow links)
        else:
            os.unlink(target)
    os.replace(source, target)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
