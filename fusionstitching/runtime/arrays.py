"""Array helpers of the executor: copies of a call's arrays on their devices, and numpy views
of outputs for checks (typed PRNG keys as their key data)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def numpy_leaves(tree) -> list:
    """The array leaves of ``tree`` as numpy arrays; a typed PRNG key (flax nnx's ``rngs``
    state) as its key data, the unsigned words XLA's module computes with."""
    leaves = jax.tree_util.tree_leaves(tree)
    return [np.asarray(jax.device_get(jax.random.key_data(leaf) if is_key(leaf) else leaf))
            for leaf in leaves]


def is_key(leaf) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def is_float(leaf) -> bool:
    return hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating)


def copies(tree):
    """Copies of the array leaves of ``tree`` on their device, in one batched ``device_put``
    (``x.copy()`` would compile a copy computation per shape: ~300 ms on the deciding call of
    the MLP step); Python scalars are immutable and kept."""
    leaves, structure = jax.tree_util.tree_flatten(tree)
    # jax arrays where they are (a multi-process job's arrays only by their sharding), the
    # others (numpy) on the default device
    placed = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]
    other = [i for i, leaf in enumerate(leaves)
             if hasattr(leaf, "shape") and not isinstance(leaf, jax.Array)]
    copied = jax.device_put([leaves[i] for i in placed], [leaves[i].sharding for i in placed],
                            may_alias=False)
    copied += jax.device_put([leaves[i] for i in other], may_alias=False)
    for i, copy in zip(placed + other, copied):
        leaves[i] = copy
    return jax.tree_util.tree_unflatten(structure, leaves)
