"""Producer caching across reduction stages and 128-bit global accesses, per schedule: each
variant's output equals XLA's (host backend), the instrumented host run counts the loads the
kernel IR claims, cached stages read every input element once and compute exp once, and the
vector variants assemble (ptxas sm_80, sm_90) to ld/st.global.v4 without spills."""
from __future__ import annotations

import dataclasses
import functools
import os
import re

import numpy as np
import pytest

from costmodel import load_device
from fusionstitching.codegen import Schedule, compile_nvptx, count_traffic, find_ptxas, generate
from fusionstitching.codegen.flatten import flatten
from fusionstitching.codegen.schedules.candidates import enumerate_schedules
from fusionstitching.codegen.schedules.choose import build_kernel
from fusionstitching.codegen.schedules.shared_memory import reuse_shared_memory
from fusionstitching.codegen.schedules.space import reduction_space
from fusionstitching.codegen.traffic import global_traffic
from fusionstitching.hlo.parser import parse_file, parse_module
from helpers_codegen import check_against_xla, kernel_nodes, module_text

HLO = os.path.join(os.path.dirname(__file__), "data", "hlo")


@functools.cache
def pattern_of(file: str):
    module = parse_file(os.path.join(HLO, file + ".hlo"))
    nodes = kernel_nodes(module)
    return module, generate(module, nodes, "k"), flatten(module, nodes)


def variant(file: str, kind: str, threads: int, vector: int, cached: bool):
    """The pattern's kernel under one block or warp schedule, as a spec."""
    module, spec, pattern = pattern_of(file)
    space = reduction_space(pattern)
    sched = Schedule(kind, space, 1, threads, space.groups, vector, cached) if kind == "block" \
        else Schedule(kind, space, 1, 32, space.groups, vector, cached)
    kernel, _ = build_kernel(pattern, sched, "k")
    reuse_shared_memory(kernel)
    return module, dataclasses.replace(spec, kernel=kernel, grid=kernel.grid, block=kernel.block,
                                       smem_bytes=kernel.smem_bytes)


# The last variant takes two chunks of 4 per thread, so its stages are loops (64 x 4 threads
# cover a row in one pass: straight-line code, like the cached variants).
VARIANTS = [("block", 256, 1, True), ("block", 64, 4, True), ("warp", 32, 4, True),
            ("block", 32, 4, False)]


@pytest.mark.parametrize("file", ["layernorm_64x256_jax_h100_classic",
                                  "softmax_64x256_jax_h100_classic"])
@pytest.mark.parametrize("kind,threads,vector,cached", VARIANTS)
def test_cached_and_vector_schedules_equal_xla_and_count_their_loads(file, kind, threads,
                                                                     vector, cached):
    module, spec = variant(file, kind, threads, vector, cached)
    check_against_xla(module, spec, rtol=1e-5, atol=1e-6)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s.dims).astype(np.float32) for _, s in spec.inputs]
    traffic = count_traffic(spec, *inputs)
    raw_read, raw_write = global_traffic(spec.kernel)
    assert (traffic.raw_read_bytes, traffic.raw_write_bytes) == (raw_read, raw_write)
    assert traffic.read_bytes == spec.read_bytes and raw_write == spec.write_bytes
    x = 64 * 256 * 4  # the [64,256] input; LayerNorm's gamma and beta are re-read per row
    per_row = raw_read - x if cached else None
    stages = str(spec.kernel).count("for r")
    if cached:
        assert stages == 0 and per_row == spec.read_bytes - x + (
            2 * 63 * 256 * 4 if file.startswith("layernorm") else 0)
        # softmax: exp(x - max) once per point, shared by the sum and the output
        assert str(spec.kernel).count("exponential") == (
            256 // threads if file.startswith("softmax") else 0)
    else:
        assert stages == 3 and raw_read > spec.read_bytes + x  # x read by every stage


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("kind,threads,vector,cached", VARIANTS)
def test_vector_schedules_assemble_to_128_bit_accesses(kind, threads, vector, cached, arch):
    if find_ptxas() is None:
        pytest.skip("find_ptxas() is None: no ptxas on PATH or in nvidia-cuda-nvcc")
    _, spec = variant("layernorm_64x256_jax_h100_classic", kind, threads, vector, cached)
    kernel = compile_nvptx(spec, arch)
    assert kernel.spills == 0 and kernel.regs <= 64
    accesses = set(re.findall(r"(?:ld|st)\.global[\w.]*", kernel.ptx))
    assert ("ld.global.nc.v4.b32" in accesses) == (vector == 4)  # read-only path, 128 bits
    assert ("st.global.v4.b32" in accesses) == (vector == 4)


def test_aligned_remainders_fold_so_lanes_stay_visible():
    # floor((a*y + s) / k) = floor(y / (k/a)) when a | k and 0 <= s < a, checked at every point.
    from fusionstitching.codegen.index_expr import Var, add, div, mod, scale
    from fusionstitching.codegen.kernel_ir import vector_group
    from fusionstitching.hlo.ir import Shape
    bid, tid, chunk = Var("bid", 64), Var("tid", 128), Var("c", 1024)
    env = {"bid": np.arange(64)[:, None], "tid": np.arange(128)[None, :]}
    row = add(scale(bid, 128), tid)
    assert str(div(row, 256)) == "(bid // 2)"  # tid < 128: the row comes from bid alone
    linear = 128 * env["bid"] + env["tid"]
    for k in (2, 4, 8, 128, 256, 512):
        np.testing.assert_array_equal(div(row, k).evaluate(env) + 0 * linear, linear // k)
        np.testing.assert_array_equal(mod(row, k).evaluate(env) + 0 * linear, linear % k)
    c = np.arange(1024)
    for lane in range(4):
        point = add(scale(chunk, 4), lane)
        column = mod(point, 256)  # a broadcast operand's column: 4*(c % 64) + lane
        np.testing.assert_array_equal(column.evaluate({"c": c}), (4 * c + lane) % 256)
        assert vector_group(Shape("f32", (256,), (0,)), column, "f32")[1] == lane


def test_one_pass_schedules_are_straight_line_and_equal_xla():
    # 64 threads x 4 elements cover a softmax row: no loop, 128-bit loads and stores.
    module, spec, pattern = pattern_of("softmax_64x256_jax_h100_classic")
    space = reduction_space(pattern)
    kernel, _ = build_kernel(pattern, Schedule("block", space, 1, 64, space.groups, 4), "k")
    text = str(kernel)
    assert "for " not in text and "f32x4 = global_load" in text and "pack" in text
    check_against_xla(module, spec, kernel, rtol=1e-5, atol=1e-6)
    # A loop schedule with more threads than elements: one guarded pass, no loop.
    module, spec, pattern = pattern_of("gelu_tanh_64x256_jax_h100_classic")
    n = 64 * 256
    kernel, _ = build_kernel(pattern, Schedule("loop", reduction_space(pattern), 96, 1,
                                               -(-n // 96)), "k")
    assert "for " not in str(kernel) and f"if 96*bid + tid < {n}:" in str(kernel)
    check_against_xla(module, spec, kernel, rtol=1e-5, atol=1e-6)


def test_gpu_division_and_roots_are_xla_gpus():
    # XLA:GPU divides with div.full.f32 (-nvptx-prec-divf32=1) and calls libdevice's
    # sqrt/rsqrt (approximate without __CUDA_PREC_SQRT); the host keeps XLA:CPU's IEEE ops.
    _, spec, _ = pattern_of("layernorm_64x256_jax_h100_classic")
    ptx = compile_nvptx(spec, "sm_90").ptx
    assert "rsqrt.approx.f32" in ptx and "sqrt.rn" not in ptx
    _, spec, _ = pattern_of("softmax_64x256_jax_h100_classic")
    ptx = compile_nvptx(spec, "sm_90").ptx
    assert "div.full.f32" in ptx and "div.rn.f32" not in ptx


ROW_SUM = """
  %x = f32[64,COLS]{1,0} parameter(0)
  %e = f32[64,COLS]{1,0} exponential(%x)
  %z = f32[] constant(0)
  ROOT %r = f32[64]{0} reduce(%e, %z), dimensions={1}, to_apply=%add"""


@pytest.mark.parametrize("cols,unrolled", [(256, True), (512, True), (1024, False)])
def test_short_row_loops_are_enumerated_unrolled_with_their_loads_in_flight(cols, unrolled):
    """One stage, nothing reused: a warp of 128-bit chunks takes a row of 256 columns in 2
    trips and one of 512 in 4, loops LLVM would keep with one load in flight
    (`unrolled_trips`); their unrolled variant is straight-line code, its loads independent.
    8 trips (1024 columns) LLVM unrolls itself: no variant."""
    module = parse_module(module_text("", ROW_SUM.replace("COLS", str(cols))))
    spec = generate(module, ["e", "r"], "k")
    pattern = flatten(module, ["e", "r"])
    warp = [s for s in enumerate_schedules(reduction_space(pattern), load_device("h100"), [64])
            if s.kind == "warp" and s.vector == 4 and s.groups_per_block == 1]
    assert [s.unrolled for s in warp] == ([False, True] if unrolled else [False])
    kernel, _ = build_kernel(pattern, warp[-1], "k")
    check_against_xla(module, spec, kernel, rtol=1e-5)
    assert ("for r" in str(kernel)) == (not unrolled)
    if unrolled and find_ptxas() is not None:
        ptx = compile_nvptx(dataclasses.replace(spec, kernel=kernel, grid=kernel.grid,
                                                block=kernel.block), "sm_90").ptx
        before_combine = ptx[ptx.index(".entry"):].split("shfl")[0]
        assert "bra" not in before_combine  # no loop
        assert before_combine.count("ld.global.nc.v4") == cols // 128
