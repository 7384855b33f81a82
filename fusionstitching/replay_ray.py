"""Replay on a Ray cluster (``fusionstitching replay --ray ADDRESS``): each module is a Ray
task of one CPU that plans the file's text (read here, so the cluster's nodes need the
package, not the files). At most one task per CPU of the cluster is in flight, so a task
runs about when it is sent and its time limit counts from then; a task past it is cancelled.
Outcomes are replay_pool's, in the files' order. Ray is optional (``pip install
fusionstitching[cluster]``) and slow to import: it is imported only when asked for.
"""
from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Callable

from .hlo.ir import HloParseError
from .hlo.parser import read_hlo_text
from .pipeline import Options
from .replay_pool import ModuleOutcome, OutcomeKind, replay_one

LOCAL = "local"  # ``--ray local``: a Ray instance of this machine, started for the run


def replay_on_ray(paths: list[str], options: Options, address: str, timeout_s: float,
                  on_outcome: Callable[[ModuleOutcome], None] = lambda outcome: None
                  ) -> list[ModuleOutcome]:
    """Every file's outcome, in the order of ``paths``, planned on the Ray cluster at
    ``address`` (LOCAL: one started here). Raises RuntimeError when Ray is missing or the
    cluster cannot be reached."""
    try:
        import ray  # optional, and a second or more to import
    except ImportError:
        raise RuntimeError("--ray needs Ray: pip install 'fusionstitching[cluster]'") from None
    if address != LOCAL:
        _check_reachable(address)
    try:
        ray.init(address=None if address == LOCAL else address, log_to_driver=True,
                 include_dashboard=False)
    except Exception as exc:  # ConnectionError, ValueError, ray's own: said, not raised
        raise RuntimeError(f"cannot reach the Ray cluster at {address}: {exc}") from None
    try:
        plan = ray.remote(num_cpus=1, max_retries=0)(replay_one)
        slots = max(1, int(ray.cluster_resources().get("CPU", 1)))
        # no query workers in a task: the cluster's CPUs are the tasks'
        return _run(ray, plan, paths, dataclasses.replace(options, workers=0), slots,
                    timeout_s, on_outcome)
    finally:
        ray.shutdown()


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """RuntimeError unless something listens at ``address`` (``host:port`` or
    ``ray://host:port``): Ray itself retries an unreachable cluster for a minute."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except ValueError:
        raise RuntimeError(f"--ray {address}: not host:port") from None
    except OSError as exc:
        raise RuntimeError(f"cannot reach the Ray cluster at {address}: "
                           f"{exc.strerror or exc}") from None


def _run(ray, plan, paths, options, slots, timeout_s, on_outcome) -> list[ModuleOutcome]:
    outcomes: dict[int, ModuleOutcome] = {}
    waiting = list(enumerate(paths))
    running: dict[object, tuple[int, str, float]] = {}  # task -> index, path, start

    def done(index: int, outcome: ModuleOutcome) -> None:
        outcomes[index] = outcome
        on_outcome(outcome)

    while len(outcomes) < len(paths):
        while waiting and len(running) < slots:
            index, path = waiting.pop(0)
            try:
                text = read_hlo_text(path)
            except (HloParseError, OSError) as exc:
                done(index, ModuleOutcome(path, OutcomeKind.BAD_INPUT, 0.0, str(exc)))
                continue
            running[plan.remote(path, options, text)] = (index, path, time.perf_counter())
        if not running:
            continue
        deadline = min(start for _, _, start in running.values()) + timeout_s
        ready, _ = ray.wait(list(running), num_returns=1,
                            timeout=max(0.0, deadline - time.perf_counter()))
        now = time.perf_counter()
        for task in list(running):
            index, path, start = running[task]
            if task in ready:
                try:
                    outcome = ray.get(task)
                except ray.exceptions.RayError as exc:  # the task's process died
                    outcome = ModuleOutcome(path, OutcomeKind.WORKER_DIED, now - start,
                                            f"{path}: the Ray task planning it failed "
                                            f"({type(exc).__name__})")
            elif now - start >= timeout_s:
                ray.cancel(task, force=True)
                outcome = ModuleOutcome(path, OutcomeKind.TIMED_OUT, now - start,
                                        f"{path}: still planning after {timeout_s:g} s; its "
                                        "Ray task was cancelled")
            else:
                continue
            del running[task]
            done(index, outcome)
    return [outcomes[i] for i in range(len(paths))]
