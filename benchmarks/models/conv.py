"""Convolution front ends of the speech and OCR models (JAX: NHWC convolutions, pooling)."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from . import layers
from .ops import JAX


def conv_shapes(kernel: tuple[int, int], c_in: int, c_out: int) -> dict:
    """Convolution (HWIO kernel, no bias: BatchNorm follows) + inference BatchNorm."""
    return {"w": (*kernel, c_in, c_out),
            "bn": {"gamma": (c_out,), "beta": (c_out,), "mean_b": (c_out,), "var": (c_out,)}}


def conv_bn(x, p, strides=(1, 1)):
    """NHWC convolution with 'SAME' padding, then inference BatchNorm."""
    y = lax.conv_general_dilated(x, p["w"], strides, "SAME",
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    bn = p["bn"]
    # running variance is stored as a raw weight; its square keeps it positive
    stats = {"gamma": bn["gamma"], "beta": bn["beta"], "mean": bn["mean_b"],
             "var": bn["var"] * bn["var"]}
    return layers.batch_norm_infer(JAX, y, stats)


def max_pool(x, window: tuple[int, int], strides: tuple[int, int]):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, *window, 1), (1, *strides, 1), "VALID")
