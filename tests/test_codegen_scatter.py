"""Scatter in the code generator (gather form, `IndexMaps.scatter`): embedding-gradient scatter-adds
with duplicate and out-of-bounds indices, their operands, updates' producers and consumers
stitched into one kernel, run on the host backend and compared with XLA:CPU (jaxlib) running
the same module, bit for bit (the gather form combines in XLA:CPU's order; the producers here
are correctly rounded ops, so that the comparison sees the order alone); the same kernels
assemble with ptxas (sm_80, sm_90) without spills; the forms it does not build are refused
with their reason."""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from fusionstitching.codegen import Refusal, can_stitch, compile_host, generate
from fusionstitching.codegen.kernel_ir import Loop
from fusionstitching.graph import build_graph
from fusionstitching.graph.traffic import pattern_traffic
from fusionstitching.hlo.parser import parse_file, parse_module
from fusionstitching.hlo.xla_runner import run_hlo_with_xla
from helpers_codegen import (ADD, kernel_nodes, snippet_inputs, assert_assembles_without_spills,
                             check_against_xla)

DATA = Path(__file__).parent / "data" / "hlo"

COMBINERS = ADD + """%add_s32 (a: s32[], b: s32[]) -> s32[] {
  %a = s32[] parameter(0)
  %b = s32[] parameter(1)
  ROOT %s = s32[] add(%a, %b)
}
%assign (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  ROOT %b = f32[] parameter(1)
}
"""

# The test inputs (`snippet_inputs`, seed 0) draw s32 parameters from -3..17: with 40 indices into
# 8 rows, rows repeat (duplicates are summed in order) and many windows fall outside the
# table (skipped); `test_indices_repeat_and_fall_outside` checks that they do.
ONE_HOT = """
  %labels = s32[{rows}]{{0}} parameter(0)
  %l = s32[{rows},1,1]{{2,1,0}} bitcast(%labels)
  %iota = s32[{rows},1,1]{{2,1,0}} iota(), iota_dimension=0
  %cat = s32[{rows},1,2]{{2,1,0}} concatenate(%iota, %l), dimensions={{2}}
  %idx = s32[{rows},2]{{1,0}} bitcast(%cat)
  %zero = f32[] constant(0)
  %z = f32[{table}]{{1,0}} broadcast(%zero), dimensions={{}}
  %g = f32[{rows},1,1]{{2,1,0}} parameter(1)
  ROOT %sc = f32[{table}]{{1,0}} scatter(%z, %idx, %g), update_window_dims={{1,2}}, inserted_window_dims={{}}, scatter_dims_to_operand_dims={{{to_operand}}}, index_vector_dim=1, to_apply=%add"""

SNIPPETS = {
    # XLA:GPU's form in the corpus (bert/dien/transformer train): update_window_dims={1,2},
    # indices [N,1], the updates computed by a producer in the same kernel, the table's
    # optimizer step consuming the scatter in the same kernel.
    "embedding_gradient": """
  %table = f32[8,4]{1,0} parameter(0)
  %idx = s32[40,1]{1,0} parameter(1)
  %g = f32[40,1,4]{2,1,0} parameter(2)
  %grad = f32[40,1,4]{2,1,0} multiply(%g, %g)
  %sc = f32[8,4]{1,0} scatter(%table, %idx, %grad), update_window_dims={1,2}, inserted_window_dims={}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
  %lr = f32[] constant(0.125)
  %lrb = f32[8,4]{1,0} broadcast(%lr), dimensions={}
  %step = f32[8,4]{1,0} multiply(%sc, %lrb)
  ROOT %new = f32[8,4]{1,0} subtract(%table, %step)""",
    # jnp.zeros(...).at[idx].add(x): a broadcast-zero operand, indices [N] (implicit index
    # vector), the row dimension inserted.
    "zero_table_inserted_dim": """
  %idx = s32[40]{0} parameter(0)
  %x = f32[40,4]{1,0} parameter(1)
  %zero = f32[] constant(0)
  %z = f32[8,4]{1,0} broadcast(%zero), dimensions={}
  %t = f32[40,4]{1,0} multiply(%x, %x)
  ROOT %sc = f32[8,4]{1,0} scatter(%z, %idx, %t), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add""",
    # 2-d windows at 2-d starts: a window reaching past the operand's edge is skipped whole,
    # not clamped; integer sums; a reduction consuming the scatter.
    "windows_2d_integer": """
  %op = s32[9,7]{1,0} parameter(0)
  %idx = s32[6,2]{1,0} parameter(1)
  %u = s32[6,3,2]{2,1,0} parameter(2)
  %sc = s32[9,7]{1,0} scatter(%op, %idx, %u), update_window_dims={1,2}, inserted_window_dims={}, scatter_dims_to_operand_dims={0,1}, index_vector_dim=1, to_apply=%add_s32
  %z = s32[] constant(0)
  %rows = s32[9]{0} reduce(%sc, %z), dimensions={1}, to_apply=%add_s32
  ROOT %out = (s32[9,7]{1,0}, s32[9]{0}) tuple(%sc, %rows)""",
    # A maximum combiner, scatter dims in the middle of the updates, a transposed layout.
    "max_column_layout": """
  %op = f32[8,5]{0,1} parameter(0)
  %idx = s32[3,4]{1,0} parameter(1)
  %u = f32[3,5,4]{2,1,0} parameter(2)
  ROOT %sc = f32[8,5]{0,1} scatter(%op, %idx, %u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=2, to_apply=%max""",
    # No index components: every window starts at the origin and covers the whole operand,
    # so every update lands (a sum over the scatter dimension, in order).
    "every_window_lands": """
  %op = f32[4,3]{1,0} parameter(0)
  %idx = s32[5,0]{1,0} parameter(1)
  %u = f32[5,4,3]{2,1,0} parameter(2)
  ROOT %sc = f32[4,3]{1,0} scatter(%op, %idx, %u), update_window_dims={1,2}, inserted_window_dims={}, scatter_dims_to_operand_dims={}, index_vector_dim=1, to_apply=%add""",
    # take_along_axis transposed (a cross-entropy's one-hot gradient, as XLA:GPU fuses it):
    # indices concatenate(iota, labels), so window b can only land on row b.
    "one_hot_rows": ONE_HOT.format(rows=40, to_operand="0,1", table="40,16"),
    # The same with the label picking the row and the iota the column.
    "one_hot_columns": ONE_HOT.format(rows=40, to_operand="1,0", table="16,40"),
    # An iota over fewer windows than the table has rows: rows 40..47 get no window, and
    # every element still scans the windows.
    "one_hot_short": ONE_HOT.format(rows=40, to_operand="0,1", table="48,16"),
}


def module(body: str):
    return parse_module(f"HloModule m\n{COMBINERS}\nENTRY %main {{\n{body}\n}}\n")


@functools.cache
def snippet(name: str):
    m = module(SNIPPETS[name])
    nodes = kernel_nodes(m)
    return m, nodes, generate(m, nodes, name)


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_scatter_pattern_is_one_kernel_equal_to_xla_bit_for_bit(name):
    """The GPU schedule emulated and the host kernel (check_against_xla runs both)."""
    m, nodes, spec = snippet(name)
    assert spec.nodes == nodes and spec.modeled_us > 0 and spec.host_kernel is not None
    check_against_xla(m, spec, rtol=0, atol=0)


def _scatter_sizes(m) -> list[int]:
    return [i.shape.num_elements for i in m.entry.instructions if i.opcode == "scatter"]


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_host_kernels_compute_each_scatter_once_in_their_prologue(name):
    """On the CPU the scatter is computed once per call, as XLA:CPU does, into a scratch
    array the kernel then reads (the gather form scanned every window for every element:
    a transformers GPT-2 train kernel ran 598-776 us against XLA's 36-46, 47-52 after);
    the GPU schedule keeps the gather form."""
    m, _, spec = snippet(name)
    assert spec.host_kernel.prologue
    assert [a.size for a in spec.host_kernel.scratch] == _scatter_sizes(m)
    assert not spec.kernel.prologue and not spec.kernel.scratch


# Updates that need a reduction of the same kernel, which a prologue cannot compute.
AFTER_A_REDUCTION = {
    # The phased schedule, on the host one thread: the scatter is computed once, when the
    # row sums it reads are staged, before the phase that reads it.
    "phased": """
  %table = f32[8,4]{1,0} parameter(0)
  %idx = s32[40,1]{1,0} parameter(1)
  %g = f32[40,4]{1,0} parameter(2)
  %zero = f32[] constant(0)
  %rs = f32[40]{0} reduce(%g, %zero), dimensions={1}, to_apply=%add
  %rsb = f32[40,4]{1,0} broadcast(%rs), dimensions={0}
  %u = f32[40,4]{1,0} subtract(%g, %rsb)
  %u3 = f32[40,1,4]{2,1,0} reshape(%u)
  %sc = f32[8,4]{1,0} scatter(%table, %idx, %u3), update_window_dims={1,2}, inserted_window_dims={}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
  %sq = f32[8,4]{1,0} multiply(%sc, %sc)
  %total = f32[] reduce(%sq, %zero), dimensions={0,1}, to_apply=%add
  ROOT %out = (f32[8,4]{1,0}, f32[]) tuple(%sc, %total)""",
    # The thread schedule (a block per row): the gather form, each row's window its own.
    "thread": ONE_HOT.format(rows=40, to_operand="0,1", table="40,16").replace(
        "%g = f32[40,1,1]{2,1,0} parameter(1)", """%x = f32[40,16]{1,0} parameter(1)
  %rs = f32[40]{0} reduce(%x, %zero), dimensions={1}, to_apply=%add
  %g = f32[40,1,1]{2,1,0} reshape(%rs)""").replace(
        "ROOT %sc", "%sc") + """
  ROOT %e = f32[40,16]{1,0} multiply(%sc, %x)""",
}


@pytest.mark.parametrize("name", list(AFTER_A_REDUCTION))
def test_a_scatter_after_a_reduction_is_computed_once_where_the_kernel_is_one_thread(name):
    m = module(AFTER_A_REDUCTION[name])
    nodes = kernel_nodes(m)
    spec = generate(m, nodes, name)
    assert spec.nodes == nodes and spec.schedule.kind == {"phased": "phases"}.get(name, name)
    host = spec.host_kernel
    assert not host.prologue
    assert [a.size for a in host.scratch] == (_scatter_sizes(m) if name == "phased" else [])
    check_against_xla(m, spec)  # the row sums are reassociated on the host: a tolerance


def _loops(body: list) -> int:
    return sum(isinstance(s, Loop) + _loops(getattr(s, "body", [])) for s in body)


def test_an_iota_indexed_scatter_reads_only_the_window_of_its_own_row():
    """One window per element instead of a scan of all 40 (a loop, beyond 32 windows), where
    the iota covers every row of the table; the numbers are checked above."""
    for name in ("one_hot_rows", "one_hot_columns"):
        assert _loops(snippet(name)[2].kernel.body) == 0, name
    assert _loops(snippet("one_hot_short")[2].kernel.body) == 1


def test_indices_repeat_and_fall_outside():
    """The inputs the comparisons above run on exercise both sides of XLA's scatter rules."""
    m, _, _ = snippet("embedding_gradient")
    idx = snippet_inputs(m, np.random.default_rng(0))[1].reshape(-1)
    inside = idx[(idx >= 0) & (idx < 8)]
    assert len(np.unique(inside)) < len(inside)  # duplicates
    assert ((idx < 0) | (idx >= 8)).any()  # out of bounds


def test_the_updates_and_the_scatter_result_stay_inside_the_kernel():
    """The gradient rows and the scatter's result are not materialised: the kernel reads the
    table, indices and raw gradient and writes only the updated table."""
    _, _, spec = snippet("embedding_gradient")
    assert sorted(n for n, _ in spec.inputs) == ["g", "idx", "table"]
    assert [n for n, _ in spec.outputs] == ["new"]
    assert spec.write_bytes == 8 * 4 * 4


def test_rows_no_window_reaches_keep_a_negative_zero_operand():
    """x + -0.0 is x for every x; a +0.0 identity would turn the operand's -0.0 into +0.0
    (assert_allclose does not see signs: they are compared here)."""
    m = module(SNIPPETS["zero_table_inserted_dim"].replace("constant(0)", "constant(-0.0)"))
    nodes = kernel_nodes(m)
    spec = generate(m, nodes, "k")
    args = snippet_inputs(m, np.random.default_rng(0))
    (want,) = run_hlo_with_xla(str(m), args)
    number = {p.name: p.parameter_number for p in m.entry.parameters}
    assert np.signbit(want).any()
    for fast in (False, True):  # the gather form (GPU schedule) and the host's prologue
        (got,) = compile_host(spec, fast=fast)(*[args[number[n]] for n, _ in spec.inputs])
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        np.testing.assert_array_equal(got, want)


def test_corpus_embedding_gradient_is_one_kernel_with_its_zero_table_and_adam_step():
    """BERT training step as XLA:GPU (H100) compiles it: the token-type embedding's gradient
    (a scatter fusion into a broadcast-zero fusion) and its Adam update are one kernel, which
    reads the gradient rows and the Adam state only: the zero table and the scatter's result
    (2x32 f32, 256 B each) are neither written nor read back."""
    m = parse_file(DATA / "bert_train_small_jax_h100.hlo.gz")
    nodes = ["loop_broadcast_fusion", "input_scatter_fusion", "loop_add_subtract_fusion.10"]
    spec = generate(m, nodes, "k")
    graph = build_graph(m)
    separately = sum(sum(pattern_traffic(graph, [n])) for n in nodes)
    assert sum(pattern_traffic(graph, nodes)) == spec.read_bytes + spec.write_bytes
    assert separately - (spec.read_bytes + spec.write_bytes) == 4 * 256


REFUSED = {
    "assign": ("%add", "%assign", Refusal.UNSUPPORTED_COMBINER,
               "scatter sc: to_apply assign is not a single "
               "add/maximum/minimum/multiply/and/or (returns its parameter b)"),
    "s64 indices": ("s32[40]{0} parameter(0)", "s64[40]{0} parameter(0)",
                    Refusal.UNSUPPORTED_TYPE,
                    "scatter sc: s64 indices are not supported (s32 only)"),
    "too many windows": ("40", "2000", Refusal.TOO_MANY_WINDOWS,
                         "scatter sc: 2000 update windows; every output element "
                         "would scan them all (at most 1024)"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unsupported_scatters_are_refused_with_a_reason(case):
    old, new, kind, reason = REFUSED[case]
    m = module(SNIPPETS["zero_table_inserted_dim"].replace(old, new))
    refusal = can_stitch(m, ["z", "t", "sc"])
    assert refusal.kind is kind and refusal.detail == reason


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ptxas_assembles_every_scatter_kernel_without_spills(arch):
    assert_assembles_without_spills((snippet(name)[2] for name in SNIPPETS), arch)
