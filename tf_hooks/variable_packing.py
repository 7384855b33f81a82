"""Small captured variables travel packed into jax: the read graph returns each dtype's small
variables as one flat tensor, and one jax executable slices them back. Each tensor's DLPack
import costs ~14 us in a quiet process, where copying a small variable costs less; measured
in benchmarks/README.md (thirtieth session). Imported at interpreter start with tf_hooks, so
TF is imported only inside the function that traces with it (tf_hooks/__init__.py)."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

# A variable of at most this many bytes is packed: its copy (twice, into the packed tensor
# and out of it) costs less than an import of its own (~14 us; this CPU copies ~100 KB in that).
PACK_MAX_BYTES = 64 << 10


@dataclass(frozen=True)
class PackedGroup:
    """Variables of one dtype read as one flat tensor, in this order."""

    dtype: str  # numpy dtype name
    variables: tuple[int, ...]  # indices into the signature's variables
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]  # each variable's start in the flat tensor, then its length


@dataclass(frozen=True)
class Packing:
    groups: tuple[PackedGroup, ...]
    whole: tuple[int, ...]  # variables read as they are: large ones, and lone small ones


def packing(variables: list) -> Packing:
    """How the variables ((dims, numpy dtype) each, in parameter order) are read. Nothing
    here imports numpy or TF at module level: the package is imported at start-up."""
    small: dict[str, list[int]] = {}
    whole = []
    for index, (dims, dtype) in enumerate(variables):
        if math.prod(dims) * dtype.itemsize <= PACK_MAX_BYTES:
            small.setdefault(dtype.name, []).append(index)
        else:
            whole.append(index)
    groups = []
    for dtype, members in small.items():
        if len(members) < 2:  # nothing saved: one import either way
            whole.extend(members)
            continue
        sizes = [math.prod(variables[i][0]) for i in members]
        groups.append(PackedGroup(dtype, tuple(members),
                                  tuple(tuple(variables[i][0]) for i in members),
                                  tuple(itertools.accumulate([0] + sizes))))
    return Packing(tuple(groups), tuple(sorted(whole)))


def read_outputs(packing: Packing, read):
    """The read graph's outputs (call while tracing it): per group one flat tensor of its
    variables, then each whole variable; ``read(index)`` reads one variable."""
    import tensorflow as tf

    packed = [tf.concat([tf.reshape(read(i), [-1]) for i in group.variables], 0)
              for group in packing.groups]
    return packed + [read(i) for i in packing.whole]


def unpacked(packing: Packing, *flat):
    """The groups' variables, in group order, sliced from their flat tensors (jax, traced)."""
    return [tensor[start:end].reshape(shape)
            for group, tensor in zip(packing.groups, flat)
            for shape, start, end in zip(group.shapes, group.offsets, group.offsets[1:])]


def in_parameter_order(packing: Packing, unpacked_arrays: list, whole_arrays: list) -> list:
    """Every variable's array in the signature's order."""
    arrays: list = [None] * (len(packing.whole) + sum(len(g.variables) for g in packing.groups))
    for index, array in zip(packing.whole, whole_arrays):
        arrays[index] = array
    members = (i for group in packing.groups for i in group.variables)
    for index, array in zip(members, unpacked_arrays, strict=True):
        arrays[index] = array
    return arrays
