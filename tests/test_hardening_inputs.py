"""Hostile and unusual inputs: bad command lines, gzip bombs, deep nesting, huge shapes, and
a fuzz of the whole pipeline over mutated corpus modules. Each ends in a clear error or a
Fallback with a reason, never a traceback."""
from __future__ import annotations

import gzip
import json
import logging
import os
import random
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from fusionstitching import codegen
from fusionstitching.cli import main as cli_main
from fusionstitching.codegen import index_expr as x, kernel_ir as k, traffic
from fusionstitching.graph.opgraph import build_graph
from fusionstitching.graph.refusal import RefusalKind, defects
from fusionstitching.hlo import parser as hlo_parser
from fusionstitching.hlo.evaluator import evaluate, evaluate_computation
from fusionstitching.hlo.inline import inline_calls, nesting_depth
from fusionstitching.hlo.ir import HloParseError
from fusionstitching.hlo.parser import parse_file, parse_module, read_hlo_text
from fusionstitching.hlo.verifier import module_problem
from fusionstitching.pipeline import Options, stitch_module
from fusionstitching.verification import random_inputs
from helpers_codegen import ADD

DATA = Path(__file__).parent / "data" / "hlo"

SMALL = """HloModule small

%fused (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %n = f32[8]{0} negate(%p)
  ROOT %e = f32[8]{0} exponential(%n)
}

ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  ROOT %f = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused
}
"""


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of the command (argparse's own errors exit 2)."""
    try:
        status = cli_main(argv)
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def small_file(tmp_path) -> Path:
    path = tmp_path / "small.hlo"
    path.write_text(SMALL)
    return path


# -- item 12: the command line ------------------------------------------------------------

@pytest.mark.parametrize("option, value", [("--target", "h1000"), ("--explorer", "dp")])
def test_cli_rejects_unknown_choices(small_file, capsys, option, value):
    status, _, err = _cli(["replay", str(small_file), "--no-ptxas", option, value], capsys)
    assert status == 2
    assert "invalid choice" in err and value in err and "internal error" not in err


@pytest.mark.parametrize("command", ["demo", "explain"])
def test_cli_other_commands_reject_unknown_targets(small_file, capsys, command):
    argv = [command] + ([str(small_file)] if command == "explain" else []) + ["--target", "x"]
    status, _, err = _cli(argv, capsys)
    assert status == 2 and "invalid choice" in err


def test_cli_json_into_a_folder_is_a_one_line_error(small_file, tmp_path, capsys):
    status, out, err = _cli(["replay", str(small_file), "--no-ptxas", "--json", str(tmp_path)],
                            capsys)
    assert status == 2
    assert "Traceback" not in err and f"--json {tmp_path}" in err
    assert "module small" not in out  # refused before any planning


def test_cli_json_into_a_missing_folder_is_a_one_line_error(small_file, tmp_path, capsys):
    target = tmp_path / "missing" / "out.json"
    status, _, err = _cli(["replay", str(small_file), "--no-ptxas", "--json", str(target)],
                          capsys)
    assert status == 2 and "Traceback" not in err and "no such folder" in err


def test_cli_emit_onto_a_file_is_a_one_line_error(small_file, capsys):
    status, _, err = _cli(["replay", str(small_file), "--no-ptxas", "--emit", str(small_file)],
                          capsys)
    assert status == 2
    assert "internal error" not in err and "not a folder" in err


def test_cli_missing_input_file_is_a_one_line_error(small_file, tmp_path, capsys):
    status, out, err = _cli(["replay", str(tmp_path / "nope.hlo"), str(small_file),
                             "--no-ptxas"], capsys)
    assert status == 1 and "Traceback" not in err and "nope.hlo" in err
    assert "module small" in out  # the next file still replays


# -- item 9: gzip bombs -------------------------------------------------------------------

def _zeros_gz(path: Path, size: int) -> None:
    """A gzip file of ``size`` zero bytes, written in chunks (the test's own memory stays
    small)."""
    with gzip.open(path, "wb", compresslevel=1) as f:
        chunk = bytes(1 << 20)
        for _ in range(size >> 20):
            f.write(chunk)


def test_gzip_bomb_is_refused_while_streaming(tmp_path, monkeypatch):
    monkeypatch.setattr(hlo_parser, "MAX_HLO_BYTES", 4 << 20)
    bomb = tmp_path / "bomb.hlo.gz"
    _zeros_gz(bomb, 64 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(HloParseError, match="more than 4 MiB"):
            read_hlo_text(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # streamed: never the whole 64 MiB


def test_plain_file_over_the_cap_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(hlo_parser, "MAX_HLO_BYTES", 1 << 20)
    big = tmp_path / "big.hlo"
    big.write_bytes(b" " * (2 << 20))
    with pytest.raises(HloParseError, match="more than 1 MiB"):
        read_hlo_text(big)


def test_gzip_under_the_cap_and_damaged_gzip(tmp_path):
    good = tmp_path / "small.hlo.gz"
    good.write_bytes(gzip.compress(SMALL.encode()))
    assert read_hlo_text(good) == SMALL
    damaged = tmp_path / "damaged.hlo.gz"
    damaged.write_bytes(gzip.compress(SMALL.encode())[:-12])
    with pytest.raises(HloParseError, match="gzip"):
        read_hlo_text(damaged)


# -- item 10: deep nesting ----------------------------------------------------------------

def _deep(kind: str, depth: int, op: str = "exponential") -> str:
    """``depth`` computations, each calling the next through a fusion or a call and applying
    ``op`` to its result."""
    def use(i: int, operand: str) -> str:
        return (f"fusion({operand}), kind=kLoop, calls=%c{i}" if kind == "fusion"
                else f"call({operand}), to_apply=%c{i}")

    comps = [f"HloModule deep_{kind}\n",
             "%c0 (p0: f32[8]) -> f32[8] {\n  %p0 = f32[8]{0} parameter(0)\n"
             "  ROOT %n0 = f32[8]{0} negate(%p0)\n}\n"]
    for i in range(1, depth):
        comps.append(f"%c{i} (p{i}: f32[8]) -> f32[8] {{\n  %p{i} = f32[8]{{0}} parameter(0)\n"
                     f"  %q{i} = f32[8]{{0}} {use(i - 1, f'%p{i}')}\n"
                     f"  ROOT %e{i} = f32[8]{{0}} {op}(%q{i})\n}}\n")
    comps.append(f"ENTRY %main (x: f32[8]) -> f32[8] {{\n  %x = f32[8]{{0}} parameter(0)\n"
                 f"  %a = f32[8]{{0}} {use(depth - 1, '%x')}\n"
                 f"  ROOT %b = f32[8]{{0}} fusion(%a), kind=kLoop, calls=%c0\n}}\n")
    return "\n".join(comps)


@pytest.mark.parametrize("kind", ["fusion", "call"])
def test_deep_nesting_is_planned_without_recursion(kind):
    result = stitch_module(parse_module(_deep(kind, 1000)), Options(ptxas=False))
    assert result.report.xla.mem_kernels == (2 if kind == "fusion" else 1)
    if kind == "fusion":  # too long a chain for one kernel: left to XLA, saying why
        refusal = codegen.can_stitch(result.module, ["a"])
        assert refusal.kind is codegen.Refusal.CHAIN_TOO_LONG
        assert "chain of more than" in str(refusal)


@pytest.mark.parametrize("kind", ["fusion", "call"])
def test_deep_nesting_verifies_without_recursion(kind):
    """The evaluator inlines a nest deeper than MAX_NESTING (hlo/inline.py) and computes what
    XLA computes: tanh applied 999 times after a negate, then a negate."""
    result = stitch_module(parse_module(_deep(kind, 1000, "tanh")),
                           Options(ptxas=False, verify=True))
    checked = result.report.verify
    assert checked.ran and checked.ok and checked.finite == 1.0, checked
    assert "xla" in checked.against


def test_inlining_a_nest_keeps_every_value(tmp_path):
    """A corpus training step evaluated with its fusions inlined gives the same bits."""
    module = parse_file(DATA / "bert_train_small_jax_cpu.hlo.gz")
    args = random_inputs(module)
    inlined, comp = inline_calls(module, module.entry)
    assert nesting_depth(inlined, comp) == 0 < nesting_depth(module, module.entry)
    for want, got in zip(_flat(evaluate(module, args)),
                         _flat(evaluate_computation(inlined, comp, args))):
        np.testing.assert_array_equal(got, want)


def _flat(value) -> list:
    return [leaf for v in value for leaf in _flat(v)] if isinstance(value, tuple) else [value]


def test_a_computation_calling_itself_is_a_parse_error():
    text = SMALL.replace("%n = f32[8]{0} negate(%p)",
                         "%n = f32[8]{0} fusion(%p), kind=kLoop, calls=%fused")
    with pytest.raises(HloParseError, match="calls itself"):
        parse_module(text)


# -- item 11: a fuzz of the whole pipeline ------------------------------------------------

# Mutations that keep a module parsing (the parser's own fuzz, in test_hlo_parser.py, covers
# text that does not): a dimension, attribute number or layout changed, an operand or opcode
# swapped for another of the module's, an element type changed, an instruction dropped.
_NUMBER = re.compile(r"(?<=[\[,{=x_])\d+(?=[\],}x_ \n])")
_OPERAND = re.compile(r"(?<=[(, ])%[\w.\-]+")
_OPCODE = re.compile(r"(?<=\} )[a-z][\w\-]*(?=\()")
_DTYPE = re.compile(r"\b(?:f32|s32|pred|f16|bf16|s64|u32)(?=\[)")


def _pipeline_mutant(text: str, rng: random.Random) -> str:
    kind = rng.choice(("number", "number", "operand", "opcode", "dtype", "drop"))
    if kind == "drop":
        lines = text.split("\n")
        del lines[rng.choice([i for i, line in enumerate(lines) if line.startswith("  %")])]
        return "\n".join(lines)
    if kind == "number":
        m = rng.choice(list(_NUMBER.finditer(text)))
        new = str(rng.choice((0, 1, 2, 3, 5, 7, 8, 31, 64, 1000)))
    else:
        regex = {"operand": _OPERAND, "opcode": _OPCODE, "dtype": _DTYPE}[kind]
        m = rng.choice(list(regex.finditer(text)))
        new = rng.choice(("f32", "s32", "pred", "f16", "s64")) if kind == "dtype" else \
            rng.choice(list(regex.finditer(text))).group()
    return text[:m.start()] + new + text[m.end():]


def _fuzz_pipeline(paths: list[Path], mutants: int, seed: str, caplog) -> int:
    """Plans every mutant that parses; returns how many did. Any exception out of the
    pipeline fails the test, and so does a defect the pipeline stopped at a stage's boundary
    (an internal error): a stage must refuse what it does not understand, with its kind."""
    caplog.set_level(logging.DEBUG, logger=defects.name)
    planned = 0
    for path in paths:
        text = read_hlo_text(path)
        rng = random.Random(f"{seed}/{path.name}")
        for number in range(mutants):
            mutant = _pipeline_mutant(text, rng)
            try:
                module = parse_module(mutant, f"{path.name}#{number}")
            except HloParseError:
                continue
            result = stitch_module(module, Options(ptxas=False))
            assert result.report is not None, (path.name, number)
            assert [r.getMessage() for r in caplog.records if r.name == defects.name] == [], \
                (path.name, number)
            planned += 1
    return planned


_FUZZ_QUICK = ["softmax_64x256_jax_h100.hlo", "layernorm_64x256_jax_cpu.hlo",
               "cross_entropy_64x256_tf_h100.hlo", "bias_dropout_residual_64x256_jax_cpu.hlo",
               "batchnorm_train_4x8x8x32_tf_cpu.hlo"]


def test_pipeline_fuzz_has_no_traceback(caplog):
    """Fixed seed, a few small modules: under 30 s."""
    assert _fuzz_pipeline([DATA / n for n in _FUZZ_QUICK], 12, "quick", caplog) >= 20


@pytest.mark.slow
def test_pipeline_fuzz_over_the_corpus_has_no_traceback(caplog):
    paths = sorted(p for p in DATA.glob("*.hlo") if p.stat().st_size < 60_000)
    assert _fuzz_pipeline(paths, 8, "slow", caplog) > len(paths)


# A fused computation that breaks one shape rule of HLO (XLA's verifier would reject it): the
# graph leaves the fusion to XLA as malformed, where the code generator indexed past a list.
_BROKEN_RULES = {
    "broadcast into a dimension the result lacks":
        ("f32[8,4]", "%r = f32[8,4]{1,0} broadcast(%p0), dimensions={2}", "f32[8]"),
    "broadcast of a wrong size":
        ("f32[8,4]", "%r = f32[8,4]{1,0} broadcast(%p0), dimensions={1}", "f32[8]"),
    "iota without its dimension": ("s32[8,4]", "%r = s32[8,4]{1,0} iota()", "f32[8]"),
    "reduce over a dimension the input lacks":
        ("f32[8]", "%z = f32[] constant(0)\n  %r = f32[8]{0} reduce(%p0, %z), dimensions={3}, "
                   "to_apply=%add", "f32[8,4]"),
    "transpose by no permutation":
        ("f32[4,8]", "%r = f32[4,8]{1,0} transpose(%p0), dimensions={0,0}", "f32[8,4]"),
    "concatenate of sizes that do not add up":
        ("f32[8,9]", "%r = f32[8,9]{1,0} concatenate(%p0, %p0), dimensions={1}", "f32[8,4]"),
    "slice past the end":
        ("f32[8,4]", "%r = f32[8,4]{1,0} slice(%p0), slice={[0:8], [2:6]}", "f32[8,4]"),
    "reshape that changes the element count":
        ("f32[30]", "%r = f32[30]{0} reshape(%p0)", "f32[8,4]"),
    "elementwise op of two shapes": ("f32[8,4]", "%r = f32[8,4]{1,0} add(%p0, %p0)", "f32[4,8]"),
    "pad config of another rank":
        ("f32[10,4]", "%z = f32[] constant(0)\n  %r = f32[10,4]{1,0} pad(%p0, %z), padding=1_1",
         "f32[8,4]"),
    "dynamic-slice without start indices":
        ("f32[2,4]", "%r = f32[2,4]{1,0} dynamic-slice(%p0), dynamic_slice_sizes={2,4}",
         "f32[8,4]"),
}


def _broken_module(result: str, body: str, operand: str) -> str:
    rank = operand.count(",") + 1
    layout = "{" + ",".join(str(d) for d in reversed(range(rank))) + "}"
    result_layout = "{" + ",".join(str(d) for d in reversed(range(result.count(",") + 1))) + "}"
    return f"""HloModule broken
{ADD}
%fused (p0: {operand}) -> {result} {{
  %p0 = {operand}{layout} parameter(0)
  {body}
  ROOT %out = {result}{result_layout} negate(%r)
}}

ENTRY %main (x: {operand}) -> {result} {{
  %x = {operand}{layout} parameter(0)
  ROOT %f = {result}{result_layout} fusion(%x), kind=kLoop, calls=%fused
}}
"""


@pytest.mark.parametrize("rule", sorted(_BROKEN_RULES))
def test_a_fusion_breaking_a_shape_rule_is_left_to_xla_as_malformed(rule):
    module = parse_module(_broken_module(*_BROKEN_RULES[rule]))
    node = build_graph(module).nodes["f"]
    assert node.refusal is not None and node.refusal.kind is RefusalKind.MALFORMED, rule
    result = stitch_module(module, Options(ptxas=False))
    assert result.kernels == [] and [f.stage for f in result.report.fallbacks] == ["graph"]


def test_the_shape_rules_hold_in_the_fuzzed_corpus_modules():
    """The rules are XLA's: no real module breaks them (the whole corpus: slow test below)."""
    for name in _FUZZ_QUICK:
        module = parse_file(DATA / name)
        assert [c.name for c in module.computations if module_problem(module, c)] == []


@pytest.mark.slow
def test_the_shape_rules_hold_in_the_whole_corpus():
    for path in sorted(p for p in DATA.rglob("*") if p.name.endswith((".hlo", ".hlo.gz"))):
        module = parse_file(path)
        assert [c.name for c in module.computations if module_problem(module, c)] == [], path


# -- item 8: planning memory does not grow with tensor size -------------------------------

def _rows_module(n: int) -> str:
    """exp of f32[n/1000, 1000], negated (returned) and summed per row (returned): an
    elementwise op and a reduction over n elements, 3 XLA kernels that stitch into one."""
    rows, shape = n // 1000, f"f32[{n // 1000},1000]"
    return f"""HloModule huge_rows

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}}

%fe (p: {shape}) -> {shape} {{
  %p = {shape}{{1,0}} parameter(0)
  ROOT %e = {shape}{{1,0}} exponential(%p)
}}

%fn (p2: {shape}) -> {shape} {{
  %p2 = {shape}{{1,0}} parameter(0)
  ROOT %n = {shape}{{1,0}} negate(%p2)
}}

%fr (q: {shape}) -> f32[{rows}] {{
  %q = {shape}{{1,0}} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[{rows}]{{0}} reduce(%q, %z), dimensions={{1}}, to_apply=%add
}}

ENTRY %main (x: {shape}) -> ({shape}, f32[{rows}]) {{
  %x = {shape}{{1,0}} parameter(0)
  %f = {shape}{{1,0}} fusion(%x), kind=kLoop, calls=%fe
  %h = {shape}{{1,0}} fusion(%f), kind=kLoop, calls=%fn
  %g = f32[{rows}]{{0}} fusion(%f), kind=kInput, calls=%fr
  ROOT %t = ({shape}{{1,0}}, f32[{rows}]{{0}}) tuple(%h, %g)
}}
"""


_REPLAY_IN_A_CHILD = r"""
import json, re, sys
from fusionstitching.hlo.parser import parse_module
from fusionstitching.pipeline import Options, stitch_module
result = stitch_module(parse_module(sys.stdin.read()), Options(ptxas=False))
print(json.dumps({
    # VmHWM is this program's own peak; ru_maxrss after exec also counts the forked copy of
    # the parent (pytest, 2.6 GB after the suite's earlier tests).
    "peak_kb": int(re.search(r"VmHWM:\s*(\d+)", open("/proc/self/status").read())[1]),
    "fallbacks": [f.reason for f in result.fallbacks + result.report.fallbacks],
    "bytes": result.report.fs.bytes,
    "kernels": [[k.spec.why, k.spec.read_bytes, k.spec.write_bytes, k.spec.raw_read_bytes]
                for k in result.kernels]}))
"""


def _replay_in_a_child(text: str) -> dict:
    """The replay's result and its process's peak RSS (a fresh process: the test's own
    memory does not count)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", _REPLAY_IN_A_CHILD], input=text, env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("n", [10**9, 10**11])
def test_huge_shapes_are_planned_in_bounded_memory(n):
    """f32[10^9] took 2.4 GB (6 GB for an elementwise kernel) and f32[10^11] a MemoryError,
    left to XLA as an internal error: global traffic was counted with arrays of one entry per
    thread. Counted per period of blocks now, the plan is the one a small tensor gets."""
    huge = _replay_in_a_child(_rows_module(n))
    assert huge["peak_kb"] < 2 << 20, huge["peak_kb"]  # 2 GB (about 100 MB measured)
    assert huge["fallbacks"] == []
    # One kernel reads x once and writes -exp(x) and the row sums: the compulsory bytes.
    assert huge["bytes"] == 4 * n + 4 * n + 4 * (n // 1000)
    [(why, read, write, raw_read)] = huge["kernels"]
    assert (read, write) == (4 * n, 4 * n + 4 * (n // 1000))
    # The warp schedule computes exp(x) in both of its loops (row sums, -exp(x)): each
    # element of x is loaded twice. The same schedule on 10^8 elements loads as many per
    # element (the schedule's text after the "[rows]x[1000]" shape is the same).
    assert why.endswith("warp schedule: one warp per result, 2 per block, 4 consecutive "
                        "elements per step"), why
    assert raw_read == 2 * 4 * n
    [(small_why, small_read, _, small_raw)] = _replay_in_a_child(_rows_module(10**8))["kernels"]
    assert why.split(" ", 1)[1] == small_why.split(" ", 1)[1]
    assert raw_read * small_read == small_raw * read


def _brute_force_traffic(kernel) -> tuple[int, int]:
    """Every thread, loop iteration and condition interpreted one by one (small kernels)."""
    totals = [0, 0]

    def value(x, env):
        return int(x.evaluate({name: np.int64(v) for name, v in env.items()}))

    def run(body, env):
        for s in body:
            if isinstance(s, k.IndexLet):
                env = {**env, s.var.name: value(s.index, env)}
            elif isinstance(s, k.GlobalLoad):
                totals[0] += k.DTYPE_BYTES[s.dst.dtype]
            elif isinstance(s, k.GlobalStore):
                totals[1] += k.DTYPE_BYTES[s.value.dtype]
            elif isinstance(s, k.If):
                lhs, rhs = value(s.lhs, env), value(s.rhs, env)
                if (lhs == rhs) if s.cmp == "eq" else (lhs < rhs):
                    run(s.body, env)
            elif isinstance(s, k.Loop):
                for v in range(value(s.start, env), s.stop, s.step):
                    run(s.body, {**env, s.var.name: v})

    for b in range(kernel.grid[0]):
        for t in range(kernel.block[0]):
            run(kernel.body, {kernel.bid.name: b, kernel.tid.name: t})
    return totals[0], totals[1]


@pytest.mark.parametrize("max_points", [1 << 20, 4])
@pytest.mark.parametrize("loop_start_moves", [False, True])
def test_periodic_traffic_count_equals_thread_by_thread(monkeypatch, max_points,
                                                        loop_start_moves):
    """Block-dependent divisions, remainders and guards of both signs, a loop expanded per
    iteration and one counted by trips, on a grid that is not a whole number of periods
    (period 15 of 41 blocks). A loop start that moves with the block, or max_points below a
    period's threads, counts block by block; max_points 4 also slices the expanded loop
    (within one thread's iterations too)."""
    monkeypatch.setattr(traffic, "MAX_POINTS", max_points)
    tid, bid = x.Var("tid", 24), x.Var("bid", 41)
    flat = x.add(x.scale(bid, 24), tid)
    row, col = x.Var("row", 10**6), x.Var("c", 10**6)
    f32, vec = k.Value("a", "f32"), k.Value("v", "f32x4")
    body = [
        k.IndexLet(row, x.div(flat, 36)),  # period 3 blocks
        k.If(x.ix(row), x.ix(20), [k.GlobalLoad(f32, 0, x.ix(row))], cmp="lt"),
        k.If(x.ix(7), x.ix(row), [k.GlobalStore(1, x.ix(row), vec)], cmp="lt"),
        k.If(x.mod(flat, 5), x.ix(2), [k.GlobalStore(1, x.ix(0), f32)]),  # period 15
        k.If(x.scale(bid, 2), x.ix(row), [k.GlobalLoad(vec, 0, x.ix(0))]),
        k.Loop(col, x.mod(tid, 8), 30, 8, [k.GlobalLoad(f32, 0, x.ix(col))]),
        k.Loop(col, x.add(bid, tid) if loop_start_moves else x.ix(tid), 50, 7, [
            k.If(x.ix(col), x.add(row, 3), [k.GlobalLoad(f32, 0, x.ix(col))], cmp="lt")]),
    ]
    kernel = k.Kernel("t", [], (41,), (24,), [], body, tid, bid)
    assert traffic.global_traffic(kernel) == _brute_force_traffic(kernel)


@pytest.mark.parametrize("max_points", [1 << 20, 5])
@pytest.mark.parametrize("coeff", [3, -2])
def test_moving_loop_start_is_counted_over_repeats(monkeypatch, max_points, coeff):
    """A loop whose start moves with the block (up, or down) by coeff per block, counted by
    trips (its body does not branch on the loop variable) and expanded per iteration (it
    does), under guards on the block that cut the repeats of a period (period 5 of 37 blocks):
    the trip counts are summed over the repeats in closed form, equal to the count thread by
    thread. The division by 4 doubles the period to 10 (3 or 4 repeats)."""
    monkeypatch.setattr(traffic, "MAX_POINTS", max_points)
    counted, blocks = [], traffic._blocks
    monkeypatch.setattr(traffic, "_blocks", lambda kernel, first, period, repeats: (
        counted.append(period) or blocks(kernel, first, period, repeats)))
    tid, bid = x.Var("tid", 6), x.Var("bid", 37)
    flat = x.add(x.scale(bid, 6), tid)
    col = x.Var("c", 10**6)
    f32, vec = k.Value("a", "f32"), k.Value("v", "f32x4")
    start = x.add(x.scale(bid, coeff), x.scale(tid, 2), -40 if coeff < 0 else 0)
    body = [
        k.If(x.mod(flat, 10), x.ix(7), [  # period 5 blocks
            k.Loop(col, start, 60, 4, [  # by trips: guards on the block only
                k.GlobalLoad(f32, 0, x.ix(col)),
                k.If(x.ix(bid), x.ix(23), [k.GlobalStore(1, x.ix(0), vec)], cmp="lt"),
                k.If(x.ix(4), x.scale(bid, 2), [k.GlobalLoad(vec, 0, x.ix(0))], cmp="lt")]),
            k.Loop(col, start, 50, 3, [  # expanded: a guard on the loop variable
                k.If(x.ix(col), x.add(x.div(flat, 4), 5), [
                    k.GlobalStore(1, x.ix(col), f32)], cmp="lt")])],
            cmp="lt"),
    ]
    kernel = k.Kernel("t", [], (37,), (6,), [], body, tid, bid)
    assert traffic.global_traffic(kernel) == _brute_force_traffic(kernel)
    assert counted[-1] == 10 and 0 not in counted  # by periods, never block by block


def test_floor_sum_matches_the_sum():
    rng = random.Random(8)
    cases = [(rng.randint(0, 25), rng.randint(1, 30), rng.randint(0, 90), rng.randint(0, 90))
             for _ in range(500)]
    n, m, a, b = (np.array(column, dtype=np.int64) for column in zip(*cases))
    assert traffic._floor_sum(n, m, a, b).tolist() == [
        sum((a * j + b) // m for j in range(n)) for n, m, a, b in cases]
    # Past int64 intermediates ((n+1)*m ~ 10^20): Python integers, checked against a 2x2
    # split of the sum (j even and odd).
    n, m, a, b = 10**9, 10**11 + 7, 10**11 - 3, 5
    whole = traffic._floor_sum(*(np.array([x], dtype=np.int64) for x in (n, m, a, b)))[0]
    even = traffic._floor_sum(*(np.array([x], dtype=np.int64) for x in (n // 2, m, 2 * a, b)))[0]
    odd = traffic._floor_sum(*(np.array([x], dtype=np.int64) for x in (n // 2, m, 2 * a, a + b)))[0]
    assert int(whole) == int(even) + int(odd)


def _transpose_module(rows: int, cols: int) -> str:
    """exp of the transpose of f32[rows, cols], negated: 2 XLA kernels that stitch into one
    whose grid-stride loop starts at 128*bid + tid, a start that moves with the block."""
    a, b = f"f32[{rows},{cols}]", f"f32[{cols},{rows}]"
    return f"""HloModule huge_transpose

%fe (p: {a}) -> {b} {{
  %p = {a}{{1,0}} parameter(0)
  %t = {b}{{1,0}} transpose(%p), dimensions={{1,0}}
  ROOT %e = {b}{{1,0}} exponential(%t)
}}

%fn (p2: {b}) -> {b} {{
  %p2 = {b}{{1,0}} parameter(0)
  ROOT %n = {b}{{1,0}} negate(%p2)
}}

ENTRY %main (x: {a}) -> {b} {{
  %x = {a}{{1,0}} parameter(0)
  %f = {b}{{1,0}} fusion(%x), kind=kLoop, calls=%fe
  ROOT %h = {b}{{1,0}} fusion(%f), kind=kLoop, calls=%fn
}}
"""


def test_huge_grid_stride_transpose_is_planned_in_bounded_time_and_memory():
    """f32[10^9] planned in 7.6 s and f32[10^11] ran past 200 s: the grid-stride loop's start
    moves with the block, and blocks were counted one by one. Its trip counts are summed over
    the repeats in closed form now."""
    import time
    rows, cols = 316223, 316241  # primes: no period of the division shorter than the grid
    began = time.perf_counter()
    huge = _replay_in_a_child(_transpose_module(rows, cols))
    assert time.perf_counter() - began < 20
    assert huge["peak_kb"] < 1 << 20, huge["peak_kb"]  # 1 GB (about 100 MB measured)
    assert huge["fallbacks"] == []
    n = rows * cols
    [(why, read, write, raw_read)] = huge["kernels"]
    assert (read, write, raw_read) == (4 * n, 4 * n, 4 * n)
