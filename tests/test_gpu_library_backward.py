"""cuDNN convolution gradients (``__cudnn$convBackwardInput``, ``__cudnn$convBackwardFilter``)
evaluated on this CPU by fusionstitching/hlo/gpu_library.py give what XLA:CPU computes.

The fixtures in tests/data/hlo/gpu_library/ are XLA:GPU H100 modules (deviceless, default
flags) of the vector-Jacobian product of one small convolution (the functions below), so
their plan is the two gradient custom calls, or one and a forward convolution where XLA:GPU
plans the input gradient as one (depthwise). Regenerate them with

    JAX_PLATFORMS=cpu python tests/test_gpu_library_backward.py
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if __name__ == "__main__":  # capturing: metadata source paths relative to the repository
    os.environ["JAX_HLO_SOURCE_FILE_CANONICALIZATION_REGEX"] = r"^.*/(?=tests/)"
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax import lax  # noqa: E402

from fusionstitching.hlo import evaluator, gpu_library  # noqa: E402
from fusionstitching.hlo.parser import parse_file, parse_module  # noqa: E402
from fusionstitching.hlo.xla_runner import run_hlo_with_xla  # noqa: E402

DATA = Path(__file__).parent / "data" / "hlo" / "gpu_library"
BACKWARD_INPUT, BACKWARD_FILTER = gpu_library.BACKWARD_CONV_TARGETS


def _conv(x, w, strides, padding, groups=1, dims=("NHWC", "HWIO", "NHWC")):
    return lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=dims,
                                    feature_group_count=groups)


def _vjp(forward, x, w, dy):
    """(dx, dw) of the convolution for the output cotangent dy: what a training step's
    backward pass computes for one convolution layer."""
    return jax.vjp(forward, x, w)[1](dy)


def conv_s1_same(x, w, dy):
    return _vjp(lambda a, b: _conv(a, b, (1, 1), "SAME"), x, w, dy)


def conv_s2_same(x, w, dy):  # the input gradient's result is XLA's padded input, [2,9,9,3]
    return _vjp(lambda a, b: _conv(a, b, (2, 2), "SAME"), x, w, dy)


def conv1x1_s2_valid(x, w, dy):  # every other input position gets no gradient
    return _vjp(lambda a, b: _conv(a, b, (2, 2), "VALID"), x, w, dy)


def depthwise_s1_same(x, w, dy):
    return _vjp(lambda a, b: _conv(a, b, (1, 1), "SAME", groups=4), x, w, dy)


def depthwise_x2_s2_same(x, w, dy):  # channel multiplier 2
    return _vjp(lambda a, b: _conv(a, b, (2, 2), "SAME", groups=4), x, w, dy)


def conv3d_ncdhw(x, w, dy):  # XLA:GPU's layout gives dim_labels bf012_oi012->bf012
    return _vjp(lambda a, b: _conv(a, b, (1, 2, 1), "SAME", dims=("NCDHW", "OIDHW", "NCDHW")),
                x, w, dy)


# name -> (function, x shape, w shape, dy shape, custom-call targets XLA:GPU plans it with)
CASES = {
    "conv_s1_same": (conv_s1_same, (2, 8, 8, 3), (3, 3, 3, 4), (2, 8, 8, 4),
                     {BACKWARD_INPUT, BACKWARD_FILTER}),
    "conv_s2_same": (conv_s2_same, (2, 8, 8, 3), (3, 3, 3, 4), (2, 4, 4, 4),
                     {BACKWARD_INPUT, BACKWARD_FILTER}),
    "conv1x1_s2_valid": (conv1x1_s2_valid, (2, 8, 8, 4), (1, 1, 4, 6), (2, 4, 4, 6),
                         {BACKWARD_INPUT, BACKWARD_FILTER}),
    "depthwise_s1_same": (depthwise_s1_same, (2, 8, 8, 4), (3, 3, 1, 4), (2, 8, 8, 4),
                          {"__cudnn$convForward", BACKWARD_FILTER}),
    "depthwise_x2_s2_same": (depthwise_x2_s2_same, (2, 8, 8, 4), (3, 3, 1, 8), (2, 4, 4, 8),
                             {"__cudnn$convForward", BACKWARD_FILTER}),
    "conv3d_ncdhw": (conv3d_ncdhw, (1, 2, 4, 6, 5), (3, 2, 3, 3, 2), (1, 3, 4, 3, 5),
                     {BACKWARD_INPUT, BACKWARD_FILTER}),
}


def _path(name: str) -> Path:
    return DATA / f"{name}_jax_h100.hlo"


def _inputs(name: str) -> list[np.ndarray]:
    rng = np.random.default_rng(sum(map(ord, name)))
    return [rng.standard_normal(s).astype(np.float32) for s in CASES[name][1:4]]


def _custom_calls(module):
    return [i for c in module.computations for i in c.instructions if i.opcode == "custom-call"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_xla_gpu_conv_gradient_matches_xla_cpu(name):
    fn, *_, targets = CASES[name]
    module = parse_file(_path(name))
    calls = _custom_calls(module)
    assert {c.custom_call_target for c in calls} == targets, "the fixture's plan changed"
    if name.startswith("depthwise"):
        (grad,) = [c for c in calls if c.custom_call_target == BACKWARD_FILTER]
        assert grad.attrs["feature_group_count"] == "4"
    args = _inputs(name)
    expected = [np.asarray(e) for e in jax.jit(fn)(*args)]
    with jax.enable_x64(True):
        exact = [np.asarray(e) for e in jax.jit(fn)(*[a.astype(np.float64) for a in args])]
    got = evaluator.evaluate(module, args)
    assert len(got) == len(expected) == 2
    for g, e, x in zip(got, expected, exact):
        assert g.shape == e.shape and g.dtype == e.dtype == np.float32
        scale = float(np.abs(x).max())
        # XLA:CPU's f32 sums (at most 72 products here) are within 2.4e-7 of the scale of
        # the exact result; 1e-6 leaves room for other summation orders, nothing more.
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-6 * scale)
        # The evaluator sums in f64 and rounds once: within an f32 ulp of the scale.
        np.testing.assert_allclose(g, x, rtol=0, atol=2.0 ** -23 * scale)


# Hand-written calls: one input channel, a 3-tap filter w, window stride 2 and one padding
# element each side, so the padded input is xp = [0, x0, .., x4, 0] and the forward output
# y[j] = sum_k w[k] xp[2j + k] for j = 0, 1, 2. With x = [1, 2, 3, 4, 5], w = [1, 2, 3] and
# dy = [1, 10, 100]:
#   dw[k] = sum_j dy[j] xp[2j + k]          = [0+20+400, 1+30+500, 2+40+0]    = [420, 531, 42]
#   dx[i] = sum_{2j+k=i+1} dy[j] w[k]       = [2, 3+10, 20, 30+100, 200]     = [2, 13, 20, 130, 200]
# A second channel, in its own feature group, has x, w and dy negated and doubled: its
# gradients are 4 times the first channel's.
X = np.array([1, 2, 3, 4, 5], np.float32)
W = np.array([1, 2, 3], np.float32)
DY = np.array([1, 10, 100], np.float32)
CONFIG = ('backend_config={"cudnn_conv_backend_config":{"activation_mode":"kNone",'
          '"conv_result_scale":%s,"side_input_scale":0}}')


def _call(target, result, lhs, rhs, scale=1):
    return f"""HloModule grad
ENTRY main {{
  lhs = {lhs} parameter(0)
  rhs = {rhs} parameter(1)
  call = ({result}, u8[0]{{0}}) custom-call(lhs, rhs), window={{size=3 stride=2 pad=1_1}}, dim_labels=b0f_o0i->b0f, feature_group_count=2, custom_call_target="{target}", {CONFIG % scale}
  ROOT grad = {result} get-tuple-element(call), index=0
}}
"""


def _two_channels(a: np.ndarray) -> np.ndarray:
    return np.stack([a, -2 * a], axis=-1)[None]  # [1, n, 2]: batch, position, feature


def test_hand_written_backward_filter():
    text = _call(BACKWARD_FILTER, "f32[2,3,1]", "f32[1,5,2]", "f32[1,3,2]")
    dw = evaluator.evaluate(parse_module(text), [_two_channels(X), _two_channels(DY)])
    assert dw.shape == (2, 3, 1)  # o0i: output feature, tap, input feature within the group
    np.testing.assert_array_equal(dw[..., 0], [[420, 531, 42], [1680, 2124, 168]])


def test_hand_written_backward_input():
    text = _call(BACKWARD_INPUT, "f32[1,5,2]", "f32[1,3,2]", "f32[2,3,1]", scale=0.5)
    w = np.stack([W, -2 * W])[:, :, None]  # o0i
    dx = evaluator.evaluate(parse_module(text), [_two_channels(DY), w])
    want = 0.5 * np.array([2, 13, 20, 130, 200], np.float32)  # conv_result_scale=0.5
    np.testing.assert_array_equal(dx, _two_channels(want) * np.array([1, -2], np.float32))


def test_backward_input_gives_zero_where_no_window_reaches():
    # A 1-tap window with stride 2 reads input positions 0, 2, 4 of 6; position 5 is also
    # beyond the last window. Their gradient is zero.
    text = _call(BACKWARD_INPUT, "f32[1,6,1]", "f32[1,3,1]", "f32[1,1,1]").replace(
        "size=3 stride=2 pad=1_1", "size=1 stride=2").replace("feature_group_count=2, ", "")
    dx = evaluator.evaluate(parse_module(text), [DY[None, :, None], np.full((1, 1, 1), 3.0,
                                                                            np.float32)])
    np.testing.assert_array_equal(dx[0, :, 0], [3, 0, 30, 0, 300, 0])


def _capture_all() -> None:
    """Writes the fixtures: XLA:GPU H100 optimized HLO, as the capture helper returns it."""
    from fusionstitching import capture

    DATA.mkdir(parents=True, exist_ok=True)
    for name, (fn, *shapes, _) in CASES.items():
        specs = [jax.ShapeDtypeStruct(s, np.float32) for s in shapes]
        _path(name).write_text(capture.jax_hlo(fn, *specs, target="h100"))
        print(_path(name))


if __name__ == "__main__":
    _capture_all()


REVERSED_FORWARD = """
HloModule reversed

ENTRY main {
  x = f32[2,8,8,4]{3,2,1,0} parameter(0)
  w = f32[8,3,3,4]{3,2,1,0} parameter(1)
  c = (f32[2,6,3,8]{3,2,1,0}, u8[0]{0}) custom-call(x, w), window={size=3x3 stride=1x2 rhs_reversal=1x1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convForward", backend_config={"cudnn_conv_backend_config":{"activation_mode":"kNone","conv_result_scale":1,"side_input_scale":0}}
  ROOT r = f32[2,6,3,8]{3,2,1,0} get-tuple-element(c), index=0
}
"""


def test_a_forward_call_with_a_reversed_window_runs_on_xla_cpu():
    """XLA:GPU writes some filter gradients (a flax ResNet step's) as forward cuDNN calls
    with ``rhs_reversal``: the reference XLA:CPU runs them as HLO convolutions with the same
    window, which equal JAX's convolution with the filter flipped; the evaluator agrees."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 8, 4)).astype(np.float32)
    w = rng.standard_normal((8, 3, 3, 4)).astype(np.float32)
    want = _conv(x, w[:, ::-1, ::-1, :], (1, 2), "VALID", dims=("NHWC", "OHWI", "NHWC"))
    (got,) = run_hlo_with_xla(REVERSED_FORWARD, [x, w])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(evaluator.evaluate(parse_module(REVERSED_FORWARD), [x, w]),
                               want, rtol=1e-5, atol=1e-5)
