"""Instructions per element of an HLO elementwise op, by latency-evaluator op class.

Both plans are priced by this one table: the stitched kernel's IR (codegen) and XLA's fused
computations (graph). The counts are the PTX our NVPTX backend emits (LLVM O3, libdevice,
sm_90) for a one-op kernel, minus the same kernel without the op; the 4 fp32 instructions
charged for the correction of div/sqrt/rcp .rn.f32 are an assumption.
"""
from __future__ import annotations

from collections.abc import Mapping

# Op class of everything the profilers do not recognise (new IR nodes, exotic HLO ops):
# charged as one integer-ALU instruction each (costmodel/data/cpi.json, derivations.other).
GENERIC_CLASS = "other"


def overlapped(op_class: str) -> str:
    """The class of an instruction of ``op_class`` that waits for no instruction before it
    (latency.op_costs: its issue cycles only)."""
    return f"{op_class}_overlapped"


# A global load issued behind an independent one still in flight (cpi.json derivations).
OVERLAPPED_LOAD = overlapped("ld_global")

_IEEE_CORRECTION = 4  # fp32 Newton-Raphson steps after the SFU approximation (assumed)

# f32 ops that are not one fp32 instruction.
_FLOAT_OPS: dict[str, dict[str, int]] = {
    "divide": {"sfu": 1, "fp32": 1 + _IEEE_CORRECTION},
    "sqrt": {"sfu": 1, "fp32": _IEEE_CORRECTION},
    "rsqrt": {"sfu": 2, "fp32": 2 * _IEEE_CORRECTION},  # lowered as sqrt.rn then rcp.rn
    "exponential": {"sfu": 1, "fp32": 8, "int": 3},
    "log": {"fp32": 22, "int": 4},
    "tanh": {"sfu": 2, "fp32": 15},
    "power": {"sfu": 1, "fp32": 78, "int": 20},
    "logistic": {"sfu": 2, "fp32": 10, "int": 3},  # exp + divide: 1 / (1 + exp(-x))
}
# Ops that move or relabel data: index arithmetic at most, no arithmetic instruction.
_FREE_OPS = {"bitcast", "reshape", "broadcast", "copy", "transpose", "slice", "parameter",
             "constant", "tuple", "get-tuple-element", "iota", "reverse", "pad",
             "concatenate", "dynamic-slice", "dynamic-update-slice", "gather"}
_SIMPLE_OPS = {"add", "subtract", "multiply", "maximum", "minimum", "negate", "abs", "compare",
               "select", "convert", "and", "or", "not", "xor", "clamp", "sign", "floor",
               "ceil", "round-nearest-even", "round-nearest-afz", "remainder",
               "shift-left", "shift-right-logical", "shift-right-arithmetic"}


def op_instructions(opcode: str, dtype: str) -> Mapping[str, int]:
    """Instructions one element of ``opcode`` producing ``dtype`` costs, by op class."""
    if opcode in _FREE_OPS:
        return {}
    if dtype in ("f32", "f16", "bf16", "f64"):  # 16-bit floats compute in f32 (as XLA:GPU)
        if opcode in _FLOAT_OPS:
            return _FLOAT_OPS[opcode]
        if opcode in _SIMPLE_OPS:
            return {"fp32": 1}
    elif opcode in _SIMPLE_OPS:
        return {"int": 1}
    return {GENERIC_CLASS: 1}


def add_instructions(total: dict[str, float], counts: Mapping[str, float],
                     times: float = 1.0) -> None:
    for op_class, n in counts.items():
        total[op_class] = total.get(op_class, 0.0) + n * times
