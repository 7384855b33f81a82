"""A job's planning process: ``fusionstitching prewarm --drain`` of a private folder, detached
and at the lowest priority, planning into the cache each module the job's lifecycles add to
the folder, in the order they were added, until none is left. One at a time per job process
and plan options; it goes on after the job ends, and the next run loads its plans.

Planning is Python: on a thread it held the GIL the training loop needs (a 12.6 s Keras script
ran 23.8 s with its builds on threads), and a job that ended first lost it. One process for
all of a job's modules starts Python, jax and the compiler once (2.3 s each time).
"""
from __future__ import annotations

import itertools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading

from . import files

_order = itertools.count()


class PlanningProcess:
    """The planning process of one set of plan options (``command``: prewarm's arguments
    after the folder); ``add`` a module to it, starting a new one where none is running."""

    def __init__(self, command: tuple[str, ...]):
        self.command = command
        self.folder: str | None = None
        self.child: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def add(self, name: str, optimized: str) -> subprocess.Popen:
        """Queue ``optimized`` (XLA's optimized module of ``name``) and return the process
        that plans it. A process that had already looked its folder over for the last time
        removes the file with the folder: the caller sees it end without the plan."""
        with self._lock:
            file_name = f"{next(_order):05d}.{name}.xla.hlo.txt"
            if self.child is not None and self.child.poll() is None:
                try:
                    files.write_atomic(os.path.join(self.folder, file_name), optimized)
                    return self.child
                except OSError:  # its folder is gone: it is ending
                    pass
            self.folder = tempfile.mkdtemp(prefix="fusionstitching-plan-")  # private (0700)
            files.write_atomic(os.path.join(self.folder, file_name), optimized)
            self.child = _start(self.folder, self.command)
            return self.child


def _start(folder: str, command: tuple[str, ...]) -> subprocess.Popen:
    prewarm = [sys.executable, "-m", "fusionstitching.cli", "prewarm", folder, "--drain",
               *command]
    # one planning process at a time per user, at the lowest priority: several at once, each
    # with XLA's thread pool, took the job's cores however nice they were
    lock = os.path.join(tempfile.gettempdir(), f"fusionstitching-planning-{os.getuid()}")
    run = f"nice -n 19 {shlex.join(prewarm)}"
    if shutil.which("flock"):
        run = f"flock {shlex.quote(lock)} {run}"
    # A new session is a new autogroup on Linux, which the scheduler weighs as much as the
    # job's whatever its members' nice: the group itself is set to nice 19.
    script = (f"{{ echo 19 > /proc/self/autogroup; }} 2>/dev/null; {run}; status=$?; "
              f"rm -rf {shlex.quote(folder)}; exit $status")
    env = {k: v for k, v in os.environ.items() if k != "FUSIONSTITCHING"}
    return subprocess.Popen(["sh", "-c", script], start_new_session=True, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


_processes: dict[tuple, PlanningProcess] = {}
_processes_lock = threading.Lock()


def planning_process(command: tuple[str, ...]) -> PlanningProcess:
    """This job's planning process for plans made with ``command`` (prewarm's options)."""
    with _processes_lock:
        return _processes.setdefault(command, PlanningProcess(command))
