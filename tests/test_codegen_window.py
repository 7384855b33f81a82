"""Reduce-window in the code generator (`IndexMaps.reduce_window`): computed at any
output index, so max pooling stitches with its producer and consumer, and SAME-padded windows,
cumulative sums, strides, base and window dilation and windows large enough for the loop form
build too. Each snippet (one XLA kernel per instruction) is planned by the pipeline into one
kernel, which runs on the host backend and equals XLA:CPU (jaxlib) running the same module bit
for bit, on inputs whose float sums depend on the order (magnitudes 1e-3 .. 1e3), so the
comparison sees XLA:CPU's combining order: init first, then the window positions in row-major
order. XLA:CPU rewrites scans longer than 16 into two levels before it emits them; its
optimized HLO shows that form, which is stitched whole and equals XLA's result for the long
scan. The kernels assemble with ptxas (sm_80, sm_90) without spills; the forms not built are
refused with their reason; the evaluator skips padding and holes as XLA:CPU does."""
from __future__ import annotations

import functools
import os

import numpy as np
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

from fusionstitching.capture import jax_hlo  # noqa: E402
from fusionstitching.codegen import Refusal, can_stitch, compile_host, generate  # noqa: E402
from fusionstitching.codegen.kernel_ir import Loop  # noqa: E402
from fusionstitching.hlo.evaluator import evaluate  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402
from fusionstitching.hlo.xla_runner import run_hlo_with_xla  # noqa: E402
from fusionstitching.pipeline import Options, stitch_module  # noqa: E402
from helpers_codegen import ADD, kernel_nodes, assert_assembles_without_spills  # noqa: E402

COMBINERS = ADD + """%add_s32 (a: s32[], b: s32[]) -> s32[] {
  %a = s32[] parameter(0)
  %b = s32[] parameter(1)
  ROOT %s = s32[] add(%a, %b)
}
%or (a: pred[], b: pred[]) -> pred[] {
  %a = pred[] parameter(0)
  %b = pred[] parameter(1)
  ROOT %s = pred[] or(%a, %b)
}
%add_f16 (a: f16[], b: f16[]) -> f16[] {
  %a = f16[] parameter(0)
  %b = f16[] parameter(1)
  ROOT %s = f16[] add(%a, %b)
}
"""

SNIPPETS = {
    # CRNN's pooling (NHWC, XLA:CPU's window={size=1x2x2x1 stride=1x2x2x1}) between its ReLU
    # and the next layer's scale and shift.
    "max_pool_relu": """
  %x = f32[2,8,16,4]{3,2,1,0} parameter(0)
  %gamma = f32[4]{0} parameter(1)
  %zero = f32[] constant(0)
  %zeros = f32[2,8,16,4]{3,2,1,0} broadcast(%zero), dimensions={}
  %relu = f32[2,8,16,4]{3,2,1,0} maximum(%x, %zeros)
  %ninf = f32[] constant(-inf)
  %pool = f32[2,4,8,4]{3,2,1,0} reduce-window(%relu, %ninf), window={size=1x2x2x1 stride=1x2x2x1}, to_apply=%max
  %g = f32[2,4,8,4]{3,2,1,0} broadcast(%gamma), dimensions={3}
  ROOT %out = f32[2,4,8,4]{3,2,1,0} multiply(%pool, %g)""",
    # SAME pooling: 3x3 windows at stride 1 over an NCHW image, padded by one on each side
    # (max and sum pools of a ReLU, and their difference).
    "same_pool_3x3": """
  %x = f32[2,3,8,8]{3,2,1,0} parameter(0)
  %zero = f32[] constant(0)
  %zeros = f32[2,3,8,8]{3,2,1,0} broadcast(%zero), dimensions={}
  %relu = f32[2,3,8,8]{3,2,1,0} maximum(%x, %zeros)
  %ninf = f32[] constant(-inf)
  %max = f32[2,3,8,8]{3,2,1,0} reduce-window(%relu, %ninf), window={size=1x1x3x3 pad=0_0x0_0x1_1x1_1}, to_apply=%max
  %sum = f32[2,3,8,8]{3,2,1,0} reduce-window(%relu, %zero), window={size=1x1x3x3 pad=0_0x0_0x1_1x1_1}, to_apply=%add
  ROOT %out = f32[2,3,8,8]{3,2,1,0} subtract(%max, %sum)""",
    # Cumulative sums along rows (jnp.cumsum's window: the whole row, padded below by its
    # length - 1); 16 is the longest XLA:CPU keeps as one reduce-window.
    "cumsum_f32": """
  %x = f32[4,16]{1,0} parameter(0)
  %e = f32[4,16]{1,0} negate(%x)
  %zero = f32[] constant(0)
  ROOT %cs = f32[4,16]{1,0} reduce-window(%e, %zero), window={size=1x16 pad=0_0x15_0}, to_apply=%add""",
    "cumsum_s32": """
  %x = s32[16,6]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %cs = s32[16,6]{1,0} reduce-window(%x, %zero), window={size=16x1 pad=15_0x0_0}, to_apply=%add_s32
  %m = s32[16,6]{1,0} multiply(%cs, %x)
  ROOT %out = (s32[16,6]{1,0}, s32[16,6]{1,0}) tuple(%cs, %m)""",
    # Base dilation (holes between the elements are skipped), window dilation, strides, uneven
    # padding, and an init that is not the sum's identity (XLA:CPU combines it once).
    "dilations": """
  %x = f32[5,9]{1,0} parameter(0)
  %one = f32[] constant(1)
  ROOT %w = f32[4,10]{1,0} reduce-window(%x, %one), window={size=3x3 stride=2x1 pad=1_0x2_3 lhs_dilate=2x1 rhs_dilate=1x2}, to_apply=%add""",
    # 6x6 windows: 36 positions per element, a loop; a column layout; the or of predicates.
    "loop_window_and_or": """
  %x = f32[8,10]{0,1} parameter(0)
  %zero = f32[] constant(0)
  %s = f32[6,8]{0,1} reduce-window(%x, %zero), window={size=6x6 stride=1x1 pad=1_2x2_1 rhs_dilate=1x1}, to_apply=%add
  %big = f32[] constant(1.5)
  %bigs = f32[8,10]{0,1} broadcast(%big), dimensions={}
  %gt = pred[8,10]{0,1} compare(%x, %bigs), direction=GT
  %false = pred[] constant(false)
  %any = pred[8,10]{0,1} reduce-window(%gt, %false), window={size=3x2 pad=1_1x0_1}, to_apply=%or
  ROOT %out = (f32[6,8]{0,1}, pred[8,10]{0,1}) tuple(%s, %any)""",
}


def module(body: str):
    return parse_module(f"HloModule m\n{COMBINERS}\nENTRY %main {{\n{body}\n}}\n")


def order_sensitive_inputs(m) -> list[np.ndarray]:
    """Floats of magnitudes 1e-3 .. 1e3 (their f32 sums depend on the order), s32 of both
    signs, random predicates."""
    rng = np.random.default_rng(0)
    out = []
    for p in m.entry.parameters:
        dims = p.shape.dims
        if p.shape.dtype == "f32":
            x = rng.standard_normal(dims) * 10.0 ** rng.integers(-3, 4, dims)
            out.append(x.astype(np.float32))
        else:
            out.append(rng.integers(-1000, 1000, dims).astype(np.int32))
    return out


def outputs(m) -> list[str]:
    root = m.entry.root
    return list(root.operands) if root.opcode == "tuple" else [root.name]


def assert_kernel_equals_xla_bit_for_bit(m, spec, args, expected=None):
    if expected is None:
        expected = run_hlo_with_xla(str(m), args)
    want = dict(zip(outputs(m), expected))
    number = {p.name: p.parameter_number for p in m.entry.parameters}
    got = compile_host(spec)(*[args[number[n]] for n, _ in spec.inputs])
    assert [n for n, _ in spec.outputs] == list(want)
    for (name, _), value in zip(spec.outputs, got):
        np.testing.assert_array_equal(value, want[name], err_msg=name)


@functools.cache
def snippet(name: str):
    m = module(SNIPPETS[name])
    nodes = kernel_nodes(m)
    return m, nodes, generate(m, nodes, name)


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_window_pattern_is_one_kernel_equal_to_xla_bit_for_bit(name):
    m, nodes, spec = snippet(name)
    assert spec.nodes == nodes and spec.modeled_us > 0
    assert_kernel_equals_xla_bit_for_bit(m, spec, order_sensitive_inputs(m))


@pytest.mark.parametrize("name", ["max_pool_relu", "same_pool_3x3"])
def test_the_pipeline_plans_pooling_with_its_producer_and_consumer_as_one_kernel(name):
    """Unfused, every instruction but parameters and constants is an XLA kernel; the plan
    stitches them all (the windows of the other snippets are priced by the cost guard, see
    docs/ARCHITECTURE.md)."""
    m, nodes, _ = snippet(name)
    result = stitch_module(m, Options(ptxas=False))
    assert result.report.xla.mem_kernels == len(nodes) and result.report.fs.mem_kernels == 1
    (kernel,) = result.kernels
    assert sorted(kernel.spec.nodes) == sorted(nodes) and not result.fallbacks
    assert_kernel_equals_xla_bit_for_bit(m, kernel.spec, order_sensitive_inputs(m))


def test_the_sums_compared_depend_on_the_order():
    """The same prefix sums with the window reversed (reverse the row, sum suffixes, reverse
    back) come out of XLA:CPU different: a kernel summing in another order would fail above."""
    m = module(SNIPPETS["cumsum_f32"])
    reversed_sums = module("""
  %x = f32[4,16]{1,0} parameter(0)
  %e = f32[4,16]{1,0} negate(%x)
  %r = f32[4,16]{1,0} reverse(%e), dimensions={1}
  %zero = f32[] constant(0)
  %cs = f32[4,16]{1,0} reduce-window(%r, %zero), window={size=1x16 pad=0_0x0_15}, to_apply=%add
  ROOT %back = f32[4,16]{1,0} reverse(%cs), dimensions={1}""")
    args = order_sensitive_inputs(m)
    (forward,) = run_hlo_with_xla(str(m), args)
    (backward,) = run_hlo_with_xla(str(reversed_sums), args)
    np.testing.assert_allclose(forward, backward, rtol=1e-5)
    assert (forward != backward).sum() >= 8


def window_loops(body: list) -> list[str]:
    """The combiners of the loops with an Accumulate in a kernel body (at any depth)."""
    found = []
    for stmt in body:
        if isinstance(stmt, Loop):
            found += [a.kind for a in stmt.accumulates]
        found += window_loops(getattr(stmt, "body", None) or [])
    return found


def test_windows_beyond_32_positions_are_a_loop_smaller_ones_straight_line():
    assert window_loops(snippet("loop_window_and_or")[2].kernel.body) == ["add"]  # 6x6
    assert window_loops(snippet("max_pool_relu")[2].kernel.body) == []  # 2x2


def test_max_pool_reads_the_image_once_and_writes_only_the_scaled_pool():
    _, _, spec = snippet("max_pool_relu")
    assert sorted(n for n, _ in spec.inputs) == ["gamma", "x"]
    assert spec.write_bytes == 2 * 4 * 8 * 4 * 4
    assert spec.raw_read_bytes <= spec.read_bytes + 4 * 2 * 4 * 8 * 4  # gamma once per element


def test_xla_cpu_long_scan_stitched_from_its_optimized_hlo_equals_xla():
    """A 64-long cumulative sum: XLA:CPU sums 16-element blocks and then the blocks' totals
    (its optimized HLO: two reduce-windows, a slice, an add). Stitched whole, in that order, the
    kernel equals what jax.jit returns for the 64-long window."""
    def cumsum(x):
        return jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 64), (1, 1), [(0, 0), (63, 0)])

    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    x *= 10.0 ** np.random.default_rng(2).integers(-3, 4, x.shape)
    m = parse_module(jax_hlo(cumsum, x))
    windows = [i for c in m.computations for i in c.instructions if i.opcode == "reduce-window"]
    assert len(windows) == 2 and all("size=64" not in i.attrs["window"] for i in windows)
    nodes = kernel_nodes(m)
    assert sum(m.entry.by_name()[n].opcode == "fusion" for n in nodes) >= 3
    spec = generate(m, nodes, "k")
    assert_kernel_equals_xla_bit_for_bit(m, spec, [x], expected=[np.asarray(jax.jit(cumsum)(x))])


REFUSED = {
    "variadic": ("""
  %x = f32[8]{0} parameter(0)
  %y = s32[8]{0} parameter(1)
  %e = f32[8]{0} exponential(%x)
  %z = f32[] constant(0)
  %zi = s32[] constant(0)
  ROOT %w = (f32[8]{0}, s32[8]{0}) reduce-window(%e, %y, %z, %zi), window={size=2}, to_apply=%pair""",
                 Refusal.UNSUPPORTED_OP,
                 "reduce-window w: variadic reduce-windows are not supported"),
    "f16 sum": ("""
  %x = f16[8]{0} parameter(0)
  %e = f16[8]{0} exponential(%x)
  %z = f16[] constant(0)
  ROOT %w = f16[8]{0} reduce-window(%e, %z), window={size=2}, to_apply=%add_f16""",
                Refusal.UNSUPPORTED_COMBINER,
                "reduce-window w: combiner add over f16 is not supported"),
    "too many positions": ("""
  %x = f32[40,40]{1,0} parameter(0)
  %e = f32[40,40]{1,0} exponential(%x)
  %z = f32[] constant(0)
  ROOT %w = f32[40,40]{1,0} reduce-window(%e, %z), window={size=40x40 pad=39_0x39_0}, to_apply=%add""",
                           Refusal.TOO_MANY_WINDOWS,
                           "reduce-window w: 1600 positions per window; every output element "
                           "would combine them all (at most 1024)"),
}
PAIR = """%pair (a: f32[], i: s32[], b: f32[], j: s32[]) -> (f32[], s32[]) {
  %a = f32[] parameter(0)
  %i = s32[] parameter(1)
  %b = f32[] parameter(2)
  %j = s32[] parameter(3)
  %s = f32[] add(%a, %b)
  %k = s32[] add(%i, %j)
  ROOT %t = (f32[], s32[]) tuple(%s, %k)
}
"""


@pytest.mark.parametrize("case", list(REFUSED))
def test_unsupported_reduce_windows_are_refused_with_a_reason(case):
    body, kind, reason = REFUSED[case]
    m = parse_module(f"HloModule m\n{COMBINERS}{PAIR}\nENTRY %main {{\n{body}\n}}\n")
    refusal = can_stitch(m, ["e", "w"])
    assert refusal.kind is kind and refusal.detail == reason


def test_evaluator_skips_padding_and_holes_as_xla_cpu_does():
    """With an init that is not the reducer's identity, combining the padding and the
    base-dilation holes as the init (the operation semantics' wording) would count it again
    per skipped position."""
    m = module(SNIPPETS["dilations"])
    args = order_sensitive_inputs(m)
    (want,) = run_hlo_with_xla(str(m), args)
    np.testing.assert_allclose(evaluate(m, args), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ptxas_assembles_every_window_kernel_without_spills(arch):
    assert_assembles_without_spills((snippet(name)[2] for name in SNIPPETS), arch)
