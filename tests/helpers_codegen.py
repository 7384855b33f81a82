"""Shared by the code generator's tests (test_codegen*.py): the add/max combiners and a module
around an entry body, the kernel nodes of a module, seeded inputs, a stitched kernel checked
against XLA:CPU on the host backend, and ptxas assembling kernels without spills."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from fusionstitching.codegen import compile_host, compile_nvptx, find_ptxas  # noqa: E402
from fusionstitching.hlo.xla_runner import run_hlo_with_xla  # noqa: E402

TRIVIAL = {"parameter", "constant", "tuple", "get-tuple-element"}


def kernel_nodes(module) -> list[str]:
    """The entry instructions that launch or compute something: a whole module as one
    pattern."""
    return [i.name for i in module.entry.instructions if i.opcode not in TRIVIAL]


ADD = """
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] maximum(%a, %b)
}
"""


def module_text(params: str, body: str) -> str:
    # The entry signature is left out: XLA's parser derives it from the parameters and ROOT.
    del params
    return f"HloModule m\n{ADD}\nENTRY %main {{\n{body}\n}}\n"


def snippet_inputs(module, rng):
    out = []
    for p in module.entry.parameters:
        dtype = p.shape.numpy_dtype
        if p.shape.dtype.startswith("s"):  # indices and divisors: small, some negative/zero
            out.append(rng.integers(-3, 18, p.shape.dims).astype(dtype))
        elif p.shape.dtype.startswith("u"):  # random bits: the whole range, and some zeros
            bits = rng.integers(0, np.iinfo(dtype).max, p.shape.dims, dtype=dtype,
                                endpoint=True)
            out.append(np.where(rng.random(p.shape.dims) < 0.1, 0, bits).astype(dtype))
        else:
            out.append(rng.standard_normal(p.shape.dims).astype(np.float32).astype(dtype))
    return out


def entry_outputs(module) -> list[str]:
    root = module.entry.root
    return list(root.operands) if root.opcode == "tuple" else [root.name]


def check_against_xla(module, spec, kernel=None, rtol=2e-6, atol=1e-6):
    rng = np.random.default_rng(0)
    args = snippet_inputs(module, rng)
    expected = dict(zip(entry_outputs(module), run_hlo_with_xla(str(module), args)))
    if kernel is not None:
        spec = dataclasses.replace(spec, kernel=kernel, grid=kernel.grid, block=kernel.block)
    number = {p.name: p.parameter_number for p in module.entry.parameters}
    inputs = [args[number[n]] for n, _ in spec.inputs]
    # The GPU schedule emulated, and the CPU-scheduled kernel the runtime runs on XLA:CPU.
    runs = [("emulated", compile_host(spec)(*inputs))]
    if spec.host_kernel is not None:
        runs.append(("fast host", compile_host(spec, fast=True)(*inputs)))
    for kind, got in runs:
        assert len(got) == len(expected)
        for (name, _), value in zip(spec.outputs, got):
            want = np.asarray(expected[name])
            if want.dtype.kind == "f" or want.dtype.name in ("bfloat16",):
                np.testing.assert_allclose(value.astype(np.float32), want.astype(np.float32),
                                           rtol=rtol, atol=atol, err_msg=f"{kind}: {name}")
            else:
                np.testing.assert_array_equal(value, want, err_msg=f"{kind}: {name}")


def assert_assembles_without_spills(specs, arch: str) -> None:
    """Each KernelSpec assembles with ptxas for ``arch``: no spills, the shared memory the code
    generator planned. Skips only where no ptxas exists."""
    if find_ptxas() is None:
        pytest.skip("find_ptxas() is None: no ptxas on PATH or in nvidia-cuda-nvcc")
    for spec in specs:
        kernel = compile_nvptx(spec, arch)
        assert kernel.cubin and kernel.spills == 0, spec.name
        assert kernel.smem_bytes == spec.smem_bytes, spec.name
