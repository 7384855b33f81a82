"""The GPU run kit (benchmarks/gpu_kit.py prepares, benchmarks/gpu_check.py runs): its logic
without a GPU. Launch attributes made again by the running jaxlib, kernel loading and argument
packing (a recording stand-in for CuPy), interleaved timing, the module check on XLA:CPU, and
the exit without a GPU."""
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from benchmarks import gpu_check, gpu_kit
from fusionstitching import capture

DATA = Path(__file__).parent / "data" / "hlo"

needs_cuda_plugin = pytest.mark.skipif(
    not capture.xla_gpu_available(),
    reason="jax CUDA plugin (jax_plugins.xla_cuda12) not importable: "
           "pip install fusionstitching[xla-gpu]")


@pytest.fixture(scope="module")
def layernorm_entry():
    name = "layernorm_64x256_jax_h100_classic"
    return gpu_kit.kit_entry(name, (DATA / f"{name}.hlo").read_text(), name)


def test_a_kit_entry_holds_both_modules_and_the_stitched_kernels(layernorm_entry):
    entry = layernorm_entry
    assert len(entry["kernels"]) == 1 and entry["modeled"]["xla_mem_kernels"] == 3
    kernel = entry["kernels"][0]
    assert f'custom_call_target="{kernel["name"]}"' in entry["stitched_hlo"]
    assert "custom_call_target" not in entry["baseline_hlo"]
    assert f".entry {kernel['entry']}(" in kernel["ptx"]
    assert [p[0] for p in entry["params"]] == ["f32", "f32", "f32"]


@needs_cuda_plugin
def test_launch_attributes_made_again_equal_the_rewrite(layernorm_entry):
    entry = layernorm_entry
    again = gpu_check.with_launch_configs(entry["stitched_hlo"], entry["kernels"], 90)
    assert again == entry["stitched_hlo"]
    other = gpu_check.with_launch_configs(entry["stitched_hlo"], entry["kernels"], 80)
    assert other != entry["stitched_hlo"]  # the compute capability is in the attribute


def test_cudnn_modules_are_written_with_plain_convolutions():
    text = (DATA / "conv_jax_h100.hlo").read_text()
    entry = gpu_kit.kit_entry("conv_jax_h100", text, "conv_jax_h100")
    assert "__cudnn$" in text
    for plain in (entry["stitched_hlo"], entry["baseline_hlo"]):
        assert "__cudnn$" not in plain and " convolution(" in plain


class _RecordingCupy:
    """Stands in for CuPy: records what the kit loads and launches; every launch takes 1 ms."""

    float32 = np.float32

    def __init__(self):
        self.loaded, self.launches = [], []
        outer = self

        class RawModule:
            def __init__(self, path):
                outer.loaded.append(Path(path).read_text())

            def get_function(self, name):
                return lambda grid, block, args: outer.launches.append((name, grid, block, args))

        class Event:
            def record(self, stream=None):
                self.at = len(outer.launches)

            def synchronize(self):
                pass

        class Device:
            def synchronize(self):
                pass

        class Stream:  # without graph capture: the kit falls back to plain launches
            def __init__(self, non_blocking=False):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def begin_capture(self):
                raise RuntimeError("no capture in this stand-in")

        Stream.null = Stream()

        class cuda:  # noqa: N801 (CuPy's name)
            pass

        cuda.Event, cuda.Device, cuda.Stream = Event, Device, Stream
        cuda.get_elapsed_time = staticmethod(lambda start, stop: float(stop.at - start.at))
        self.RawModule, self.cuda = RawModule, cuda
        self.random = type("random", (), {"standard_normal": staticmethod(
            lambda n, dtype: np.zeros(n, dtype))})

    @staticmethod
    def zeros(n, dtype):
        return np.zeros(n, dtype)


def test_a_kernel_is_loaded_from_its_ptx_and_launched_on_its_buffers(layernorm_entry, tmp_path):
    kernel = layernorm_entry["kernels"][0]
    cupy = _RecordingCupy()
    row = gpu_check.time_kernel(cupy, kernel, str(tmp_path))
    assert cupy.loaded == [kernel["ptx"]]
    name, grid, block, args = cupy.launches[-1]
    assert name == kernel["entry"]
    assert grid == (math.prod(kernel["grid"]),) and block == (math.prod(kernel["block"]),)
    sizes = [a.nbytes for a in args]
    assert sizes == [gpu_check.buffer_bytes(s) for s in kernel["inputs"] + kernel["outputs"]]
    assert row["measured_us"] == pytest.approx(1000.0)  # 1 ms per launch, as recorded
    assert not row["graphed"]
    assert row["bytes"] == kernel["read_bytes"] + kernel["write_bytes"]


def test_interleaved_timing_alternates_and_takes_medians():
    now = [0.0]
    order = []

    def runner(name, per_call):
        def run(n):
            order.append(name)
            now[0] += n * per_call
        return run

    seconds = gpu_check.interleaved_seconds({"a": runner("a", 1e-3), "b": runner("b", 2e-3)},
                                            rounds=3, round_s=0.01, clock=lambda: now[0])
    assert seconds == pytest.approx({"a": 1e-3, "b": 2e-3})
    assert order[-6:] == ["a", "b"] * 3  # timed rounds alternate


def test_a_module_is_checked_against_xlas_f64_result(layernorm_entry):
    # On XLA:CPU, with XLA's module in place of the stitched one (the launcher needs a GPU).
    entry = dict(layernorm_entry, stitched_hlo=layernorm_entry["baseline_hlo"], kernels=[])
    row = gpu_check.run_module(entry, jax.devices("cpu")[0], 90)
    assert row["check"] == "f64" and row["problems"] == [] and row["finite"] == 1.0
    assert row["xla_us"] > 0 and row["fs_us"] > 0


def test_without_a_gpu_the_check_says_so_and_exits_0(tmp_path, capsys):
    assert gpu_check.main(["--kit", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert "no GPU here" in capsys.readouterr().out


def test_the_verdict_leaves_out_outputs_rounding_decides_and_vacuous_steps():
    exact = [np.array([1.0, 2.0, 4.0]), np.array([100.0, -50.0])]
    xla = [np.array([1.0, 2.0, 4.0], np.float32), np.array([70.0, -50.0], np.float32)]
    good = [np.array([1.0, 2.0, 4.0], np.float32), np.array([20.0, 10.0], np.float32)]
    # Output 1: XLA's own f32 is 30% off its f64 result, so it says nothing about a kernel.
    assert gpu_check.verdict(good, xla, exact, 1.0) == ("f64", [], 1)
    wrong = [np.array([1.0, 2.5, 4.0], np.float32), good[1]]
    check, problems, chaotic = gpu_check.verdict(wrong, xla, exact, 1.0)
    assert check == "MISMATCH" and problems[0].startswith("output 0:") and chaotic == 1
    assert gpu_check.verdict(good, xla, exact, 0.2)[0] == "vacuous"
    assert gpu_check.verdict(good[1:], xla[1:], exact[1:], 1.0)[0] == "no verdict"


def test_the_table_says_vacuous_where_most_outputs_were_not_finite():
    row = dict(module="m", xla_mem_kernels=5, fs_mem_kernels=2, xla_us=10.0, fs_us=8.0,
               speedup=1.25, noise=0.01, check="f64", finite=0.0)
    kernel = dict(kernel="k", module="m", measured_us=2.0, modeled_us=2.0)
    text = gpu_check.table([dict(modules=[row, dict(row, module="n", finite=1.0)],
                                 kernels=[kernel])])
    lines = {line.split()[0]: line for line in text.splitlines() if line}
    assert lines["m"].endswith("vacuous (finite 0%)") and lines["n"].endswith("f64")
    assert "1 stitched kernels timed alone: measured/modeled median 1.00, 1 within 25%" in text
