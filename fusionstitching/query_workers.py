"""Capability queries (capability.ask) in worker processes, one per core: the explorer names
the patterns it will ask next (``ahead``) and the workers build them side by side while it
waits for the first (``answer``); then the plan's kernels go through LLVM and ptxas in them
(``assemble``). A worker is a fresh interpreter (``python -m
fusionstitching.query_workers FD``, never a fork of a process with threads, never a rerun of
the user's script) holding the module; the planning process keeps the schedules chosen
(workers look them up and add to them through it), so answers are the same as in-process ones.
Any failure of a worker raises ``WorkersFailed``: the caller asks in its own process instead.
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from collections.abc import MutableMapping
from multiprocessing.connection import Connection, wait

import costmodel

from . import capability, child_processes, codegen
from .graph import build_graph
from .hlo.ir import Module

MAX_WORKERS = 8  # each holds the module and its graph
# Below this many memory-intensive kernels a module plans in about the time workers take to
# start (an interpreter and the package's imports, ~1 s): it plans in its own process.
MIN_KERNELS = 40
Nodes = tuple[str, ...]  # a query's key; an assembly's is (ASSEMBLE, its number)
ASSEMBLE = "#assemble"


class WorkersFailed(RuntimeError):
    """A worker died, or its messages could not be read: ask in this process instead."""


def worker_count() -> int:
    """One worker per core this process may run on."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(cores or 1, MAX_WORKERS)


class QueryWorkers:
    """``count`` workers answering capability queries of ``module``'s patterns."""

    def __init__(self, module: Module, target: str, ptxas: bool, chosen: MutableMapping,
                 count: int, pricing=None):
        self.chosen = chosen
        self._answers: dict[tuple, object] = {}  # by key, until taken
        self._pending: list[tuple] = []  # named ahead, not yet sent
        self._later: list[tuple] = []  # named ahead, to be asked later, not yet sent
        self._busy: dict[Connection, tuple] = {}  # the key each busy worker is on
        self._idle: list[Connection] = []
        self._procs: list[subprocess.Popen] = []
        self._senders: list[threading.Thread] = []
        self._requests: dict[tuple, tuple] = {}  # messages other than a query, by key
        init = ("init", module, target, ptxas, pricing)
        try:
            for _ in range(count):
                proc, conn = child_processes.start_worker("fusionstitching.query_workers")
                self._procs.append(proc)
                self._idle.append(conn)
                # The module is sent while the worker imports (a blocking send of a large
                # message would wait for that): by a thread, joined before the first query.
                sender = threading.Thread(target=_send_quietly, args=(conn, init), daemon=True)
                sender.start()
                self._senders.append(sender)
        except (OSError, ValueError) as exc:  # ValueError: no pass_fds on this platform
            self.close()
            raise WorkersFailed(f"could not start a query worker: {exc}") from exc

    def ahead(self, patterns: list[Nodes], next_up: bool = True) -> None:
        """Patterns to be asked, in order, that idle workers start on: ``next_up``, the ones
        asked next, else ones asked later (see ``_dispatch``). Each call replaces the list
        of its kind: a pattern named before and not now is dropped unless started."""
        fresh = [p for p in patterns if p not in self._answers and p not in self._busy.values()]
        if next_up:
            self._pending = fresh
        else:
            self._later = fresh
        self._dispatch()

    def answer(self, nodes: Nodes):
        """capability.ask_counted's answer and work for ``nodes`` (the schedules it chose are
        in ``chosen``), waiting for it."""
        if nodes not in self._answers and nodes not in self._busy.values():
            self._pending = [nodes] + [p for p in self._pending if p != nodes]
            self._dispatch()
        while nodes not in self._answers:
            self._dispatch(keep_idle=0)
            self._receive()
        return self._answers.pop(nodes)

    def assemble(self, specs: list, arch: str) -> list:
        """``codegen.compile_nvptx`` of each kernel, side by side in the workers: its
        NvptxKernel, or what it raised (as a RuntimeError naming it)."""
        keys = [(ASSEMBLE, i) for i in range(len(specs))]
        self._requests.update((k, ("assemble", spec, arch)) for k, spec in zip(keys, specs))
        self._pending, self._later = list(keys), []  # nothing more is asked ahead
        for key in keys:
            while key not in self._answers:
                self._dispatch(keep_idle=0)
                self._receive()
        return [self._answers.pop(k)[0] for k in keys]

    @property
    def alive(self) -> bool:
        """Not closed (a failed pool is closed by its user)."""
        return bool(self._procs)

    def close(self) -> None:
        """End every worker (one still on a query named ahead is killed)."""
        for proc in self._procs:
            child_processes.stop(proc, grace_s=0.0)
        for conn in [*self._idle, *self._busy]:
            conn.close()
        self._idle, self._busy, self._procs = [], {}, []

    def _dispatch(self, keep_idle: int = 1) -> None:
        """Send the patterns named ahead to idle workers: those asked next first, then those
        asked later while more than ``keep_idle`` workers are idle (one is kept for the next
        pattern asked, except while the caller waits for an answer: the worker that answers
        is then free)."""
        for sender in self._senders:
            sender.join()
            if not getattr(sender, "ok", True):
                raise WorkersFailed("the module could not be sent to a query worker")
        self._senders = []
        while self._idle and self._pending:
            self._start(self._pending.pop(0))
        while len(self._idle) > keep_idle and self._later:
            self._start(self._later.pop(0))

    def _start(self, nodes: Nodes) -> None:
        """Send ``nodes`` to an idle worker unless it is answered or asked already."""
        if nodes in self._answers or nodes in self._busy.values():
            return
        conn = self._idle.pop()
        self._send(conn, self._requests.pop(nodes, None) or ("ask", list(nodes)))
        self._busy[conn] = nodes

    def _receive(self) -> None:
        """Read one message from a busy worker: a schedule lookup it needs, or an answer."""
        if not self._busy:
            raise WorkersFailed("no query worker is on the pattern asked")
        for conn in wait(list(self._busy)):
            try:
                message = conn.recv()
            except (EOFError, OSError) as exc:
                raise WorkersFailed(f"a query worker ended ({_exit_status(self._procs)})"
                                    ) from exc
            if message[0] == "get":  # the worker's chosen schedules live here
                self._send(conn, self.chosen.get(message[1]))
                continue
            _, answer, work, new_schedules = message
            nodes = self._busy.pop(conn)
            self.chosen.update(new_schedules)
            self._answers[nodes] = (answer, work)
            self._idle.append(conn)

    def _send(self, conn: Connection, message) -> None:
        try:
            conn.send(message)
        except (OSError, ValueError) as exc:
            raise WorkersFailed(f"a query worker could not be reached: {exc}") from exc


def _send_quietly(conn: Connection, message) -> None:
    try:
        conn.send(message)
    except (OSError, ValueError):
        threading.current_thread().ok = False


def _exit_status(procs: list[subprocess.Popen]) -> str:
    codes = [p.poll() for p in procs]
    return ", ".join("running" if c is None else f"exit code {c}" for c in codes)


# ============================================================================ in the worker

class _ChosenThroughParent(MutableMapping):
    """The planning process's chosen schedules, read through the connection; what this
    worker adds is kept here too and sent back with the answer."""

    def __init__(self, conn: Connection):
        self.conn, self.known, self.added = conn, {}, {}

    def __getitem__(self, key):
        if key not in self.known:
            self.conn.send(("get", key))
            self.known[key] = self.conn.recv()
        if self.known[key] is None:
            raise KeyError(key)
        return self.known[key]

    def __setitem__(self, key, schedule) -> None:
        self.known[key] = self.added[key] = schedule

    def __delitem__(self, key) -> None:
        raise TypeError("chosen schedules are never removed")

    def __iter__(self):
        return iter(k for k, v in self.known.items() if v is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def serve(conn: Connection) -> None:
    """Answer queries until told to stop (None) or the planning process is gone."""
    _, module, target, ptxas, pricing = conn.recv()
    graph, device = build_graph(module), costmodel.load_device(target)
    # As the explorer pauses it while it asks in-process: a query's millions of small objects
    # are freed by reference counting, and the collector would only rescan them (27% more CPU
    # a query with it on, bert_train_small_jax_h100). The worker ends with the planning.
    gc.disable()
    chosen = _ChosenThroughParent(conn)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        chosen.added, work = {}, 0
        if message[0] == "assemble":
            _, spec, arch = message
            try:
                answer = codegen.compile_nvptx(spec, arch)
            except Exception as exc:  # sent as text: not every exception pickles
                answer = RuntimeError(f"{type(exc).__name__}: {exc}")
        else:
            answer, work = capability.ask_counted(graph, message[1], device, target, ptxas,
                                                  chosen, pricing)
        conn.send(("answer", answer, work, chosen.added))


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
