"""Host kernels: a value that a later loop over the same points would compute again (softmax's
exp, recomputed for the output after the sum) is kept by the first loop in an array and read
back by the later ones.

The paper stitches such values through shared memory on the GPU; on the CPU a row's array
stays in L1, and reading it back costs less than a polynomial exp per element. Only the
block's top-level loops over the same points (from 0, step 1) holding plain statements take
part, and only values whose computation includes an expensive op are kept; the loops and
every other statement stay as they are, so the numbers are the same bit for bit.
"""
from __future__ import annotations

import dataclasses

from ..index_expr import ix
from ..kernel_ir import (DTYPE_BYTES, Compute, Const, ConstLoad, GlobalLoad, GlobalStore,
                         IndexValue, Kernel, Loop, SharedArray, SharedLoad, SharedStore, Value,
                         defined_values, used_values)

# Ops whose cost per element is many instructions (a polynomial, a division, a square root).
EXPENSIVE = frozenset({"exponential", "exponential-minus-one", "log", "log-plus-one", "tanh",
                       "erf", "logistic", "power", "sqrt", "rsqrt", "cbrt", "divide",
                       "remainder", "sine", "cosine", "tan", "atan2"})
KEPT_BYTES = 32 * 1024  # the kernel's arrays together: on the stack, in L1
_PLAIN = (Compute, Const, ConstLoad, GlobalLoad, GlobalStore, IndexValue)


def reuse_across_loops(kernel: Kernel) -> Kernel:
    """``kernel`` with values recomputed by later top-level loops kept in arrays instead."""
    loops = [i for i, s in enumerate(kernel.body) if _takes_part(kernel, s)]
    first: dict[int, tuple[int, Value]] = {}  # a value's form -> (loop, its value there)
    arrays: dict[int, SharedArray] = {}
    stores: dict[int, dict[Value, SharedStore]] = {}  # loop -> value -> its store after it
    loads: dict[int, dict[Value, SharedLoad]] = {}  # loop -> value -> the load replacing it
    kept_bytes = 0
    interned: dict[tuple, int] = {}
    for i in loops:
        loop = kernel.body[i]
        forms = _forms(kernel, loop, interned)
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


def _forms(kernel: Kernel, loop: Loop, interned: dict[tuple, int]
           ) -> dict[Value, tuple[int, bool]]:
    """Each value the loop defines -> (its computation as a tree over the loop's index and
    values from outside the loop, whether an expensive op is in it). A tree is numbered by
    ``interned`` (equal trees, equal numbers): as nested tuples, hashing threefry's rounds,
    which read each earlier value twice, costs 2 ** rounds."""
    forms: dict[Value, tuple[int, bool]] = {}

    def number(tree: tuple) -> int:
        return interned.setdefault(tree, len(interned))

    def form(v: Value) -> tuple[int, bool]:
        return forms.get(v, (number(("outside", v)), False))

    for s in loop.body:
        match s:
            case Compute():
                args = [form(a) for a in s.args]
                forms[s.dst] = (number(("op", s.op, s.dst.dtype, s.attr,
                                        tuple(f for f, _ in args))),
                                s.op in EXPENSIVE or any(c for _, c in args))
            case Const():
                forms[s.dst] = (number(("const", s.dst.dtype, repr(s.value))), False)
            case GlobalLoad():
                forms[s.dst] = (number(("load", s.buffer, s.offset, s.dst.dtype)), False)
            case ConstLoad():
                forms[s.dst] = (number(("constant", s.array.name, s.offset, s.dst.dtype)),
                                False)
            case IndexValue():
                forms[s.dst] = (number(("index", s.index)), False)
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
