"""GPU launch path (runtime/gpu.py): everything that needs no device.

Launch dimensions and buffer order come from the KernelSpec and the PTX; the launcher's
proto is decoded from the custom call's attribute after XLA's own parser and HLO->StableHLO
conversion read it; the rewritten modules compile with XLA:GPU for an H100 without a GPU,
and XLA's final HLO is checked for our custom calls (and for XLA's kernels being gone).
Launching, stream ordering and numbers on a GPU are not tested here (no GPU).
"""
import dataclasses
import re
import subprocess
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from benchmarks.models import micro
from fusionstitching import capture, pipeline
from fusionstitching.codegen import find_ptxas
from fusionstitching.hlo.parser import parse_file, parse_module
from fusionstitching.runtime import build, gpu
from fusionstitching.runtime.rewrite import RewriteError

DATA = Path(__file__).parent / "data" / "hlo"


needs_cuda_plugin = pytest.mark.skipif(
    not capture.xla_gpu_available(),
    reason="jax CUDA plugin (jax_plugins.xla_cuda12) not importable: "
           "pip install fusionstitching[xla-gpu]")


def _stitched(name: str):
    module = parse_file(DATA / name)
    return module, pipeline.stitch_module(module, pipeline.Options(target="h100"))


@pytest.fixture(scope="module")
def layernorm():
    # Rows of 2048: a block schedule, so the launch carries static shared memory.
    module, result = _stitched("layernorm_32x2048_jax_h100_classic.hlo")
    assert len(result.kernels) == 1, result.report.fallbacks
    return module, result


@pytest.fixture(scope="module")
def dien():
    """DIEN inference for H100: kernels with several outputs (tuple-shaped custom calls)."""
    module, result = _stitched("dien_infer_small_jax_h100_classic.hlo.gz")
    assert any(len(k.spec.outputs) > 1 for k in result.kernels)
    return module, result


# -- protobuf wire format, just enough to read the launcher's TritonAnyKernelCall -----------

def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if byte < 0x80:
            return value, i


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    out, i = [], 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i:i + size], i + size
        else:
            raise AssertionError(f"unexpected wire type {wire} in field {number}")
        out.append((number, value))
    return out


def _one(fields, number, default=0):
    values = [v for n, v in fields if n == number]
    assert len(values) <= 1
    return values[0] if values else default  # proto3 omits zero values


def _decode_kernel_call(opaque: bytes) -> dict:
    """jaxlib/gpu/triton.proto: TritonAnyKernelCall{kernel_call=1, name=4};
    TritonKernelCall{kernel=1, grid_0..2=2..4, parameters=5};
    TritonKernel{kernel_name=1, num_warps=2, shared_mem_bytes=3, ptx=4, compute_capability=6,
    num_ctas=10}; Parameter{array=1 {bytes_to_zero=1, ptr_divisibility=2}}."""
    any_call = _fields(zlib.decompress(opaque))
    call = _fields(_one(any_call, 1))
    kernel = _fields(_one(call, 1))
    parameters = []
    for number, value in call:
        if number == 5:
            (kind, array), = _fields(value)
            assert kind == 1, "every parameter is an array (a buffer pointer)"
            array = _fields(array)
            parameters.append((_one(array, 1), _one(array, 2)))
    return {
        "name": _one(any_call, 4).decode(),
        "kernel_name": _one(kernel, 1).decode(), "num_warps": _one(kernel, 2),
        "shared_mem_bytes": _one(kernel, 3), "ptx": _one(kernel, 4).decode(),
        "compute_capability": _one(kernel, 6), "num_ctas": _one(kernel, 10),
        "grid": (_one(call, 2), _one(call, 3), _one(call, 4)), "parameters": parameters,
    }


# -- launch description ---------------------------------------------------------------------

def test_launch_dims_and_buffer_order_come_from_the_spec_and_the_ptx(layernorm):
    _, result = layernorm
    kernel = result.kernels[0]
    spec, nvptx = kernel.spec, kernel.nvptx
    launch = gpu.launch_for(spec, nvptx)

    assert launch.grid == (spec.grid[0], 1, 1)
    assert launch.block == (spec.block[0], 1, 1)
    assert launch.num_warps * 32 == spec.block[0]
    assert launch.kernel_name == spec.kernel.name
    assert launch.target == spec.name and launch.target.startswith("fusionstitching")
    assert launch.compute_capability == 90 and nvptx.arch == "sm_90"
    # Shared arrays are static in the PTX: nothing dynamic on top of them.
    assert launch.dynamic_smem_bytes == 0
    assert re.search(r"\.shared\s", nvptx.ptx)
    assert launch.static_smem_bytes == nvptx.smem_bytes > 0
    # Inputs then outputs, each in the physical layout the kernel indexes.
    assert [(p.name, p.shape, p.is_output) for p in launch.parameters] == \
        [(n, s, False) for n, s in spec.inputs] + [(n, s, True) for n, s in spec.outputs]
    assert gpu.ptx_entry_parameters(nvptx.ptx, spec.kernel.name) == len(launch.parameters)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) not found")
def test_ptx_assembles_for_what_the_launcher_compiles(layernorm, tmp_path):
    """jaxlib's launcher assembles the PTX with ptxas for the proto's compute capability at
    initialization; for 90 that is sm_90a (the accelerated-features variant)."""
    kernel = layernorm[1].kernels[0]
    launch = gpu.launch_for(kernel.spec, kernel.nvptx)
    source = tmp_path / "k.ptx"
    source.write_text(launch.ptx)
    run = subprocess.run([find_ptxas(), f"-arch=sm_{launch.compute_capability}a", str(source),
                          "-o", str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_compute_capability_names():
    assert gpu.compute_capability("sm_90") == 90
    assert gpu.compute_capability("sm_90a") == 90
    assert gpu.compute_capability("sm_80") == 80
    with pytest.raises(ValueError):
        gpu.compute_capability("gfx90a")


@pytest.mark.parametrize("change, message", [
    (dict(block=(48,)), "whole number of warps"),
    (dict(block=(2048,)), "whole number of warps"),
    (dict(block=(128, 2)), "in x only"),
    (dict(grid=(4, 2)), "in x only"),
    (dict(grid=(0,)), "grid of 0 blocks"),
])
def test_launches_the_launcher_cannot_start_are_refused(layernorm, change, message):
    kernel = layernorm[1].kernels[0]
    with pytest.raises(RewriteError, match=message):
        gpu.launch_for(dataclasses.replace(kernel.spec, **change), kernel.nvptx)


def test_ptx_that_does_not_match_the_buffers_is_refused(layernorm):
    kernel = layernorm[1].kernels[0]
    one_less = re.sub(r",\s*\.param[^,)]*\)", ")", kernel.nvptx.ptx, count=1)
    with pytest.raises(RewriteError, match="parameters for"):
        gpu.launch_for(kernel.spec, dataclasses.replace(kernel.nvptx, ptx=one_less))
    with pytest.raises(RewriteError, match="no entry"):
        gpu.launch_for(dataclasses.replace(kernel.spec, kernel=dataclasses.replace(
            kernel.spec.kernel, name="other")), kernel.nvptx)
    too_much = dataclasses.replace(kernel.nvptx, smem_bytes=64 * 1024)
    with pytest.raises(RewriteError, match="static shared memory"):
        gpu.launch_for(kernel.spec, too_much)


# -- the custom call --------------------------------------------------------------------------

@needs_cuda_plugin
def test_opaque_holds_the_ptx_grid_warps_and_one_pointer_per_buffer(layernorm):
    kernel = layernorm[1].kernels[0]
    launch = gpu.launch_for(kernel.spec, kernel.nvptx)
    decoded = _decode_kernel_call(gpu.opaque(launch))
    assert decoded == {
        "name": launch.target, "kernel_name": launch.kernel_name,
        "num_warps": kernel.spec.block[0] // 32, "shared_mem_bytes": 0, "ptx": kernel.nvptx.ptx,
        "compute_capability": 90, "num_ctas": 1, "grid": (kernel.spec.grid[0], 1, 1),
        "parameters": [(0, 16)] * (len(kernel.spec.inputs) + len(kernel.spec.outputs)),
    }


@needs_cuda_plugin
def test_custom_call_text_survives_xla_parser_and_stablehlo(layernorm):
    """What XLA reads back from our HLO text: the target, the typed-FFI API, the layouts the
    kernel indexes, and the launcher's opaque bytes unchanged."""
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client as xc
    from jax._src.lib.mlir import ir

    module, result = layernorm
    kernel = result.kernels[0]
    text = gpu.rewrite_for_gpu(module, result)
    (call,) = [line for line in text.splitlines() if "custom-call(" in line]
    assert f'custom_call_target="{kernel.spec.name}"' in call
    assert "api_version=API_VERSION_TYPED_FFI" in call
    operands = ", ".join(str(s) for _, s in kernel.spec.inputs)
    assert f"operand_layout_constraints={{{operands}}}" in call
    (_, out_shape), = kernel.spec.outputs
    assert f"= {out_shape} custom-call(" in call  # the result's physical layout

    proto = xc.hlo.hlo_module_from_text(text)
    stablehlo = xc._xla.mlir.hlo_to_stablehlo(proto.as_serialized_hlo_module_proto())
    with mlir.make_ir_context():
        parsed = ir.Module.parse(stablehlo)
        calls = []

        def visit(op):
            if op.operation.name == "stablehlo.custom_call":
                calls.append(op.operation)
            return ir.WalkResult.ADVANCE

        parsed.operation.walk(visit)
        (op,) = calls
        assert ir.StringAttr(op.attributes["call_target_name"]).value == kernel.spec.name
        config = ir.DictAttr(op.attributes["backend_config"])
        opaque = ir.StringAttr(config["opaque"]).value_bytes
    assert opaque == gpu.opaque(gpu.launch_for(kernel.spec, kernel.nvptx))


@needs_cuda_plugin
def test_a_cudnn_convolution_is_written_as_the_convolution_xla_gpu_derives_again():
    """A cuDNN call passed through would lose its window on the StableHLO route (XLA then
    aborts the process); written as a plain convolution, XLA:GPU makes the call again."""
    module = parse_module((DATA / "conv_jax_h100_cublas.hlo").read_text())
    result = pipeline.stitch_module(module, pipeline.Options(target="h100"))
    text = gpu.rewrite_for_gpu(module, result)
    assert "__cudnn$" not in text and " convolution(" in text
    final = gpu.compile_for_gpu_deviceless(text, "h100")
    (call,) = [line for line in _entry(final).splitlines() if "custom-call(" in line]
    assert 'custom_call_target="__cudnn$convForward"' in call
    assert "window={size=3x5 stride=2x1 pad=1_1x2_2}" in call


def test_modules_with_other_xla_library_calls_stay_xla():
    """A cuBLAS call keeps its meaning in a backend_config the normalization strips: the
    rewrite refuses before anything is compiled."""
    module = parse_module(CUBLAS_GEMM)
    result = pipeline.stitch_module(module, pipeline.Options(target="h100"))
    with pytest.raises(RewriteError, match=r"__cublas\$gemm"):
        gpu.rewrite_for_gpu(module, result)


CUBLAS_GEMM = """HloModule gemm

ENTRY %main (a: f32[4,4], b: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0)
  %b = f32[4,4]{1,0} parameter(1)
  %gemm = (f32[4,4]{1,0}, s8[0]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"alpha_real":1}}
  ROOT %out = f32[4,4]{1,0} get-tuple-element(%gemm), index=0
}
"""


@needs_cuda_plugin
def test_a_kernel_that_cannot_launch_is_left_to_xla_with_a_reason(layernorm):
    module, result = layernorm
    kernel = result.kernels[0]
    odd = dataclasses.replace(kernel, spec=dataclasses.replace(kernel.spec, block=(48,)))
    report = dataclasses.replace(result.report, fallbacks=[])
    text = gpu.rewrite_for_gpu(module, dataclasses.replace(result, kernels=[odd],
                                                           report=report))
    assert "custom-call" not in text
    (fallback,) = report.fallbacks
    assert fallback.stage == "gpu-launch" and "48 threads" in fallback.reason
    assert set(fallback.nodes) == set(kernel.pattern.nodes)


def test_only_fusionstitching_targets_are_registered():
    with pytest.raises(ValueError, match="not a FusionStitching target"):
        gpu.register_launch_targets(["triton_kernel_call_ffi"])


# -- deviceless XLA:GPU compile for H100 -----------------------------------------------------

def _entry(hlo_text: str) -> str:
    return hlo_text[hlo_text.index("\nENTRY"):]


@needs_cuda_plugin
def test_jax_layernorm_compiles_for_h100_with_our_kernel_instead_of_xlas():
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32)
    p = jax.ShapeDtypeStruct((256,), jnp.float32)
    optimized = capture.jax_hlo(micro.layernorm, x, p, p, target="h100", classic=True)
    module = parse_module(optimized)
    result = pipeline.stitch_module(module, pipeline.Options(target="h100"))
    (kernel,) = result.kernels
    # XLA:GPU's own plan: a reduction kernel and the normalization kernel.
    assert len(re.findall(r"\bfusion\(", _entry(optimized))) >= 2

    final = gpu.compile_for_gpu_deviceless(gpu.rewrite_for_gpu(module, result), "h100")

    entry = _entry(final)
    calls = [line for line in entry.splitlines() if "custom-call(" in line]
    assert len(calls) == 1
    assert f'custom_call_target="{kernel.spec.name}"' in calls[0]
    assert "backend_config={opaque = " in calls[0]
    # The whole LayerNorm is our kernel: XLA launches none of its own for it.
    assert "fusion(" not in final and "reduce(" not in final


@needs_cuda_plugin
def test_multi_output_kernels_compile_as_tuple_custom_calls(dien):
    module, result = dien
    text = gpu.rewrite_for_gpu(module, result)
    final = gpu.compile_for_gpu_deviceless(text, "h100")
    for kernel in result.kernels:
        (call,) = [line for line in _entry(final).splitlines()
                   if f'custom_call_target="{kernel.spec.name}"' in line]
        launch = _decode_kernel_call(_opaque_of(text, kernel.spec.name))
        assert len(launch["parameters"]) == len(kernel.spec.inputs) + len(kernel.spec.outputs)
        if len(kernel.spec.outputs) > 1:
            assert re.search(r"= \(.*\) custom-call\(", call), call  # tuple result


def _opaque_of(text: str, target: str) -> bytes:
    """The opaque bytes in our HLO text (HLO string escapes, then MLIR's \\XX)."""
    (line,) = [t for t in text.splitlines() if f'custom_call_target="{target}"' in t]
    escaped = re.search(r'opaque = \\"((?:\\\\[0-9A-F]{2})*)\\"', line).group(1)
    return bytes(int(h, 16) for h in re.findall(r"\\\\([0-9A-F]{2})", escaped))


@needs_cuda_plugin
def test_a_stitched_module_keeps_its_loops_known_trip_count():
    # The flax LSTM's scan: XLA:GPU's plan knows the loop runs 16 times; with the counter's
    # start value in our kernel it did not, and the step ran 2.3x slower on an H200.
    module = parse_file(DATA / "third_party" / "flax_lstm_infer_h100.hlo")
    result = pipeline.stitch_module(module, pipeline.Options(target="h100"))
    assert result.kernels
    final = gpu.compile_for_gpu_deviceless(gpu.rewrite_for_gpu(module, result), "h100")
    (loop,) = [line for line in final.splitlines() if " while(" in line]
    assert '"known_trip_count":{"n":"16"}' in loop


# -- the GPU route of fusionstitching.jit (runtime/build.py), up to XLA:GPU's compile ---------

class _FakeCudaDevice:
    platform, compute_capability = "gpu", "9.0"


@needs_cuda_plugin
def test_jit_on_a_gpu_plans_for_the_card_and_launches_ptx(monkeypatch, tmp_path):
    """On a CUDA device the build makes launcher calls (no host code) that XLA:GPU compiles,
    and the plan cache gives the same module back. No GPU here: the device is a stand-in,
    XLA:GPU compiles without one and the swap is recorded instead of made."""

    compiled_texts = []

    def compile_deviceless(text, device):
        assert device is fake
        compiled_texts.append(gpu.compile_for_gpu_deviceless(text, "h100"))
        return "executable"

    fake = _FakeCudaDevice()
    monkeypatch.setattr(build, "gpu_device_of", lambda compiled: fake)
    monkeypatch.setattr(build.xla, "compile_hlo", compile_deviceless)
    monkeypatch.setattr(build.xla, "swap_executable", lambda lowered, compiled, exe: exe)
    x = jnp.ones((64, 256), jnp.float32)
    p = jnp.ones((256,), jnp.float32)
    lowered = jax.jit(micro.layernorm).lower(x, p, p)
    options = pipeline.Options(target="a100")  # the card decides: sm_90 plans as an H100

    built = build.build_stitched(lowered, lowered.compile(), options, str(tmp_path))

    assert built.stitched == "executable" and built.stitched_report.target == "h100"
    assert built.stitched_report.fs.mem_kernels < built.xla_report.fs.mem_kernels
    targets = gpu.launch_targets(built.rewritten_hlo)
    assert targets and all(f'custom_call_target="{t}"' in _entry(compiled_texts[0])
                           for t in targets)
    again = build.build_stitched(lowered, lowered.compile(), options, str(tmp_path))
    assert again.cache.plan == "hit" and again.rewritten_hlo == built.rewritten_hlo
    assert len(compiled_texts) == 2
