"""A quiet start beside the ``[xla-gpu]`` extra. Its JAX CUDA plugin (there for deviceless
XLA:GPU compiles) fails to initialize in every JAX program on a machine without an NVIDIA
driver, printing tracebacks and ``cudart_stub`` lines before JAX falls back to the CPU. At
start-up (the .pth line), with that plugin installed, no NVIDIA driver and no TPU runtime,
``JAX_PLATFORMS`` defaults to ``cpu``: the platform JAX ends up on there anyway, without the
noise. A ``JAX_PLATFORMS`` the user set is kept; the deviceless compiler works under ``cpu``.
"""
from __future__ import annotations

import importlib.util
import os

NVIDIA_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl")


def default_jax_platforms(environ=os.environ) -> bool:
    """Set ``JAX_PLATFORMS=cpu`` where the CUDA plugin can only fail; True when it did."""
    if "JAX_PLATFORMS" in environ or any(map(os.path.exists, NVIDIA_DRIVER_FILES)):
        return False
    if not _installed("jax_plugins.xla_cuda12") or _installed("libtpu"):
        return False
    environ["JAX_PLATFORMS"] = "cpu"
    return True


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or half-installed package: not ours to judge
        return False
