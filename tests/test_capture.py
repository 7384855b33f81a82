"""Capture helper (JAX/TF -> XLA:CPU or deviceless XLA:GPU optimized HLO) and the HLO corpus."""
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.models import micro
from fusionstitching import capture

REPO = Path(__file__).resolve().parent.parent
HLO_DIR = REPO / "tests" / "data" / "hlo"


needs_cuda_plugin = pytest.mark.skipif(
    not capture.xla_gpu_available(),
    reason="jax CUDA plugin (jax_plugins.xla_cuda12) not importable: "
           "pip install fusionstitching[xla-gpu] for XLA:GPU deviceless capture")


def _layernorm_args(shape=(64, 256)):
    return [jax.ShapeDtypeStruct(s, jnp.float32) for s in micro.arg_shapes("layernorm", shape)]


def test_jax_cpu_capture():
    text = capture.jax_hlo(micro.layernorm, *_layernorm_args())
    assert "ENTRY" in text and "f32[64,256]" in text


def test_jax_cpu_capture_accepts_concrete_arrays():
    text = capture.jax_hlo(micro.softmax, np.zeros((8, 16), np.float32))
    assert "ENTRY" in text and "f32[8,16]" in text


def test_tf_cpu_capture():
    tf = pytest.importorskip("tensorflow")
    specs = [tf.TensorSpec(s, tf.float32) for s in micro.arg_shapes("rmsnorm", (64, 256))]
    text = capture.tf_hlo(micro.tf_functions()["rmsnorm"], *specs)
    assert "ENTRY" in text and "fusion(" in text



def test_tf_cpu_capture_prints_large_constants_in_full():
    """TF's own text elides them as ``{...}`` (the sinusoid table XLA folds here)."""
    tf = pytest.importorskip("tensorflow")
    from fusionstitching.hlo.parser import parse_module
    from fusionstitching.hlo.xla_runner import run_hlo_with_xla

    @tf.function(jit_compile=True)
    def add_positions(x):
        return x + tf.sin(tf.range(1024, dtype=tf.float32) * 0.01)

    x = np.linspace(-1, 1, 1024, dtype=np.float32)
    text = capture.tf_hlo(add_positions, tf.TensorSpec([1024], tf.float32))
    assert "{...}" not in text and "f32[1024]{0} constant({" in text
    parse_module(text)
    (got,) = run_hlo_with_xla(text, [x])
    np.testing.assert_allclose(got, add_positions(x).numpy(), rtol=1e-6, atol=1e-6)

@needs_cuda_plugin
def test_jax_gpu_capture_classic_with_dump(tmp_path):
    # In a pytest process JAX is not on JAX_PLATFORMS=cpu, so this also covers the child path.
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32)
    text = capture.jax_hlo(micro.softmax, x, target="h100", classic=True, dump_to=tmp_path)
    assert "ENTRY" in text
    assert "kind=kInput" in text and "__triton" not in text  # classic reduction fusions
    assert list(tmp_path.glob("*.ptx")), "XLA should dump PTX per kernel"


@needs_cuda_plugin
def test_tf_gpu_capture():
    tf = pytest.importorskip("tensorflow")
    specs = [tf.TensorSpec(s, tf.float32) for s in micro.arg_shapes("layernorm", (64, 256))]
    text = capture.tf_hlo_for_gpu(micro.tf_functions()["layernorm"], *specs, target="a100",
                                  classic=True)
    assert "ENTRY" in text and "kind=kInput" in text


def test_cli_cpu_with_bare_array_type():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "fusionstitching.capture", "jax",
         "benchmarks.models.micro:rmsnorm", "f32[8,16]", "f32[16]"],
        capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ENTRY" in proc.stdout and "f32[8,16]" in proc.stdout


def test_copies_are_routed_around_for_stablehlo():
    from jax._src.lib import xla_client as xc

    hlo = """HloModule m
ENTRY e {
  p = f32[4,8]{1,0} parameter(0)
  t = f32[8,4]{0,1} transpose(p), dimensions={1,0}
  c = f32[8,4]{1,0} copy(t)
  ROOT r = f32[4,8]{1,0} copy(p)
}"""
    routed = capture._route_around_copies(hlo)
    assert "copy(" not in routed
    proto = xc.hlo.hlo_module_from_text(routed).as_serialized_hlo_module_proto()
    assert b"mhlo.copy" not in xc._xla.mlir.hlo_to_stablehlo(proto)


def test_tuple_copy_is_refused_clearly():
    with pytest.raises(capture.CaptureError, match="tuple-shaped copy"):
        capture._route_around_copies("  c = (f32[2]{0}, f32[3]{0}) copy(t)\n")


def test_argument_codec_round_trip():
    args = (jax.ShapeDtypeStruct((2, 3), jnp.bfloat16),
            {"w": np.zeros((4,), np.float32), "eps": 1e-5}, [jax.ShapeDtypeStruct((), jnp.int32)])
    decoded = [capture._decode_arg(json.loads(json.dumps(capture._encode_arg(a)))) for a in args]
    assert decoded[0] == jax.ShapeDtypeStruct((2, 3), jnp.bfloat16)
    assert decoded[1] == {"w": jax.ShapeDtypeStruct((4,), jnp.float32), "eps": 1e-5}
    assert decoded[2] == [jax.ShapeDtypeStruct((), jnp.int32)]


def test_gpu_capture_refuses_functions_a_child_cannot_import():
    with pytest.raises(capture.CaptureError, match="top level"):
        capture._importable_name(lambda x: x)


def test_missing_cuda_plugin_says_how_to_install(monkeypatch):
    monkeypatch.setattr(capture, "_CUDA_PLUGIN", "jax_plugins.not_installed")
    with pytest.raises(capture.CaptureError, match=r"pip install fusionstitching\[xla-gpu\]"):
        capture.jax_hlo(micro.softmax, jax.ShapeDtypeStruct((8, 16), jnp.float32), target="h100")


def test_bad_options_are_refused():
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    with pytest.raises(ValueError, match="unknown target"):
        capture.jax_hlo(micro.softmax, x, target="h200")
    with pytest.raises(ValueError, match="classic"):
        capture.jax_hlo(micro.softmax, x, classic=True)


@pytest.mark.parametrize("target", sorted(capture.GPU_TARGETS))
def test_target_configs_ship_with_the_package(target):
    assert "gpu_device_info" in capture.target_config(target)


def test_corpus_manifest_matches_files():
    manifest = json.loads((HLO_DIR / "manifest.json").read_text())
    on_disk = {p.name for p in HLO_DIR.glob("*.hlo*")}  # *.hlo and gzipped *.hlo.gz
    assert set(manifest) == on_disk
    for name, entry in manifest.items():
        assert (HLO_DIR / name).is_file()
        assert {"model", "framework", "target", "parameters", "regenerate"} <= set(entry)
        assert name.startswith(f"{entry['model']}_") and f"_{entry['framework']}_" in name
