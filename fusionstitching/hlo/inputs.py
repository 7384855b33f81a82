"""Inputs a check runs a module on: seeded random arrays that respect what HLO leaves open,
and what evaluating the module on them costs in memory.

A reduction's init value is meant to be its combiner's identity, and XLA may combine it into
a result more than once (XLA:CPU's tree reduction folds it into every window), so a parameter
that reaches an init value gets the identity: any other value gives results that differ
between correct executions. ``evaluation_bytes`` bounds the memory of a check before it runs.
"""
from __future__ import annotations

import math

import numpy as np

from .eval_values import NARROW_FLOATS, UnsupportedOp, integer_range, is_integer_type
from .ir import NUMPY_DTYPES, Computation, Instruction, Module

INPUT_KINDS = ("normal", "positive", "small positive")


def random_inputs(module: Module, seed: int = 0, kind: str = "normal") -> list[np.ndarray]:
    """Seeded random arguments for the entry parameters (logical numpy arrays); UnsupportedOp
    for a parameter no array stands for (a tuple, a token). ``kind``: INPUT_KINDS. A parameter
    that reaches a reduction's init value is that reduction's identity."""
    rng = np.random.default_rng(seed)
    identities = identity_parameters(module)
    args = []
    for param in module.entry.parameters:
        shape = param.shape
        if shape.is_tuple or shape.dtype not in NUMPY_DTYPES:
            raise UnsupportedOp(f"entry parameter %{param.name} of type {shape}")
        array = random_array(rng, shape.dims, shape.numpy_dtype, kind)
        if param.parameter_number in identities:
            array = np.full(shape.dims, _identity_value(identities[param.parameter_number],
                                                        shape.numpy_dtype), shape.numpy_dtype)
        args.append(array)
    return args


def random_array(rng: np.random.Generator, dims, dtype, kind: str = "normal") -> np.ndarray:
    """One seeded random argument of ``kind`` (INPUT_KINDS) for floats."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(dims) < 0.5
    if is_integer_type(dtype):
        # Integer parameters are mostly indices (tokens, segments, labels), masks and step
        # counters: 0 and 1 are valid for all of them; larger values index out of range
        # (JAX's gathers then fill NaN, and every output of BERT was NaN, comparing equal).
        return rng.integers(0, 2, size=dims).astype(dtype)
    if dtype.kind == "c":
        return (random_array(rng, dims, np.float32, kind)
                + 1j * random_array(rng, dims, np.float32, kind)).astype(dtype)
    if kind == "normal":
        return rng.standard_normal(dims).astype(dtype)
    if kind == "positive":
        return np.abs(rng.standard_normal(dims)).astype(dtype)
    return rng.uniform(0.01, 0.1, size=dims).astype(dtype)


def seeded_inputs(shapes) -> list[np.ndarray]:
    """One `random_array` per shape, from seed 0 (a kernel's trial and timing inputs)."""
    rng = np.random.default_rng(0)
    return [random_array(rng, shape.dims, shape.numpy_dtype) for shape in shapes]


# The identity of each combiner a reduction's computation can be (its root's opcode).
_IDENTITIES = {"add": 0, "or": 0, "xor": 0, "multiply": 1, "and": -1,
               "maximum": "lowest", "minimum": "highest"}
# Ops an init value may pass through on its way from a parameter without changing meaning.
_SAME_VALUE = ("convert", "copy", "bitcast", "reshape", "broadcast")


def identity_parameters(module: Module) -> dict[int, str]:
    """Entry parameter number -> the combiner (an opcode of _IDENTITIES) of a reduction whose
    init value it is, through fusions and calls; a parameter that two combiners disagree on is
    left out."""
    computations = module.computation_map()
    callers: dict[str, list[tuple[Computation, Instruction]]] = {}
    for comp in module.computations:
        for inst in comp.instructions:
            callee = _called(inst)
            if callee:
                callers.setdefault(callee, []).append((comp, inst))
    found: dict[int, str] = {}
    conflicting: set[int] = set()
    for comp in module.computations:
        table = comp.by_name()
        for inst in comp.instructions:
            if inst.opcode not in ("reduce", "reduce-window") or len(inst.operands) != 2:
                continue  # a variadic reduction (argmax) has no identity of its own
            combiner = _combiner(computations.get(inst.attrs.get("to_apply", "").lstrip("%")))
            if combiner is None:
                continue
            for number in _entry_parameters(table[inst.operands[1]], comp, table, callers,
                                            module):
                if found.get(number, combiner) != combiner:
                    conflicting.add(number)
                found[number] = combiner
    return {n: c for n, c in found.items() if n not in conflicting}


def _called(inst: Instruction) -> str:
    """The computation a fusion or call passes its operands to as parameters."""
    if inst.opcode == "fusion":
        return inst.attrs.get("calls", "").lstrip("%")
    if inst.opcode == "call":
        return inst.attrs.get("to_apply", "").lstrip("%")
    return ""


def _combiner(comp: Computation | None) -> str | None:
    if comp is None or len(comp.parameters) != 2:
        return None
    root = comp.root
    params = {p.name for p in comp.parameters}
    if root.opcode in _IDENTITIES and set(root.operands) == params:
        return root.opcode
    return None


def _entry_parameters(inst: Instruction, comp: Computation, table, callers, module,
                      depth: int = 0) -> list[int]:
    while inst.opcode in _SAME_VALUE and inst.operands:
        inst = table[inst.operands[0]]
    if inst.opcode != "parameter" or depth > 64:
        return []
    if comp is module.entry:
        return [inst.parameter_number]
    numbers = []
    for caller_comp, caller in callers.get(comp.name, []):
        if inst.parameter_number < len(caller.operands):
            caller_table = caller_comp.by_name()
            numbers += _entry_parameters(caller_table[caller.operands[inst.parameter_number]],
                                         caller_comp, caller_table, callers, module, depth + 1)
    return numbers


def _identity_value(combiner: str, dtype: np.dtype):
    value = _IDENTITIES[combiner]
    if dtype == np.bool_:
        return {"lowest": False, "highest": True, -1: True}.get(value, bool(value))
    if is_integer_type(dtype):
        lowest, highest = integer_range(dtype)
        return {"lowest": lowest, "highest": highest}.get(value, value)
    return {"lowest": -np.inf, "highest": np.inf, -1: np.nan}.get(value, value)


def evaluation_bytes(module: Module) -> int:
    """About how much memory one check of ``module`` holds at its peak: every entry value and
    the largest called computation's values, floats as the f64 copies the exact run makes
    (measured: 1.17 GB at the peak of a bf16 layer norm this puts at 1.23 GB)."""
    def wide_bytes(comp: Computation) -> int:
        total = 0
        for inst in comp.instructions:
            if inst.opcode in ("tuple", "get-tuple-element") or (
                    inst.opcode == "parameter" and comp is not module.entry):
                continue  # the values of other instructions, counted there
            for leaf in inst.shape.leaves():
                if leaf.dtype in NUMPY_DTYPES:
                    item = NUMPY_DTYPES[leaf.dtype]
                    size = 16 if item.kind == "c" else 8 if (
                        item.kind == "f" or item in NARROW_FLOATS) else item.itemsize
                    total += math.prod(leaf.dims) * size
        return total

    others = [wide_bytes(c) for c in module.computations if c is not module.entry]
    return wide_bytes(module.entry) + max(others, default=0)


def evaluation_steps(module: Module) -> int:
    """About how many instructions one evaluation of ``module`` runs: a while loop's body and
    condition counted once per trip where XLA knows the trip count (``known_trip_count``;
    once where it does not), a fusion's or call's computation once per call. The evaluator
    spends microseconds of Python on each, whatever its size."""
    computations = module.computation_map()
    memo: dict[str, int] = {}

    def steps(name: str, depth: int = 0) -> int:
        if name in memo or depth > 64 or name not in computations:
            return memo.get(name, 0)
        total = 0
        for inst in computations[name].instructions:
            total += 1
            if inst.opcode == "while":
                trips = ((inst.attr_json() or {}).get("known_trip_count") or {}).get("n", 1)
                body = steps(inst.attrs.get("body", "").lstrip("%"), depth + 1) + steps(
                    inst.attrs.get("condition", "").lstrip("%"), depth + 1)
                total += int(trips) * body
            elif inst.opcode in ("fusion", "call", "conditional"):
                total += sum(steps(c, depth + 1) for c in inst.called_computations)
        memo[name] = total
        return total

    return steps(module.entry.name)
