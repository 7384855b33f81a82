"""Every subprocess of ours (ptxas, Graphviz, the deviceless XLA:GPU compile) runs through
``run``: with a time limit, and killed when the interpreter exits, so a hung tool can neither
hang replay or a jit call forever nor outlive the user's script (a background build's thread
dies at exit; its child would not)."""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

# Seconds. ptxas takes well under 10 s on the corpus's largest kernels; an XLA:GPU compile of
# a training step under a minute (deviceless, 2 cores).
PTXAS_TIMEOUT_S = 120.0
TOOL_TIMEOUT_S = 120.0
COMPILE_TIMEOUT_S = 900.0

_live: set[subprocess.Popen] = set()
_live_lock = threading.Lock()


class ChildTimeout(RuntimeError):
    """A subprocess ran past its limit and was killed."""


def run(cmd: list[str], timeout_s: float, input: str | None = None,
        env: dict | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)`` that kills the child after
    ``timeout_s`` (ChildTimeout naming the command) and at interpreter exit."""
    # A session of its own: killing it kills what it started too (a shell's sleep kept the
    # pipes open, and the wait for their end never ended).
    with subprocess.Popen(cmd, stdin=subprocess.PIPE if input is not None else None,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, start_new_session=True) as proc:
        with _live_lock:
            _live.add(proc)
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.communicate()
            raise ChildTimeout(f"{cmd[0]} did not finish in {timeout_s:g} s and was "
                               f"stopped") from None
        finally:
            with _live_lock:
                _live.discard(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def start(cmd: list[str], **popen_options) -> subprocess.Popen:
    """A long-lived child (a query worker): in a session of its own, killed at interpreter
    exit unless ``stop`` ended it before."""
    proc = subprocess.Popen(cmd, start_new_session=True, **popen_options)
    with _live_lock:
        _live.add(proc)
    return proc


def start_worker(module: str) -> tuple[subprocess.Popen, Connection]:
    """``python -m module FD`` (a fresh interpreter, never a fork of a process with threads)
    and our end of the socket whose other end is FD; its stdout discarded, its stderr ours.
    Raises OSError (or ValueError where pass_fds is missing) when it cannot start."""
    package_root = str(Path(__file__).resolve().parent.parent)
    # without FUSIONSTITCHING: a worker of the compiler is no job of the user's to hook
    env = {**{k: v for k, v in os.environ.items() if k != "FUSIONSTITCHING"},
           "PYTHONPATH": os.pathsep.join(
               p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    ours, theirs = socket.socketpair()
    try:
        proc = start([sys.executable, "-m", module, str(theirs.fileno())],
                     pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return proc, Connection(ours.detach())


def stop(proc: subprocess.Popen, grace_s: float = 2.0) -> None:
    """Wait up to ``grace_s`` for ``proc`` to end by itself, then kill it."""
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        proc.wait()
    finally:
        with _live_lock:
            _live.discard(proc)


@atexit.register
def _kill_children() -> None:
    with _live_lock:
        children = list(_live)
    for proc in children:
        _kill(proc)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass
