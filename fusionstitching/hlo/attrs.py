"""HLO attributes the compiler reads, parsed in one place: windows, slices, padding, gather and
scatter dimension numbers, convolution labels, and printed literals.

``ir.Instruction.attrs`` keeps every attribute as its printed text; the evaluator and the code
generator read them through these parsers (each takes the attribute text, or the attrs map).
"""
from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .ir import Shape

_INT = re.compile(r"-?\d+")
_SLICE = re.compile(r"\[(-?\d+):(-?\d+)(?::(-?\d+))?\]")


def int_list(text: str | None) -> tuple[int, ...]:
    """``{1,0}`` -> (1, 0); an absent attribute (None) is empty."""
    return tuple(int(v) for v in _INT.findall(text or ""))


# -- windows, slices, padding ------------------------------------------------------------------

@dataclass(frozen=True)
class Window:
    """``window={size=3x3 stride=2x2 pad=0_1x0_1 lhs_dilate=.. rhs_dilate=.. rhs_reversal=..}``
    of reduce-window, select-and-scatter and convolution; absent fields take XLA's defaults."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]  # (low, high) per dimension
    base_dilation: tuple[int, ...]  # lhs_dilate
    window_dilation: tuple[int, ...]  # rhs_dilate
    reversal: tuple[int, ...]  # rhs_reversal

    @staticmethod
    @functools.lru_cache(maxsize=4096)  # the code generator asks once per value
    def parse(text: str | None, rank: int) -> Window:
        fields = dict(item.split("=", 1) for item in (text or "").strip("{} ").split())

        def ints(key: str, default: int) -> tuple[int, ...]:
            return tuple(int(v) for v in fields[key].split("x")) if key in fields \
                else (default,) * rank

        padding = (tuple(tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x"))
                   if "pad" in fields else ((0, 0),) * rank)
        return Window(ints("size", 1), ints("stride", 1), padding, ints("lhs_dilate", 1),
                      ints("rhs_dilate", 1), ints("rhs_reversal", 0))

    @property
    def undilated(self) -> bool:
        """No base or window dilation and no reversal: only size, stride and padding."""
        return all(d == 1 for d in self.base_dilation + self.window_dilation) and \
            not any(self.reversal)


class SliceDim(NamedTuple):
    """One dimension of ``slice={[start:limit:stride], ...}``."""

    start: int
    limit: int
    stride: int


@functools.lru_cache(maxsize=4096)  # the code generator asks once per value
def parse_slice(text: str | None) -> tuple[SliceDim, ...]:
    return tuple(SliceDim(int(a), int(b), int(s or 1)) for a, b, s in _SLICE.findall(text or ""))


class PaddingDim(NamedTuple):
    """One dimension of ``padding=low_high[_interior]x...`` (negative low/high cut elements)."""

    low: int
    high: int
    interior: int


@functools.lru_cache(maxsize=4096)  # the code generator asks once per value
def parse_padding(text: str | None) -> tuple[PaddingDim, ...]:
    dims = []
    for part in (text or "").split("x"):
        if not part:
            continue
        values = [int(v) for v in part.split("_")]
        if len(values) not in (2, 3):
            raise ValueError(f"padding dimension {part!r} is not low_high[_interior]")
        dims.append(PaddingDim(*values, *([0] * (3 - len(values)))))
    return tuple(dims)


# -- gather, scatter, convolution --------------------------------------------------------------

@dataclass(frozen=True)
class GatherDims:
    """A gather's dimension numbers and slice sizes."""

    offset_dims: tuple[int, ...]
    collapsed_slice_dims: tuple[int, ...]
    start_index_map: tuple[int, ...]
    index_vector_dim: int
    slice_sizes: tuple[int, ...]
    operand_batching_dims: tuple[int, ...]
    start_indices_batching_dims: tuple[int, ...]

    @staticmethod
    def parse(attrs: Mapping[str, str]) -> GatherDims:
        return GatherDims(*(int_list(attrs.get(k)) for k in (
            "offset_dims", "collapsed_slice_dims", "start_index_map")),
            int(attrs["index_vector_dim"]), *(int_list(attrs.get(k)) for k in (
                "slice_sizes", "operand_batching_dims", "start_indices_batching_dims")))


@dataclass(frozen=True)
class ScatterDims:
    """A scatter's dimension numbers."""

    update_window_dims: tuple[int, ...]
    inserted_window_dims: tuple[int, ...]
    scatter_dims_to_operand_dims: tuple[int, ...]
    index_vector_dim: int
    input_batching_dims: tuple[int, ...]
    scatter_indices_batching_dims: tuple[int, ...]

    @staticmethod
    def parse(attrs: Mapping[str, str]) -> ScatterDims:
        return ScatterDims(*(int_list(attrs.get(k)) for k in (
            "update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims")),
            int(attrs["index_vector_dim"]), *(int_list(attrs.get(k)) for k in (
                "input_batching_dims", "scatter_indices_batching_dims")))


@dataclass(frozen=True)
class ConvDims:
    """A convolution's ``dim_labels=b01f_01io->b01f`` (input, filter, output: ``b``/``f`` batch
    and feature, ``i``/``o`` filter input and output features, digits the spatial dims),
    ``window`` and group counts; also the form of XLA:GPU's cuDNN convolution calls."""

    input_labels: str
    filter_labels: str
    output_labels: str
    window: Window
    feature_group_count: int
    batch_group_count: int

    @property
    def spatial(self) -> str:
        """The spatial dims' labels in order: ``01`` for a 2-D convolution."""
        return "".join(str(i) for i in range(len(self.input_labels) - 2))

    @staticmethod
    def parse(attrs: Mapping[str, str]) -> ConvDims:
        input_labels, rest = attrs["dim_labels"].split("_", 1)
        filter_labels, output_labels = rest.split("->")
        return ConvDims(input_labels, filter_labels, output_labels,
                        Window.parse(attrs.get("window"), len(input_labels) - 2),
                        int(attrs.get("feature_group_count", "1")),
                        int(attrs.get("batch_group_count", "1")))


# -- literals ----------------------------------------------------------------------------------

def parse_literal(text: str, shape: Shape):
    """A printed HLO literal (``1.5``, ``{ {1, 2}, {3, 4} }``, ``-inf``, ``true``, tuples) as a
    numpy array of ``shape`` (a tuple of them for a tuple shape)."""
    text = text.strip()
    text = re.sub(r"^\w+\[[^\]]*\](\{[^}]*\})?\s*", "", text)  # old printers prefix the shape
    if "..." in text:
        raise ValueError("constant literal is elided ('{...}'); dump the HLO with large "
                         "constants printed (print_large_constants) to evaluate it")
    if shape.is_tuple:
        parts = _split_top_level(text[1:-1] if text.startswith("(") else text)
        return tuple(parse_literal(p, s) for p, s in zip(parts, shape.tuple_shapes))
    text = re.sub(r"nan\(0x[0-9a-fA-F]+\)", "nan", text)  # NaN payloads are not kept
    tokens = re.findall(r"[^\s{}(),]+", text)
    dtype = shape.numpy_dtype
    if dtype.kind == "c":  # complex elements print as (re, im)
        values = np.array([complex(float(r), float(i)) for r, i in zip(tokens[::2], tokens[1::2])])
    elif dtype.kind in "biu":
        values = np.array([int(_BOOL_WORDS.get(t, t)) for t in tokens], dtype=dtype)
    else:  # floats, including bf16/f8: parsed in f64 and rounded once
        values = np.array([float(t) for t in tokens], dtype=np.float64)
    if values.size != shape.num_elements:
        raise ValueError(f"literal has {values.size} values, shape {shape.dims} needs "
                         f"{shape.num_elements}")
    return values.astype(dtype).reshape(shape.dims)


_BOOL_WORDS = {"true": "1", "false": "0"}


# -- module header -----------------------------------------------------------------------------

_WHOLE_ALIAS = re.compile(r"\{(\d+)\}:\s*\((\d+),\s*\{\},\s*(?:may|must)-alias\)")


def input_output_alias(header_attrs: str) -> dict[int, int]:
    """{result index: parameter number} of the header's ``input_output_alias`` (the donated
    parameters), for whole results of a tuple root aliasing whole parameters."""
    for attr in _split_top_level(header_attrs):
        name, _, value = attr.partition("=")
        if name.strip() == "input_output_alias":
            return {int(out): int(param) for out, param in _WHOLE_ALIAS.findall(value)}
    return {}


def _split_top_level(text: str) -> list[str]:
    """Splits at commas outside any braces/parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "({":
            depth += 1
        elif ch in ")}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]
