"""Elided constants: ``as_text()`` prints a large constant as ``{...}``.

Planning needs no values (an elided constant is a buffer read from memory, as XLA:GPU keeps
large constants); checking numbers does: `fill_elided` gives every elided constant seeded
values that both plans and XLA's own parser then read alike.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .ir import Computation, Module, Shape


def elided_constants(module: Module) -> list[str]:
    """Names of the module's elided constants, in every computation."""
    return [i.name for c in module.computations for i in c.instructions if i.literal_elided]


def fill_elided(module: Module, seed: int = 0) -> Module:
    """The module with each elided constant's ``{...}`` replaced by seeded values: floats in
    [-1, 1) (a position table, a mask of 0/1, a scale: finite wherever the step is), integers
    and predicates 0 or 1 (mostly indices and masks, valid for any size)."""
    rng = np.random.default_rng(seed)

    def filled(comp: Computation) -> Computation:
        return dataclasses.replace(comp, instructions=[
            dataclasses.replace(i, literal=format_literal(_values(i.shape, rng), i.shape))
            if i.literal_elided else i for i in comp.instructions])

    return dataclasses.replace(module, computations=[filled(c) for c in module.computations])


def _values(shape: Shape, rng: np.random.Generator) -> np.ndarray:
    dtype = shape.numpy_dtype
    if dtype == np.bool_ or np.issubdtype(dtype, np.integer):
        return rng.integers(0, 2, size=shape.dims).astype(dtype)
    return rng.uniform(-1.0, 1.0, size=shape.dims).astype(dtype)


def format_literal(values: np.ndarray, shape: Shape) -> str:
    """An array as HLO literal text (``{ {1, 2}, {3, 4} }``), exact for its element type."""
    if shape.dtype == "pred":
        words = ["true" if v else "false" for v in values.reshape(-1)]
    elif values.dtype.kind in "iu":
        words = [str(int(v)) for v in values.reshape(-1)]
    elif values.dtype.kind == "c":
        words = [f"({float(v.real)!r}, {float(v.imag)!r})" for v in values.reshape(-1)]
    else:  # the shortest f64 text of a value of a narrower type reads back as that value
        words = [repr(float(v)) for v in values.reshape(-1)]
    return _nest(words, list(shape.dims))


def _nest(words: list[str], dims: list[int]) -> str:
    if not dims:
        return words[0]
    if len(dims) == 1:
        return "{" + ", ".join(words) + "}"
    step = len(words) // dims[0] if dims[0] else 0
    return "{ " + ", ".join(_nest(words[k * step:(k + 1) * step], dims[1:])
                            for k in range(dims[0])) + " }"
