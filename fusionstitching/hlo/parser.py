"""HLO text -> ``ir.Module``: a small cursor-based lexer and a recursive-descent parser.

It reads what XLA's ``HloModule::ToString`` prints, with comments between tokens as XLA's own
lexer allows. Attribute values and constant literals stay raw text. The bracket scanner keeps
an explicit stack and tuple shapes have a depth limit, so any input ends in either a Module or
an HloParseError, never an IndexError or RecursionError.
"""
from __future__ import annotations

import bisect
import gzip
import re
import zlib
from pathlib import Path

from .ir import ELEMENT_BITS, Computation, HloParseError, Instruction, Module, Shape

_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_WORD = re.compile(r"[\w.\-]+")
_INT = re.compile(r"-?\d+")
_SPACE = re.compile(r"\s*")
_SPACE_START = frozenset(" \t\r\n\f\v/")
_DIM = re.compile(r"(<=)?(\d+)")
_MINOR_TO_MAJOR = re.compile(r"\d+(?:,\d+)*")
_OPCODE = re.compile(r"[A-Za-z][\w\-]*")
_DTYPE = re.compile(r"[a-z][a-z0-9]*(?=\[)")
_SECTION_LINE = re.compile(r"[A-Za-z_]\w*[ \t\r]*")
# Runs of characters the bracket scanner may skip in one step: outside brackets a value also
# ends at whitespace and commas, inside brackets those are ordinary text.
_PLAIN_TOP = re.compile(r'[^"{}\[\]()/,\s]+')
_PLAIN_NESTED = re.compile(r'[^"{}\[\]()/]+')
_STRING = re.compile(r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"')  # linear: the alternatives are disjoint
_CLOSER = {"{": "}", "[": "]", "(": ")"}
_ATTR_STOP = frozenset(", \t\r\n")

# Real modules nest tuples a few levels deep; the limit keeps hostile input from reaching
# Python's recursion limit.
_MAX_TUPLE_DEPTH = 100


def parse_module(text: str, source: str = "<string>") -> Module:
    """Parse one HLO module (``HloModule::ToString`` output or an XLA ``--xla_dump_to`` file)."""
    return _Parser(text, source).module()


# The largest HLO text read (after decompression). The biggest corpus module, a ConvNeXt
# training step, is 1.6 MB; a gzip bomb of 10 MB inflates to gigabytes. Parsing alone needs
# ~11x the text's size and planning more, so 64 MiB keeps replay's memory near 2 GB or less.
MAX_HLO_BYTES = 64 << 20
_GZIP_CHUNK = 1 << 20


def read_hlo_text(path) -> str:
    """The text of an HLO file; a ``.gz`` file (a gzipped dump, a large corpus module) is
    decompressed as a stream. A file that is not UTF-8 text, a damaged ``.gz``, or text over
    ``MAX_HLO_BYTES`` is an HloParseError naming where (so a bad file is reported like a
    syntax error, never a traceback, and a gzip bomb is stopped at the cap)."""
    path = Path(path)
    data = _read_gzip(path) if path.suffix == ".gz" else _read_plain(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[:exc.start]
        line, column = before.count(b"\n") + 1, exc.start - (before.rfind(b"\n") + 1) + 1
        raise HloParseError(str(path), line, column, "not UTF-8 text") from None


def _too_large(path: Path) -> HloParseError:
    return HloParseError(str(path), 1, 1, f"more than {MAX_HLO_BYTES >> 20} MiB of HLO text "
                                          f"(fusionstitching.hlo.parser.MAX_HLO_BYTES)")


def _read_plain(path: Path) -> bytes:
    if path.stat().st_size > MAX_HLO_BYTES:
        raise _too_large(path)
    return path.read_bytes()


def _read_gzip(path: Path) -> bytes:
    """The decompressed bytes, read in chunks and stopped one chunk past the cap."""
    chunks, size = [], 0
    with open(path, "rb") as raw:  # a missing or unreadable file stays an OSError
        try:
            with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                while chunk := f.read(_GZIP_CHUNK):
                    size += len(chunk)
                    if size > MAX_HLO_BYTES:
                        raise _too_large(path)
                    chunks.append(chunk)
        except (OSError, EOFError, zlib.error) as exc:
            raise HloParseError(str(path), 1, 1, f"not a readable gzip file ({exc})") from None
    return b"".join(chunks)


def parse_file(path) -> Module:
    return parse_module(read_hlo_text(path), source=str(path))


def parse_shape(text: str, source: str = "<shape>") -> Shape:
    """Parse a shape such as ``f32[64,256]{1,0}`` or ``(s32[], token[])``."""
    parser = _Parser(text, source)
    shape = parser.shape()
    parser.expect_end()
    return shape


class _Parser:
    def __init__(self, text: str, source: str):
        self.text = text
        self.source = source
        self.pos = 0
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    # -- positions and errors ---------------------------------------------------------------
    def line_col(self, pos: int) -> tuple[int, int]:
        line = bisect.bisect_right(self._line_starts, pos)
        return line, pos - self._line_starts[line - 1] + 1

    def fail(self, message: str, pos: int | None = None) -> HloParseError:
        line, col = self.line_col(self.pos if pos is None else pos)
        return HloParseError(self.source, line, col, message)

    def expected(self, what: str, pos: int | None = None) -> HloParseError:
        pos = self.pos if pos is None else pos
        return self.fail(f"expected {what}, got {self.describe(pos)}", pos)

    def describe(self, pos: int) -> str:
        if pos >= len(self.text):
            return "end of input"
        if self.text[pos] == "\n":
            return "end of line"
        m = _WORD.match(self.text, pos)
        return repr(m.group()[:40] if m else self.text[pos])

    # -- lexing ---------------------------------------------------------------------------
    def skip_space(self) -> None:
        text, pos = self.text, self.pos
        if text[pos:pos + 1] not in _SPACE_START:
            return  # the common case, kept cheap: this runs before every token
        while True:
            pos = _SPACE.match(text, pos).end()
            if text.startswith("/*", pos):
                end = text.find("*/", pos + 2)
                if end < 0:
                    raise self.fail("unterminated /* comment", pos)
                pos = end + 2
            elif text.startswith("//", pos):
                end = text.find("\n", pos)
                pos = len(text) if end < 0 else end
            else:
                break
        self.pos = pos

    def peek(self) -> str:
        """The next significant character ('' at end of input)."""
        self.skip_space()
        return self.text[self.pos:self.pos + 1]

    def accept(self, token: str) -> bool:
        """Consume ``token`` if it comes next; otherwise leave the position alone (so that
        end_of_line can still see where the previous token ended)."""
        start = self.pos
        self.skip_space()
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        self.pos = start
        return False

    def expect(self, token: str, what: str | None = None) -> None:
        if not self.accept(token):
            raise self.expected(what or repr(token))

    def expect_end(self) -> None:
        self.skip_space()
        if self.pos < len(self.text):
            raise self.expected("end of input")

    def match(self, regex: re.Pattern, what: str) -> str:
        self.skip_space()
        m = regex.match(self.text, self.pos)
        if not m:
            raise self.expected(what)
        self.pos = m.end()
        return m.group()

    def name(self, what: str = "name") -> str:
        """A name with its optional ``%`` sigil removed."""
        self.skip_space()
        start = self.pos
        if self.text.startswith("%", start):
            self.pos += 1
        m = _NAME.match(self.text, self.pos)
        if not m:
            raise self.expected(what, start)
        self.pos = m.end()
        return m.group()

    def keyword(self, word: str) -> bool:
        """Consume ``word`` if it is the next whole word (``ROOT``, ``ENTRY``)."""
        self.skip_space()
        m = _NAME.match(self.text, self.pos)
        if m and m.group() == word:
            self.pos = m.end()
            return True
        return False

    def integer(self, what: str) -> int:
        return int(self.match(_INT, what))

    def raw(self, stop: frozenset[str] | str, what: str) -> str:
        """Raw text up to a ``stop`` character (or unmatched closing bracket) outside brackets.

        Brackets must nest properly and strings may hold anything; ``/* */`` comments are
        dropped (XLA's ``/*index=N*/`` markers), so values compare equal however printed.
        """
        start = self.pos  # an empty value is reported where it should have begun
        self.skip_space()
        text, pos = self.text, self.pos
        pieces: list[str] = []
        open_brackets: list[tuple[str, int]] = []  # (expected closer, position of opener)
        while pos < len(text):
            c = text[pos]
            if c == '"':
                m = _STRING.match(text, pos)
                if not m:
                    raise self.fail("unterminated string", pos)
                pieces.append(m.group())
                pos = m.end()
            elif c == "/" and text.startswith("/*", pos):
                end = text.find("*/", pos + 2)
                if end < 0:
                    raise self.fail("unterminated /* comment", pos)
                pos = end + 2
            elif c in _CLOSER:
                open_brackets.append((_CLOSER[c], pos))
                pieces.append(c)
                pos += 1
            elif c in ")]}":
                if not open_brackets:
                    break  # closes something the caller opened
                closer, _ = open_brackets.pop()
                if c != closer:
                    raise self.expected(repr(closer), pos)
                pieces.append(c)
                pos += 1
            elif not open_brackets and c in stop:
                break
            else:
                plain = _PLAIN_NESTED if open_brackets else _PLAIN_TOP
                m = plain.match(text, pos)
                end = m.end() if m else pos + 1
                pieces.append(text[pos:end])
                pos = end
        if open_brackets:
            closer, opened = open_brackets[-1]
            raise self.expected(f"{closer!r} to close {text[opened]!r} at "
                                f"{':'.join(map(str, self.line_col(opened)))}", pos)
        self.pos = pos
        value = "".join(pieces).strip()
        if not value:
            raise self.expected(what, start)
        return value

    def attribute(self, attrs: dict[str, str], positions: dict[str, int]) -> None:
        """``name=value`` into ``attrs``; ``positions`` records where each value starts."""
        self.skip_space()
        key_pos = self.pos
        key = self.match(_NAME, "attribute name")
        if key in attrs:
            raise self.fail(f"duplicate attribute {key!r}", key_pos)
        self.expect("=")
        positions[key] = self.pos
        attrs[key] = self.raw(_ATTR_STOP, f"value of attribute {key!r}")
        if attrs[key].startswith("mesh["):  # replica_groups=mesh['x'=2,'y'=4] {'y'}
            self._mesh_rest(attrs, key)

    def _mesh_rest(self, attrs: dict[str, str], key: str) -> None:
        """The rest of a mesh-form value: ``, device_ids=(...)`` and the ``{axes}``."""
        mark = self.pos
        if self.accept(",") and self.keyword("device_ids"):
            self.expect("=")
            attrs[key] += ", device_ids=" + self.raw(_ATTR_STOP, "device_ids")
        else:
            self.pos = mark  # the comma before the next attribute
        self.skip_space()
        if self.peek() == "{":
            attrs[key] += " " + self.raw(_ATTR_STOP, f"axes of attribute {key!r}")

    # -- shapes ---------------------------------------------------------------------------
    def shape(self, depth: int = 0) -> Shape:
        self.skip_space()
        if self.accept("("):
            if depth >= _MAX_TUPLE_DEPTH:
                raise self.fail("tuple shape nested too deeply")
            elements: list[Shape] = []
            if not self.accept(")"):
                elements.append(self.shape(depth + 1))
                while not self.accept(")"):
                    self.expect(",", "',' or ')' in tuple shape")
                    elements.append(self.shape(depth + 1))
            return Shape("tuple", tuple_shapes=tuple(elements))
        start = self.pos
        m = _DTYPE.match(self.text, start)
        if not m or m.group() not in ELEMENT_BITS:
            raise self.expected("shape", start)
        dims_start = m.end() + 1  # past '['
        line_end = self.text.find("\n", dims_start)
        line_end = len(self.text) if line_end < 0 else line_end
        # Shapes never span lines: a missing ']' is reported on the shape's own line.
        dims_end = self.text.find("]", dims_start, line_end)
        closed = dims_end >= 0
        dims_end = dims_end if closed else line_end
        dims: list[int] = []
        dynamic: list[bool] = []
        pos = dims_start
        # Dimensions are printed without spaces; read them as one comma-separated run.
        for item in self.text[dims_start:dims_end].split(",") if dims_end > dims_start else ():
            dim = _DIM.fullmatch(item)
            if not dim:
                what = "unbounded dynamic dimension '?' is not supported" if item == "?" else \
                    f"expected dimension size, got {item[:40]!r}"
                raise self.fail(what, pos)
            dynamic.append(dim.group(1) is not None)
            dims.append(int(dim.group(2)))
            pos += len(item) + 1
        if not closed:
            raise self.expected("']' closing the dimensions", line_end)
        self.pos = dims_end + 1
        layout, suffix = None, ""
        if self.text.startswith("{", self.pos):  # a layout only when glued to ']'
            self.pos += 1
            layout_pos = self.pos
            layout, suffix = self.layout()
            # Every stage indexes dimensions through the layout: it must order all of them.
            if sorted(layout) != list(range(len(dims))):
                raise self.fail(f"layout {{{','.join(map(str, layout))}}} is not an order of "
                                f"the {len(dims)} dimensions", layout_pos)
        return Shape(m.group(), tuple(dims), layout, suffix,
                     tuple(dynamic) if any(dynamic) else ())

    def layout(self) -> tuple[tuple[int, ...], str]:
        """After ``{``: minor-to-major numbers, then ``:tiling/memory space...`` kept raw."""
        m = _MINOR_TO_MAJOR.match(self.text, self.pos)
        minor_to_major = tuple(map(int, m.group().split(","))) if m else ()
        self.pos = m.end() if m else self.pos
        suffix = ""
        if self.accept(":"):
            suffix = ":" + self.raw("}", "layout attributes")
        self.expect("}", "'}' closing the layout")
        return minor_to_major, suffix

    # -- instructions -----------------------------------------------------------------------
    def operand(self, defined: set[str]) -> tuple[Shape | None, str]:
        """``%name`` or, as older printers write it, ``f32[] %name``."""
        self.skip_space()
        shape = None
        if self.text.startswith("(", self.pos) or _DTYPE.match(self.text, self.pos):
            shape = self.shape()
        self.skip_space()
        pos = self.pos
        name = self.name("operand name")
        if name not in defined:
            raise self.fail(f"undefined operand %{name}", pos)
        return shape, name

    def instruction(self, defined: set[str], called: list[tuple[str, int]]) -> Instruction:
        self.skip_space()
        line = self.line_col(self.pos)[0]
        is_root = self.keyword("ROOT")
        self.skip_space()
        name_pos = self.pos
        name = self.name("instruction name")
        if name in defined:
            raise self.fail(f"duplicate instruction name %{name}", name_pos)
        self.expect("=")
        shape = self.shape()
        opcode = self.match(_OPCODE, "opcode")
        self.expect("(", "'(' after opcode")
        inst = Instruction(name=name, shape=shape, opcode=opcode, is_root=is_root, line=line)
        if opcode == "constant":
            inst.literal = self.raw(")", "literal")
        elif opcode == "parameter":
            inst.parameter_number = self.integer("parameter number")
            if inst.parameter_number < 0:
                raise self.fail("negative parameter number")
        elif self.peek() != ")":
            operands = [self.operand(defined)]
            while self.accept(","):
                operands.append(self.operand(defined))
            inst.operands = [n for _, n in operands]
            if any(s is not None for s, _ in operands):
                inst.operand_shapes = [s for s, _ in operands]
        self.expect(")", "',' or ')' after operands")
        positions: dict[str, int] = {}
        while self.accept(","):
            self.attribute(inst.attrs, positions)
        for key, pos in positions.items():
            if key in _CALLING_ATTRS:
                called.extend((n, pos) for n in _computation_names(inst.attrs[key]))
        for key in _REQUIRED_CALLS.get(opcode, ()):
            if not _computation_names(inst.attrs.get(key, "")):
                raise self.fail(f"{opcode} %{name} needs attribute {key}=%computation")
        self.end_of_line("',' or end of line after instruction")
        defined.add(name)
        return inst

    def end_of_line(self, what: str) -> None:
        """Instructions end at a newline (or a '}' on the same line, for one-line snippets)."""
        end = self.pos
        self.skip_space()
        if self.pos < len(self.text) and "\n" not in self.text[end:self.pos] \
                and self.text[self.pos] != "}":
            raise self.expected(what)

    # -- computations and modules -----------------------------------------------------------
    def computation(self, called: list[tuple[str, int]]) -> Computation:
        self.skip_space()
        line = self.line_col(self.pos)[0]
        is_entry = self.keyword("ENTRY")
        name = self.name("computation name")
        result, result_pos = None, 0
        if self.peek() == "(":
            self.signature_parameters()
            self.expect("->", "'->' after parameter list")
            self.skip_space()
            result_pos = self.pos
            result = self.shape()
        self.expect("{", "'{' opening the computation body")
        instructions: list[Instruction] = []
        defined: set[str] = set()
        parameter_numbers: set[int] = set()
        has_root = False
        while self.peek() != "}":
            inst_pos = self.pos
            inst = self.instruction(defined, called)
            if inst.is_root and has_root:
                raise self.fail(f"second ROOT in computation %{name}", inst_pos)
            has_root |= inst.is_root
            if inst.parameter_number is not None:
                if inst.parameter_number in parameter_numbers:
                    raise self.fail(f"duplicate parameter({inst.parameter_number})", inst_pos)
                parameter_numbers.add(inst.parameter_number)
            instructions.append(inst)
        if not instructions:
            raise self.expected("instruction")
        self.pos += 1  # past '}'
        comp = Computation(name, instructions, is_entry=is_entry, line=line)
        if result is not None and result.without_layout() != comp.root.shape.without_layout():
            raise self.fail(f"computation %{name} declares result {result} but its root "
                            f"%{comp.root.name} has shape {comp.root.shape}", result_pos)
        attrs: dict[str, str] = {}
        while self.accept(","):
            self.attribute(attrs, {})
        comp.suffix = "".join(f", {k}={v}" for k, v in attrs.items())
        return comp

    def signature_parameters(self) -> None:
        """``(name: shape, ...)``: checked for syntax only; the parameter instructions rule."""
        self.expect("(")
        if self.accept(")"):
            return
        while True:
            self.name("parameter name")
            self.expect(":", "':' after parameter name")
            self.shape()
            if self.accept(")"):
                return
            self.expect(",", "',' or ')' in parameter list")

    def module(self) -> Module:
        self.skip_space()
        if not self.keyword("HloModule"):
            raise self.expected("'HloModule'")
        name = self.name("module name")
        header_attrs = ""
        if self.accept(","):
            self.skip_space()
            start = self.pos
            self.attribute({}, {})
            while self.accept(","):
                self.attribute({}, {})
            header_attrs = self.text[start:self.pos]
        self.end_of_line("',' or end of line after module header")
        sections = self.sections()
        computations: list[Computation] = []
        called: list[tuple[str, int]] = []
        positions: dict[str, int] = {}  # computation name -> where it starts
        while self.peek():
            pos = self.pos
            comp = self.computation(called)
            if comp.name in positions:
                raise self.fail(f"duplicate computation name %{comp.name}", pos)
            if comp.is_entry and any(c.is_entry for c in computations):  # XLA allows one
                raise self.fail("second ENTRY computation", pos)
            positions[comp.name] = pos
            computations.append(comp)
        if not computations:
            raise self.expected("computation")
        for callee, pos in called:
            if callee not in positions:
                raise self.fail(f"called computation %{callee} does not exist", pos)
        self.check_call_graph(computations, positions)
        return Module(name, computations, header_attrs=header_attrs, sections=sections,
                      source=self.source)

    def check_call_graph(self, computations: list[Computation],
                         positions: dict[str, int]) -> None:
        """XLA's call graph is acyclic (a computation never calls itself, even through
        others): every stage walks it from callers to callees. Checked with an explicit stack,
        so a chain of thousands of nested calls is fine and a cycle is an HloParseError."""
        callees = {c.name: [n for i in c.instructions for n in i.called_computations]
                   for c in computations}
        state: dict[str, int] = {}  # 1: on the current path, 2: done
        for start in callees:
            if start in state:
                continue
            state[start] = 1
            stack = [(start, iter(callees[start]))]
            while stack:
                name, pending = stack[-1]
                callee = next(pending, None)
                if callee is None:
                    state[name] = 2
                    stack.pop()
                elif state.get(callee) == 1:
                    raise self.fail(f"computation %{callee} calls itself (through "
                                    f"%{name})", positions[callee])
                elif callee not in state:
                    state[callee] = 1
                    stack.append((callee, iter(callees[callee])))

    def sections(self) -> list[tuple[str, list[str]]]:
        """Debug-info blocks after the header: a bare word line, then lines up to a blank one.

        They are line-structured (not token-structured), so they are read line by line.
        """
        sections: list[tuple[str, list[str]]] = []
        while True:
            self.skip_space()
            line_start = self.pos
            line_end = self.text.find("\n", line_start)
            line_end = len(self.text) if line_end < 0 else line_end
            at_line_start = line_start == 0 or self.text[line_start - 1] == "\n"
            if not (at_line_start and _SECTION_LINE.fullmatch(self.text, line_start, line_end)):
                return sections
            title = self.text[line_start:line_end].strip()
            lines: list[str] = []
            pos = line_end + 1
            while pos < len(self.text):
                end = self.text.find("\n", pos)
                end = len(self.text) if end < 0 else end
                line = self.text[pos:end].rstrip()
                if not line:
                    break
                lines.append(line)
                pos = end + 1
            self.pos = min(pos, len(self.text))
            sections.append((title, lines))


# Attributes whose values name computations; the same keys and splitting as
# ir.Instruction.called_computations, but per attribute so errors can point at the value.
_CALLING_ATTRS = ("calls", "to_apply", "condition", "body", "select", "scatter",
                  "branch_computations", "true_computation", "false_computation",
                  "called_computations", "async_execution_thread_computation")


# The computations an opcode cannot be without (XLA's parser requires them too).
_REQUIRED_CALLS = {"fusion": ("calls",), "call": ("to_apply",), "map": ("to_apply",),
                   "reduce": ("to_apply",), "reduce-window": ("to_apply",),
                   "all-reduce": ("to_apply",), "scatter": ("to_apply",),
                   "select-and-scatter": ("select", "scatter"),
                   "while": ("condition", "body")}


def _computation_names(value: str) -> list[str]:
    return [n.strip().lstrip("%") for n in value.strip("{}").split(",") if n.strip()]
