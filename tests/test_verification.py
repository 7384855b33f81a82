"""Verification's verdicts: the stitched plan against XLA's own f32 distance from its f64 result,
widened element by element to where f32 executions with other roundings land; a mismatch names
the stitched kernels that differ given XLA's plan's values of their inputs."""
import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fusionstitching.cli import main as cli_main
from fusionstitching.hlo.parser import parse_file, parse_module
from fusionstitching.hlo.drift import drift_problems, widened_to_f64
from fusionstitching.hlo.xla_runner import optimized_hlo_text, run_hlo_with_xla
from fusionstitching.pipeline import Options, stitch_module
from fusionstitching.runtime.executor import Executor
from fusionstitching.verification import (Drift, kernel_mismatches, random_inputs, rounding_reach,
                                          verify)

DATA = Path(__file__).parent / "data" / "hlo"
LAYERNORM = DATA / "layernorm_64x256_jax_cpu.hlo"

# Output 0 is the sign of a difference of two sums of the same elements in two orders, so f32
# rounding alone decides it; output 1 (a square of a sum) is well conditioned.
NOISE_SIGN = """HloModule noise_sign

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[64,256]{1,0} parameter(0)
  r = f32[64,256]{1,0} reverse(x), dimensions={1}
  zero = f32[] constant(0)
  sum1 = f32[64]{0} reduce(x, zero), dimensions={1}, to_apply=add
  sum2 = f32[64]{0} reduce(r, zero), dimensions={1}, to_apply=add
  d = f32[64]{0} subtract(sum1, sum2)
  sg = f32[64]{0} sign(d)
  sq = f32[64]{0} multiply(sum1, sum1)
  ROOT t = (f32[64]{0}, f32[64]{0}) tuple(sg, sq)
}
"""


def _off_by(kernel, delta: float):
    """``kernel`` whose host build adds ``delta`` to one element of its first output."""
    def host(*args):
        outs = list(kernel.host(*args))
        first = np.array(outs[0], copy=True)
        first.flat[7] += delta
        return [first] + outs[1:]
    return dataclasses.replace(kernel, host=host)


def test_the_plans_own_kernels_match_xlas_plan_on_its_values():
    result = stitch_module(parse_file(LAYERNORM), Options(ptxas=False, host=True))
    assert result.kernels
    assert kernel_mismatches(result.module, result.kernels,
                             random_inputs(result.module)) == []


def test_a_wrong_kernel_fails_and_is_named_given_xlas_values_of_its_inputs():
    result = stitch_module(parse_file(LAYERNORM), Options(ptxas=False, host=True))
    wrong = [_off_by(result.kernels[0], 1e-3)] + result.kernels[1:]
    notes = []
    outcome = verify(result.module, wrong, notes)
    assert outcome.ran and not outcome.ok and not outcome.vacuous and not outcome.rounding_decides
    assert outcome.max_abs_err == pytest.approx(1e-3, rel=1e-2)
    named = [n.reason for n in notes if result.kernels[0].spec.name in n.reason]
    assert named and "given XLA's plan's values of their inputs" in named[0], notes


def test_an_error_below_the_tolerance_is_not_a_kernel_mismatch():
    result = stitch_module(parse_file(LAYERNORM), Options(ptxas=False, host=True))
    args = random_inputs(result.module)
    assert kernel_mismatches(result.module, [_off_by(result.kernels[0], 1e-7)], args) == []
    assert kernel_mismatches(result.module, [_off_by(result.kernels[0], 1e-3)], args)


def test_rounding_noise_reaches_the_elements_rounding_decides_and_only_those():
    module = parse_module(NOISE_SIGN, "noise_sign")
    args = random_inputs(module)
    exact = [np.asarray(v) for v in run_hlo_with_xla(widened_to_f64(NOISE_SIGN),
                                                     [a.astype(np.float64) for a in args])]
    sign, square = rounding_reach(module, args, exact)
    assert (sign >= 1).sum() > 8  # rows whose sign some other rounding flips
    assert (square <= 1e-5 * np.abs(exact[1])).all()
    # The widened yardstick takes a flipped sign where rounding reaches it, not elsewhere.
    flipped = exact[0].astype(np.float32).copy()
    row = int(np.argmax(sign >= 1))
    flipped[row] = -1.0 if exact[0][row] >= 0 else 1.0
    ours, xla = [flipped, exact[1].astype(np.float32)], [a.astype(np.float32) for a in exact]
    assert drift_problems(ours, xla, exact)
    assert not drift_problems(ours, xla, exact, spread=[sign, square])
    ours[1] = ours[1] * np.float32(1.001)
    assert drift_problems(ours, xla, exact, spread=[sign, square])


@pytest.mark.slow
def test_nnx_gpts_first_adam_step_verifies_where_rounding_decides_a_sign(tmp_path, capsys):
    """Flax nnx GPT's CPU training step: Adam's first update is sign(g), and the attention key
    bias's gradient is rounding noise (softmax ignores a shift of its row): our f32 lands on
    the other sign in one element, beyond XLA's own f32 distance (4e-8 over that output) but
    where the evaluator with rounding noise lands too (benchmarks/README.md, "Verification of
    the tier")."""
    path = DATA / "third_party" / "flax_nnx_gpt_train_cpu.hlo.gz"
    out = tmp_path / "report.json"
    assert cli_main(["replay", str(path), "--verify", "--no-ptxas", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "verify: OK" in printed and "where f32 rounding decides" in printed, printed
    checked = json.loads(out.read_text())[0]["verify"]
    assert checked["ok"] and checked["rounding_decides"].startswith("output 1: 1 of"), checked


def noise_sign(x, w):
    """The sign of (x @ w) summed over rows minus the same sum taken first: rounding noise."""
    return jnp.sign((x @ w).sum(0) - x.sum(0) @ w), x * 2.0


def test_the_runtime_check_takes_a_sign_rounding_decides_and_not_an_error():
    """Against a reference lucky everywhere (XLA's f64 result rounded to f32), a flipped sign
    where other roundings land is accepted; an error of 0.01 in a well-conditioned output is
    not."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    w = rng.standard_normal((32, 16)).astype(np.float32)
    compiled = jax.jit(noise_sign).lower(x, w).compile()
    executor = Executor(compiled, "noise_sign", verify=True)
    text = optimized_hlo_text(compiled)
    exact = [np.asarray(v) for v in run_hlo_with_xla(widened_to_f64(text), [
        x.astype(np.float64), w.astype(np.float64)])]
    lucky = [v.astype(np.float32) for v in exact]
    reach = rounding_reach(parse_module(text), [x, w], exact)
    assert (reach[0] >= 1).any()  # some sign other roundings flip
    flipped = lucky[0].copy()
    at = int(np.argmax(reach[0] >= 1))
    flipped[at] = -1.0 if exact[0][at] >= 0 else 1.0
    inputs = ((x, w), {})
    drift, detail = executor._f64_drift(inputs, lucky, [flipped, lucky[1]])
    assert drift is Drift.WITHIN_ROUNDING and detail.startswith("output 0: 1 of 16"), detail
    wrong = lucky[1].copy()
    wrong[3, 3] += 0.01
    assert executor._f64_drift(inputs, lucky, [lucky[0], wrong])[0] is Drift.BEYOND
