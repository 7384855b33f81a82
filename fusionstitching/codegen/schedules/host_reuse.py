"""Host kernels: a value that a later loop over the same points would compute again (softmax's
exp, recomputed for the output after the sum) is kept by the first loop in an array and read
back by the later ones.

The paper stitches such values through shared memory on the GPU; on the CPU a row's array
stays in L1, and reading it back costs less than a polynomial exp per element. Only the
block's top-level loops over the same points (from 0, step 1) holding plain statements take
part, and only values whose computation includes an expensive op are kept; the loops and
every other statement stay as they are, so the numbers are the same bit for bit.
`tabulate_small_inputs`: an expensive op of a small input's elements that the kernel computes
many times over (RoPE's sine and cosine, once per output element) is computed once per element
and part before the kernel's share, and read from its table.
"""
from __future__ import annotations

import dataclasses

from ..host import split_loop
from ..index_expr import Var, ix
from ..kernel_ir import (DTYPE_BYTES, Compute, Const, ConstLoad, GlobalLoad, GlobalStore, If,
                         IndexValue, Kernel, Loop, SharedArray, SharedLoad, SharedStore, Value,
                         defined_values, used_values)

# Ops whose cost per element is many instructions (a polynomial, a division, a square root).
EXPENSIVE = frozenset({"exponential", "exponential-minus-one", "log", "log-plus-one", "tanh",
                       "erf", "logistic", "power", "sqrt", "rsqrt", "cbrt", "divide",
                       "remainder", "sine", "cosine", "tan", "atan2"})
KEPT_BYTES = 32 * 1024  # the kernel's arrays together: on the stack, in L1
# An input's elements are tabulated when the kernel would compute the op at least this many
# times per element: each part fills its own table (one op, one store per element), and a
# kernel may run in up to TABULATE_PARTS parts (the table is then filled that many times).
TABULATE_REUSE = 4
TABULATE_PARTS = 8
TABULATED_ELEMENTS = 1 << 16  # at most this many per table (heap memory of the call)
_PLAIN = (Compute, Const, ConstLoad, GlobalLoad, GlobalStore, IndexValue)


def reuse_across_loops(kernel: Kernel) -> Kernel:
    """``kernel`` with values recomputed by later top-level loops kept in arrays instead."""
    loops = [i for i, s in enumerate(kernel.body) if _takes_part(kernel, s)]
    first: dict[tuple, tuple[int, Value]] = {}  # a value's form -> (loop, its value there)
    arrays: dict[tuple, SharedArray] = {}
    stores: dict[int, dict[Value, SharedStore]] = {}  # loop -> value -> its store after it
    loads: dict[int, dict[Value, SharedLoad]] = {}  # loop -> value -> the load replacing it
    kept_bytes = 0
    for i in loops:
        loop = kernel.body[i]
        forms = _forms(kernel, loop)
        again = {v for v, (form, costly) in forms.items() if costly and form in first
                 and _same_points(kernel.body[first[form][0]], loop)}
        for v in _outermost(loop, again):
            form = forms[v][0]
            if form not in arrays:
                size = loop.stop * DTYPE_BYTES[v.dtype]
                if kept_bytes + size > KEPT_BYTES:
                    continue
                kept_bytes += size
                arrays[form] = SharedArray(f"kept{len(arrays)}", v.dtype, loop.stop)
                where, value = first[form]
                stores.setdefault(where, {})[value] = SharedStore(arrays[form], ix(loop.var),
                                                                  value)
            loads.setdefault(i, {})[v] = SharedLoad(v, arrays[form], ix(loop.var))
        for v, (form, _) in forms.items():
            first.setdefault(form, (i, v))
    if not arrays:
        return kernel
    body = list(kernel.body)
    for i in set(stores) | set(loads):
        body[i] = dataclasses.replace(body[i], body=_rewritten(body[i].body, loads.get(i, {}),
                                                               stores.get(i, {})))
    return dataclasses.replace(kernel, body=body, shared=kernel.shared + list(arrays.values()))


def _takes_part(kernel: Kernel, s) -> bool:
    return isinstance(s, Loop) and s.start == ix(0) and s.step == 1 and all(
        isinstance(t, _PLAIN) for t in s.body) and not any(
        isinstance(t, GlobalLoad) and kernel.buffers[t.buffer].is_output for t in s.body)


def _same_points(a: Loop, b: Loop) -> bool:
    return a.var == b.var and a.stop == b.stop


def _forms(kernel: Kernel, loop: Loop) -> dict[Value, tuple[tuple, bool]]:
    """Each value the loop defines -> (its computation as a tree over the loop's index and
    values from outside the loop, whether an expensive op is in it)."""
    forms: dict[Value, tuple[tuple, bool]] = {}

    def form(v: Value) -> tuple[tuple, bool]:
        return forms.get(v, (("outside", v), False))

    for s in loop.body:
        match s:
            case Compute():
                args = [form(a) for a in s.args]
                forms[s.dst] = (("op", s.op, s.dst.dtype, s.attr, tuple(f for f, _ in args)),
                                s.op in EXPENSIVE or any(c for _, c in args))
            case Const():
                forms[s.dst] = (("const", s.dst.dtype, repr(s.value)), False)
            case GlobalLoad():
                forms[s.dst] = (("load", s.buffer, s.offset, s.dst.dtype), False)
            case ConstLoad():
                forms[s.dst] = (("constant", s.array.name, s.offset, s.dst.dtype), False)
            case IndexValue():
                forms[s.dst] = (("index", s.index), False)
    return forms


def _outermost(loop: Loop, again: set[Value]) -> list[Value]:
    """The values of ``again`` that something else in the loop reads, in the loop's order (an
    inner one, read only by others of ``again``, need not be kept: it goes dead)."""
    read_by_others = set()
    for s in loop.body:
        if not set(defined_values(s)) & again:
            read_by_others.update(used_values(s))
    read_by_others.update(a.value for a in loop.accumulates)
    # In the loop's order, not the set's: the arrays' names must not vary from run to run
    # (they are in the kernel's text, hence its cache key).
    return [v for s in loop.body for v in defined_values(s)
            if v in again and v in read_by_others]


def _rewritten(body: list, loads: dict[Value, SharedLoad], stores: dict[Value, SharedStore]
               ) -> list:
    out = []
    for s in body:
        defined = defined_values(s)
        out.append(loads[defined[0]] if len(defined) == 1 and defined[0] in loads else s)
        out.extend(stores[v] for v in defined if v in stores)
    return out


def tabulate_small_inputs(kernel: Kernel) -> Kernel:
    """``kernel`` with each expensive op of an input's loaded elements (``op(buffer[i])``) that
    it computes many times per element (TABULATE_REUSE, times TABULATE_PARTS if it has parts)
    computed once per element into a table by each part's prologue, and read from there."""
    if kernel.block[0] != 1:  # the threads of a block would each fill the table
        return kernel
    reuse = TABULATE_REUSE * (TABULATE_PARTS if split_loop(kernel) is not None else 1)
    loads = {s.dst: s for s in _statements(kernel.body) if isinstance(s, GlobalLoad)}
    evaluations: dict[tuple[str, int], int] = {}  # (op, buffer) -> per call, body's order
    first: dict[tuple[str, int], Compute] = {}
    for s, trips in _with_trips(kernel.body, kernel.grid[0]):
        if _tabulable(kernel, s, loads):
            key = (s.op, loads[s.args[0]].buffer)
            evaluations[key] = evaluations.get(key, 0) + trips
            first.setdefault(key, s)
    tables: dict[tuple[str, int], SharedArray] = {}
    prologue = []  # each part's
    for (op, buffer), count in evaluations.items():
        elements = kernel.buffers[buffer].shape.num_elements
        if count < reuse * elements or elements > TABULATED_ELEMENTS:
            continue
        compute = first[op, buffer]
        k = len(tables)
        table = tables[op, buffer] = SharedArray(f"table{k}", compute.dst.dtype, elements)
        at = Var(f"tab{k}", elements)
        x, y = Value(f"tab{k}x", compute.args[0].dtype), Value(f"tab{k}y", compute.dst.dtype)
        prologue.append(Loop(at, ix(0), elements, 1, [GlobalLoad(x, buffer, ix(at)),
                                                      Compute(y, op, [x]),
                                                      SharedStore(table, ix(at), y)]))
    if not tables:
        return kernel

    def rewrite(body: list) -> list:
        out = []
        for s in body:
            if _tabulable(kernel, s, loads) and (s.op, loads[s.args[0]].buffer) in tables:
                load = loads[s.args[0]]
                out.append(SharedLoad(s.dst, tables[s.op, load.buffer], load.offset))
            elif isinstance(s, (Loop, If)):
                out.append(dataclasses.replace(s, body=rewrite(s.body)))
            else:
                out.append(s)
        return out

    return dataclasses.replace(kernel, body=rewrite(kernel.body), part_prologue=prologue,
                               scratch=kernel.scratch + list(tables.values()))


def _tabulable(kernel: Kernel, s, loads: dict[Value, GlobalLoad]) -> bool:
    """``s`` is an expensive op of one element loaded from an input buffer."""
    return isinstance(s, Compute) and s.op in EXPENSIVE and len(s.args) == 1 \
        and s.args[0] in loads and not kernel.buffers[loads[s.args[0]].buffer].is_output \
        and "x" not in s.args[0].dtype  # not a 4-lane vector


def _statements(body: list):
    for s in body:
        yield s
        if isinstance(s, (Loop, If)):
            yield from _statements(s.body)


def _with_trips(body: list, trips: int):
    """(statement, how many times a call runs it) of every statement, inner ones included
    (a loop's trips as stop / step; an If as if always taken)."""
    for s in body:
        yield s, trips
        if isinstance(s, Loop):
            yield from _with_trips(s.body, trips * -(-s.stop // s.step))
        elif isinstance(s, If):
            yield from _with_trips(s.body, trips)
