"""Failures found on modules nobody here wrote, each as the smallest HLO that shows it.

Elided constants (``as_text()`` prints large ones as ``{...}``), a plan that loops through an
intermediate tuple, verification that compares NaN with NaN, and a replay that lost every
file's report to one file's crash.
"""
import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest

import costmodel
import fusionstitching
from fusionstitching import codegen
from fusionstitching.cli import main as cli_main
from fusionstitching.graph import build_graph
from fusionstitching.graph.xla_kernel_model import xla_kernel_profile
from fusionstitching.graph.traffic import pattern_traffic
from fusionstitching.hlo import gpu_library  # noqa: F401 - evaluates the cuDNN calls below
from fusionstitching.hlo.attrs import parse_literal
from fusionstitching.hlo.elided import elided_constants, fill_elided
from fusionstitching.hlo.evaluator import evaluate
from fusionstitching.hlo.parser import parse_file, parse_module
from fusionstitching.hlo.drift import drift_problems, widened_to_f64
from fusionstitching.hlo.xla_runner import optimized_hlo_text, run_hlo_with_xla
from fusionstitching.pipeline import Options, StitchedKernel, _schedulable, stitch_module
from fusionstitching.runtime.executor import Executor
from fusionstitching.verification import Drift, compare, random_inputs, stitched_steps

TABLE = np.sin(np.arange(64 * 128, dtype=np.float32).reshape(64, 128) / 7.0)


def layernorm_with_table(x, gamma):
    """A LayerNorm over x plus a constant table (a position table, as in a flax model)."""
    y = x + TABLE
    mean = y.mean(-1, keepdims=True)
    var = ((y - mean) ** 2).mean(-1, keepdims=True)
    return (y - mean) * jax.lax.rsqrt(var + 1e-5) * gamma


def example_args():
    rng = np.random.default_rng(0)
    return rng.standard_normal((64, 128)).astype(np.float32), np.ones(128, np.float32)


def jax_texts():
    """XLA:CPU's module as ``as_text()`` prints it (elided) and with constants in full."""
    compiled = jax.jit(layernorm_with_table).lower(*example_args()).compile()
    return compiled.as_text(), optimized_hlo_text(compiled)


def patterns(result):
    return sorted(sorted(p.nodes) for p in result.plan.patterns)


def test_an_elided_constant_is_read_as_a_buffer_and_verified_with_filled_values():
    elided, full = jax_texts()
    assert "{...}" in elided and "{...}" not in full
    result = stitch_module(parse_module(elided), Options(verify=True, ptxas=False))
    report = result.report
    assert report.verify.ran and report.verify.ok and not report.verify.vacuous, report.verify
    assert set(report.verify.against) == {"evaluator", "xla"}
    assert report.fallbacks == [] and report.fs.mem_kernels == 1
    (kernel,) = result.kernels
    (constant,) = elided_constants(result.module)
    assert constant in [name for name, _ in kernel.spec.inputs]
    # The capture with the constant in full plans alike.
    full_result = stitch_module(parse_module(full), Options(ptxas=False))
    assert patterns(full_result) == patterns(result)
    assert full_result.report.fs.bytes == report.fs.bytes


ELIDED_INSIDE_FUSION = """
HloModule elided_inside

fused_add {
  p = f32[16,32]{1,0} parameter(0)
  c = f32[16,32]{1,0} constant({...})
  ROOT a = f32[16,32]{1,0} add(p, c)
}

fused_exp {
  q = f32[16,32]{1,0} parameter(0)
  ROOT e = f32[16,32]{1,0} exponential(q)
}

ENTRY main {
  x = f32[16,32]{1,0} parameter(0)
  f = f32[16,32]{1,0} fusion(x), kind=kLoop, calls=fused_add
  ROOT g = f32[16,32]{1,0} fusion(f), kind=kLoop, calls=fused_exp
}
"""


def test_an_elided_constant_inside_a_fusion_is_left_to_xla_with_a_reason():
    module = parse_module(ELIDED_INSIDE_FUSION)
    refusal = codegen.can_stitch(module, ["f", "g"], costmodel.load_device("h100"))
    assert refusal.kind is codegen.Refusal.ELIDED_CONSTANT
    result = stitch_module(module, Options(verify=True, ptxas=False))
    assert result.kernels == [] and result.report.verify.ok


def test_filled_constants_read_back_as_the_values_written():
    module = fill_elided(parse_module(ELIDED_INSIDE_FUSION), seed=3)
    assert elided_constants(module) == []
    (constant,) = [i for c in module.computations for i in c.instructions
                   if i.opcode == "constant"]
    values = parse_literal(constant.literal, constant.shape)
    assert values.shape == (16, 32) and np.all(np.abs(values) <= 1) and values.std() > 0.1
    again = fill_elided(parse_module(ELIDED_INSIDE_FUSION), seed=3)
    assert str(again) == str(module)


def test_the_runtime_stitches_a_function_with_a_large_constant():
    x, gamma = example_args()
    step = fusionstitching.jit(layernorm_with_table, keep="stitched", verify=True)
    for _ in range(3):
        out = step(x, gamma)
    (report,) = step.reports()
    assert report.fallbacks == [] and report.runtime["kept"] == "stitched", report.runtime
    np.testing.assert_allclose(out, jax.jit(layernorm_with_table)(x, gamma), rtol=1e-5,
                               atol=1e-5)


# A stitched kernel holding `f` and `c`, where `c` reads f's output through an intermediate
# tuple: read through the tuple, the kernel would wait for its own outputs (from XLA:GPU's
# training step of a keras-hub transformer).
TUPLE_LOOP = """
HloModule tuple_loop

fused_f {
  p = f32[64,256]{1,0} parameter(0)
  e = f32[64,256]{1,0} exponential(p)
  n = f32[64,256]{1,0} negate(p)
  ROOT t = (f32[64,256]{1,0}, f32[64,256]{1,0}) tuple(e, n)
}

fused_g {
  q = f32[64,256]{1,0} parameter(0)
  ROOT s = f32[64,256]{1,0} sine(q)
}

ENTRY main {
  x = f32[64,256]{1,0} parameter(0)
  f = (f32[64,256]{1,0}, f32[64,256]{1,0}) fusion(x), kind=kLoop, calls=fused_f
  g0 = f32[64,256]{1,0} get-tuple-element(f), index=0
  g1 = f32[64,256]{1,0} get-tuple-element(f), index=1
  t = (f32[64,256]{1,0}, f32[64,256]{1,0}) tuple(g0, g1)
  tg = f32[64,256]{1,0} get-tuple-element(t), index=0
  c = f32[64,256]{1,0} fusion(tg), kind=kLoop, calls=fused_g
  ROOT r = (f32[64,256]{1,0}, f32[64,256]{1,0}) tuple(c, g1)
}
"""


def test_a_kernel_reads_an_intermediate_tuples_element_itself():
    result = stitch_module(parse_module(TUPLE_LOOP), Options(verify=True, ptxas=False))
    assert patterns(result) == [["c", "f"]]
    (kernel,) = result.kernels
    assert [name for name, _ in kernel.spec.inputs] == ["x"]
    assert result.report.verify.ok and result.report.fallbacks == []


# `a` and `c` in one kernel with `b` outside between them: no schedule runs it.
CYCLE = """
HloModule cycle

ENTRY main {
  x = f32[32,32]{1,0} parameter(0)
  a = f32[32,32]{1,0} exponential(x)
  b = f32[32,32]{1,0} sine(a)
  c = f32[32,32]{1,0} add(a, b)
  ROOT r = (f32[32,32]{1,0}, f32[32,32]{1,0}) tuple(c, b)
}
"""


def test_a_kernel_in_a_cycle_is_left_to_xla_before_it_runs():
    module = parse_module(CYCLE)
    spec = codegen.generate(module, ["a", "c"], "cyclic", costmodel.load_device("h100"))
    kernel = StitchedKernel(pattern=dataclasses.make_dataclass("P", ["nodes"])(["a", "c"]),
                            spec=spec)
    steps, stuck = stitched_steps(module, [kernel])
    assert steps == [] and stuck == [kernel]
    fallbacks = []
    assert _schedulable(module, [kernel], fallbacks) == []
    (fallback,) = fallbacks
    assert fallback.stage == "schedule" and fallback.nodes == ["a", "c"]


def test_most_outputs_not_finite_is_vacuous_not_ok():
    # log of a negative number: NaN whatever the inputs.
    module = parse_module("""
HloModule nan_everywhere

ENTRY main {
  x = f32[8,16]{1,0} parameter(0)
  a = f32[8,16]{1,0} abs(x)
  n = f32[8,16]{1,0} negate(a)
  ROOT l = f32[8,16]{1,0} log(n)
}
""")
    report = stitch_module(module, Options(verify=True, ptxas=False)).report
    assert report.verify.ran and report.verify.vacuous and not report.verify.ok
    assert report.verify.finite < 0.5 and not report.ok


def test_a_step_nan_on_normal_inputs_is_checked_on_positive_ones():
    # A row sum of logs (the log-likelihood of a variance): NaN in every row with a negative.
    module = parse_module("""
HloModule log_rows

add {
  p = f32[] parameter(0)
  q = f32[] parameter(1)
  ROOT s = f32[] add(p, q)
}

fused_log_sum {
  x = f32[8,64]{1,0} parameter(0)
  l = f32[8,64]{1,0} log(x)
  zero = f32[] constant(0)
  ROOT r = f32[8]{0} reduce(l, zero), dimensions={1}, to_apply=add
}

ENTRY main {
  x = f32[8,64]{1,0} parameter(0)
  ROOT f = f32[8]{0} fusion(x), kind=kInput, calls=fused_log_sum
}
""")
    report = stitch_module(module, Options(verify=True, ptxas=False)).report
    assert report.verify.ok and not report.verify.vacuous
    assert report.verify.inputs == "positive" and report.verify.finite == 1.0


def test_one_files_internal_error_does_not_lose_the_others_reports(tmp_path, monkeypatch,
                                                                  capsys):
    good, bad = tmp_path / "a_good.hlo", tmp_path / "b_bad.hlo"
    good.write_text(TUPLE_LOOP)
    bad.write_text(CYCLE)
    real = fusionstitching.pipeline.stitch_module

    def crashes_on_cycle(module, *args, **kwargs):
        if module.name == "cycle":
            raise RuntimeError("a defect")
        return real(module, *args, **kwargs)

    monkeypatch.setattr(fusionstitching.replay_pool, "stitch_module", crashes_on_cycle)
    out_json = tmp_path / "reports.json"
    status = cli_main(["replay", str(good), str(bad), "--no-ptxas", "--json", str(out_json)])
    assert status == 1
    assert "b_bad.hlo: internal error (RuntimeError: a defect)" in capsys.readouterr().err
    assert [r["module"] for r in json.loads(out_json.read_text())] == ["tuple_loop"]


@pytest.mark.parametrize("dtype", ["pred", "s32", "bf16", "f16", "c64"])
def test_filled_literals_of_other_element_types_parse(dtype):
    text = f"""
HloModule typed

ENTRY main {{
  ROOT c = {dtype}[2]{{0}} constant({{...}})
}}
"""
    module = fill_elided(parse_module(text))
    (constant,) = module.entry.instructions
    values = parse_literal(constant.literal, constant.shape)
    assert values.shape == (2,) and values.dtype == constant.shape.numpy_dtype


# XLA:GPU's tree reduction of a long row: [8,4096] reduced as [8,16,256] over 256, then 16
# (a vocabulary row of 32000 becomes 128 x 250 in a cross-entropy step).
SPLIT_ROW = """
HloModule split_row

max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}

fused_partial {
  p = f32[8,4096]{1,0} parameter(0)
  s = f32[8,16,256]{2,1,0} bitcast(p)
  ninf = f32[] constant(-inf)
  ROOT r = f32[8,16]{1,0} reduce(s, ninf), dimensions={2}, to_apply=max
}

fused_rows {
  q = f32[8,16]{1,0} parameter(0)
  ninf = f32[] constant(-inf)
  ROOT r = f32[8]{0} reduce(q, ninf), dimensions={1}, to_apply=max
}

fused_sub {
  x = f32[8,4096]{1,0} parameter(0)
  m = f32[8]{0} parameter(1)
  b = f32[8,4096]{1,0} broadcast(m), dimensions={0}
  ROOT d = f32[8,4096]{1,0} subtract(x, b)
}

ENTRY main {
  x = f32[8,4096]{1,0} parameter(0)
  partial = f32[8,16]{1,0} fusion(x), kind=kInput, calls=fused_partial
  rows = f32[8]{0} fusion(partial), kind=kInput, calls=fused_rows
  ROOT d = f32[8,4096]{1,0} fusion(x, rows), kind=kLoop, calls=fused_sub
}
"""


def test_a_row_split_by_xlas_tree_reduction_is_one_row_reduction():
    module = parse_module(SPLIT_ROW)
    spec = codegen.generate(module, ["partial", "rows", "d"], "split_row",
                            costmodel.load_device("h100"))
    assert spec.why.startswith("[8]x[4096]"), spec.why
    result = stitch_module(module, Options(verify=True, ptxas=False))
    assert result.report.verify.ok and result.report.fs.mem_kernels == 1
    assert result.report.fs.bytes == result.report.compulsory_bytes


# The log-probability of each label: a gather out of an expression over [8, 1000] logits.
# XLA's fused emitter computes the expression and reads the logits at 8 elements, not 8000.
GATHERED_LABELS = """
HloModule gathered_labels

fused_pick {
  logits = f32[8,1000]{1,0} parameter(0)
  e = f32[8,1000]{1,0} exponential(logits)
  idx = s32[8,2]{1,0} parameter(1)
  ROOT g = f32[8]{0} gather(e, idx), offset_dims={}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1}
}

ENTRY main {
  x = f32[8,1000]{1,0} parameter(0)
  i = s32[8,2]{1,0} parameter(1)
  ROOT pick = f32[8]{0} fusion(x, i), kind=kLoop, calls=fused_pick
}
"""


def test_a_gathers_operand_is_read_and_computed_only_where_gathered():
    graph = build_graph(parse_module(GATHERED_LABELS))
    assert graph.nodes["pick"].partial_reads == {"x": 8}
    assert pattern_traffic(graph, ["pick"]) == (8 * 4 + 8 * 2 * 4, 8 * 4)
    profile = xla_kernel_profile(graph, "pick", costmodel.load_device("h100"))
    exps = sum(n for k, n in profile.instructions.items() if k.startswith("sfu"))
    assert 0 < exps <= 8, profile.instructions  # one exponential per gathered element
    assert profile.bytes_read == 8 * 4 + 8 * 2 * 4


def cancelling(x, c):
    """(x + c) - c with c = 1e4: XLA's f32 result is off by up to ~5e-4, far past 1e-5."""
    return (x + c) - c


def test_the_runtime_check_accepts_what_is_as_close_to_f64_as_xlas_own_f32():
    x = np.random.default_rng(1).standard_normal(4096).astype(np.float32)
    c = np.full(4096, 1e4, np.float32)
    executor = Executor(jax.jit(cancelling).lower(x, c).compile(), "cancelling", verify=True)
    xla = np.asarray(executor.xla(x, c))
    assert not compare(xla, x)[0]  # the exact answer fails the fixed tolerance
    inputs = ((x, c), {})
    assert executor._f64_drift(inputs, [xla], [x])[0] is Drift.WITHIN_XLAS
    assert executor._f64_drift(inputs, [xla], [x + 0.01])[0] is Drift.BEYOND


# A vocabulary cross-entropy's training step (log_softmax, take_along_axis, mean; value and
# gradient) as XLA:GPU (H100) compiles it at [64, 32000], scaled to [8, 4096]: the rows'
# max and sum as tree reductions, the loss summed over rows, the one-hot gradient as a scatter.
VOCAB_CROSS_ENTROPY = Path(__file__).parent / "data" / "hlo" / "unseen" / \
    "vocab_cross_entropy_8x4096_h100.hlo"


def test_a_vocabulary_cross_entropy_step_reads_the_logits_once():
    """Before: 11 kernels of XLA's moving 4.5x the compulsory bytes (the stitched plan 2x):
    every candidate through the rows' reductions also took the loss (another reduction space)
    and was refused, and the backward kernel could not take the forward reductions it reads
    (its producers' siblings). Now one kernel reads the logits and writes the gradient: the
    beams' plan after the neighbour merge (4 -> 3), or the connected-region plan directly."""
    result = stitch_module(parse_file(VOCAB_CROSS_ENTROPY), Options(verify=True, ptxas=False))
    report = result.report
    assert report.verify.ok and not report.verify.vacuous and report.verify.finite == 1.0
    assert report.fs.mem_kernels == 3 and report.xla.mem_kernels == 11
    assert report.fs.bytes <= 1.2 * report.compulsory_bytes
    (kernel,) = result.kernels
    assert {"input_reduce_fusion.2", "input_scatter_fusion", "loop_add_fusion"} <= \
        set(kernel.spec.nodes)
    reasons = [d.reason for d in result.plan.decisions if d.ok]
    assert any(r.startswith("buildable without the reductions in other spaces") for r in reasons)
    notes = result.plan.notes
    assert any(note.startswith("beam 0: 4 kernels") for note in notes)
    assert any(note.startswith("connected-region plan: 3 kernels") for note in notes)
    assert any(note.startswith(("chose connected-region plan", "neighbour merge: 4 -> 3 kernels"))
               for note in notes)


# take_along_axis of log-probabilities: the gather's row index is an iota, so row b's pick
# reads row b's maximum, which the thread group of row b computed (XLA:CPU's form of the
# cross-entropy above puts this gather in its own kernel, reading x - max written out).
PICK_AFTER_ROW_MAX = """
HloModule pick_after_row_max

max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}

ENTRY main {
  x = f32[8,1000]{1,0} parameter(0)
  labels = s32[8]{0} parameter(1)
  ninf = f32[] constant(-inf)
  m = f32[8]{0} reduce(x, ninf), dimensions={1}, to_apply=max
  mb = f32[8,1000]{1,0} broadcast(m), dimensions={0}
  d = f32[8,1000]{1,0} subtract(x, mb)
  rows = s32[8,1]{1,0} iota(), iota_dimension=0
  l = s32[8,1]{1,0} bitcast(labels)
  idx = s32[8,2]{1,0} concatenate(rows, l), dimensions={1}
  ROOT g = f32[8]{0} gather(d, idx), offset_dims={}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1}
}
"""


def test_a_gather_at_an_iota_row_reads_its_own_rows_reduction():
    module = parse_module(PICK_AFTER_ROW_MAX)
    spec = codegen.generate(module, ["m", "mb", "d", "rows", "l", "idx", "g"], "pick",
                            costmodel.load_device("h100"))
    assert spec.why.startswith("[8]x[1000]"), spec.why
    result = stitch_module(module, Options(verify=True, ptxas=False))
    assert result.report.verify.ok and result.report.fs.mem_kernels == 1


# -- fusionstitching replay --verify over the third-party tier -------------------------------

def relu_sum_of_rsqrt(x):
    return jax.numpy.sum(jax.numpy.maximum(jax.lax.rsqrt(x), 0.0), axis=(1, 2))


def test_a_reference_mostly_nan_moves_the_check_to_other_inputs():
    """flax ResNet inference (XLA:CPU): on normal inputs the running variances are negative
    and rsqrt is NaN. XLA:CPU's YNNPACK fusion of ReLU + mean drops the NaN that HLO's maximum
    propagates, so the oracle runs XLA without YNNPACK: XLA and the evaluator agree (all NaN),
    and the check moves to inputs where the outputs are numbers. (It once counted only XLA's
    finite outputs and took the evaluator's NaN as within XLA's distance: "OK".)"""
    x = np.ones((4, 8, 8, 16), np.float32)
    text = optimized_hlo_text(jax.jit(relu_sum_of_rsqrt).lower(x).compile())
    module = parse_module(text)
    args = random_inputs(module, 0, "normal")
    xla, ours = run_hlo_with_xla(text, args), [evaluate(module, args)]
    assert np.isnan(xla[0]).all() and np.isnan(ours[0]).all()
    finite = [np.zeros_like(xla[0])]
    assert not compare(finite, ours)[0] and compare(finite, ours)[1] == np.inf
    assert drift_problems(ours, finite, finite)  # a NaN is never as close as XLA's own number
    report = stitch_module(module, Options(verify=True, ptxas=False)).report
    assert report.verify.ok and report.verify.inputs == "positive", report.verify
    assert report.verify.finite == 1.0 and report.verify.against == ["evaluator", "xla"]


def test_a_step_partly_nan_on_normal_inputs_is_checked_where_all_are_finite():
    """flax LSTM's RMSprop step: on normal inputs the square root of a negative second moment
    made half of every update NaN; the check took those inputs (most outputs finite) and
    compared NaN with NaN for the other half."""
    module = parse_module("""
HloModule rmsprop_like

ENTRY main {
  nu = f32[64]{0} parameter(0)
  g = f32[64]{0} parameter(1)
  s = f32[64]{0} sqrt(nu)
  u = f32[64]{0} divide(g, s)
  ROOT t = (f32[64]{0}, f32[64]{0}, f32[64]{0}) tuple(u, g, nu)
}
""")
    report = stitch_module(module, Options(verify=True, ptxas=False)).report
    assert report.verify.ok and report.verify.inputs == "positive", report.verify
    assert report.verify.finite == 1.0


def cudnn_module(target: str, lhs, rhs, result, window: str, groups: int = 1,
                 extra: tuple = (), config: str = "") -> str:
    """One XLA:GPU cuDNN convolution custom call (NHWC input, OHWI filter, as XLA:GPU's
    layout assignment writes them) and its result."""
    def shape(dims):
        return f"f32[{','.join(map(str, dims))}]{{{','.join(map(str, reversed(range(len(dims)))))}}}"

    params = [shape(lhs), shape(rhs)] + [shape(e) for e in extra]
    names = [f"p{i}" for i in range(len(params))]
    config = config or '"activation_mode":"kNone","conv_result_scale":1,"side_input_scale":0'
    group = f", feature_group_count={groups}" if groups != 1 else ""
    lines = "\n".join(f"  {n} = {s} parameter({i})" for i, (n, s) in enumerate(zip(names,
                                                                                     params)))
    return f"""
HloModule cudnn

ENTRY main {{
{lines}
  c = ({shape(result)}, u8[0]{{0}}) custom-call({', '.join(names)}), window={window}, dim_labels=b01f_o01i->b01f{group}, custom_call_target="__cudnn${target}", backend_config={{"cudnn_conv_backend_config":{{{config}}}}}
  ROOT r = {shape(result)} get-tuple-element(c), index=0
}}
"""


def jax_conv(x, w, stride, pad, groups):
    return jax.lax.conv_general_dilated(x, w, (stride, stride), [pad, pad],
                                        dimension_numbers=("NHWC", "OHWI", "NHWC"),
                                        feature_group_count=groups)


@pytest.mark.parametrize("size,kernel,stride,pad,groups", [
    (8, 3, 1, (1, 1), 1),   # ResNet's 3x3
    (9, 3, 2, (0, 0), 1),   # a row and column no window reaches (input gradient: zeros)
    (8, 1, 2, (0, 0), 1),   # a 1x1 projection with stride: the filter gradient pads by -1
    (8, 5, 2, (1, 1), 4),   # MobileNet's depthwise convolutions (filter gradient)
])
def test_cudnn_convolutions_run_on_xla_cpu(size, kernel, stride, pad, groups):
    """XLA:GPU's cuDNN calls (flax ResNet, MLP-Mixer and ViT, Keras ConvNeXt and MobileNet):
    XLA:CPU has no cuDNN, so those modules were checked against the evaluator alone. Each
    call is now the HLO convolution it stands for, and XLA:CPU's results are JAX's own
    convolution and gradients on this CPU."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, size, size, 4)).astype(np.float32)
    w = rng.standard_normal((8, kernel, kernel, 4 // groups)).astype(np.float32)
    y, vjp = jax.vjp(lambda x, w: jax_conv(x, w, stride, pad, groups), x, w)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx, dw = vjp(dy)
    window = (f"{{size={kernel}x{kernel} stride={stride}x{stride} "
              f"pad={pad[0]}_{pad[1]}x{pad[0]}_{pad[1]}}}")
    cases = [("convForward", x, w, y), ("convBackwardFilter", x, dy, dw)]
    if groups == 1:
        cases.append(("convBackwardInput", dy, w, dx))
    for target, a, b, want in cases:
        text = cudnn_module(target, a.shape, b.shape, want.shape, window, groups)
        (got,) = run_hlo_with_xla(text, [a, b])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=target)
        np.testing.assert_allclose(evaluate(parse_module(text), [a, b]), want, rtol=1e-5,
                                   atol=1e-4, err_msg=target)


def test_a_cudnn_bias_activation_with_side_input_runs_on_xla_cpu():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 8, 8, 4)), rng.standard_normal((8, 3, 3, 4))
    bias, side = rng.standard_normal(8), rng.standard_normal((2, 8, 8, 8))
    x, w, bias, side = (a.astype(np.float32) for a in (x, w, bias, side))
    want = jax.nn.relu(2 * jax_conv(x, w, 1, (1, 1), 1) + bias + 0.5 * side)
    text = cudnn_module("convBiasActivationForward", x.shape, w.shape, want.shape,
                        "{size=3x3 pad=1_1x1_1}", extra=((8,), side.shape),
                        config='"activation_mode":"kRelu","conv_result_scale":2,'
                               '"side_input_scale":0.5')
    (got,) = run_hlo_with_xla(text, [x, w, bias, side])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    report = stitch_module(parse_module(text), Options(verify=True, ptxas=False)).report
    assert report.verify.ok and report.verify.against == ["evaluator", "xla"]


def test_top_k_is_evaluated_as_xla_cpu_runs_it():
    """keras-hub Mixtral's router (XLA:CPU): lax.top_k is a ``TopK`` custom call, which the
    evaluator did not know, so the module was "not run". Ties go to the lower index; NaN is
    the largest, -NaN the smallest, -0 below +0, as in XLA:CPU's runtime."""
    x = np.random.default_rng(0).standard_normal((6, 10)).astype(np.float32)
    x[0, 3] = x[0, 7] = 5.0
    x[1, 2], x[3, 1], x[4, 5] = np.nan, np.inf, -np.nan
    x[2, :] = 0.0
    x[2, 4] = -0.0
    compiled = jax.jit(lambda x: jax.lax.top_k(x, 3)).lower(x).compile()
    text = optimized_hlo_text(compiled)
    assert 'custom_call_target="TopK"' in text
    for got, want in zip(evaluate(parse_module(text), [x]), compiled(x)):
        np.testing.assert_array_equal(got, np.asarray(want))
    report = stitch_module(parse_module(text), Options(verify=True, ptxas=False)).report
    assert report.verify.ran and report.verify.ok, report.verify


def test_a_total_order_comparator_runs_in_f64():
    """XLA's float sort comparator bitcasts f32 to s32 (keras-hub Mixtral's router on H100):
    widened to f64, the bitcast changed the element size and the f64 yardstick could not
    run, so a step that drifted by rounding was a MISMATCH."""
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    compiled = jax.jit(lambda x: jax.numpy.argsort(x, axis=-1, descending=True)).lower(
        x).compile()
    text = optimized_hlo_text(compiled)
    assert "s32[] bitcast(" in text
    (order,) = run_hlo_with_xla(widened_to_f64(text), [x.astype(np.float64)])
    np.testing.assert_array_equal(order, np.asarray(compiled(x)))


def test_top_k_runs_in_f64():
    """XLA:CPU's TopK takes f32 only (keras-hub Mixtral's router on CPU: "TopK expects F32
    data type for input" in the f64 module); there it runs on the operand rounded to f32."""
    x = np.random.default_rng(0).standard_normal((6, 10)).astype(np.float32)
    compiled = jax.jit(lambda x: jax.lax.top_k(2 * x, 3)).lower(x).compile()
    values, indices = run_hlo_with_xla(widened_to_f64(optimized_hlo_text(compiled)),
                                       [x.astype(np.float64)])
    assert values.dtype == np.float64
    np.testing.assert_array_equal(indices, np.asarray(compiled(x)[1]))
    np.testing.assert_array_equal(values, np.asarray(compiled(x)[0]))

