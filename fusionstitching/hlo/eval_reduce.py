"""Ops that combine elements: reduce, reduce-window, select-and-scatter, scatter, dot and
convolution, with the window arithmetic they share (``window_pad``, ``window_offsets``,
``window_slices``; also used by the cuDNN calls in gpu_library).

A reducer or combiner computation runs *lifted* (on whole arrays); one that is a single
associative numpy ufunc runs as that ufunc. Float sums accumulate in f64 and round once.
"""
from __future__ import annotations

import itertools

import numpy as np

from .attrs import ConvDims, ScatterDims, Window
from .eval_movement import pad_array, window_offset, window_starts
from .eval_values import NARROW_FLOATS, UnsupportedOp, accumulation_dtype, pack, results, widen
from .ir import Computation


def _reduce_arrays(ev, comp: Computation, inputs: list, inits: list, axes: tuple[int, ...]):
    """Reduces ``inputs`` over ``axes`` with ``comp``, starting from the scalar ``inits``."""
    ufunc = ev.reducer_ufunc(comp) if len(inputs) == 1 else None
    kept = [d for d in range(inputs[0].ndim) if d not in axes]
    out_shape = tuple(inputs[0].shape[d] for d in kept)
    count = int(np.prod([inputs[0].shape[d] for d in axes], dtype=np.int64))
    if count == 0:
        return [np.broadcast_to(init, out_shape) for init in inits]
    if ufunc is not None:
        x = inputs[0]
        acc = accumulation_dtype(x.dtype)
        partial = ufunc.reduce(x.astype(acc), axis=axes, dtype=acc)
        return [np.asarray(ufunc(partial, inits[0].astype(acc))).astype(x.dtype)]
    # General (e.g. variadic argmax) reducers: XLA may combine elements in any order, so combine
    # the two halves of the reduced elements pairwise: log2(count) lifted calls.
    parts = [np.transpose(x, kept + list(axes)).reshape(out_shape + (count,)) for x in inputs]
    while count > 1:
        half = count // 2
        combined = results(ev.call(comp, [p[..., :half] for p in parts]
                                   + [p[..., half:2 * half] for p in parts]))
        parts = [np.concatenate([c, p[..., 2 * half:]], axis=-1) for c, p in zip(combined, parts)]
        count = half + count % 2
    reduced = results(ev.call(comp, [np.broadcast_to(i, out_shape) for i in inits]
                              + [p[..., 0] for p in parts]))
    return [np.broadcast_to(r, out_shape) for r in reduced]


def _reduce(ev, inst, operands):
    n = len(operands) // 2
    reduced = _reduce_arrays(ev, ev.called(inst, "to_apply"), operands[:n], operands[n:],
                             inst.dimensions)
    return pack([r.astype(s.numpy_dtype, copy=False)
                 for r, s in zip(reduced, inst.shape.leaves())])


def window_pad(window: Window, x: np.ndarray, value, leading: int = 0) -> np.ndarray:
    """Applies padding and base dilation to the last dims of ``x`` (after ``leading`` dims)."""
    config = [(0, 0, 0)] * leading + [
        (lo, hi, d - 1) for (lo, hi), d in zip(window.padding, window.base_dilation)]
    return pad_array(x, value, config)


def window_offsets(window: Window):
    """Every position in the window (a kernel tap), in row-major order."""
    return itertools.product(*[range(s) for s in window.size])


def window_slices(window: Window, offset, out_sizes) -> tuple[slice, ...]:
    """For a padded input: the element at window position ``offset`` of every output."""
    return tuple(slice(o * d, o * d + max((n - 1) * s + 1, 0), s) for o, d, s, n in
                 zip(offset, window.window_dilation, window.stride, out_sizes))


def _reduce_window(ev, inst, operands):
    n = len(operands) // 2
    inputs, inits = operands[:n], operands[n:]
    comp = ev.called(inst, "to_apply")
    window = Window.parse(inst.attrs.get("window"), inputs[0].ndim)
    out_shapes = inst.shape.leaves()
    out_sizes = out_shapes[0].dims
    # Window positions in the padding or in a base dilation hole are skipped, as XLA:CPU does
    # (combining them as the init value, as XLA's operation semantics word it, differs from
    # XLA's result when the init is not the reducer's identity: a sum starting at 1).
    padded = [window_pad(window, x, init) for x, init in zip(inputs, inits)]
    inside = window_pad(window, np.ones(inputs[0].shape, bool), np.zeros((), bool))
    ufunc = ev.reducer_ufunc(comp) if n == 1 else None
    acc = [np.broadcast_to(init, out_sizes) for init in inits]
    for offset in window_offsets(window):
        sl = window_slices(window, offset, out_sizes)
        elements = [p[sl] for p in padded]
        if ufunc is not None:
            new = [ufunc(widen(acc[0]), widen(elements[0])).astype(inputs[0].dtype)]
        else:
            new = results(ev.call(comp, acc + elements))
        acc = [np.where(inside[sl], v, a) for v, a in zip(new, acc)]
    return pack([np.broadcast_to(a, out_sizes).astype(s.numpy_dtype, copy=False)
                 for a, s in zip(acc, out_shapes)])


def scatter_combine(ev, comp: Computation, targets: list, index: np.ndarray, updates: list):
    """targets[k][index[i]] = comp(targets..., updates...[i]) in order; targets are flat arrays.

    Repeated indices must see each other's results, so the generic path applies the updates in
    rounds in which every target element is touched at most once.
    """
    ufunc = ev.reducer_ufunc(comp) if len(targets) == 1 else None
    if ufunc is not None and targets[0].dtype not in NARROW_FLOATS:
        ufunc.at(targets[0], index, updates[0])
        return
    order = np.argsort(index, kind="stable")
    ordered = index[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]]
    rank = np.arange(len(order)) - np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
    for r in range(int(rank.max(initial=-1)) + 1):
        chosen = order[rank == r]
        where = index[chosen]
        new = results(ev.call(comp, [t[where] for t in targets] + [u[chosen] for u in updates]))
        for t, v in zip(targets, new):
            t[where] = v


def _select_and_scatter(ev, inst, operands):
    operand, source, init = operands
    window = Window.parse(inst.attrs.get("window"), operand.ndim)
    select, scatter = ev.called(inst, "select"), ev.called(inst, "scatter")
    # Padding is never selected: track flat operand positions, -1 in the padding.
    positions = window_pad(window, np.arange(operand.size).reshape(operand.shape), -1)
    padded = window_pad(window, operand, np.zeros((), operand.dtype))
    chosen_value, chosen_position = None, np.full(source.shape, -1)
    for offset in window_offsets(window):
        sl = window_slices(window, offset, source.shape)
        value, position = padded[sl], positions[sl]
        if chosen_value is None:
            chosen_value = value
            take = position >= 0
        else:
            # select(current, candidate) true keeps the current choice, as in XLA.
            keep = np.broadcast_to(ev.call(select, [chosen_value, value]), source.shape)
            take = (position >= 0) & ((chosen_position < 0) | ~keep)
        chosen_value = np.where(take, value, chosen_value)
        chosen_position = np.where(take, position, chosen_position)
    result = np.full(operand.size, init, dtype=operand.dtype)
    valid = chosen_position >= 0
    scatter_combine(ev, scatter, [result], chosen_position[valid], [source[valid]])
    return result.reshape(operand.shape)


def _scatter(ev, inst, operands):
    n = (len(operands) - 1) // 2
    targets, indices, updates = operands[:n], operands[n], operands[n + 1:]
    dims = ScatterDims.parse(inst.attrs)
    window_dims = dims.update_window_dims
    shape, rank = targets[0].shape, updates[0].ndim
    starts = window_starts(indices, dims.index_vector_dim, dims.scatter_dims_to_operand_dims,
                           dims.input_batching_dims, dims.scatter_indices_batching_dims,
                           len(shape), [d for d in range(rank) if d not in window_dims], rank)
    windowed = [d for d in range(len(shape)) if d not in dims.inserted_window_dims
                and d not in dims.input_batching_dims]
    index, in_bounds = [], np.ones((), bool)
    for d in range(len(shape)):
        size = updates[0].shape[window_dims[windowed.index(d)]] if d in windowed else 1
        # Unlike gather, scatter skips a whole update window that does not fit the operand.
        in_bounds = in_bounds & (starts[d] >= 0) & (starts[d] + size <= shape[d])
        offset = window_offset(size, window_dims[windowed.index(d)], rank) if d in windowed else 0
        index.append(np.broadcast_to(starts[d] + offset, updates[0].shape))
    valid = np.broadcast_to(in_bounds, updates[0].shape)
    flat_index = np.ravel_multi_index([i[valid] for i in index], shape)
    flat_targets = [np.array(t).reshape(-1) for t in targets]
    scatter_combine(ev, ev.called(inst, "to_apply"), flat_targets, flat_index,
                    [u[valid] for u in updates])
    return pack([t.reshape(shape) for t in flat_targets])


def _dot(ev, inst, operands):
    lhs, rhs = operands
    lb, lc, rb, rc = (list(inst.int_list_attr(key) or ()) for key in (
        "lhs_batch_dims", "lhs_contracting_dims", "rhs_batch_dims", "rhs_contracting_dims"))
    lf = [d for d in range(lhs.ndim) if d not in lb + lc]
    rf = [d for d in range(rhs.ndim) if d not in rb + rc]

    def size(x, dims):
        return int(np.prod([x.shape[d] for d in dims], dtype=np.int64))

    acc = accumulation_dtype(inst.shape.numpy_dtype)
    # As a batched matmul: [batch, free, contracting] x [batch, contracting, free].
    a = np.transpose(lhs, lb + lf + lc).reshape(size(lhs, lb), size(lhs, lf), size(lhs, lc))
    b = np.transpose(rhs, rb + rc + rf).reshape(size(rhs, rb), size(rhs, rc), size(rhs, rf))
    product = np.matmul(a.astype(acc), b.astype(acc))
    return product.reshape(inst.shape.dims).astype(inst.shape.numpy_dtype)


def convolution(ev, inst, operands):
    lhs, rhs = operands
    conv = ConvDims.parse(inst.attrs)
    if conv.batch_group_count != 1:
        raise UnsupportedOp(f"convolution with batch_group_count (%{inst.name})")
    spatial, groups, window = conv.spatial, conv.feature_group_count, conv.window
    acc = accumulation_dtype(inst.shape.numpy_dtype)
    # Canonical layouts: input [N, C, spatial...], kernel [O, I, spatial...].
    x = np.transpose(lhs, [conv.input_labels.index(c) for c in "bf" + spatial]).astype(acc)
    w = np.transpose(rhs, [conv.filter_labels.index(c) for c in "oi" + spatial]).astype(acc)
    w = np.flip(w, axis=[2 + i for i, r in enumerate(window.reversal) if r])
    x = window_pad(window, x, np.zeros((), acc), leading=2)
    out_sizes = [inst.shape.dims[conv.output_labels.index(c)] for c in spatial]
    batch, out_features, in_per_group = x.shape[0], w.shape[0], w.shape[1]
    x = x.reshape(batch, groups, in_per_group, *x.shape[2:])
    w = w.reshape(groups, out_features // groups, in_per_group, *w.shape[2:])
    result = np.zeros((batch, groups, out_features // groups, *out_sizes), acc)
    for offset in window_offsets(window):  # one matmul per kernel tap
        patch = x[(slice(None),) * 3 + window_slices(window, offset, out_sizes)]
        result += np.einsum("ngi...,goi->ngo...", patch, w[(Ellipsis,) + offset])
    result = result.reshape(batch, out_features, *out_sizes)
    canonical = "bf" + spatial
    return np.transpose(result, [canonical.index(c) for c in conv.output_labels]).astype(
        inst.shape.numpy_dtype)


OPS = {
    "reduce": _reduce,
    "reduce-window": _reduce_window,
    "select-and-scatter": _select_and_scatter,
    "scatter": _scatter,
    "dot": _dot,
    "convolution": convolution,
}
