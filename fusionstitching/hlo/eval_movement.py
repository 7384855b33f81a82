"""Data-movement ops: constants, shapes, layouts (bitcast), slicing, padding, tuples, gather.

Layouts matter only for ``bitcast``, which reads the operand's buffer in its physical order.
``window_starts`` (the window each index vector chooses) is shared with scatter.
"""
from __future__ import annotations

import numpy as np

from .attrs import GatherDims, parse_padding, parse_slice
from .ir import Shape


def _constant(ev, inst, operands):
    return ev.constant(inst)


def _iota(ev, inst, operands):
    dims, d = inst.shape.dims, int(inst.attrs["iota_dimension"])
    line = np.arange(dims[d]).reshape([dims[d] if i == d else 1 for i in range(len(dims))])
    return np.broadcast_to(line.astype(inst.shape.numpy_dtype), dims)


def _broadcast(ev, inst, operands):
    # ``dimensions`` maps operand dim i to result dim dimensions[i]; put them in result order,
    # insert the new unit dims, and let numpy broadcast.
    x, dims = operands[0], inst.dimensions
    x = np.transpose(x, np.argsort(dims))
    shape = [1] * inst.shape.rank
    for size, d in zip(x.shape, sorted(dims)):
        shape[d] = size
    return np.broadcast_to(x.reshape(shape), inst.shape.dims)


def _reshape(ev, inst, operands):
    return np.reshape(operands[0], inst.shape.dims)


def _physical_order(shape: Shape) -> list[int]:
    """Dimensions from major to minor: the order in which they are laid out in memory."""
    return list(reversed(shape.minor_to_major))


def _bitcast(ev, inst, operands):
    # Reinterpret the operand's buffer: read it in its physical (layout) order, reinterpret the
    # element type if it changes, and lay the same bytes out in the result's layout.
    source = ev.operand_shape(inst, 0)
    if source.dims == inst.shape.dims and source.minor_to_major == inst.shape.minor_to_major:
        # Only the element type changes: reinterpret in place (also works on lifted scalars;
        # ascontiguousarray makes a scalar 1-d, so the operand's shape is put back).
        x = np.asarray(operands[0])
        return np.ascontiguousarray(x).view(inst.shape.numpy_dtype).reshape(x.shape)
    buffer = np.transpose(operands[0], _physical_order(source)).reshape(-1)
    buffer = buffer.view(inst.shape.numpy_dtype)
    order = _physical_order(inst.shape)
    physical = buffer.reshape([inst.shape.dims[d] for d in order])
    return np.transpose(physical, np.argsort(order))


def _transpose(ev, inst, operands):
    return np.transpose(operands[0], inst.dimensions)


def _identity(ev, inst, operands):
    return operands[0]


def _slice(ev, inst, operands):
    bounds = parse_slice(inst.attrs["slice"])
    return operands[0][tuple(slice(d.start, d.limit, d.stride) for d in bounds)]


def _clamped_starts(starts, operand_dims, sizes) -> list[int]:
    # Dynamic slicing clamps each start so the whole window stays inside the operand.
    if len(starts) == 1 and np.ndim(starts[0]) == 1:  # the older form: one array of starts
        starts = list(np.asarray(starts[0]))
    return [min(max(int(s), 0), n - k) for s, n, k in zip(starts, operand_dims, sizes)]


def _dynamic_slice(ev, inst, operands):
    x, sizes = operands[0], inst.int_list_attr("dynamic_slice_sizes")
    starts = _clamped_starts(operands[1:], x.shape, sizes)
    return x[tuple(slice(s, s + k) for s, k in zip(starts, sizes))]


def _dynamic_update_slice(ev, inst, operands):
    x, update = operands[0], operands[1]
    starts = _clamped_starts(operands[2:], x.shape, update.shape)
    result = np.array(x)
    result[tuple(slice(s, s + k) for s, k in zip(starts, update.shape))] = update
    return result


def _concatenate(ev, inst, operands):
    return np.concatenate(operands, axis=inst.dimensions[0])


def pad_array(x: np.ndarray, value, config) -> np.ndarray:
    """Pads with (low, high, interior) per dim; negative low/high cut elements away."""
    sizes, placed, kept = [], [], []
    for n, (low, high, interior) in zip(x.shape, config):
        core = n + max(n - 1, 0) * interior
        size = max(low, 0) + core + max(high, 0)
        sizes.append(size)
        placed.append(slice(max(low, 0), max(low, 0) + core, interior + 1))
        kept.append(slice(max(-low, 0), size - max(-high, 0)))
    result = np.full(sizes, value, dtype=x.dtype)
    result[tuple(placed)] = x
    return result[tuple(kept)]


def _pad(ev, inst, operands):
    x, value = operands
    return pad_array(x, value, parse_padding(inst.attrs.get("padding", "")))


def _reverse(ev, inst, operands):
    return np.flip(operands[0], axis=inst.dimensions)


def _tuple(ev, inst, operands):
    return tuple(operands)


def _get_tuple_element(ev, inst, operands):
    return operands[0][int(inst.attrs["index"])]


def window_starts(indices: np.ndarray, index_vector_dim: int, start_index_map, operand_batching,
                  index_batching, operand_rank: int, batch_positions: list[int], rank: int):
    """Per operand dim, the window start chosen by each index vector (shared by gather/scatter).

    The result has ``rank`` dims, the index batch dims at ``batch_positions`` and 1 elsewhere,
    so it broadcasts against the gather output / scatter updates. Not clamped.
    """
    if index_vector_dim == indices.ndim:
        indices = indices[..., None]
    else:
        indices = np.moveaxis(indices, index_vector_dim, -1)
    batch_shape = indices.shape[:-1]

    def placed(values: np.ndarray, batch_dim: int | None = None) -> np.ndarray:
        shape = [1] * rank
        for i, (pos, size) in enumerate(zip(batch_positions, batch_shape)):
            if batch_dim is None or i == batch_dim:
                shape[pos] = size
        return values.reshape(shape)

    starts = [np.zeros((), np.int64)] * operand_rank
    for k, d in enumerate(start_index_map):
        starts[d] = placed(indices[..., k].astype(np.int64))
    # Batching dims pair operand dim d with index dim i: the start is that batch coordinate.
    for d, i in zip(operand_batching, index_batching):
        i = i if i < index_vector_dim else i - 1  # numbering without the index vector dim
        starts[d] = placed(np.arange(batch_shape[i]), batch_dim=i)
    return starts


def window_offset(size: int, position: int, rank: int) -> np.ndarray:
    return np.arange(size).reshape([size if i == position else 1 for i in range(rank)])


def _gather(ev, inst, operands):
    operand, indices = operands
    dims = GatherDims.parse(inst.attrs)
    rank = inst.shape.rank
    starts = window_starts(indices, dims.index_vector_dim, dims.start_index_map,
                           dims.operand_batching_dims, dims.start_indices_batching_dims,
                           operand.ndim, [d for d in range(rank) if d not in dims.offset_dims],
                           rank)
    windowed = [d for d in range(operand.ndim) if d not in dims.collapsed_slice_dims
                and d not in dims.operand_batching_dims]
    index = []
    for d in range(operand.ndim):
        # Gather clamps each window into the operand.
        start = np.clip(starts[d], 0, operand.shape[d] - dims.slice_sizes[d])
        if d in windowed:
            start = start + window_offset(dims.slice_sizes[d],
                                          dims.offset_dims[windowed.index(d)], rank)
        index.append(start)
    return np.broadcast_to(operand[tuple(index)], inst.shape.dims)


OPS = {
    "constant": _constant,
    "iota": _iota,
    "broadcast": _broadcast,
    "reshape": _reshape,
    "bitcast": _bitcast,
    "transpose": _transpose,
    "copy": _identity,
    "opt-barrier": _identity,
    "slice": _slice,
    "dynamic-slice": _dynamic_slice,
    "dynamic-update-slice": _dynamic_update_slice,
    "concatenate": _concatenate,
    "pad": _pad,
    "reverse": _reverse,
    "tuple": _tuple,
    "get-tuple-element": _get_tuple_element,
    "gather": _gather,
}
