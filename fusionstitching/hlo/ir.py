"""HLO IR: plain dataclasses for what XLA prints after optimization, and their text form.

Attributes are kept as their printed text, in order, so that printing reproduces the input
(``str(module)``, ``print_module``); hlo/attrs.py parses the ones the compiler reads.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field

import numpy as np

# HLO element types -> numpy dtypes (bf16 and the f8 types come from ml_dtypes, which jax ships).
try:
    import ml_dtypes

    # Sub-byte integers are one element per byte here, as numpy holds them (XLA packs them).
    _EXTRA = {name: np.dtype(getattr(ml_dtypes, attr)) for name, attr in (
        ("bf16", "bfloat16"), ("f8e4m3fn", "float8_e4m3fn"), ("f8e5m2", "float8_e5m2"),
        ("s2", "int2"), ("s4", "int4"), ("u2", "uint2"), ("u4", "uint4"))
        if hasattr(ml_dtypes, attr)}
except ImportError:  # pragma: no cover - jax always brings ml_dtypes
    _EXTRA = {}

NUMPY_DTYPES: dict[str, np.dtype] = {
    "pred": np.dtype(np.bool_),
    "s8": np.dtype(np.int8),
    "s16": np.dtype(np.int16),
    "s32": np.dtype(np.int32),
    "s64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32),
    "u64": np.dtype(np.uint64),
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "c64": np.dtype(np.complex64),
    "c128": np.dtype(np.complex128),
    **_EXTRA,
}

# Element sizes in bits for every primitive type XLA prints (including ones numpy lacks).
ELEMENT_BITS: dict[str, int] = {
    "pred": 8, "s2": 2, "s4": 4, "s8": 8, "s16": 16, "s32": 32, "s64": 64,
    "u2": 2, "u4": 4, "u8": 8, "u16": 16, "u32": 32, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f4e2m1fn": 4, "f8e3m4": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8,
    "f8e4m3fnuz": 8, "f8e5m2": 8, "f8e5m2fnuz": 8, "f8e8m0fnu": 8,
    "token": 0, "opaque": 0,
}


@dataclass(frozen=True)
class Shape:
    """An array shape ``f32[64,256]{1,0}``, a tuple shape ``(f32[], s32[2])``, or ``token[]``.

    ``layout`` is the minor-to-major order (None when the text has no layout);
    ``layout_suffix`` keeps anything printed after it inside the braces (tiling ``:T(8,128)``,
    memory space ``S(1)``) verbatim. ``dynamic`` marks bounded-dynamic dims (``<=8``).
    """

    dtype: str  # 'f32', 'pred', 'token', ... ; 'tuple' for tuple shapes
    dims: tuple[int, ...] = ()
    layout: tuple[int, ...] | None = None
    layout_suffix: str = ""
    dynamic: tuple[bool, ...] = ()
    tuple_shapes: tuple["Shape", ...] = ()

    @property
    def is_tuple(self) -> bool:
        return self.dtype == "tuple"

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def num_elements(self) -> int:
        return math.prod(self.dims)  # exact Python ints; np.prod costs ~1 s per 10^5 nodes

    @property
    def byte_size(self) -> int:
        """Bytes of the array (sum over leaves for tuples; tuples' own pointer tables ignored)."""
        if self.is_tuple:
            return sum(s.byte_size for s in self.tuple_shapes)
        return (self.num_elements * ELEMENT_BITS[self.dtype] + 7) // 8

    @property
    def numpy_dtype(self) -> np.dtype:
        return NUMPY_DTYPES[self.dtype]

    @property
    def minor_to_major(self) -> tuple[int, ...]:
        """The layout, defaulting to row-major as XLA does for shapes printed without one."""
        if self.layout is not None:
            return self.layout
        return tuple(range(self.rank - 1, -1, -1))

    def leaves(self) -> list["Shape"]:
        if not self.is_tuple:
            return [self]
        out: list[Shape] = []
        for s in self.tuple_shapes:
            out.extend(s.leaves())
        return out

    def same_array(self, other: "Shape") -> bool:
        """The same array in memory: element type, dimensions and physical layout (a shape
        printed without one is row-major)."""
        return (self.dtype, tuple(self.dims), self.minor_to_major) == \
            (other.dtype, tuple(other.dims), other.minor_to_major)

    def without_layout(self) -> "Shape":
        if self.is_tuple:
            return dataclasses.replace(
                self, tuple_shapes=tuple(s.without_layout() for s in self.tuple_shapes))
        return dataclasses.replace(self, layout=None, layout_suffix="")

    def __str__(self) -> str:
        return format_shape(self)


@dataclass
class Instruction:
    """One HLO instruction: ``[ROOT] %name = shape opcode(operands), attr=value, ...``.

    ``operands`` are instruction names (without ``%``) in the same computation. For ``constant``
    the literal text sits in ``literal`` and there are no operands; for ``parameter`` the number
    sits in ``parameter_number``. ``attrs`` maps attribute names to their printed value text, in
    printed order. ``operand_shapes`` keeps shapes that older printers write before operand
    names (``add(f32[] %a, f32[] %b)``), so they round-trip; None where absent.
    """

    name: str
    shape: Shape
    opcode: str
    operands: list[str] = field(default_factory=list)
    attrs: dict[str, str] = field(default_factory=dict)
    is_root: bool = False
    literal: str | None = None
    parameter_number: int | None = None
    operand_shapes: list[Shape | None] | None = None
    line: int = 0  # 1-based source line, for error messages (not part of equality)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Instruction):
            return NotImplemented
        fields = ("name", "shape", "opcode", "operands", "attrs", "is_root", "literal",
                  "parameter_number", "operand_shapes")
        return all(getattr(self, f) == getattr(other, f) for f in fields)

    # -- typed views of attributes the compiler reads ------------------------------------
    def int_list_attr(self, key: str) -> tuple[int, ...] | None:
        """``dimensions={1,0}`` -> (1, 0); None when the attribute is absent."""
        text = self.attrs.get(key)
        if text is None:
            return None
        body = text.strip().strip("{}").strip()
        return tuple(int(t) for t in body.split(",") if t.strip()) if body else ()

    @property
    def dimensions(self) -> tuple[int, ...]:
        return self.int_list_attr("dimensions") or ()

    @property
    def called_computations(self) -> list[str]:
        """Names of computations this instruction calls (fusion, reduce, while, ...)."""
        names: list[str] = []
        for key in ("calls", "to_apply", "condition", "body", "select", "scatter",
                    "branch_computations", "true_computation", "false_computation",
                    "called_computations", "async_execution_thread_computation"):
            text = self.attrs.get(key)
            if text is not None:
                names.extend(n.strip().lstrip("%") for n in text.strip("{}").split(",")
                             if n.strip())
        return names

    @property
    def control_predecessors(self) -> list[str]:
        """``control-predecessors={%a, %b}`` -> ["a", "b"]."""
        text = self.attrs.get("control-predecessors", "")
        return [n.strip().lstrip("%") for n in text.strip("{}").split(",") if n.strip()]

    def without_control_predecessors(self, gone) -> "Instruction":
        """This instruction without the control predecessors named in ``gone`` (itself when
        none of them is)."""
        names = self.control_predecessors
        kept = [n for n in names if n not in gone]
        if kept == names:
            return self
        attrs = {k: v for k, v in self.attrs.items() if k != "control-predecessors"}
        if kept:
            attrs["control-predecessors"] = "{" + ", ".join(f"%{n}" for n in kept) + "}"
        return dataclasses.replace(self, attrs=attrs)

    @property
    def literal_elided(self) -> bool:
        """A constant printed as ``{...}`` (``as_text()`` elides large ones): its values are lost."""
        return self.opcode == "constant" and "..." in (self.literal or "")

    @property
    def fusion_kind(self) -> str | None:
        return self.attrs.get("kind")

    @property
    def custom_call_target(self) -> str | None:
        text = self.attrs.get("custom_call_target")
        return text.strip('"') if text is not None else None

    def attr_json(self, key: str = "backend_config"):
        """The JSON payload of ``backend_config`` (or another JSON attribute), or None."""
        text = self.attrs.get(key)
        if text is None:
            return None
        text = text.strip()
        if text.startswith('"'):  # older printers quote the JSON as a string
            text = json.loads(text)
        try:
            return json.loads(text)
        except ValueError:
            return None


@dataclass
class Computation:
    """A named computation; ``instructions`` in printed order (operands before users)."""

    name: str
    instructions: list[Instruction]
    is_entry: bool = False
    suffix: str = ""  # text after the signature, e.g. ``, execution_thread="main"``
    line: int = 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Computation):
            return NotImplemented
        return (self.name, self.instructions, self.is_entry, self.suffix) == (
            other.name, other.instructions, other.is_entry, other.suffix)

    @property
    def root(self) -> Instruction:
        for inst in self.instructions:
            if inst.is_root:
                return inst
        return self.instructions[-1]

    @property
    def parameters(self) -> list[Instruction]:
        params = [i for i in self.instructions if i.opcode == "parameter"]
        return sorted(params, key=lambda i: i.parameter_number)

    def by_name(self) -> dict[str, Instruction]:
        return {i.name: i for i in self.instructions}

    def users(self) -> dict[str, list[str]]:
        """Instruction name -> names of the instructions that use it (in order, no repeats)."""
        out: dict[str, list[str]] = {i.name: [] for i in self.instructions}
        for inst in self.instructions:
            for op in dict.fromkeys(inst.operands):
                out[op].append(inst.name)
        return out

    def __getstate__(self) -> dict:  # pickled and copied without the kept index
        return {k: v for k, v in self.__dict__.items() if k != "_index"}

    def index(self) -> ComputationIndex:
        """``by_name``, ``users`` and each instruction's position, built once and kept while
        ``instructions`` is the same list of the same length (the explorer's queries flatten
        thousands of patterns of one entry; a change in place that keeps the length is not
        seen)."""
        kept = self.__dict__.get("_index")
        if kept is None or kept[0] is not self.instructions or kept[1] != len(kept[0]):
            index = ComputationIndex(self.by_name(), self.users(),
                                     {inst.name: k for k, inst in enumerate(self.instructions)})
            kept = self.__dict__["_index"] = (self.instructions, len(self.instructions), index)
        return kept[2]


@dataclass(frozen=True)
class ComputationIndex:
    """Lookups over one computation's instructions (`Computation.index`); not to be changed."""

    by_name: dict[str, Instruction]
    users: dict[str, list[str]]
    position: dict[str, int]


@dataclass
class Module:
    """An HLO module: header attributes, debug-info sections and computations in order."""

    name: str
    computations: list[Computation]
    header_attrs: str = ""  # text after the module name, e.g. ``is_scheduled=true, ...``
    sections: list[tuple[str, list[str]]] = field(default_factory=list)  # FileNames etc.
    source: str = "<string>"  # file the module was read from (not part of equality)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Module):
            return NotImplemented
        return (self.name, self.computations, self.header_attrs, self.sections) == (
            other.name, other.computations, other.header_attrs, other.sections)

    @property
    def entry(self) -> Computation:
        entry = self._lookups()[1]
        return entry if entry is not None else self.computations[-1]

    def __getstate__(self) -> dict:  # pickled and copied without the kept lookups
        return {k: v for k, v in self.__dict__.items() if k != "_kept_lookups"}

    def computation(self, name: str) -> Computation:
        return self._lookups()[0][name]

    def _lookups(self) -> tuple[dict[str, Computation], Computation | None]:
        """The computations by name (the first of a name) and the ENTRY one, kept while
        ``computations`` is the same list of the same length: code generation looks up each
        fusion's computation and the entry, in modules of thousands."""
        kept = self.__dict__.get("_kept_lookups")
        if kept is None or kept[0] is not self.computations or kept[1] != len(kept[0]):
            by_name: dict[str, Computation] = {}
            for comp in self.computations:
                by_name.setdefault(comp.name, comp)
            entry = next((c for c in self.computations if c.is_entry), None)
            kept = self.__dict__["_kept_lookups"] = (self.computations, len(self.computations),
                                                by_name, entry)
        return kept[2], kept[3]

    def computation_map(self) -> dict[str, Computation]:
        return {c.name: c for c in self.computations}

    def called_by(self, instructions: list["Instruction"]) -> set[str]:
        """Names of the computations ``instructions`` call, transitively."""
        found, stack = set(), [c for i in instructions for c in i.called_computations]
        while stack:
            name = stack.pop()
            if name not in found:
                found.add(name)
                stack += [c for i in self.computation(name).instructions
                          for c in i.called_computations]
        return found

    def __str__(self) -> str:
        return print_module(self)


class HloParseError(ValueError):
    """Malformed HLO text: names file:line:column and what was expected there."""

    def __init__(self, source: str, line: int, column: int, message: str):
        self.source, self.line, self.column, self.message = source, line, column, message
        super().__init__(f"{source}:{line}:{column}: {message}")


_NAME_RE = re.compile(r"[A-Za-z_][\w.\-]*")


def is_valid_name(name: str) -> bool:
    return bool(_NAME_RE.fullmatch(name))


# -- the text form, in the layout ``HloModule::ToString`` uses ----------------------------------
# It parses back to an equal Module (parser.parse_module) and XLA's own parser accepts it. Like
# XLA, long tuple shapes and operand lists get ``/*index=N*/`` markers every five elements.

def _join_indexed(items: list[str]) -> str:
    """``a, b, c, d, e, /*index=5*/f``: XLA's markers that help reading long lists."""
    return ", ".join(f"/*index={i}*/{s}" if i and i % 5 == 0 else s
                     for i, s in enumerate(items))


def format_shape(shape: Shape) -> str:
    if shape.is_tuple:
        return "(" + _join_indexed([format_shape(s) for s in shape.tuple_shapes]) + ")"
    dynamic = shape.dynamic or (False,) * len(shape.dims)
    dims = ",".join(("<=" if dyn else "") + str(d) for d, dyn in zip(shape.dims, dynamic))
    text = f"{shape.dtype}[{dims}]"
    if shape.layout is not None:
        text += "{" + ",".join(map(str, shape.layout)) + shape.layout_suffix + "}"
    return text


def print_instruction(inst: Instruction) -> str:
    """One instruction line, without indentation."""
    if inst.opcode == "constant":
        args = inst.literal or ""
    elif inst.opcode == "parameter":
        args = str(inst.parameter_number)
    else:
        shapes = inst.operand_shapes or [None] * len(inst.operands)
        args = _join_indexed([(f"{format_shape(s)} " if s is not None else "") + f"%{name}"
                              for s, name in zip(shapes, inst.operands)])
    attrs = "".join(f", {key}={value}" for key, value in inst.attrs.items())
    root = "ROOT " if inst.is_root else ""
    return f"{root}%{inst.name} = {format_shape(inst.shape)} {inst.opcode}({args}){attrs}"


def print_computation(comp: Computation) -> str:
    """``[ENTRY] %name (p: shape, ...) -> shape {`` + indented instructions + ``}``.

    The signature is derived from the parameters and root (shapes without layout, as XLA
    prints it), so it cannot disagree with the body.
    """
    params = ", ".join(f"{p.name}: {format_shape(p.shape.without_layout())}"
                       for p in comp.parameters)
    result = format_shape(comp.root.shape.without_layout())
    lines = [f"{'ENTRY ' if comp.is_entry else ''}%{comp.name} ({params}) -> {result} {{"]
    lines += [f"  {print_instruction(inst)}" for inst in comp.instructions]
    lines.append("}" + comp.suffix)
    return "\n".join(lines)


def print_module(module: Module) -> str:
    header = f"HloModule {module.name}"
    if module.header_attrs:
        header += f", {module.header_attrs}"
    out = [header + "\n\n"]
    for title, lines in module.sections:
        out.append(title + "\n" + "".join(line + "\n" for line in lines) + "\n")
    if module.sections:
        out.append("\n")
    out += [print_computation(comp) + "\n\n" for comp in module.computations]
    return "".join(out)
