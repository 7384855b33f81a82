"""TF's HLO module of a concrete function, as the hook compiles it: which of its parameters
are the function's inputs and captured variables, which results its outputs and variable
updates (``Signature``), and TF's ``input_output_alias`` taken off its text.
"""
from __future__ import annotations

from dataclasses import dataclass

from .hlo_function import numpy_dtype


class Unsupported(Exception):
    """The function runs as TF would; the message says why."""


@dataclass(frozen=True)
class Signature:
    """How TF's HLO module maps onto the concrete function."""

    num_inputs: int  # flat tensor inputs (the rest of the parameters are captured variables)
    variables: tuple  # (handle, tf dtype) per captured variable, in parameter order
    num_outputs: int  # the function's flat outputs (the rest of the results are updates)
    updates: tuple  # per update result: index into ``variables`` of the variable it writes


def split_alias(hlo_text: str) -> tuple[str, dict[int, int]]:
    """(module text without ``input_output_alias``, {result index: parameter index}).

    The alias is TF's contract with its own executor (it donates the variables' buffers);
    the modules compiled here never donate: the buffers are TF's tensors."""
    from fusionstitching.hlo.attrs import input_output_alias

    head, newline, rest = hlo_text.partition("\n")
    start = head.find("input_output_alias={")
    if start < 0:
        return hlo_text, {}
    depth, end = 0, start + len("input_output_alias=")
    for end in range(end, len(head)):
        depth += {"{": 1, "}": -1}.get(head[end], 0)
        if depth == 0:
            break
    alias = input_output_alias(head[start:end + 1])
    before, after = head[:start], head[end + 1:]
    head = before + after[2:] if after.startswith(", ") else before.rstrip(", ") + after
    return head + newline + rest, alias


def signature(concrete, module, alias: dict[int, int], shapes: tuple) -> Signature:
    """Check that the module's parameters and results are the function's, as TF's XLA
    compiler lays them out for inputs of ``shapes``; ``Unsupported`` says where they are
    not."""
    import tensorflow as tf

    inputs = list(concrete.inputs)
    captured = list(concrete.captured_inputs)
    num_inputs = len(inputs) - len(captured)
    params = module.entry.parameters
    if len(params) != len(inputs):
        raise Unsupported(f"the HLO module has {len(params)} parameters for "
                          f"{len(inputs)} inputs (compile-time constant arguments?)")
    for i, tensor in enumerate(inputs[:num_inputs]):
        if tensor.dtype in (tf.resource, tf.variant):
            raise Unsupported(f"input {i} is a {tensor.dtype.name} (a variable or dataset "
                              "passed as an argument); only captured variables are handled")
        if tuple(params[i].shape.dims) != shapes[i]:
            raise Unsupported(f"input {i} has the shape {shapes[i]} in the call and "
                              f"{params[i].shape.dims} in TF's module")
    variables = []
    for tensor, handle in zip(inputs[num_inputs:], captured):
        if tensor.dtype != tf.resource:
            raise Unsupported(f"captured input {tensor.name} is a {tensor.dtype.name}, not a "
                              "variable")
        shape = params[len(variables) + num_inputs].shape
        variables.append((handle, tf.as_dtype(numpy_dtype(shape.dtype))))
    results = module.entry.root.shape
    num_results = len(results.tuple_shapes) if results.is_tuple else 1
    num_outputs = len(concrete.outputs)
    if any(t.dtype in (tf.resource, tf.variant) for t in concrete.outputs):
        raise Unsupported("the function returns a resource or variant")
    updates = []
    for index in range(num_outputs, num_results):
        param = alias.get(index)
        if param is None or param < num_inputs:
            raise Unsupported(f"result {index} is neither an output nor a variable update")
        updates.append(param - num_inputs)
    if any(out >= num_results or out < num_outputs for out in alias):
        raise Unsupported("an output of the function aliases a parameter")
    return Signature(num_inputs, tuple(variables), num_outputs, tuple(updates))
