"""Replay of HLO files: one module at a time in this process, or side by side in worker
processes (``fusionstitching replay --workers N``). A worker is a fresh interpreter
(``python -m fusionstitching.replay_pool FD``, as query workers are) that plans the modules
it is sent one at a time, without query workers of its own: the pool fills the cores. A
module that fails, kills its worker or runs past its time limit is an outcome like any other
and the run goes on (a dead or killed worker is replaced). Outcomes come back in the
files' order.
"""
from __future__ import annotations

import dataclasses
import enum
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path

from . import child_processes
from .hlo.ir import HloParseError
from .hlo.parser import parse_file, parse_module
from .pipeline import Options, stitch_module
from .report import Report, format_summary

# Seconds one module may plan in a worker before it is killed and reported (the zoo's
# paper-size modules are to plan within 10 minutes).
MODULE_TIMEOUT_S = 900.0


class OutcomeKind(str, enum.Enum):
    PLANNED = "planned"
    BAD_INPUT = "bad input"  # unreadable, or not HLO: the user's to fix
    INTERNAL_ERROR = "internal error"  # a defect of ours
    TIMED_OUT = "timed out"
    WORKER_DIED = "worker died"  # its process ended while planning the module


@dataclasses.dataclass(frozen=True)
class ModuleOutcome:
    """One file's replay: ``text`` is the plan's summary, or what went wrong."""
    path: str
    kind: OutcomeKind
    seconds: float
    text: str
    report: Report | None = None

    @property
    def failed(self) -> bool:
        """Not planned, or a check that ran failed (a verification mismatch)."""
        return self.kind is not OutcomeKind.PLANNED or not self.report.ok


def replay_one(path: str, options: Options, text: str | None = None) -> ModuleOutcome:
    """Parse and plan one file (``text``: its text, read elsewhere)."""
    started = time.perf_counter()
    seconds = lambda: time.perf_counter() - started  # noqa: E731
    try:
        module = parse_file(path) if text is None else parse_module(text, source=path)
        result = stitch_module(module, options, parse_seconds=seconds())
        summary = format_summary(result.report)
    except (HloParseError, OSError) as exc:
        return ModuleOutcome(path, OutcomeKind.BAD_INPUT, seconds(), str(exc))
    except Exception as exc:  # a defect of ours: this file fails, the others still replay
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return ModuleOutcome(
            path, OutcomeKind.INTERNAL_ERROR, seconds(),
            f"{path}: internal error ({type(exc).__name__}: {exc}); please report it with "
            f"the file\n  raised at {frame.filename}:{frame.lineno} in {frame.name}")
    return ModuleOutcome(path, OutcomeKind.PLANNED, seconds(), summary, result.report)


def replay_all(paths: list[str], options: Options, workers: int = 1,
               timeout_s: float = MODULE_TIMEOUT_S,
               on_outcome: Callable[[ModuleOutcome], None] = lambda outcome: None
               ) -> list[ModuleOutcome]:
    """Every file's outcome, in the order of ``paths``; ``on_outcome`` hears each as it
    comes. ``workers`` <= 1, or one file: in this process, one after another (no time limit:
    nothing could stop a module planning here). Otherwise ``workers`` processes, each module
    limited to ``timeout_s``."""
    if workers <= 1 or len(paths) <= 1:
        outcomes = []
        for path in paths:
            outcomes.append(replay_one(path, options))
            on_outcome(outcomes[-1])
        return outcomes
    pool = _Pool(min(workers, len(paths)), dataclasses.replace(options, workers=0))
    try:
        return pool.run(paths, timeout_s, on_outcome)
    finally:
        pool.close()


def outcome_json(outcome: ModuleOutcome) -> dict:
    """A planned module's Report as JSON; otherwise the file, what happened and why."""
    if outcome.report is not None:
        return {**outcome.report.to_json(), "file": outcome.path, "outcome": outcome.kind.value,
                "seconds": outcome.seconds}
    return {"file": outcome.path, "outcome": outcome.kind.value, "seconds": outcome.seconds,
            "error": outcome.text}


def outcome_table(outcomes: list[ModuleOutcome], wall_s: float, slowest: int = 5) -> str:
    """One line per module (plan seconds, kernels and modeled time of XLA's plan and the
    stitched one), the count of each outcome, and the slowest modules."""
    rows = [("module", "outcome", "plan s", "kernels XLA -> stitched", "modeled us XLA -> "
             "stitched", "x")]
    for o in outcomes:
        r = o.report
        if r is None:
            rows.append((o.path, o.kind.value, f"{o.seconds:.1f}", "", "", ""))
            continue
        speedup = r.xla.modeled_us / r.fs.modeled_us if r.fs.modeled_us else float("nan")
        rows.append((o.path, o.kind.value if r.ok else "verify failed", f"{o.seconds:.1f}",
                     f"{r.xla.kernels} -> {r.fs.kernels}",
                     f"{r.xla.modeled_us:.1f} -> {r.fs.modeled_us:.1f}", f"{speedup:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    counts = {kind: sum(o.kind is kind for o in outcomes) for kind in OutcomeKind}
    lines.append(f"{len(outcomes)} modules in {wall_s:.1f} s wall, "
                 f"{sum(o.seconds for o in outcomes):.1f} s of planning: " + ", ".join(
                     f"{n} {kind.value}" for kind, n in counts.items() if n))
    by_time = sorted(outcomes, key=lambda o: -o.seconds)[:slowest]
    lines.append("slowest: " + ", ".join(f"{Path(o.path).name} {o.seconds:.1f} s"
                                         for o in by_time))
    return "\n".join(lines)


class _Pool:
    """Worker processes and the module each one plans."""

    def __init__(self, count: int, options: Options):
        self.options = options
        self.procs: dict[Connection, subprocess.Popen] = {}
        # Workers still importing: a module's time limit starts when its worker is ready
        # (the compiler's imports take seconds on a slow machine).
        self.starting: set[Connection] = set()
        for _ in range(count):
            self._start()

    def _start(self) -> Connection:
        proc, conn = child_processes.start_worker("fusionstitching.replay_pool")
        conn.send(self.options)
        self.procs[conn] = proc
        self.starting.add(conn)
        return conn

    def _heard_ready(self, conn: Connection) -> None:
        """A starting worker's first message (it is ready), or its end (it is replaced)."""
        self.starting.discard(conn)
        try:
            conn.recv()
        except (EOFError, OSError):
            self._replace(conn)

    def _replace(self, conn: Connection) -> None:
        self.starting.discard(conn)
        child_processes.stop(self.procs.pop(conn), grace_s=0.0)
        conn.close()
        self._start()

    def run(self, paths: list[str], timeout_s: float, on_outcome) -> list[ModuleOutcome]:
        outcomes: dict[int, ModuleOutcome] = {}
        waiting = list(enumerate(paths))
        busy: dict[Connection, tuple[int, str, float]] = {}  # index, path, start
        while len(outcomes) < len(paths):
            for conn in [c for c in self.procs if c not in busy and c not in self.starting]:
                if not waiting:
                    break
                index, path = waiting.pop(0)
                try:
                    conn.send(path)
                except OSError:  # the worker is gone: the path waits for its replacement
                    waiting.insert(0, (index, path))
                    self._replace(conn)
                    continue
                busy[conn] = (index, path, time.perf_counter())
            if not busy:  # workers still starting (or replaced): the paths wait for them
                for conn in wait(list(self.starting)):
                    self._heard_ready(conn)
                continue
            deadline = min(start for _, _, start in busy.values()) + timeout_s
            ready = wait(list(busy) + list(self.starting),
                         timeout=max(0.0, deadline - time.perf_counter()))
            for conn in [c for c in ready if c in self.starting]:
                self._heard_ready(conn)
            now = time.perf_counter()
            for conn in list(busy):
                index, path, start = busy[conn]
                if conn in ready:
                    try:
                        outcome = conn.recv()
                    except (EOFError, OSError):
                        code = _exit_code_once_ended(self.procs[conn])
                        outcome = ModuleOutcome(path, OutcomeKind.WORKER_DIED, now - start,
                                                f"{path}: the worker planning it ended "
                                                f"(exit status {code})")
                        self._replace(conn)
                elif now - start >= timeout_s:
                    outcome = ModuleOutcome(path, OutcomeKind.TIMED_OUT, now - start,
                                            f"{path}: still planning after {timeout_s:g} s; "
                                            "its worker was stopped")
                    self._replace(conn)
                else:
                    continue
                del busy[conn]
                outcomes[index] = outcome
                on_outcome(outcome)
        return [outcomes[i] for i in range(len(paths))]

    def close(self) -> None:
        for conn, proc in self.procs.items():
            try:
                conn.send(None)
            except OSError:
                pass
            child_processes.stop(proc, grace_s=2.0)
            conn.close()
        self.procs = {}


def _exit_code_once_ended(proc: subprocess.Popen) -> int | None:
    """The worker's exit status, once it has ended (its socket closes just before)."""
    try:
        return proc.wait(2.0)
    except subprocess.TimeoutExpired:
        return None


def serve(conn: Connection) -> None:
    """Plan each path sent until told to stop (None) or the pool is gone."""
    options = conn.recv()
    conn.send("ready")  # imported: the pool's time limits start from here
    while True:
        try:
            path = conn.recv()
        except EOFError:
            return
        if path is None:
            return
        conn.send(replay_one(path, options))


if __name__ == "__main__":
    # The package's module, not this __main__ copy: outcomes must unpickle as its classes.
    from fusionstitching import replay_pool
    replay_pool.serve(Connection(int(sys.argv[1])))
