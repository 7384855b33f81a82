"""Library-call fixtures: small functions whose XLA:GPU plan is one cuBLAS or cuDNN call
(or one Triton GEMM fusion), to check that the evaluator runs XLA:GPU's opaque nodes
(fusionstitching/hlo/gpu_library.py) as XLA means them. Each covers one backend_config
feature: a cuBLASLt epilogue (BIAS_RELU, BIAS_GELU), alpha (a scaled batched product), beta
(an added matrix), a cuDNN convolution with its window and dim_labels.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def dense_relu(x, w, b):
    return jnp.maximum(x @ w + b, 0.0)


def dense_gelu(x, w, b):
    return jax.nn.gelu(x @ w + b, approximate=True)


def scaled_scores(q, k):
    return jnp.einsum("bqd,bkd->bqk", q, k) * 0.125


def dense_residual(x, w, residual):
    return x @ w + residual


def conv(x, w):
    return lax.conv_general_dilated(x, w, (2, 1), ((1, 1), (2, 2)),
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))


JAX_FUNCTIONS = {f.__name__: f for f in (dense_relu, dense_gelu, scaled_scores,
                                          dense_residual, conv)}
ARG_SHAPES = {"dense_relu": [(64, 32), (32, 16), (16,)],
              "dense_gelu": [(64, 32), (32, 16), (16,)],
              "scaled_scores": [(4, 16, 8), (4, 12, 8)],
              "dense_residual": [(64, 32), (32, 16), (64, 16)],
              "conv": [(2, 12, 10, 3), (3, 5, 3, 8)]}


def example_inputs(name: str, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in ARG_SHAPES[name]]
