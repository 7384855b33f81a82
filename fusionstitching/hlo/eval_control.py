"""Ops that run computations or order elements: fusion, call, map, while, conditional, sort and
XLA:CPU's ``TopK`` custom call; and the random-bit ops, which are refused.

Sorts whose comparator is ``f(lhs) < f(rhs)`` (plain or JAX's float total order) sort by numpy's
stable argsort of that key; any other comparator runs in a vectorized merge sort.
"""
from __future__ import annotations

import numpy as np

from .eval_values import UnsupportedOp, pack, total_order_key, widen
from .ir import Computation, Instruction


def _call(key: str):
    def op(ev, inst, operands):
        return ev.call(ev.called(inst, key), operands)
    return op


def _map(ev, inst, operands):
    result = ev.call(ev.called(inst, "to_apply"), operands)  # lifted over all elements
    return np.broadcast_to(result, inst.shape.dims)


def _while(ev, inst, operands):
    condition, body = ev.called(inst, "condition"), ev.called(inst, "body")
    state = operands[0]
    while bool(ev.call(condition, [state])):
        state = ev.call(body, [state])
    return state


def _conditional(ev, inst, operands):
    selector, branch_args = operands[0], operands[1:]
    branches = inst.called_computations  # branch_computations, or true then false
    if selector.dtype == np.bool_:
        branch = 0 if bool(selector) else 1
    else:  # out-of-range indices run the last branch
        branch = int(selector) if 0 <= int(selector) < len(branches) else len(branches) - 1
    return ev.call(branches[branch], [branch_args[branch]])


def _uses_parameters(table: dict[str, Instruction], inst: Instruction) -> bool:
    return inst.opcode == "parameter" or any(_uses_parameters(table, table[o])
                                             for o in inst.operands)


def _signature(inst: Instruction) -> tuple:
    """What an instruction computes, apart from its operands (metadata is only debug info)."""
    attrs = {k: v for k, v in inst.attrs.items() if k != "metadata"}
    return inst.opcode, inst.shape, inst.literal, attrs, len(inst.operands)


def _mirrored(table: dict[str, Instruction], lhs: Instruction, rhs: Instruction) -> bool:
    """True when ``rhs`` computes from the comparator's rhs parameters (odd numbers) exactly
    what ``lhs`` computes from the lhs parameters (even numbers)."""
    if lhs.opcode == "parameter" or rhs.opcode == "parameter":
        return (lhs.opcode == rhs.opcode and lhs.parameter_number % 2 == 0
                and rhs.parameter_number == lhs.parameter_number + 1)
    if _signature(lhs) != _signature(rhs):
        return False
    return all(_mirrored(table, table[a], table[b]) if a != b
               else not _uses_parameters(table, table[a])  # a shared constant subexpression
               for a, b in zip(lhs.operands, rhs.operands))


def _sort_key(comp: Computation) -> tuple[str, bool] | None:
    """(lhs key instruction, descending) for comparators ``f(lhs) < f(rhs)`` (or ``>``).

    That covers plain comparisons and JAX's float comparator, which maps floats to a total-order
    integer key with selects and bitcasts before one compare; those sort by numpy's argsort.
    """
    root = comp.root
    if root.opcode != "compare" or root.attrs["direction"] not in ("LT", "GT"):
        return None
    table = comp.by_name()
    a, b = (table[o] for o in root.operands)
    descending = root.attrs["direction"] == "GT"
    if _mirrored(table, a, b):
        return a.name, descending
    if _mirrored(table, b, a):
        return b.name, not descending
    return None


def _sort_order(ev, comp: Computation, keys: list) -> np.ndarray:
    """Stable sorting permutation along the last axis of ``keys`` under comparator ``comp``."""
    lhs_and_rhs = [k for key in keys for k in (key, key)]  # comparator params alternate lhs/rhs
    found = _sort_key(comp)
    if found is None:
        return _merge_sort_order(ev, comp, keys)
    name, descending = found
    key = np.broadcast_to(ev.call(comp, lhs_and_rhs, result=name), keys[0].shape)
    key = total_order_key(widen(key))
    if not descending:
        return np.argsort(key, axis=-1, kind="stable")
    n = key.shape[-1]  # stable descending = mirrored stable ascending of the mirror
    return n - 1 - np.flip(np.argsort(np.flip(key, -1), axis=-1, kind="stable"), -1)


def _merge_sort_order(ev, comp: Computation, keys: list) -> np.ndarray:
    """Bottom-up merge sort with any comparator, vectorized over all rows and runs.

    Each pass merges runs of ``width``: an element's new position is its rank in its own run
    plus the number of partner-run elements that go before it, found by a binary search (the
    partner run is sorted). log2(n) passes of log2(width) lifted comparator calls.
    """
    n = keys[0].shape[-1]
    order = np.broadcast_to(np.arange(n), keys[0].shape).copy()
    position = np.broadcast_to(np.arange(n), order.shape)
    width = 1
    while width < n:
        current = [np.take_along_axis(k, order, -1) for k in keys]

        def less(i, j):  # comparator on the elements at positions i and j of this pass
            args = [np.take_along_axis(k, p, -1) for k in current for p in (i, j)]
            return np.broadcast_to(ev.call(comp, args), i.shape)

        start = position // width * width
        in_left_run = (position // width) % 2 == 0
        partner = np.minimum(np.where(in_left_run, start + width, start - width), n)
        lo, hi = partner, np.minimum(partner + width, n)
        while np.any(lo < hi):
            active = lo < hi
            mid = np.where(active, (lo + hi) // 2, 0)
            # Stability: equal elements of the left run go before those of the right run.
            before = np.where(in_left_run, less(mid, position), ~less(position, mid))
            lo = np.where(active & before, mid + 1, lo)
            hi = np.where(active & ~before, mid, hi)
        new_position = np.minimum(start, partner) + (position - start) + (lo - partner)
        merged = np.empty_like(order)
        np.put_along_axis(merged, new_position, order, axis=-1)
        order, width = merged, width * 2
    return order


def _sort(ev, inst, operands):
    axis = inst.dimensions[0]
    keys = [np.moveaxis(x, axis, -1) for x in operands]
    order = _sort_order(ev, ev.called(inst, "to_apply"), keys)
    return pack([np.moveaxis(np.take_along_axis(k, order, axis=-1), -1, axis) for k in keys])


def top_k(ev, inst, operands):
    """XLA's ``TopK`` custom call (lax.top_k on XLA:CPU): the k first elements along the last
    dimension in the order of its comparator (largest first) and their indices, ties in index
    order (XLA:CPU's runtime sorts by the float total order, stabilized by index)."""
    (x,) = operands
    values_shape, index_shape = inst.shape.tuple_shapes
    k = values_shape.dims[-1]
    index = np.broadcast_to(np.arange(x.shape[-1], dtype=index_shape.numpy_dtype), x.shape)
    called = inst.attrs.get("called_computations", "").strip("{} ").lstrip("%")
    if called:
        order = _sort_order(ev, ev.computations[called], [x, index])
    else:
        key = total_order_key(widen(x))
        order = np.argsort(-key.astype(np.int64), axis=-1, kind="stable")
    order = order[..., :k]
    return np.take_along_axis(x, order, -1), np.take_along_axis(index, order, -1)


def _opaque(ev, inst, operands):
    raise UnsupportedOp(f"{inst.opcode} (%{inst.name}): random bits are backend-defined")


OPS = {
    "fusion": _call("calls"),
    "call": _call("to_apply"),
    "map": _map,
    "while": _while,
    "conditional": _conditional,
    "sort": _sort,
    "rng": _opaque,
    "rng-bit-generator": _opaque,
}
