"""Shared-memory reuse along the dominance tree of a kernel's top-level statements (paper 4.4)."""
from __future__ import annotations

import networkx as nx

from ..kernel_ir import Barrier, BlockReduce, If, Kernel, Loop, SharedArray, SharedLoad, SharedStore


def _touches(stmt, array: SharedArray) -> bool:
    match stmt:
        case SharedStore() | SharedLoad():
            return stmt.array is array
        case BlockReduce():
            return stmt.scratch is array
        case Loop() | If():
            return any(_touches(s, array) for s in stmt.body)
    return False


def reuse_shared_memory(kernel: Kernel) -> int:
    """Let shared arrays share buffers when one's last use dominates the other's first use.

    The dominance tree is built over the kernel's top-level statements (networkx
    immediate_dominators); an array takes over the buffer of an earlier array whose last use
    dominates its first use, with a barrier between so that no thread still reads the old
    contents. Returns the bytes without reuse; `kernel.shared` holds the reused buffers.
    """
    before = kernel.smem_bytes
    if len(kernel.shared) < 2:
        return before
    body = kernel.body
    graph = nx.DiGraph([(i, i + 1) for i in range(len(body))])
    idom = nx.immediate_dominators(graph, 0)

    def dominates(a: int, b: int) -> bool:
        while b != a and idom[b] != b:
            b = idom[b]
        return a == b

    spans = {a.name: [i for i, s in enumerate(body) if _touches(s, a)] for a in kernel.shared}
    slots: list[tuple[SharedArray, int]] = []  # buffer, last statement using it
    rename: dict[str, SharedArray] = {}
    barriers: list[int] = []
    for array in kernel.shared:
        first, last = spans[array.name][0], spans[array.name][-1]
        for k, (slot, busy_until) in enumerate(slots):
            if slot.dtype == array.dtype and busy_until < first and dominates(busy_until, first):
                slot.size = max(slot.size, array.size)
                slots[k] = (slot, last)
                rename[array.name] = slot
                barriers.append(first)
                break
        else:
            slot = SharedArray(array.name, array.dtype, array.size)
            slots.append((slot, last))
            rename[array.name] = slot
    _rename_shared(body, rename)
    for at in sorted(set(barriers), reverse=True):
        body.insert(at, Barrier())
    kernel.shared = [s for s, _ in slots]
    return before


def _rename_shared(body: list, rename: dict[str, SharedArray]) -> None:
    for s in body:
        if isinstance(s, (SharedStore, SharedLoad)):
            s.array = rename[s.array.name]
        elif isinstance(s, BlockReduce):
            s.scratch = rename[s.scratch.name]
        elif isinstance(s, (Loop, If)):
            _rename_shared(s.body, rename)
