"""Reference evaluator: runs an HLO ``Module`` on numpy arrays with XLA:CPU's semantics.

Every correctness check compares against it, so it favours clarity and fidelity over speed,
while staying vectorized. Values are logical numpy arrays or tuples (eval_values.py); the ops
live in eval_elementwise, eval_movement, eval_reduce and eval_control. Custom calls other than
``TopK`` run only when registered (``register_custom_call``): hlo/gpu_library.py registers
XLA:GPU's cuBLAS and cuDNN calls when imported.
"""
from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np

from . import eval_collective, eval_control, eval_elementwise, eval_movement, eval_reduce
from .attrs import parse_literal
from .eval_values import NARROW_FLOATS, UnsupportedOp
from .inline import inline_calls, nesting_depth
from .ir import Computation, Instruction, Module, Shape

MAX_NESTING = 64  # fusions or calls deep; deeper ones are inlined first (hlo/inline.py)


# A custom call's value from (module, instruction, operand values), by custom_call_target.
CustomCall = Callable[[Module, Instruction, list], object]
_CUSTOM_CALLS: dict[str, CustomCall] = {}


def register_custom_call(target: str, evaluate_call: CustomCall) -> None:
    """Lets the evaluator run custom calls to ``target`` (a library's opaque nodes)."""
    _CUSTOM_CALLS[target] = evaluate_call


def evaluate(module: Module, args: list, computation: str | None = None,
             rounding_noise: np.random.Generator | None = None,
             replica: eval_collective.Replica | None = None):
    """Runs ``computation`` (the entry by default) on ``args``; tuple results are tuples.
    ``replica``: the simulated device this is (``evaluate_replicas``), for collectives.

    With ``rounding_noise``, every float result of an op that rounds is scaled by a random
    1 + u * eps (u uniform in [-1, 1], eps of its type): one of the f32 executions XLA could
    have been, to tell which output elements f32 rounding decides (stochastic arithmetic)."""
    comp = module.entry if computation is None else module.computation(computation)
    return evaluate_computation(module, comp, args, rounding_noise, replica)


def evaluate_replicas(module: Module, args: list[list]) -> list:
    """The entry run by each device of a partitioned module (``args[i]``: device ``i``'s
    arguments), collectives between them (eval_collective.py); results in device order."""
    return eval_collective.run_replicas(
        len(args), lambda replica: evaluate(module, args[replica.index], replica=replica))


def evaluate_computation(module: Module, comp: Computation | str, args: list,
                         rounding_noise: np.random.Generator | None = None,
                         replica: eval_collective.Replica | None = None):
    """Runs one computation of ``module``; arguments are checked against its parameter shapes."""
    if isinstance(comp, str):
        comp = module.computation(comp)
    if nesting_depth(module, comp) > MAX_NESTING:  # past Python's recursion limit otherwise
        module, comp = inline_calls(module, comp)
    params = comp.parameters
    if len(args) != len(params):
        raise ValueError(f"{comp.name} takes {len(params)} arguments, got {len(args)}")
    checked = [_as_value(a, p.shape, f"argument {p.parameter_number} ({p.name})")
               for a, p in zip(args, params)]
    with np.errstate(all="ignore"):  # overflow, NaN and wrap-around are XLA semantics here
        result = _Evaluator(module, rounding_noise, replica).call(comp, checked)
    return _materialize(result)


def _as_value(arg, shape: Shape, what: str):
    if shape.is_tuple:
        if not isinstance(arg, (tuple, list)) or len(arg) != len(shape.tuple_shapes):
            raise ValueError(f"{what}: expected a tuple of {len(shape.tuple_shapes)} values")
        return tuple(_as_value(a, s, f"{what}[{i}]")
                     for i, (a, s) in enumerate(zip(arg, shape.tuple_shapes)))
    array = np.asarray(arg, dtype=shape.numpy_dtype)
    if array.shape != shape.dims:
        raise ValueError(f"{what}: expected shape {shape.dims}, got {array.shape}")
    return array


def _materialize(value):
    """Turns broadcast views into ordinary arrays, so callers may write to the results."""
    if isinstance(value, tuple):
        return tuple(_materialize(v) for v in value)
    return value if value.flags.c_contiguous and value.flags.writeable else np.array(value)


class _Evaluator:
    """One evaluation: computations by name, operand shapes, parsed constants (the object
    every op receives as ``ev``)."""

    def __init__(self, module: Module, rounding_noise: np.random.Generator | None = None,
                 replica: eval_collective.Replica | None = None):
        self.module = module
        self.rounding_noise = rounding_noise
        self.replica = replica
        self.computations = module.computation_map()
        # Instruction -> table of its computation, so ops can look at operand shapes (layouts).
        self._scope: dict[int, dict[str, Instruction]] = {}
        for comp in module.computations:
            table = comp.by_name()
            for inst in comp.instructions:
                self._scope[id(inst)] = table
        self._constants: dict[int, object] = {}  # parsed literals (loop bodies re-run them)
        self._reducer_ufuncs: dict[str, np.ufunc | None] = {}

    def call(self, comp: Computation | str, args: list, result: str | None = None):
        """Runs ``comp``; returns its root's value, or that of instruction ``result``."""
        if isinstance(comp, str):
            comp = self.computations[comp]
        env: dict[str, object] = {}
        for inst in comp.instructions:
            if inst.opcode == "parameter":
                env[inst.name] = args[inst.parameter_number]
                continue
            op = _OPS.get(inst.opcode)
            if op is None:
                raise UnsupportedOp(f"{inst.opcode} (%{inst.name} in {comp.name})")
            try:
                env[inst.name] = op(self, inst, [env[name] for name in inst.operands])
                if self.rounding_noise is not None and inst.opcode in _ROUNDING:
                    env[inst.name] = _with_rounding_noise(env[inst.name], self.rounding_noise)
            except Exception as err:
                err.add_note(f"while evaluating %{inst.name} = {inst.opcode} in {comp.name}")
                raise
        return env[result or comp.root.name]

    def called(self, inst: Instruction, key: str) -> Computation:
        return self.computations[inst.attrs[key].strip().lstrip("%")]

    def operand_shape(self, inst: Instruction, i: int) -> Shape:
        return self._scope[id(inst)][inst.operands[i]].shape

    def constant(self, inst: Instruction):
        if id(inst) not in self._constants:
            self._constants[id(inst)] = parse_literal(inst.literal or "", inst.shape)
        return self._constants[id(inst)]

    def reducer_ufunc(self, comp: Computation) -> np.ufunc | None:
        """The numpy ufunc when ``comp`` is just ``op(parameter(0), parameter(1))`` for an
        associative, commutative op; such reducers/combiners skip lifted calls."""
        if comp.name not in self._reducer_ufuncs:
            root, params = comp.root, comp.parameters
            simple = (len(comp.instructions) == 3 and len(params) == 2
                      and sorted(root.operands) == sorted(p.name for p in params))
            self._reducer_ufuncs[comp.name] = \
                eval_elementwise.REDUCER_UFUNCS.get(root.opcode) if simple else None
        return self._reducer_ufuncs[comp.name]


def _with_rounding_noise(value, rng: np.random.Generator):
    if isinstance(value, tuple):
        return tuple(_with_rounding_noise(v, rng) for v in value)
    if not (isinstance(value, np.ndarray) and (value.dtype.kind == "f"
                                               or value.dtype in NARROW_FLOATS)):
        return value
    eps = float(ml_dtypes.finfo(value.dtype).eps)
    noise = rng.uniform(-eps, eps, size=value.shape)
    return (value.astype(np.float64) * (1.0 + noise)).astype(value.dtype)


def _custom_call(ev, inst, operands):
    target = inst.custom_call_target
    if target == "TopK":
        return eval_control.top_k(ev, inst, operands)
    if target not in _CUSTOM_CALLS:
        raise UnsupportedOp(f"custom-call to {target!r} (%{inst.name}): no evaluation is "
                            "registered for this target (XLA:GPU's library calls: import "
                            "fusionstitching.hlo.gpu_library)")
    return _CUSTOM_CALLS[target](ev.module, inst, operands)


# Ops whose float results are rounded (data movement, selection, max/min and sign-like ops are
# exact); fusions, calls, maps and loops round in the computations they run.
_ROUNDING = (set(eval_elementwise.UNARY) | set(eval_elementwise.BINARY) | {
    "convert", "reduce", "reduce-window", "scatter", "select-and-scatter", "dot", "convolution",
    "custom-call"}) - {
    "abs", "negate", "maximum", "minimum", "sign", "floor", "ceil", "round-nearest-afz",
    "round-nearest-even", "real", "imag"}

_OPS = {**eval_elementwise.OPS, **eval_movement.OPS, **eval_reduce.OPS, **eval_control.OPS,
        **eval_collective.OPS, "custom-call": _custom_call}
