"""Code generator: whole LayerNorm/Softmax/RMSNorm plans as one stitched kernel, checked on the
host backend against JAX, and assembled by ptxas for sm_80 and sm_90. The schedule is the
latency-evaluator's choice among the enumerated ones (test_codegen_ops.py checks each kind).
"""
from __future__ import annotations

import functools
import os

import numpy as np
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

from benchmarks.models import micro  # noqa: E402
from costmodel import load_device  # noqa: E402
from fusionstitching.codegen import (Refusal, can_stitch, compile_host,  # noqa: E402
                                     compile_nvptx, find_ptxas, generate)
from fusionstitching.codegen.flatten import flatten  # noqa: E402
from fusionstitching.codegen.schedules.candidates import enumerate_schedules  # noqa: E402
from fusionstitching.codegen.schedules import emitter  # noqa: E402
from fusionstitching.codegen.schedules.choose import build_kernel  # noqa: E402
from fusionstitching.codegen.schedules.space import reduction_space  # noqa: E402
from fusionstitching.hlo.evaluator import evaluate  # noqa: E402
from fusionstitching.hlo.parser import parse_file, parse_module  # noqa: E402
from fusionstitching.graph import build_graph  # noqa: E402
from fusionstitching.capability import xla_kernel_us  # noqa: E402
from helpers import producer_with_two_consumers  # noqa: E402
from helpers_codegen import ADD, check_against_xla, kernel_nodes, module_text  # noqa: E402

HLO = os.path.join(os.path.dirname(__file__), "data", "hlo")

# file, XLA kernels stitched into one
CASES = [
    ("layernorm_64x256_jax_cpu", 5),
    ("layernorm_64x256_jax_h100_classic", 3),
    ("layernorm_32x2048_jax_cpu", 5),
    ("layernorm_4x16x256_jax_h100_classic", 3),
    ("layernorm_64x256_tf_h100_classic", 3),
    # XLA:CPU's TF plan splits row sums into reduce-window tiles + reduce: folded back.
    ("layernorm_64x256_tf_cpu", 6),
    ("softmax_64x256_jax_cpu", 4),
    ("softmax_32x2048_jax_h100_classic", 3),
    ("softmax_4x16x256_jax_h100", 1),
    ("rmsnorm_64x256_jax_h100_classic", 2),
    ("rmsnorm_32x2048_jax_cpu", 3),
    ("rmsnorm_4x16x256_jax_cpu", 3),
]


@functools.cache
def case(file: str):
    module = parse_file(os.path.join(HLO, file + ".hlo"))
    return module, generate(module, kernel_nodes(module), file)


@pytest.mark.parametrize("file,kernels", CASES, ids=[c[0] for c in CASES])
def test_whole_plan_is_one_kernel_matching_jax(file, kernels):
    module, spec = case(file)
    assert len(spec.nodes) == kernels
    assert spec.schemes[0] == "thread_composition"
    assert spec.modeled_us == min(t for _, t in spec.candidates)
    assert spec.smem_bytes <= spec.smem_bytes_no_reuse

    model, dims = file.split("_")[:2]
    args = micro.example_inputs(model, tuple(int(d) for d in dims.split("x")))
    expected = np.asarray(jax.jit(micro.JAX_FUNCTIONS[model])(*args))
    number = {p.name: p.parameter_number for p in module.entry.parameters}
    (got,) = compile_host(spec)(*[args[number[name]] for name, _ in spec.inputs])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

    # The stitched kernel touches global memory only at the plan's boundary.
    assert spec.read_bytes == sum(p.shape.byte_size for p in module.entry.parameters)
    assert spec.write_bytes == module.entry.root.shape.byte_size


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("file", [c[0] for c in CASES])
def test_ptxas_assembles_without_spills(file, arch):
    if find_ptxas() is None:
        pytest.skip("find_ptxas() is None: no ptxas on PATH or in nvidia-cuda-nvcc")
    _, spec = case(file)
    kernel = compile_nvptx(spec, arch)
    assert kernel.cubin and f".target {arch}" in kernel.ptx
    assert kernel.spills == 0
    assert 0 < kernel.regs <= 64
    assert kernel.smem_bytes == spec.smem_bytes
    assert ("shfl.sync.bfly" in kernel.ptx) == ("warp_reduce" in str(spec) or
                                                "block_reduce" in str(spec))
    assert ("bar.sync" in kernel.ptx) == (spec.smem_bytes > 0)


def warp_schedule(file: str, rows_per_block: int = 4):
    module, spec = case(file)
    pattern = flatten(module, spec.nodes)
    sched = next(s for s in enumerate_schedules(reduction_space(pattern), load_device("h100"),
                                                []) if s.kind == "warp"
                 and s.groups_per_block == rows_per_block)
    return build_kernel(pattern, sched, "k")[0]


def test_kernel_ir_is_readable_and_hoists_row_values():
    _, spec = case("layernorm_64x256_jax_cpu")
    text = str(warp_schedule("layernorm_64x256_jax_cpu"))
    assert "warp_reduce.add" in text and "let o = (tid // 32) + 4*bid" in text
    # rsqrt runs once per row, before the column loop that writes the output.
    lines = text.splitlines()
    rsqrt = next(i for i, line in enumerate(lines) if "rsqrt" in line)
    assert not lines[rsqrt].startswith("    ")  # block level, not inside a loop
    assert spec.regs_model > 0


def test_three_d_reshape_indices_fold_back_to_rows():
    text = str(warp_schedule("layernorm_4x16x256_jax_h100_classic"))
    assert "//" not in text.split("for r")[1].split("\n")[1]  # global_load x[r + 256*o]


def test_full_depth_tiles_combine_each_column_in_a_warp():
    """BatchNorm training (H100 plan) as one kernel: its two column statistics (32 channels
    over 256 rows) run on 32-deep tiles (8 columns per block since the latency-evaluator
    knows LLVM unrolls their 8-trip loops), whose columns go through a tile padded to
    width + 1 columns and are combined by a warp each with shuffles (as XLA's column
    reductions), not by a five-barrier tree; the kernel equals XLA and is modeled faster than
    XLA's five kernels."""
    module = parse_file(os.path.join(HLO, "batchnorm_train_4x8x8x32_jax_h100.hlo"))
    spec = generate(module, kernel_nodes(module), "batchnorm_train")
    assert "8 results x 32 threads per block" in spec.why, spec.why
    text = str(spec.kernel)
    assert text.count("warp_reduce.add") == 2 and "[9*(tid // 8) + (tid % 8)]" in text, text
    assert text.count("for r = (tid // 8); r < 256; r += 32") == 3, text
    check_against_xla(module, spec)
    graph, h100 = build_graph(module), load_device("h100")
    assert spec.modeled_us < sum(xla_kernel_us(graph, n.name, h100) for n in graph.kernel_nodes())


def test_middle_digits_of_a_delinearized_row_fold_back():
    """BatchNorm's statistics reduce f32[4,8,8,32] over its first three dimensions: the row
    r of the column reduction is delinearized into three digits and linearized again, which
    folds to 32*r only when the middle digit ((r // 8) % 8) joins the low one (r % 8)."""
    from fusionstitching.codegen.index_expr import Var, add, div, mod, scale
    r, column = Var("r", 256), Var("o", 32)
    address = add(scale(div(r, 64), 2048), scale(mod(div(r, 8), 8), 256),
                  scale(mod(r, 8), 32), column)
    assert str(address) == "o + 32*r"
    x, points = Var("x", 4096), np.arange(4096)
    for k, m, c in [(8, 8, 1), (4, 16, 3), (3, 5, 2)]:  # ((x // k) % m)*k*c + (x % k)*c
        joined = add(scale(mod(div(x, k), m), k * c), scale(mod(x, k), c))
        assert str(joined) == (f"(x % {k * m})" if c == 1 else f"{c}*(x % {k * m})")
        np.testing.assert_array_equal(joined.evaluate({"x": points}),
                                      ((points // k) % m) * k * c + (points % k) * c)
    module = parse_file(os.path.join(HLO, "batchnorm_train_4x8x8x32_jax_h100.hlo"))
    kernel = str(generate(module, ["input_reduce_fusion"], "column_sum").kernel)
    assert "global_load buffer0[o + 32*r]" in kernel, kernel


SNIPPET = """
HloModule m, entry_computation_layout={{(f32[8,64]{{1,0}})->f32[8,64]{{1,0}}}}

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}}

ENTRY %main (x: f32[8,64]) -> f32[8,64] {{
  %x = f32[8,64]{{1,0}} parameter(0)
  %init = f32[] constant({init})
  %r = f32[8]{{0}} reduce(%x, %init), dimensions={{1}}, to_apply=%add
  %b = f32[8,64]{{1,0}} broadcast(%r), dimensions={{0}}
  ROOT %y = f32[8,64]{{1,0}} {op}(%x, %b)
}}
"""


def run_snippet(text: str, nodes: list[str]):
    module = parse_module(text)
    spec = generate(module, nodes, "snippet")
    x = np.random.default_rng(1).standard_normal(spec.inputs[0][1].dims).astype(np.float32)
    return spec, compile_host(spec)(x), evaluate(module, [x])


def test_unfused_ops_and_non_identity_init():
    spec, (got,), expected = run_snippet(SNIPPET.format(init="1.5", op="subtract"),
                                         ["r", "b", "y"])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_can_stitch_refuses_unsupported_op_with_reason():
    module = parse_module(SNIPPET.format(init="0", op="complex"))
    refusal = can_stitch(module, ["r", "b", "y"])
    assert refusal.kind is Refusal.UNSUPPORTED_OP and "complex y" in str(refusal)
    module = parse_module(SNIPPET.format(init="0", op="add"))
    assert can_stitch(module, ["r", "b", "y"]) is None
    spec = generate(module, ["r", "b", "y"], "k")
    assert spec.why.startswith("[8]x[64]") and "thread_composition" in spec.schemes


def test_reduction_read_at_another_row_needs_cross_block_communication():
    """Every one-space schedule refuses it (locality); small, it runs as one phased block
    (the row sums in shared memory), large, it is refused with both reasons."""
    def text(n: int) -> str:
        return SNIPPET.format(init="0", op="add").replace("f32[8,64]", f"f32[{n},{n}]").replace(
            "f32[8]", f"f32[{n}]").replace("dimensions={0}", "dimensions={1}")
    spec, (got,), expected = run_snippet(text(64), ["r", "b", "y"])
    assert spec.why.startswith("phased schedule") and spec.grid == (1,)
    assert any(r.kind is Refusal.CROSS_BLOCK for r in spec.refused)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    refusal = can_stitch(parse_module(text(512)), ["r", "b", "y"])
    assert refusal.kind is Refusal.CROSS_BLOCK and "for one block" in refusal.detail


def test_column_reduction_stitches_with_its_consumer():
    text = SNIPPET.format(init="0", op="add").replace("dimensions={1}, to_apply",
                                                      "dimensions={0}, to_apply")
    text = text.replace("f32[8]{0} reduce", "f32[64]{0} reduce").replace(
        "%b = f32[8,64]{1,0} broadcast(%r), dimensions={0}",
        "%b = f32[8,64]{1,0} broadcast(%r), dimensions={1}")
    spec, (got,), expected = run_snippet(text, ["r", "b", "y"])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


MULTI_OUTPUT = """
HloModule m

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%fused (p: f32[4,8,32]) -> (f32[32,32], f32[32]) {
  %p = f32[4,8,32]{2,1,0} parameter(0)
  %e = f32[4,8,32]{2,1,0} exponential(%p)
  %flat = f32[32,32]{1,0} bitcast(%e)
  %z = f32[] constant(-inf)
  %mx = f32[32]{0} reduce(%flat, %z), dimensions={1}, to_apply=%max
  ROOT %t = (f32[32,32]{1,0}, f32[32]{0}) tuple(%flat, %mx)
}

ENTRY %main (x: f32[4,8,32]) -> (f32[32,32], f32[32]) {
  %x = f32[4,8,32]{2,1,0} parameter(0)
  %f = (f32[32,32]{1,0}, f32[32]{0}) fusion(%x), kind=kInput, calls=%fused
  %g0 = f32[32,32]{1,0} get-tuple-element(%f), index=0
  %g1 = f32[32]{0} get-tuple-element(%f), index=1
  %n = f32[32]{0} negate(%g1)
  ROOT %out = (f32[32,32]{1,0}, f32[32]{0}) tuple(%g0, %n)
}
"""


def test_multi_output_fusion_outputs_are_its_get_tuple_elements():
    spec, got, expected = run_snippet(MULTI_OUTPUT, ["f", "n"])
    assert [n for n, _ in spec.outputs] == ["g0", "n"]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6)


def test_column_major_layout_is_addressed_physically():
    text = MULTI_OUTPUT.replace("f32[32,32]{1,0}", "f32[32,32]{0,1}").replace(
        "%flat = f32[32,32]{0,1} bitcast(%e)", "%flat = f32[32,32]{0,1} copy(%c)").replace(
        "%e = f32[4,8,32]{2,1,0} exponential(%p)",
        "%e = f32[4,8,32]{2,1,0} exponential(%p)\n  %c = f32[32,32]{1,0} reshape(%e)")
    # The reduction now runs along the major dimension of %c: a column reduction.
    spec, got, expected = run_snippet(text, ["f", "n"])
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6)
    # As an output only (no reduction over it), a {0,1} result is written transposed in memory.
    text = text.replace("dimensions={1}, to_apply", "dimensions={1}, to_apply").replace(
        "%mx = f32[32]{0} reduce(%flat, %z)", "%mx = f32[32]{0} reduce(%c, %z)")
    spec, got, expected = run_snippet(text, ["f", "n"])
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6)


# XLA:GPU repeats a reduction in two fusions (each consumer recomputes the row sum of x).
ROW_SUM_THEN = """%{name} (x: f32[64,256]) -> f32[64,256] {{
  %x = f32[64,256]{{1,0}} parameter(0)
  %zero = f32[] constant(0)
  %sum = f32[64]{{0}} reduce(%x, %zero), dimensions={{1}}, to_apply=%add
  %sum_b = f32[64,256]{{1,0}} broadcast(%sum), dimensions={{0}}
  ROOT %r = f32[64,256]{{1,0}} {op}(%x, %sum_b)
}}
"""
REPEATED_REDUCTION = "HloModule m\n" + ADD + ROW_SUM_THEN.format(
    name="centered", op="subtract") + ROW_SUM_THEN.format(name="scaled", op="multiply") + """
ENTRY %main {
  %x = f32[64,256]{1,0} parameter(0)
  %f1 = f32[64,256]{1,0} fusion(%x), kind=kInput, calls=%centered
  %f2 = f32[64,256]{1,0} fusion(%x), kind=kInput, calls=%scaled
  ROOT %out = (f32[64,256]{1,0}, f32[64,256]{1,0}) tuple(%f1, %f2)
}
"""


def test_a_reduction_repeated_across_fusions_is_computed_once():
    module = parse_module(REPEATED_REDUCTION)
    pattern = flatten(module, ["f1", "f2"])
    assert [op.name for op in pattern.ops if op.opcode == "reduce"] == ["f1/sum"]
    spec = generate(module, ["f1", "f2"], "repeated")
    check_against_xla(module, spec, rtol=1e-5, atol=1e-5)


# -- patterns equal up to names (a model's repeated layers) ------------------------------

TWO_LAYERS = module_text("", """
  %x = f32[64,256]{1,0} parameter(0)
  %y = f32[64,256]{1,0} parameter(1)
  %z = f32[] constant(0)
  %e1 = f32[64,256]{1,0} exponential(%x)
  %s1 = f32[64]{0} reduce(%e1, %z), dimensions={1}, to_apply=%add
  %e2 = f32[64,256]{1,0} exponential(%y)
  %s2 = f32[64]{0} reduce(%e2, %z), dimensions={1}, to_apply=%add
  %e3 = f32[64,256]{1,0} exponential(%y)
  %s3 = f32[64,128]{1,0} slice(%e3), slice={[0:64], [0:128]}
  ROOT %t = (f32[64]{0}, f32[64]{0}, f32[64,128]{1,0}) tuple(%s1, %s2, %s3)""")


def test_a_pattern_equal_up_to_names_gets_the_schedule_chosen_before():
    """The second layer's pattern is built with the first one's schedule alone, and that is
    the kernel every schedule tried would have given it; another pattern is not matched."""
    module = parse_module(TWO_LAYERS)
    first, second, other = ["e1", "s1"], ["e2", "s2"], ["e3", "s3"]
    assert flatten(module, first).canonical_form() == flatten(module, second).canonical_form()
    assert flatten(module, first).canonical_form() != flatten(module, other).canonical_form()
    chosen = {}
    generate(module, first, "k", chosen=chosen)
    remembered = generate(module, second, "k", chosen=chosen)
    tried_all = generate(module, second, "k")
    assert len(chosen) == 1 and len(tried_all.candidates) > 1
    assert [c for c, _ in remembered.candidates][0].endswith("equal up to names")
    assert remembered.schedule == tried_all.schedule
    assert str(remembered.kernel) == str(tried_all.kernel)
    assert remembered.modeled_us == tried_all.modeled_us
    generate(module, other, "k", chosen=chosen)
    assert len(chosen) == 2


def test_a_kernel_of_too_many_values_is_left_to_xla(monkeypatch):
    """Each pad or concatenate can ask its operand at another index; a log-depth scan (the
    gradient of cummax) asked 2^depth of them and planned for minutes. Past MAX_VALUES the
    code generator refuses, saying why (the bound lowered here so a small kernel passes it)."""
    module = parse_module(producer_with_two_consumers(16, 128))
    assert can_stitch(module, ["a", "b", "c"]) is None
    monkeypatch.setattr(emitter, "MAX_VALUES", 3)
    refusal = can_stitch(module, ["a", "b", "c"])
    assert refusal.kind is Refusal.EXPRESSION_TOO_LARGE
    assert "values at distinct indices" in str(refusal)
