"""Fuzz programs side by side in worker processes (``fusionstitching fuzz --workers N``).

A worker is a fresh interpreter (``python -m fusionstitching.fuzz.pool FD``) that runs the
seeds it is sent one at a time. A program that kills its worker is a crash, one that runs
past its time limit a hang (its worker is stopped and replaced); the run goes on either way.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait

from .. import child_processes
from .differential import ROUTE_LIMIT_S, ProgramOutcome, RouteOutcome, Verdict, run_program
from .programs import generate

# A program's wall-time limit in a worker: each route's own limit, and XLA's compiles.
PROGRAM_LIMIT_S = 2 * ROUTE_LIMIT_S + 60


def fuzz_in_process(seeds: list[int], routes: tuple[str, ...],
                    on_outcome: Callable[[ProgramOutcome], None]) -> list[ProgramOutcome]:
    outcomes = []
    for seed in seeds:
        outcomes.append(run_program(generate(seed), routes))
        on_outcome(outcomes[-1])
    return outcomes


def fuzz_in_workers(seeds: list[int], routes: tuple[str, ...], workers: int,
                    on_outcome: Callable[[ProgramOutcome], None],
                    limit_s: float = PROGRAM_LIMIT_S) -> list[ProgramOutcome]:
    """Every seed's outcome, in the order of ``seeds``."""
    procs: dict[Connection, object] = {}
    cores: dict[Connection, int | None] = {}
    # A program's planning is timed: with no more workers than cores each has a core of its
    # own (and plans in its process: query workers would take a neighbour's core).
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    own_cores = 0 < workers <= len(available)

    def start(core: int | None) -> None:
        proc, conn = child_processes.start_worker("fusionstitching.fuzz.pool")
        conn.send((routes, core))
        procs[conn], cores[conn] = proc, core

    def replace(conn: Connection) -> None:
        child_processes.stop(procs.pop(conn), grace_s=0.0)
        conn.close()
        start(cores.pop(conn))

    for i in range(min(workers, len(seeds))):
        start(available[i] if own_cores else None)
    outcomes: dict[int, ProgramOutcome] = {}
    waiting = list(enumerate(seeds))
    busy: dict[Connection, tuple[int, int, float]] = {}
    try:
        while len(outcomes) < len(seeds):
            for conn in [c for c in procs if c not in busy]:
                if not waiting:
                    break
                index, seed = waiting.pop(0)
                conn.send(seed)
                busy[conn] = (index, seed, time.perf_counter())
            deadline = min(start_s for _, _, start_s in busy.values()) + limit_s
            ready = wait(list(busy), timeout=max(0.0, deadline - time.perf_counter()))
            now = time.perf_counter()
            for conn in list(busy):
                index, seed, started = busy[conn]
                if conn in ready:
                    try:
                        outcome = conn.recv()
                    except (EOFError, OSError):
                        code = procs[conn].poll()
                        outcome = _lost(seed, Verdict.CRASH, f"the worker running it ended "
                                                             f"(exit status {code})", now - started)
                        replace(conn)
                elif now - started >= limit_s:
                    outcome = _lost(seed, Verdict.HANG, f"still running after {limit_s:g} s; "
                                                        f"its worker was stopped", now - started)
                    replace(conn)
                else:
                    continue
                del busy[conn]
                outcomes[index] = outcome
                on_outcome(outcome)
    finally:
        for conn, proc in procs.items():
            try:
                conn.send(None)
            except OSError:
                pass
            child_processes.stop(proc, grace_s=2.0)
            conn.close()
    return [outcomes[i] for i in range(len(seeds))]


def _lost(seed: int, verdict: Verdict, detail: str, seconds: float) -> ProgramOutcome:
    return ProgramOutcome(generate(seed), [RouteOutcome("worker", verdict, detail, 0, seconds)])


def serve(conn: Connection) -> None:
    """Run each seed sent until told to stop (None) or the pool is gone."""
    routes, core = conn.recv()
    if core is not None:
        os.sched_setaffinity(0, {core})
    while True:
        try:
            seed = conn.recv()
        except EOFError:
            return
        if seed is None:
            return
        conn.send(run_program(generate(seed), routes))


if __name__ == "__main__":
    from fusionstitching.fuzz import pool  # the package's classes, so outcomes unpickle
    pool.serve(Connection(int(sys.argv[1])))
