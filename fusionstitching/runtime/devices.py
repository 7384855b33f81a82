"""The device a jax executable runs on, and the cost model's target for a CUDA device."""
from __future__ import annotations

import costmodel


def gpu_device_of(xla_compiled):
    """The CUDA device XLA's executable runs on, or None (the host route)."""
    device = xla_compiled.runtime_executable().local_devices()[0]
    return device if device.platform in ("gpu", "cuda") else None


def device_compute_capability(device) -> int:
    """A jax CUDA device's compute capability: ``"9.0"`` -> 90."""
    major, _, minor = str(device.compute_capability).partition(".")
    return int(major) * 10 + int(minor or 0)


def target_for(device) -> str:
    """The cost model's device (costmodel.TARGETS) for a jax CUDA device: the one of the same
    compute capability (an H200 is planned as the H100 it shares sm_90 with); "h100" when
    none matches (the PTX is still built for the device's own architecture)."""
    arch = f"sm_{device_compute_capability(device)}"
    for target in costmodel.TARGETS:
        if costmodel.load_device(target).sm_arch == arch:
            return target
    return "h100"
