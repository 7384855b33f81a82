"""HLO text parser and printer: round trips on the corpus, agreement with XLA's own parser
(jaxlib), the constructs JAX / TF / XLA:GPU print, error positions, and robustness."""
from __future__ import annotations

import copy
import gzip
import pickle
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fusionstitching.hlo.ir import (HloParseError, Shape, format_shape, print_instruction,
                                     print_module)
from fusionstitching.hlo.parser import parse_file, parse_module, parse_shape, read_hlo_text

DATA = Path(__file__).parent / "data"


def _corpus() -> list[Path]:
    """Every HLO file under tests/data (``*.hlo``, gzipped ``*.hlo.gz``, and ``*.txt`` only
    when it is an HLO module, since XLA dump folders also hold buffer-assignment reports and
    the like)."""
    files = [p for p in sorted(DATA.rglob("*"))
             if p.name.endswith((".hlo", ".hlo.gz", ".txt")) and p.is_file()]
    return [p for p in files
            if p.suffix != ".txt" or p.read_text().lstrip().startswith("HloModule")]


CORPUS = _corpus()
IDS = [str(p.relative_to(DATA)) for p in CORPUS]
_INDEX_COMMENT = re.compile(r"/\*index=\d+\*/")


def _xla_parse(text: str):
    from jax._src.lib import xla_client

    return xla_client.hlo.hlo_module_from_text(text)  # XLA's HloParser, as jaxlib 0.10 exposes it


def _instruction_lines(text: str) -> list[str]:
    return [_INDEX_COMMENT.sub("", line).rstrip() for line in text.splitlines()
            if line.startswith("  ")]


def test_corpus_is_not_empty():
    assert len(CORPUS) >= 4


# -- corpus ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", CORPUS, ids=IDS)
def test_round_trip(path):
    text = read_hlo_text(path)
    module = parse_file(path)
    printed = print_module(module)
    assert parse_module(printed) == module
    # XLA's own text comes back line for line (the printer regenerates /*index=N*/ markers).
    assert _instruction_lines(printed) == _instruction_lines(text)
    assert module.source == str(path)


@pytest.mark.parametrize("path", CORPUS, ids=IDS)
def test_agrees_with_xla_parser(path):
    """Per computation: same instructions, each with XLA's opcode and shape text; and XLA
    accepts what the printer writes."""
    module = parse_file(path)
    ours = {c.name: {i.name: (i.opcode, format_shape(i.shape)) for i in c.instructions}
            for c in module.computations}
    theirs = {}
    text = read_hlo_text(path)
    for comp in _xla_parse(text).computations():
        if comp.name.startswith("async_wrapped") and f"%{comp.name} " not in text:
            continue  # XLA's parser wraps a reduce-scatter-start's reduce-scatter itself
        insts = {}
        for inst in comp.instructions():
            # ``%name = SHAPE OPCODE(...)``: tuple shapes contain spaces but no '=' or ' op('.
            head = inst.to_string().split(" = ", 1)[1]
            shape, opcode = re.match(r"(\(.*?\)|\S+) ([\w\-]+)\(", head).groups()
            if shape.startswith("("):  # the lazy match stops at the first ')'; take the tuple
                shape = head[:head.rindex(f" {opcode}(")]
            insts[inst.name] = (opcode, shape)
        theirs[comp.name] = insts
    assert {k: len(v) for k, v in ours.items()} == {k: len(v) for k, v in theirs.items()}
    assert ours == theirs
    _xla_parse(print_module(module))


def _mutants(text: str, rng: random.Random, count: int):
    for _ in range(count):
        cut = rng.randrange(len(text))
        kind = rng.choice(("truncate", "delete", "replace"))
        if kind == "truncate":
            yield text[:cut]
        elif kind == "delete":
            yield text[:cut] + text[cut + 1:]
        else:
            yield text[:cut] + rng.choice('{}[]()<>,=:%"/*\n x0-') + text[cut + 1:]


# The third-party tier's training steps are large (fuzzing them took ~2 minutes): slow.
_THIRD_PARTY = [p for p in CORPUS if "third_party" in p.parts]
FUZZED = [p for p in CORPUS if p not in _THIRD_PARTY] + [
    pytest.param(p, marks=pytest.mark.slow) for p in _THIRD_PARTY]
# Mutants per file; the total stays bounded as the corpus grows.
_MUTANTS = max(12, min(60, 2400 // max(1, len(CORPUS) - len(_THIRD_PARTY))))


@pytest.mark.parametrize("path", FUZZED, ids=IDS)
def test_fuzzed_input_parses_or_raises_hlo_parse_error(path):
    text = read_hlo_text(path)
    rng = random.Random(f"{path.name}")
    start = time.perf_counter()
    parse_module(text)
    # "Never hangs": a mutant may not take much longer than the intact file (linear time),
    # whatever the file's size and the machine's load.
    budget = 2.0 + 5 * (time.perf_counter() - start)
    for mutant in _mutants(text, rng, _MUTANTS):
        start = time.perf_counter()
        try:
            parse_module(mutant, "mutant")
        except HloParseError as err:
            lines = mutant.split("\n")
            assert 1 <= err.line <= len(lines), err
            assert 1 <= err.column <= len(lines[err.line - 1]) + 1, err
            assert str(err).startswith(f"mutant:{err.line}:{err.column}: ")
        assert time.perf_counter() - start < budget


# -- shapes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, shape", [
    ("f32[]", Shape("f32")),
    ("f32[64,256]{1,0}", Shape("f32", (64, 256), (1, 0))),
    ("bf16[8,128]{1,0:T(8,128)(2,1)S(1)}",
     Shape("bf16", (8, 128), (1, 0), ":T(8,128)(2,1)S(1)")),
    ("f32[]{:S(1)}", Shape("f32", (), (), ":S(1)")),
    ("f32[<=8,4]{1,0}", Shape("f32", (8, 4), (1, 0), dynamic=(True, False))),
    ("token[]", Shape("token")),
    ("()", Shape("tuple")),
    ("(f32[2]{0}, (s32[], pred[3]))",
     Shape("tuple", tuple_shapes=(Shape("f32", (2,), (0,)), Shape("tuple", tuple_shapes=(
         Shape("s32"), Shape("pred", (3,))))))),
])
def test_parse_and_format_shape(text, shape):
    assert parse_shape(text) == shape
    assert format_shape(shape) == text
    assert str(shape) == text


def test_long_tuple_shapes_get_xla_index_markers():
    text = "(" + ", ".join(["f32[]"] * 5) + ", /*index=5*/s32[])"
    shape = parse_shape(text)
    assert len(shape.tuple_shapes) == 6 and shape.tuple_shapes[5] == Shape("s32")
    assert format_shape(shape) == text


@pytest.mark.parametrize("text", ["f32", "f32[", "f33[2]", "f32[2,]", "f32[-1]", "f32[?]",
                                  "f32[2]{1:", "(f32[], ", "f32[2] x"])
def test_bad_shapes(text):
    with pytest.raises(HloParseError):
        parse_shape(text)


# -- constructs -----------------------------------------------------------------------------

def _module(body: str, extra: str = "", header: str = "HloModule m") -> str:
    return f"{header}\n\n{extra}ENTRY %main {{\n{body}\n}}\n"


def _entry(body: str, extra: str = ""):
    return parse_module(_module(body, extra)).entry


def _check_round_trip(text: str):
    module = parse_module(text)
    printed = print_module(module)
    assert parse_module(printed) == module
    _xla_parse(printed)
    return module


def test_header_sections_and_optional_percent():
    text = (
        "HloModule jit_f, is_scheduled=true, entry_computation_layout={(f32[2]{0}, f32[2]{0}, "
        "f32[2]{0}, f32[2]{0}, f32[2]{0}, /*index=5*/f32[2]{0})->f32[2]{0}}, "
        "frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<[\"x\"=1]>}}\n\n"
        "FileNames\n1 \"/tmp/f.py\"\n\nFunctionNames\n\nFileLocations\n\nStackFrames\n"
        "1 {file_location_id=1 parent_frame_id=1}\n\n\n"
        "ENTRY main.1 (a: f32[2], b: f32[2], c: f32[2], d: f32[2], e: f32[2], f: f32[2]) -> f32[2] {\n"
        + "".join(f"  {n} = f32[2]{{0}} parameter({i})\n" for i, n in enumerate("abcdef"))
        + "  ROOT sum = f32[2]{0} add(a, f)\n}\n")
    module = _check_round_trip(text)
    assert module.name == "jit_f"
    assert module.header_attrs.startswith("is_scheduled=true, entry_computation_layout={(")
    assert "/*index=5*/" in module.header_attrs  # the header is kept verbatim
    assert module.sections == [("FileNames", ['1 "/tmp/f.py"']), ("FunctionNames", []),
                               ("FileLocations", []), ("StackFrames", ["1 {file_location_id=1 parent_frame_id=1}"])]
    entry = module.entry
    assert entry.is_entry and entry.name == "main.1"
    assert [p.parameter_number for p in entry.parameters] == list(range(6))
    assert entry.root.operands == ["a", "f"] and entry.root.is_root
    printed = print_module(module)
    assert "ENTRY %main.1 (a: f32[2], b: f32[2]" in printed and "%sum = f32[2]{0} add(%a, %f)" in printed


def test_attributes_stay_raw_text_with_nested_brackets_and_strings():
    entry = _entry(
        '  %p = f32[8]{0} parameter(0), sharding={devices=[2,1]<=[2]}, '
        'metadata={op_name="jit(f)/a, b {c}" source_file="x\\"y.py" source_line=3}\n'
        '  ROOT %c = f32[8]{0} custom-call(%p), custom_call_target="__cublas$gemm", '
        'operand_layout_constraints={f32[8]{0}}, api_version=API_VERSION_TYPED_FFI, '
        'output_to_operand_aliasing={{}: (0, {})}, '
        'frontend_attributes={_xla_stream_annotation="1",b="{[("}, '
        'backend_config={"x":[{"y":"}"}],"z":{"n":1}}')
    p, c = entry.instructions
    assert p.attrs == {"sharding": "{devices=[2,1]<=[2]}",
                       "metadata": '{op_name="jit(f)/a, b {c}" source_file="x\\"y.py" source_line=3}'}
    assert list(c.attrs) == ["custom_call_target", "operand_layout_constraints", "api_version",
                             "output_to_operand_aliasing", "frontend_attributes",
                             "backend_config"]
    assert c.custom_call_target == "__cublas$gemm"
    assert c.attr_json() == {"x": [{"y": "}"}], "z": {"n": 1}}
    assert print_instruction(c).startswith('ROOT %c = f32[8]{0} custom-call(%p), custom_call_target=')


def test_backend_config_as_string():
    entry = _entry('  ROOT %c = f32[] custom-call(), custom_call_target="t", '
                   'backend_config="{\\"k\\": 2}"')
    assert entry.root.attr_json() == {"k": 2}


def test_constants_and_parameters():
    module = _check_round_trip(_module(
        "  %p = f32[2,2]{1,0} parameter(0)\n"
        "  %a = f32[2,2]{1,0} constant({ { 1, nan }, { inf, -inf } })\n"
        "  %b = pred[2]{0} constant({true, false})\n"
        "  %s = f32[] constant(-1.5e-05)\n"
        "  %big = f32[5,8]{1,0} constant({...})\n"
        "  %t = (f32[], s32[2]{0}) constant(( 1, {2, 3} ))\n"
        "  ROOT %r = f32[2,2]{1,0} add(%p, %a)"))
    insts = module.entry.by_name()
    assert insts["p"].parameter_number == 0 and insts["p"].operands == []
    assert insts["a"].literal == "{ { 1, nan }, { inf, -inf } }"
    assert insts["b"].literal == "{true, false}"
    assert insts["s"].literal == "-1.5e-05"
    assert insts["big"].literal == "{...}"
    assert insts["t"].literal == "( 1, {2, 3} )"
    assert print_instruction(insts["a"]) == "%a = f32[2,2]{1,0} constant({ { 1, nan }, { inf, -inf } })"


def test_called_computations_fusion_while_conditional_and_async():
    text = """HloModule m

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%fused (p0: f32[4]) -> f32[] {
  %p0 = f32[4]{0} parameter(0)
  %zero = f32[] constant(0)
  ROOT %r = f32[] reduce(%p0, %zero), dimensions={0}, to_apply=%add
}

%cond (c: (s32[], f32[4])) -> pred[] {
  %c = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (b: (s32[], f32[4])) -> (s32[], f32[4]) {
  ROOT %b = (s32[], f32[4]{0}) parameter(0)
}

%neg (v: f32[4]) -> f32[4] {
  %v = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%v)
}

%wrapped (w: f32[4]) -> f32[4] {
  %w = f32[4]{0} parameter(0)
  ROOT %cc = f32[4]{0} custom-call(%w), custom_call_target="foo"
}, execution_thread="side"

ENTRY %main (x: f32[4], k: s32[]) -> f32[] {
  %x = f32[4]{0} parameter(0)
  %k = s32[] parameter(1)
  %f = f32[] fusion(%x), kind=kLoop, calls=%fused
  %t = (s32[], f32[4]{0}) tuple(%k, %x)
  %w = (s32[], f32[4]{0}) while(%t), condition=%cond, body=%body
  %c = f32[4]{0} conditional(%k, %x, %x), branch_computations={%neg, %neg}
  %start = ((f32[4]{0}), f32[4]{0}, s32[]) async-start(%c), async_execution_thread="side", calls=%wrapped
  %done = f32[4]{0} async-done(%start)
  %ars = f32[4]{0} all-reduce-start(%done), replica_groups={}, to_apply=%add
  %ard = f32[4]{0} all-reduce-done(%ars)
  ROOT %sum = f32[] fusion(%ard), kind=kInput, calls=%fused
}
"""
    module = _check_round_trip(text)
    insts = module.entry.by_name()
    assert insts["f"].fusion_kind == "kLoop" and insts["f"].called_computations == ["fused"]
    assert insts["w"].called_computations == ["cond", "body"]
    assert insts["c"].called_computations == ["neg", "neg"]
    assert insts["start"].called_computations == ["wrapped"]
    assert insts["start"].shape.tuple_shapes[0] == Shape("tuple", tuple_shapes=(
        Shape("f32", (4,), (0,)),))
    assert module.computation("wrapped").suffix == ', execution_thread="side"'
    assert print_module(module).count('}, execution_thread="side"\n') == 1


def test_operands_with_shapes_from_older_printers():
    module = _check_round_trip(_module(
        "  %a = f32[2]{0} parameter(0)\n"
        "  %t = (f32[2]{0}, f32[2]{0}) tuple(f32[2]{0} %a, f32[2]{0} %a)\n"
        "  %g = f32[2]{0} get-tuple-element((f32[2]{0}, f32[2]{0}) %t), index=1\n"
        "  ROOT %s = f32[2]{0} add(f32[2]{0} %g, %a)"))
    insts = module.entry.by_name()
    assert insts["g"].operands == ["t"]
    assert insts["g"].operand_shapes == [parse_shape("(f32[2]{0}, f32[2]{0})")]
    assert insts["s"].operand_shapes == [Shape("f32", (2,), (0,)), None]
    assert insts["a"].operand_shapes is None
    assert print_instruction(insts["s"]) == "ROOT %s = f32[2]{0} add(f32[2]{0} %g, %a)"


def test_long_operand_lists_and_comments():
    body = "".join(f"  %p{i} = f32[] parameter({i})\n" for i in range(7))
    module = _check_round_trip(_module(
        body + "  // a line comment\n"
        "  ROOT %t = (f32[], f32[], f32[], f32[], f32[], /*index=5*/f32[], f32[]) "
        "tuple(%p0, %p1, %p2, %p3, %p4, /*index=5*/%p5, %p6) /* trailing */"))
    root = module.entry.root
    assert root.operands == [f"p{i}" for i in range(7)]
    assert print_instruction(root).endswith("tuple(%p0, %p1, %p2, %p3, %p4, /*index=5*/%p5, %p6)")


def test_computation_without_root_marker_uses_last_instruction():
    entry = _entry("  %a = f32[] constant(1)\n  %b = f32[] negate(%a)")
    assert entry.root.name == "b"


# -- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("body, line, message", [
    ("  ROOT %a = f32[] negate(%nope)", 4, "undefined operand %nope"),
    ("  %a = f32[] constant(1)\n  ROOT %a = f32[] negate(%a)", 5, "duplicate instruction name"),
    ("  ROOT %a = f32[] call(), to_apply=%missing", 4, "called computation %missing"),
    ("  %a = f32[] constant(1)\n  ROOT %b = f32[] negate(%a), metadata={op_name=\"x}",
     5, "unterminated string"),
    ("  ROOT %a = f32[2]{0} constant({1, 2)", 4, "expected '}'"),
    ("  %a = f32[] parameter(0)\n  ROOT %b = f32[] parameter(0)", 5, "duplicate parameter(0)"),
    ("  ROOT %a = f32[] constant(1)\n  ROOT %b = f32[] constant(2)", 5, "second ROOT"),
    ("  ROOT %a = f32[] constant(1), dimensions={0} index=1", 4, "expected ',' or end of line"),
    ("  ROOT %a = f32[] constant(1), x=1, x=2", 4, "duplicate attribute 'x'"),
    ("  ROOT %a = f32[] constant(1), x=", 4, "expected value of attribute 'x', got end of line"),
    ("", 5, "expected instruction, got '}'"),
])
def test_semantic_and_syntax_errors(body, line, message):
    with pytest.raises(HloParseError) as info:
        parse_module(_module(body), "snippet.hlo")
    assert info.value.line == line
    assert message in info.value.message


def test_error_message_names_file_line_and_column(tmp_path):
    path = tmp_path / "bad.hlo"
    path.write_text(_module("  %a = f32[2]{0} parameter(0)\n"
                            "  ROOT %b = f32[2,x]{1,0} negate(%a)"))
    with pytest.raises(HloParseError) as info:
        parse_file(path)
    assert str(info.value).startswith(f"{path}:5:19: expected dimension size, got 'x'")
    assert (info.value.source, info.value.line, info.value.column) == (str(path), 5, 19)


def test_gzipped_file_parses_and_damaged_files_name_the_file(tmp_path):
    text = _module("  ROOT %a = f32[] constant(1)")
    packed = tmp_path / "m.hlo.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    assert parse_file(packed) == parse_module(text)
    assert parse_file(packed).source == str(packed)
    truncated = tmp_path / "cut.hlo.gz"
    truncated.write_bytes(gzip.compress(text.encode())[:20])
    with pytest.raises(HloParseError, match=f"^{re.escape(str(truncated))}:1:1: not a readable gzip"):
        parse_file(truncated)
    binary = tmp_path / "bin.hlo"
    binary.write_bytes(text.encode().replace(b"constant", b"const\xffnt"))
    with pytest.raises(HloParseError) as info:
        parse_file(binary)
    assert "not UTF-8 text" in str(info.value)
    assert (info.value.line, info.value.column) == (4, text.splitlines()[3].index("constant") + 6)


def test_module_level_errors():
    with pytest.raises(HloParseError, match=r"<string>:1:1: expected 'HloModule'"):
        parse_module("ENTRY %m { ROOT %a = f32[] constant(1) }")
    with pytest.raises(HloParseError, match="expected computation, got end of input"):
        parse_module("HloModule m\n\nFileNames\n1 \"x\"\n")
    two_entries = _module("  ROOT %a = f32[] constant(1)") + "ENTRY %e2 {\n  ROOT %b = f32[] constant(2)\n}\n"
    with pytest.raises(HloParseError, match="second ENTRY"):
        parse_module(two_entries)
    with pytest.raises(HloParseError, match="declares result f32\\[\\] but its root"):
        parse_module("HloModule m\nENTRY %e () -> f32[] {\n  ROOT %a = s32[] constant(1)\n}\n")
    with pytest.raises(HloParseError, match="unterminated /\\* comment"):
        parse_module("HloModule m /* never closed")


def test_deep_nesting_is_an_error_not_a_crash():
    with pytest.raises(HloParseError, match="nested too deeply"):
        parse_shape("(" * 5000 + "f32[]" + ")" * 5000)
    start = time.perf_counter()
    with pytest.raises(HloParseError):
        parse_module(_module("  ROOT %a = f32[] constant(" + "{" * 100000 + ")"))
    assert time.perf_counter() - start < 2.0


def _fresh_python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parent.parent).stdout.strip()


def test_importing_the_ir_loads_no_llvm():
    """The package's ``jit`` loads on first use: a stage's import leaves llvmlite out."""
    assert _fresh_python("import fusionstitching.hlo.ir, sys; "
                         "print('llvmlite' in sys.modules)") == "False"


def test_jit_stays_the_function_once_its_module_is_loaded():
    code = ("from fusionstitching.stitched_jit import jit as function; import fusionstitching; "
            "from fusionstitching import jit; "
            "print(fusionstitching.jit is function is jit)")
    assert _fresh_python(code) == "True"


def test_kept_lookups_follow_the_instruction_lists_and_are_not_copied():
    """``Computation.index``, ``Module.computation`` and ``Module.entry`` keep their lookups
    while the lists stay the same; a new list is read again; a pickled or copied module
    carries none."""
    module = parse_file(DATA / "hlo" / "layernorm_64x256_jax_cpu.hlo")
    entry = module.entry
    index = entry.index()
    assert entry.index() is index
    assert (index.by_name, index.users) == (entry.by_name(), entry.users())
    assert [index.position[i.name] for i in entry.instructions] == \
        list(range(len(entry.instructions)))
    called = next(c for c in module.computations if not c.is_entry)
    assert module.computation(called.name) is called
    first, second = entry.instructions[:2]
    entry.instructions = [first, second]
    assert set(entry.index().by_name) == {first.name, second.name}
    assert entry.index().users[second.name] == []
    module.computations = [entry]
    with pytest.raises(KeyError):
        module.computation(called.name)
    assert module.entry is entry
    module.computations = [called]  # no ENTRY: the last computation, as before
    assert module.entry is called
    module.computations = [entry, called]
    assert module.entry is entry
    for other in (pickle.loads(pickle.dumps(module)), copy.deepcopy(module)):
        assert "_kept_lookups" not in other.__dict__ and "_index" not in other.entry.__dict__
        assert other == module
