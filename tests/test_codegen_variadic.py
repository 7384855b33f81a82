"""Variadic reductions: argmax/argmin as XLA emits them (a reduce of (values, iota) pairs whose
combiner compares and selects, read through get-tuple-element), stitched with their producers
and consumers and compared with XLA:CPU bit for bit on inputs with ties and NaNs."""
from __future__ import annotations

import functools
import os

import numpy as np
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from fusionstitching.capture import jax_hlo  # noqa: E402
from fusionstitching.codegen import Refusal, can_stitch, compile_host, generate  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402
from fusionstitching.hlo.xla_runner import run_hlo_with_xla  # noqa: E402
from fusionstitching.pipeline import Options, stitch_module  # noqa: E402
from helpers_codegen import kernel_nodes, assert_assembles_without_spills  # noqa: E402


def ties_and_nans(shape, seed=0):
    """Few distinct values (so a row's maximum and minimum repeat) and a NaN in a few rows and
    columns, some of them twice (which NaN's index wins is the combiner's business)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, shape).astype(np.float32)
    x[1, 2] = x[1, 5] = x[3, 0] = x[0, 7] = np.nan
    return x


FUNCTIONS = {
    "argmax_rows": (lambda x: jnp.argmax(x, axis=1), (16, 12)),
    "argmax_columns": (lambda x: jnp.argmax(x, axis=0), (24, 8)),
    "argmin_rows": (lambda x: jnp.argmin(x, axis=1), (16, 12)),
    # Longer rows than straight-line code takes: a loop carrying the (value, index) pair.
    "argmax_long_rows": (lambda x: jnp.argmax(x, axis=1), (8, 100)),
    # log-softmax's two row reductions, the argmax and the producers between them.
    "log_softmax_argmax": (lambda x: jnp.argmax(jax.nn.log_softmax(x, axis=-1), axis=-1),
                           (16, 12)),
    # XLA:CPU splits rows of 40 into two tiles of 32 (a reduce-window padded with the init
    # value) and a reduce of the tiles: folded back into one row reduction.
    "log_softmax_argmax_tiled": (lambda x: jnp.argmax(jax.nn.log_softmax(x, axis=-1),
                                                      axis=-1), (16, 40)),
}


@functools.cache
def captured(name: str):
    fn, shape = FUNCTIONS[name]
    return parse_module(jax_hlo(fn, np.zeros(shape, np.float32))), shape


@functools.cache
def stitched(name: str):
    """The whole module as one kernel (every XLA kernel of it, e.g. the reduce-max, the
    log-sum fusion and the argmax fusion of log_softmax_argmax)."""
    module, _ = captured(name)
    return generate(module, kernel_nodes(module), name)


def run_both(module, spec, args):
    """(the kernel's outputs, XLA's): the GPU schedule emulated, and the fast host kernel
    (its own CPU schedule, vectorized), which must give the same bits."""
    want = run_hlo_with_xla(str(module), args)
    number = {p.name: p.parameter_number for p in module.entry.parameters}
    ordered = [args[number[n]] for n, _ in spec.inputs]
    got = compile_host(spec)(*ordered)
    for fast, emulated in zip(compile_host(spec, fast=True)(*ordered), got, strict=True):
        np.testing.assert_array_equal(fast, emulated)
    return got, want


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_argmax_and_argmin_are_one_kernel_equal_to_xla_with_ties_and_nans(name):
    module, shape = captured(name)
    assert any(i.shape.is_tuple and i.opcode == "fusion" for i in module.entry.instructions)
    spec = stitched(name)
    assert "thread schedule" in spec.why
    # the host kernel combines a block's results side by side (columns), each in XLA's order
    assert "shared acc_" in str(spec.host_kernel)
    x = ties_and_nans(shape)
    (got,), (want,) = run_both(module, spec, [x])
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_the_inputs_have_ties_and_nans_where_argmax_reads_them():
    x = ties_and_nans((16, 12))
    rows = np.nan_to_num(x, nan=-9)
    assert ((rows == rows.max(axis=1, keepdims=True)).sum(axis=1) > 1).any()  # tied maxima
    assert (np.isnan(x).sum(axis=1) == 2).any()  # two NaNs in one row


def test_log_softmax_then_argmax_is_one_kernel_through_the_pipeline():
    """The pipeline plans the whole module as one stitched kernel, runs it through the host
    backend and matches XLA (its own verify, on random inputs)."""
    module, _ = captured("log_softmax_argmax")
    result = stitch_module(module, Options(verify=True, ptxas=False))
    assert result.report.verify.ok and "xla" in result.report.verify.against
    assert result.report.fs.mem_kernels == 1 and result.report.xla.mem_kernels == 3
    assert not result.report.fallbacks


def test_padded_tiles_of_xla_cpu_row_reductions_fold_back_into_rows():
    module, _ = captured("log_softmax_argmax_tiled")
    windows = [i for c in module.computations for i in c.instructions
               if i.opcode == "reduce-window"]
    assert windows and all("pad=0_0x12_12" in i.attrs["window"] for i in windows)
    assert "reduce-window" not in str(stitched("log_softmax_argmax_tiled").kernel)


def test_tiles_starting_at_another_value_than_the_identity_do_not_fold():
    """Each window of reduce-window adds its init value: folding would drop 5 per tile, so the
    reduce-window is computed as a window (reduce-window stitching) and equals XLA."""
    module = parse_module("""HloModule m
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
ENTRY %main {
  %x = f32[4,64]{1,0} parameter(0)
  %c = f32[] constant(5)
  %w = f32[4,2]{1,0} reduce-window(%x, %c), window={size=1x32 stride=1x32}, to_apply=%add
  ROOT %r = f32[4]{0} reduce(%w, %c), dimensions={1}, to_apply=%add
}
""")
    spec = generate(module, ["w", "r"], "tiles")
    x = np.arange(256, dtype=np.float32).reshape(4, 64) / 7
    want = run_hlo_with_xla(str(module), [x])[0]
    got = compile_host(spec)(x)[0]
    # A fold would drop the tiles' init values (10 per row): far outside the tolerance.
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_results_read_inside_a_multi_output_fusion():
    """A fusion whose root tuple reads the argmax's results through get-tuple-element (and
    computes from them), as XLA:GPU's multi-output fusions do."""
    module = parse_module("""HloModule m
%argmax (a: f32[], i: s32[], b: f32[], j: s32[]) -> (f32[], s32[]) {
  %a = f32[] parameter(0)
  %i = s32[] parameter(1)
  %b = f32[] parameter(2)
  %j = s32[] parameter(3)
  %gt = pred[] compare(%a, %b), direction=GT
  %nan = pred[] compare(%a, %a), direction=NE
  %eq = pred[] compare(%a, %b), direction=EQ
  %lt = pred[] compare(%i, %j), direction=LT
  %keep = pred[] or(%gt, %nan)
  %tie = pred[] and(%eq, %lt)
  %v = f32[] select(%keep, %a, %b)
  %first = pred[] or(%keep, %tie)
  %k = s32[] select(%first, %i, %j)
  ROOT %t = (f32[], s32[]) tuple(%v, %k)
}
%fused (p: f32[8,12]) -> (f32[8], s32[8]) {
  %p = f32[8,12]{1,0} parameter(0)
  %io = s32[8,12]{1,0} iota(), iota_dimension=1
  %ninf = f32[] constant(-inf)
  %zero = s32[] constant(0)
  %r = (f32[8]{0}, s32[8]{0}) reduce(%p, %io, %ninf, %zero), dimensions={1}, to_apply=%argmax
  %v = f32[8]{0} get-tuple-element(%r), index=0
  %k = s32[8]{0} get-tuple-element(%r), index=1
  %e = f32[8]{0} exponential(%v)
  ROOT %out = (f32[8]{0}, s32[8]{0}) tuple(%e, %k)
}
ENTRY %main {
  %x = f32[8,12]{1,0} parameter(0)
  %f = (f32[8]{0}, s32[8]{0}) fusion(%x), kind=kLoop, calls=%fused
  %e = f32[8]{0} get-tuple-element(%f), index=0
  %k = s32[8]{0} get-tuple-element(%f), index=1
  ROOT %t = (f32[8]{0}, s32[8]{0}) tuple(%e, %k)
}
""")
    spec = generate(module, ["f"], "k")
    assert [n for n, _ in spec.outputs] == ["e", "k"]
    got, want = run_both(module, spec, [ties_and_nans((8, 12))])
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


# Both results of the tuple are outputs; the combiner is a float sum over the pairs (not
# associative): the serial order from the init value must be XLA:CPU's own.
SUM_PAIRS = """HloModule m
%pairs (a: f32[], b: f32[], c: f32[], d: f32[]) -> (f32[], f32[]) {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %c = f32[] parameter(2)
  %d = f32[] parameter(3)
  %ac = f32[] add(%a, %c)
  %bd = f32[] multiply(%b, %d)
  ROOT %t = (f32[], f32[]) tuple(%ac, %bd)
}
ENTRY %main {
  %x = f32[6,COLS]{1,0} parameter(0)
  %y = f32[6,COLS]{1,0} parameter(1)
  %e = f32[6,COLS]{1,0} negate(%y)
  %zero = f32[] constant(0.1)
  %one = f32[] constant(1)
  ROOT %r = (f32[6]{0}, f32[6]{0}) reduce(%x, %e, %zero, %one), dimensions={1}, to_apply=%pairs
}
"""


@pytest.mark.parametrize("columns", [24, 48])  # straight-line code, a loop
def test_a_non_associative_variadic_reduce_combines_in_xla_cpu_order(columns):
    module = parse_module(SUM_PAIRS.replace("COLS", str(columns)))
    spec = generate(module, ["e", "r"], "k")
    assert [n for n, _ in spec.outputs] == ["r#0", "r#1"]
    assert "shared acc_" in str(spec.host_kernel)
    assert ("next(" in str(spec.kernel)) == (columns > 32)
    rng = np.random.default_rng(1)
    shape = (6, columns)
    args = [(rng.standard_normal(shape) * 10.0 ** rng.integers(-4, 5, shape)
             ).astype(np.float32), (1 + 0.05 * rng.standard_normal(shape)).astype(np.float32)]
    got, want = run_both(module, spec, args)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # The data tell orders apart: summing each row backwards gives other f32 sums.
    backwards = np.float32(0.1) + np.zeros(6, np.float32)
    for column in args[0].T[::-1]:
        backwards = backwards + column
    assert not np.array_equal(backwards, want[0])


# Several reduced dimensions: (operand layout, reduced dimensions, result shape).
LAYOUTS = {"row_major": ("2,1,0", "0,1,2", "f32[]"), "minor_two": ("1,2,0", "0,2", "f32[6]{0}")}


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_several_reduced_dimensions_combine_in_xla_cpu_order(case):
    layout, dims, result = LAYOUTS[case]
    module = parse_module(SUM_PAIRS.replace("f32[6,COLS]{1,0}", f"f32[4,6,8]{{{layout}}}")
                          .replace("dimensions={1}", f"dimensions={{{dims}}}")
                          .replace("(f32[6]{0}, f32[6]{0})", f"({result}, {result})"))
    spec = generate(module, ["e", "r"], "k")
    rng = np.random.default_rng(3)
    args = [(rng.standard_normal((4, 6, 8)) * 10.0 ** rng.integers(-4, 5, (4, 6, 8))
             ).astype(np.float32), (1 + 0.05 * rng.standard_normal((4, 6, 8))).astype(np.float32)]
    got, want = run_both(module, spec, args)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_a_layout_that_would_change_the_combining_order_is_refused():
    module = parse_module(SUM_PAIRS.replace("f32[6,COLS]{1,0}", "f32[4,6,8]{0,1,2}")
                          .replace("dimensions={1}", "dimensions={1,2}")
                          .replace("f32[6]{0}", "f32[4]{0}"))
    refusal = can_stitch(module, ["e", "r"])
    assert refusal.kind is Refusal.VARIADIC_ORDER
    assert refusal.detail == ("reduce r: reduced dimensions [1, 2] are not row-major in the "
                              "operand's layout (0, 1, 2); the combining order would depend "
                              "on the layout")


def test_schedules_combining_across_threads_are_refused_with_a_reason():
    """Warp, block and tile schedules are enumerated and refused, each with the reason."""
    spec = stitched("argmax_rows")
    assert [d for d, t in spec.candidates if t == float("inf")] == \
        [f"{r.what}; refused: {r.detail}" for r in spec.refused]
    assert all(r.kind is Refusal.VARIADIC_ACROSS_THREADS for r in spec.refused)
    assert {r.schedule.kind for r in spec.refused} == {"warp", "block", "tile"}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ptxas_assembles_every_variadic_kernel_without_spills(arch):
    assert_assembles_without_spills((stitched(name) for name in FUNCTIONS), arch)
