"""One decision for every process of a multi-process job (``jax.distributed``).

Each replica deciding alone (a build that failed here, a verdict, a timing) could run another
executable than its peers: their collectives would pair calls of different programs, and
their weights would drift apart. So every decision is taken at the same call in every
process, through the job's own key-value store: a yes/no that all must give, or process 0's
choice, which the others wait for.
"""
from __future__ import annotations

import itertools
import threading

WAIT_MS = 600_000  # a peer that never answers (dead, or stuck in its build)
_ordinals: dict[str, itertools.count] = {}
_lock = threading.Lock()


class Coordinator:
    """The decisions of one compiled signature, shared with the same signature's executor in
    every other process (``prefix`` names it the same everywhere)."""

    def __init__(self, client, process: int, count: int, prefix: str):
        self.client, self.process, self.count, self.prefix = client, process, count, prefix

    def all_agree(self, what: str, ok: bool) -> bool:
        """True when every process says ``ok``."""
        key = f"{self.prefix}/{what}"
        self.client.key_value_set(f"{key}/{self.process}", "1" if ok else "0")
        return all(self.client.blocking_key_value_get(f"{key}/{p}", WAIT_MS) == "1"
                   for p in range(self.count))

    def first_says(self, what: str, value: str) -> str:
        """Process 0's ``value``, in every process."""
        key = f"{self.prefix}/{what}"
        if self.process == 0:
            self.client.key_value_set(key, value)
            return value
        return self.client.blocking_key_value_get(key, WAIT_MS)


def for_job(name: str) -> Coordinator | None:
    """The coordinator of the next signature compiled under ``name`` in this process; None
    in a single-process job. Processes of an SPMD job compile the same signatures in the same
    order, so the n-th of each name is the same signature everywhere."""
    import jax
    from jax._src import distributed  # the job's client: jax internals, pinned by setup.py

    client = distributed.global_state.client
    if jax.process_count() == 1 or client is None:
        return None
    with _lock:
        ordinal = next(_ordinals.setdefault(name, itertools.count()))
    return Coordinator(client, jax.process_index(), jax.process_count(),
                       f"fusionstitching/{name}/{ordinal}")
