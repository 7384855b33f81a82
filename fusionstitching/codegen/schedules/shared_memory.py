"""Shared-memory reuse along the dominance tree of a kernel's top-level statements (paper 4.4)."""
from __future__ import annotations

from ..kernel_ir import Barrier, BlockReduce, If, Kernel, Loop, SharedArray, SharedLoad, SharedStore


def _arrays_touched(stmt, out: set[int]) -> set[int]:
    """``out`` with the ids of the shared arrays ``stmt`` reads or writes."""
    match stmt:
        case SharedStore() | SharedLoad():
            out.add(id(stmt.array))
        case BlockReduce():
            out.add(id(stmt.scratch))
        case Loop() | If():
            for s in stmt.body:
                _arrays_touched(s, out)
    return out


def reuse_shared_memory(kernel: Kernel) -> int:
    """Let shared arrays share buffers when one's last use dominates the other's first use.

    The dominance tree is over the kernel's top-level statements, which run one after the
    other (loops and branches are single statements there): an earlier statement dominates
    every later one. An array takes over the buffer of an earlier array whose last use comes
    before its first use, with a barrier between so that no thread still reads the old
    contents. Returns the bytes without reuse; `kernel.shared` holds the reused buffers.
    """
    before = kernel.smem_bytes
    if len(kernel.shared) < 2:
        return before
    body = kernel.body
    spans: dict[int, list[int]] = {id(a): [] for a in kernel.shared}
    for i, stmt in enumerate(body):
        for touched in _arrays_touched(stmt, set()):
            if touched in spans:
                spans[touched].append(i)
    slots: list[tuple[SharedArray, int]] = []  # buffer, last statement using it
    rename: dict[str, SharedArray] = {}
    barriers: list[int] = []
    for array in kernel.shared:
        first, last = spans[id(array)][0], spans[id(array)][-1]
        for k, (slot, busy_until) in enumerate(slots):
            if slot.dtype == array.dtype and busy_until < first:
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
