"""A newly built host kernel runs first in a forked child, on seeded random inputs of its
shapes: a kernel that crashes (a segfault) or hangs then becomes a fallback with a reason
instead of taking the user's job down, as it did even with ``--verify``.

The child only calls the kernel on arrays made before the fork and leaves with ``os._exit``:
no JAX, no locks, nothing of the parent's threads.
"""
from __future__ import annotations

import enum
import os
import signal
import time
import warnings

from ..verification import seeded_inputs

TIMEOUT_S = 60.0  # a host kernel of the corpus runs in well under a second


class Outcome(enum.Enum):
    RAN = "ran"
    CRASHED = "crashed"
    HUNG = "hung"
    FAILED = "failed"  # the call raised (a wrong shape, say): the child said so and left
    NOT_CHECKED = "not checked"  # no fork on this platform


def run_in_child(kernel, timeout_s: float | None = None) -> tuple[Outcome, str]:
    """Run ``kernel`` (codegen.HostKernel) once in a forked child; what became of it, and
    why in words."""
    if not hasattr(os, "fork"):
        return Outcome.NOT_CHECKED, "this platform has no fork"
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    inputs = seeded_inputs([shape for _, shape in kernel.spec.inputs])
    with warnings.catch_warnings():
        # JAX warns at every fork that a child using JAX may deadlock on a lock one of its
        # threads held; this child uses nothing but the kernel and numpy, and a child that
        # hangs anyway is stopped at the time limit.
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                                category=RuntimeWarning)
        pid = os.fork()
    if pid == 0:  # the child: run, and leave without Python's exit handlers
        code = 0
        try:
            kernel(*inputs)
        except BaseException:  # noqa: BLE001 - any failure is reported by the exit code
            code = 1
        os._exit(code)
    status = _wait(pid, timeout_s)
    if status is None:
        return Outcome.HUNG, f"did not finish in {timeout_s:g} s on random inputs in a " \
                             f"trial process (stopped)"
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return Outcome.CRASHED, f"crashed ({name}) on random inputs in a trial process"
    if os.WEXITSTATUS(status) != 0:
        return Outcome.FAILED, "raised an error on random inputs in a trial process"
    return Outcome.RAN, ""


def _wait(pid: int, timeout_s: float) -> int | None:
    """The child's wait status, or None after killing it at ``timeout_s``."""
    deadline, pause = time.monotonic() + timeout_s, 1e-4
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(pause)
        pause = min(pause * 2, 0.01)
