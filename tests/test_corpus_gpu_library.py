"""XLA:GPU's opaque nodes evaluated on this CPU (fusionstitching/hlo/gpu_library.py) give
what JAX computes for the same function on XLA:CPU.

The fixtures (benchmarks/models/library.py, captured by benchmarks/make_corpus.py) are
XLA:GPU H100 modules whose plan is one cuBLASLt GEMM (epilogues BIAS_RELU and BIAS_GELU,
alpha of a scaled batched product, beta of an added matrix) or one cuDNN convolution
(``*_h100_cublas.hlo``: Triton GEMM off), and the default plan with Triton GEMM fusions
(``*_h100.hlo``).
"""
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from benchmarks.models import library
from fusionstitching.hlo import evaluator, gpu_library
from fusionstitching.hlo.eval_values import UnsupportedOp
from fusionstitching.hlo.parser import parse_file, parse_module

DATA = Path(__file__).parent / "data" / "hlo"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
FIXTURES = sorted(n for n, e in MANIFEST.items() if e.get("kind") == "library"
                  and e["target"] == "h100" and "skipped" not in e)


@pytest.mark.parametrize("name", FIXTURES)
def test_gpu_module_matches_jax_on_cpu(name):
    model = MANIFEST[name]["model"]
    module = parse_file(DATA / name)
    opaque = [i for c in module.computations for i in c.instructions
              if i.opcode == "custom-call" or (i.opcode == "fusion" and i.fusion_kind == "kCustom")]
    assert opaque, f"{name}: the fixture should hold XLA:GPU's library node"
    args = library.example_inputs(model)
    expected = np.asarray(jax.jit(library.JAX_FUNCTIONS[model])(*args))
    got = evaluator.evaluate(module, args)  # library calls dispatched to gpu_library
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_cublas_fixtures_exercise_each_backend_config_feature():
    configs = []
    for name in FIXTURES:
        for inst in parse_file(DATA / name).entry.instructions:
            if inst.custom_call_target in gpu_library.GEMM_TARGETS:
                configs.append(inst.attr_json()["gemm_backend_config"])
    assert {c["epilogue"] for c in configs} >= {"DEFAULT", "BIAS_RELU", "BIAS_GELU"}
    assert any(float(c["alpha_real"]) != 1 for c in configs)
    assert any(float(c["beta"]) != 0 for c in configs)
    assert any(c["dot_dimension_numbers"]["lhs_batch_dimensions"] for c in configs)


def test_workspace_output_is_returned_and_unknown_targets_are_refused():
    module = parse_file(DATA / "dense_relu_jax_h100_cublas.hlo")
    (gemm,) = [i for i in module.entry.instructions if i.opcode == "custom-call"]
    x, w, b = library.example_inputs("dense_relu")
    result, workspace = gpu_library.evaluate_custom_call(module, gemm, [x, w, b])
    assert result.shape == (64, 16) and workspace.dtype == np.int8
    np.testing.assert_allclose(result, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)

    text = (DATA / "dense_relu_jax_h100_cublas.hlo").read_text().replace(
        '"__cublas$lt$matmul"', '"__cublas$lt$matmul$f8"')
    renamed = parse_module(text)
    (call,) = [i for i in renamed.entry.instructions if i.opcode == "custom-call"]
    with pytest.raises(UnsupportedOp, match="matmul\\$f8"):
        gpu_library.evaluate_custom_call(renamed, call, [x, w, b])
