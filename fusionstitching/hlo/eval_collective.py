"""Collectives for the evaluator, by simulated replicas: every device of a partitioned module
runs the same program on a thread of its own, and a collective waits until each member of its
group has handed in its operand (``Exchange``), then computes its own result from theirs, in
group order. Device ``i`` is partition ``i`` (SPMD) or replica ``i``: its global id either way.
Async start/done pairs compute at the start; the done returns the result.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .attrs import int_list
from .collectives import replica_groups
from .eval_values import UnsupportedOp

WAIT_S = 600.0  # a replica that never arrives (an error on its thread) stops the others


class Exchange:
    """Where the replicas of one evaluation meet: ``meet`` returns every replica's value."""

    def __init__(self, count: int):
        self.count = count
        self._values: dict[tuple, list] = {}
        self._taken: dict[tuple, int] = {}
        self._lock = threading.Condition()
        self.failed: str | None = None

    def meet(self, key: tuple, index: int, value) -> list:
        with self._lock:
            values = self._values.setdefault(key, [None] * self.count)
            values[index] = (value,)
            self._lock.notify_all()
            if not self._lock.wait_for(lambda: self.failed or all(values), WAIT_S):
                self.failed = self.failed or f"replicas never reached {key[0]}"
            if self.failed:
                self._lock.notify_all()
                raise RuntimeError(f"replica simulation stopped: {self.failed}")
            self._taken[key] = self._taken.get(key, 0) + 1
            if self._taken[key] == self.count:  # the last reader frees the values
                del self._values[key], self._taken[key]
            return [v[0] for v in values]

    def fail(self, why: str) -> None:
        with self._lock:
            self.failed = self.failed or why
            self._lock.notify_all()


@dataclass
class Replica:
    """One simulated device: its index (global id), and the exchange it meets others at."""

    index: int
    exchange: Exchange
    seen: dict = field(default_factory=dict)  # instruction -> times met (loops run it again)

    def meet(self, inst, value) -> list:
        self.seen[inst.name] = self.seen.get(inst.name, 0) + 1
        return self.exchange.meet((inst.name, self.seen[inst.name]), self.index, value)

    def group(self, inst) -> list[int]:
        groups = replica_groups(inst.attrs.get("replica_groups", "{}"))
        if not groups:
            return list(range(self.exchange.count))
        for group in groups:
            if self.index in group:
                return group
        raise UnsupportedOp(f"{inst.opcode} %{inst.name}: device {self.index} is in no group")


def run_replicas(count: int, run: Callable[[Replica], object]) -> list:
    """``run(replica)`` for each of ``count`` simulated devices, each on a thread; their
    results in device order. The first error is raised (the others stop at their next
    collective)."""
    exchange = Exchange(count)
    results: list = [None] * count
    errors: list = []

    def device(index: int) -> None:
        try:
            results[index] = run(Replica(index, exchange))
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)
            exchange.fail(f"device {index}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=device, args=(i,), daemon=True,
                                name=f"fusionstitching-replica-{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        first = next((e for e in errors if not str(e).startswith("replica simulation")),
                     errors[0])
        raise first
    return results


def _replica(ev, inst):
    if ev.replica is None:
        raise UnsupportedOp(f"{inst.opcode} (%{inst.name}): a collective needs the module's "
                            "devices simulated (evaluate_replicas)")
    return ev.replica


def _device_id(ev, inst, operands):
    return np.array(_replica(ev, inst).index, dtype=np.uint32)


def _members(ev, inst, operands) -> tuple[list, list[int], int]:
    """(every device's operands, this device's group, its position there)."""
    replica = _replica(ev, inst)
    everyone = replica.meet(inst, operands)
    group = replica.group(inst)
    return [everyone[d] for d in group], group, group.index(replica.index)


def _all_reduce(ev, inst, operands):
    ufunc = ev.reducer_ufunc(ev.called(inst, "to_apply"))
    if ufunc is None:
        raise UnsupportedOp(f"{inst.opcode} %{inst.name}: its reducer is not a single "
                            "associative op")
    members, _, _ = _members(ev, inst, operands)
    results = []
    for i in range(len(operands)):
        total = members[0][i]
        for values in members[1:]:
            total = ufunc(total, values[i]).astype(total.dtype)
        results.append(total)
    return results[0] if len(results) == 1 and not inst.shape.is_tuple else tuple(results)


def _all_gather(ev, inst, operands):
    members, _, _ = _members(ev, inst, operands)
    axis = int_list(inst.attrs.get("dimensions"))[0]
    gathered = [np.concatenate([m[i] for m in members], axis=axis)
                for i in range(len(operands))]
    return gathered[0] if len(gathered) == 1 else tuple(gathered)


def _reduce_scatter(ev, inst, operands):
    members, group, position = _members(ev, inst, operands)
    ufunc = ev.reducer_ufunc(ev.called(inst, "to_apply"))
    if ufunc is None:
        raise UnsupportedOp(f"reduce-scatter %{inst.name}: its reducer is not a single op")
    axis = int_list(inst.attrs.get("dimensions"))[0]
    results = []
    for i in range(len(operands)):
        total = members[0][i]
        for values in members[1:]:
            total = ufunc(total, values[i]).astype(total.dtype)
        results.append(np.array_split(total, len(group), axis=axis)[position])
    return results[0] if len(results) == 1 else tuple(results)


def _all_to_all(ev, inst, operands):
    members, group, position = _members(ev, inst, operands)
    if "dimensions" in inst.attrs:  # one array: chunk j of every member goes to member j
        axis = int_list(inst.attrs["dimensions"])[0]
        return np.concatenate([np.array_split(m[0], len(group), axis=axis)[position]
                               for m in members], axis=axis)
    return tuple(m[position] for m in members)  # operand j of every member goes to member j


def _collective_permute(ev, inst, operands):
    replica = _replica(ev, inst)
    everyone = replica.meet(inst, operands)
    pairs = replica_groups(inst.attrs.get("source_target_pairs", "{}"))
    sources = [s for s, t in pairs if t == replica.index]
    return everyone[sources[0]][0] if sources else np.zeros_like(operands[0])


def _start(collective):
    """An async start whose value is (what it sends, its result, contexts...): all-gather,
    reduce-scatter, all-to-all, collective-permute (all-reduce-start's is the result)."""
    def start(ev, inst, operands):
        result = collective(ev, inst, operands)
        extra = [np.zeros(s.dims, s.numpy_dtype) for s in inst.shape.tuple_shapes[2:]]
        sent = tuple(operands) if inst.shape.tuple_shapes[0].is_tuple else operands[0]
        return (sent, result, *extra)
    return start


def _done(ev, inst, operands):
    return operands[0][1]


def _identity(ev, inst, operands):
    return operands[0]


OPS = {
    "partition-id": _device_id,
    "replica-id": _device_id,
    "all-reduce": _all_reduce,
    "all-reduce-start": _all_reduce,
    "all-reduce-done": _identity,
    "all-gather": _all_gather,
    "all-gather-start": _start(_all_gather),
    "all-gather-done": _done,
    "reduce-scatter": _reduce_scatter,
    "reduce-scatter-start": _start(_reduce_scatter),
    "reduce-scatter-done": _done,
    "all-to-all": _all_to_all,
    "all-to-all-start": _start(_all_to_all),
    "all-to-all-done": _done,
    "collective-permute": _collective_permute,
    "collective-permute-start": _start(_collective_permute),
    "collective-permute-done": _done,
}
