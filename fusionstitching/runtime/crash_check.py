"""A newly built host kernel runs first in a forked child, on seeded random inputs of its
shapes: a kernel that crashes (a segfault) or hangs then becomes a fallback with a reason
instead of taking the user's job down, as it did even with ``--verify``. Given a reference
(the same IR built without LLVM's loop vectorizer), the child also compares their outputs:
LLVM 22's vectorizer miscompiled a rotary-embedding kernel (a table read at ``i % 8`` loaded
as 16 consecutive floats).

The child only calls the kernel on arrays made before the fork and leaves with ``os._exit``:
no JAX, no locks, nothing of the parent's threads.
"""
from __future__ import annotations

import enum
import os
import signal
import time
import warnings

import numpy as np

from ..verification import seeded_inputs

TIMEOUT_S = 60.0  # a host kernel of the corpus runs in well under a second
# Kernel and reference may differ by the order of reassociated f32 reductions: by far less
# than this share of the output's largest magnitude. A miscompiled index reads other elements:
# differences of the order of the values themselves.
TOLERANCE = 1e-3
DIFFERS_EXIT = 3


class Outcome(enum.Enum):
    RAN = "ran"
    CRASHED = "crashed"
    HUNG = "hung"
    FAILED = "failed"  # the call raised (a wrong shape, say): the child said so and left
    NOT_CHECKED = "not checked"  # no fork on this platform
    DIFFERS = "differs"  # ran, and its outputs are not the reference's


def run_in_child(kernel, timeout_s: float | None = None, reference=None
                 ) -> tuple[Outcome, str]:
    """Run ``kernel`` (codegen.HostKernel) once in a forked child; what became of it, and
    why in words. ``reference``: a kernel computing the same, run after it in the child and
    compared with it (``differences``)."""
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
        read_end, write_end = os.pipe()
        pid = os.fork()
    if pid == 0:  # the child: run, and leave without Python's exit handlers
        code = 0
        try:
            os.close(read_end)
            got = kernel(*inputs)
            if reference is not None:
                why = differences(got, reference(*inputs))
                if why:
                    os.write(write_end, why.encode()[:4000])
                    code = DIFFERS_EXIT
        except BaseException:  # noqa: BLE001 - any failure is reported by the exit code
            code = 1
        os._exit(code)
    os.close(write_end)
    status = _wait(pid, timeout_s)
    with os.fdopen(read_end, "rb") as pipe:  # the child has exited: its end is closed
        said = pipe.read().decode(errors="replace") if status is not None else ""
    if status is None:
        return Outcome.HUNG, f"did not finish in {timeout_s:g} s on random inputs in a " \
                             f"trial process (stopped)"
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return Outcome.CRASHED, f"crashed ({name}) on random inputs in a trial process"
    if os.WEXITSTATUS(status) == DIFFERS_EXIT:
        return Outcome.DIFFERS, f"differs from its reference on random inputs: {said}"
    if os.WEXITSTATUS(status) != 0:
        return Outcome.FAILED, "raised an error on random inputs in a trial process"
    return Outcome.RAN, ""


def differences(got: list, want: list) -> str:
    """Where outputs ``got`` are not ``want`` (empty: they agree): floats within TOLERANCE of
    each output's largest finite magnitude, the same NaNs and infinities; others exactly."""
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.atleast_1d(np.asarray(g)), np.atleast_1d(np.asarray(w))
        if not np.issubdtype(w.dtype, np.floating):
            if not np.array_equal(g, w):
                return f"output {i}: {int((g != w).sum())} of {w.size} elements differ"
            continue
        g, w = g.astype(np.float64), w.astype(np.float64)
        finite = np.isfinite(w)
        scale = float(np.abs(w[finite]).max()) if finite.any() else 0.0
        with np.errstate(invalid="ignore"):  # inf - inf where both are infinite
            close = np.where(finite, np.abs(g - w) <= TOLERANCE * scale,
                             (g == w) | (np.isnan(g) & np.isnan(w)))
        if not close.all():
            at = tuple(int(k) for k in np.argwhere(~close)[0])
            return f"output {i}: {int((~close).sum())} of {w.size} elements differ, at " \
                   f"{list(at)} {g[at]:.6g} against {w[at]:.6g}"
    return ""


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
