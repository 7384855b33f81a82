"""The oracle on material nobody here wrote: modules of XLA's own test suite (read where they
lie, ../shared/xla_suite), element types other than f32, reduction inits, and checks that
must say "not run" with a reason instead of dying."""
from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from fusionstitching.hlo.drift import drift_problems, widened_args, widened_to_f64
from fusionstitching.hlo.evaluator import evaluate
from fusionstitching.hlo.inputs import identity_parameters, random_inputs
from fusionstitching.hlo.parser import parse_file, parse_module
from fusionstitching.hlo.xla_runner import run_hlo_with_xla
from fusionstitching.pipeline import Options, stitch_module

SUITE = Path(__file__).resolve().parents[2] / "shared" / "xla_suite"
needs_suite = pytest.mark.skipif(not SUITE.is_dir(), reason=f"{SUITE} is not there")


def replayed(path: Path):
    return stitch_module(parse_file(path), Options(verify=True, ptxas=False, workers=0)).report


@needs_suite
@pytest.mark.parametrize("name", [
    "gpu/gpu_emitters_reduce_multirow__f16_v4",  # f16 sums: XLA's own distance, not equality
    "gpu/gpu_emitters_reduce_column__vectorize_x1_c64",  # complex
    "gpu/gpu_emitters_reduce_row__side_output_unsigned",  # u32 init from a parameter
    "gpu/gpu_kernel_tiling_test__MofReduceDifferentType__asis",  # f16 beside f32
    "gpu/priority_fusion_test__ReductionEpilogueFusionRegressionTest",  # bf16
    "gpu/emitters_concatenate__concat_s4",  # s4
    "gpu/gpu_emitters_reduce_row__side_output_s4",
    "gpu/reduce_test__ReduceWithEpilogueMultiOutputFusion",  # log of a sum: positive inputs
    "gpu/emitters_dynamic_update_slice__mof__asis",  # a kernel's tuple output is the root
    "cpu/cpu_benchmarks__jax.issue.33666.linx.slow_0100.module_0013",  # bitcast f32 -> s32[]
])
def test_xla_suite_module_verifies(name):
    check = replayed(SUITE / f"{name}.hlo.txt").verify
    assert check.ran and check.ok and not check.vacuous, check


@needs_suite
@pytest.mark.parametrize("name, why", [
    ("gpu/gpu_kernel_tiling_test__LargeRowReductionNonMultipleOf2", "GiB"),
    ("gpu/copy_fusion_test__CopyFusionWithDynamicUpdateSliceNotInplace__asis",
     "broadcast changes the element type f32 to f16"),
    ("cpu/cpu_benchmarks__in_place_dynamic_update_slice_fusion", "instructions"),
])
def test_xla_suite_module_too_large_or_malformed_is_not_run_with_why(name, why):
    check = replayed(SUITE / f"{name}.hlo.txt").verify
    assert not check.ran and why in check.not_run, check


REDUCE_FROM_PARAMETER = """HloModule init_param

add {
  a = u32[] parameter(0)
  b = u32[] parameter(1)
  ROOT s = u32[] add(a, b)
}

fused {
  p = u32[8,2048]{1,0} parameter(0)
  i = u32[] parameter(1)
  ROOT r = u32[8]{0} reduce(p, i), dimensions={1}, to_apply=add
}

ENTRY main {
  x = u32[8,2048]{1,0} parameter(0)
  init = u32[] parameter(1)
  ROOT f = u32[8]{0} fusion(x, init), kind=kInput, calls=fused
}
"""


def test_a_parameter_that_is_a_reductions_init_value_gets_its_identity():
    """XLA:CPU folds a reduction's init value into every window of its tree reduction (with
    an init of 1: +66 on each of these sums), so only the identity has one meaning."""
    module = parse_module(REDUCE_FROM_PARAMETER)
    assert identity_parameters(module) == {1: "add"}
    args = random_inputs(module, 0)
    assert args[1] == 0 and args[0].any()
    np.testing.assert_array_equal(evaluate(module, args),
                                  run_hlo_with_xla(REDUCE_FROM_PARAMETER, args)[0])
    nonidentity = [args[0], np.uint32(1)]
    assert not np.array_equal(evaluate(module, nonidentity),
                              run_hlo_with_xla(REDUCE_FROM_PARAMETER, nonidentity)[0])


BF16_SUM = """HloModule bf16_sum

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = bf16[64,128]{1,0} parameter(0)
  w = f32[64,128]{1,0} convert(x)
  zero = f32[] constant(0)
  s = f32[64]{0} reduce(w, zero), dimensions={1}, to_apply=add
  ROOT r = bf16[64]{0} convert(s)
}
"""


def test_a_bf16_output_is_judged_by_xlas_distance_and_bf16_ulps():
    """A bf16 output a rounding away from XLA's is within the drift rule; one 16 ulps away
    is not. The exact module computes the sums in f64 from the same bf16 inputs."""
    module = parse_module(BF16_SUM)
    args = random_inputs(module, 0)
    assert args[0].dtype == ml_dtypes.bfloat16
    (xla,) = run_hlo_with_xla(BF16_SUM, args)
    exact = run_hlo_with_xla(widened_to_f64(BF16_SUM), widened_args(args))
    assert exact[0].dtype == np.float64
    bits = xla.view(np.uint16)
    one_ulp = (bits + 1).astype(np.uint16).view(ml_dtypes.bfloat16)
    sixteen = (bits + 16).astype(np.uint16).view(ml_dtypes.bfloat16)
    assert drift_problems([one_ulp], [xla], exact) == []
    assert drift_problems([sixteen], [xla], exact)


BITS_OF_F16 = """HloModule bits

ENTRY main {
  x = f16[16]{0} parameter(0)
  b = u16[16]{0} bitcast-convert(x)
  one = u16[] constant(1)
  ones = u16[16]{0} broadcast(one), dimensions={}
  c = u16[16]{0} or(b, ones)
  ROOT y = f16[16]{0} bitcast-convert(c)
}
"""


def test_widened_module_keeps_a_narrow_floats_bits_as_they_are():
    """Reinterpreted bits keep their width in the exact module: the f64 operand is rounded
    back to f16 before its bits are read, and the bits read as f16 before widening."""
    x = np.linspace(-2, 2, 16).astype(np.float16)
    (narrow,) = run_hlo_with_xla(BITS_OF_F16, [x])
    (wide,) = run_hlo_with_xla(widened_to_f64(BITS_OF_F16), widened_args([x]))
    np.testing.assert_array_equal(wide, narrow.astype(np.float64))


def test_random_inputs_of_sub_byte_and_complex_types():
    module = parse_module("""HloModule types

ENTRY main {
  a = s4[8]{0} parameter(0)
  c = c64[8]{0} parameter(1)
  ROOT t = (s4[8]{0}, c64[8]{0}) tuple(a, c)
}
""")
    a, c = random_inputs(module, 0)
    assert a.dtype == ml_dtypes.int4 and set(a.astype(int)) <= {0, 1}
    assert c.dtype == np.complex64 and np.abs(c.imag).max() > 0


def test_an_inf_output_compares_and_only_nan_makes_a_check_vacuous():
    """A module whose outputs are +inf for every input (a sum started at -inf, subtracted)
    is checked: an infinity must have XLA's sign. All-NaN outputs compare nothing."""
    inf_module = parse_module("""HloModule infs

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[16,32]{1,0} parameter(0)
  ninf = f32[] constant(-inf)
  r = f32[16]{0} reduce(x, ninf), dimensions={1}, to_apply=add
  b = f32[16,32]{1,0} broadcast(r), dimensions={0}
  ROOT d = f32[16,32]{1,0} subtract(x, b)
}
""")
    check = stitch_module(inf_module, Options(verify=True, ptxas=False, workers=0)).report.verify
    assert check.ok and not check.vacuous and check.finite == 0.0 and check.compared == 1.0
    nan_module = parse_module("""HloModule nans

ENTRY main {
  x = f32[16,32]{1,0} parameter(0)
  n = f32[] constant(nan)
  b = f32[16,32]{1,0} broadcast(n), dimensions={}
  ROOT d = f32[16,32]{1,0} multiply(x, b)
}
""")
    check = stitch_module(nan_module, Options(verify=True, ptxas=False, workers=0)).report.verify
    assert check.vacuous and not check.ok and check.compared == 0.0
