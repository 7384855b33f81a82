"""The phased schedule: reductions over different spaces (row statistics and column sums of the
same inputs, a reduction consuming another space's results) in one kernel, phases handing their
results over through shared memory; one block, or the last phase spread over several blocks
that each compute the earlier phases. Numbers against XLA:CPU (jaxlib) through
the host backend (the GPU schedule and the one-thread host schedule), kernel and schedule
asserted, ptxas sm_80/sm_90 without spills; and the one-block memory bound of the cost model."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import costmodel
from fusionstitching.codegen import Refusal, Schedule, can_stitch, count_traffic, generate
from fusionstitching.codegen.flatten import flatten
from fusionstitching.codegen.kernel_ir import GlobalLoad, GlobalStore, Loop, SharedStore
from fusionstitching.codegen.schedules.choose import _build_and_price
from fusionstitching.codegen.schedules.phased import build_phased_kernel
from fusionstitching.codegen.schedules.space import Space
from fusionstitching.hlo.parser import parse_module

from helpers_codegen import (kernel_nodes, assert_assembles_without_spills, check_against_xla,
                             module_text)

# LayerNorm backward over [16,32] rows: the row statistics (mean, variance; O=16 R=32), the row
# sums of the input gradient's terms (a later stage, reading the statistics), and the column
# reductions dgamma and dbeta (O=32 R=16; dgamma reads the row statistics).
LAYERNORM_BACKWARD = """
  %x = f32[16,32]{1,0} parameter(0)
  %dy = f32[16,32]{1,0} parameter(1)
  %gamma = f32[32]{0} parameter(2)
  %zero = f32[] constant(0)
  %inv = f32[] constant(0.03125)
  %eps0 = f32[] constant(1e-05)
  %n = f32[16,32]{1,0} broadcast(%inv), dimensions={}
  %n16 = f32[16]{0} broadcast(%inv), dimensions={}
  %eps = f32[16]{0} broadcast(%eps0), dimensions={}
  %sx = f32[16]{0} reduce(%x, %zero), dimensions={1}, to_apply=%add
  %mean = f32[16,32]{1,0} broadcast(%sx), dimensions={0}
  %mean_n = f32[16,32]{1,0} multiply(%mean, %n)
  %xc = f32[16,32]{1,0} subtract(%x, %mean_n)
  %xc2 = f32[16,32]{1,0} multiply(%xc, %xc)
  %sv = f32[16]{0} reduce(%xc2, %zero), dimensions={1}, to_apply=%add
  %var = f32[16]{0} multiply(%sv, %n16)
  %ve = f32[16]{0} add(%var, %eps)
  %rstd = f32[16]{0} rsqrt(%ve)
  %rstd_b = f32[16,32]{1,0} broadcast(%rstd), dimensions={0}
  %xhat = f32[16,32]{1,0} multiply(%xc, %rstd_b)
  %dyx = f32[16,32]{1,0} multiply(%dy, %xhat)
  %dgamma = f32[32]{0} reduce(%dyx, %zero), dimensions={0}, to_apply=%add
  %dbeta = f32[32]{0} reduce(%dy, %zero), dimensions={0}, to_apply=%add
  %gb = f32[16,32]{1,0} broadcast(%gamma), dimensions={1}
  %g = f32[16,32]{1,0} multiply(%dy, %gb)
  %sg = f32[16]{0} reduce(%g, %zero), dimensions={1}, to_apply=%add
  %gx = f32[16,32]{1,0} multiply(%g, %xhat)
  %sgx = f32[16]{0} reduce(%gx, %zero), dimensions={1}, to_apply=%add
  %sg_b = f32[16,32]{1,0} broadcast(%sg), dimensions={0}
  %sgx_b = f32[16,32]{1,0} broadcast(%sgx), dimensions={0}
  %mg = f32[16,32]{1,0} multiply(%sg_b, %n)
  %mgx = f32[16,32]{1,0} multiply(%sgx_b, %n)
  %t1 = f32[16,32]{1,0} subtract(%g, %mg)
  %t2 = f32[16,32]{1,0} multiply(%xhat, %mgx)
  %t3 = f32[16,32]{1,0} subtract(%t1, %t2)
  %dx = f32[16,32]{1,0} multiply(%t3, %rstd_b)
  ROOT %out = (f32[16,32]{1,0}, f32[32]{0}, f32[32]{0}) tuple(%dx, %dgamma, %dbeta)"""

# A column sum of x minus its row means ([64,48]: O=64 R=48, then O=48 R=64), plus the full sum
# of its squares (O=1: all threads split R, a block_reduce), and a max with a non-identity init.
CENTERED_COLUMN_SUM = """
  %x = f32[64,48]{1,0} parameter(0)
  %zero = f32[] constant(0)
  %low = f32[] constant(-1)
  %inv = f32[] constant(0.020833334)
  %s = f32[64]{0} reduce(%x, %zero), dimensions={1}, to_apply=%add
  %sb = f32[64,48]{1,0} broadcast(%s), dimensions={0}
  %n = f32[64,48]{1,0} broadcast(%inv), dimensions={}
  %mean = f32[64,48]{1,0} multiply(%sb, %n)
  %xc = f32[64,48]{1,0} subtract(%x, %mean)
  %col = f32[48]{0} reduce(%xc, %zero), dimensions={0}, to_apply=%add
  %colmax = f32[48]{0} reduce(%xc, %low), dimensions={0}, to_apply=%max
  %sq = f32[64,48]{1,0} multiply(%xc, %xc)
  %total = f32[] reduce(%sq, %zero), dimensions={0,1}, to_apply=%add
  ROOT %out = (f32[48]{0}, f32[48]{0}, f32[]) tuple(%col, %colmax, %total)"""


def _generate(body: str):
    module = parse_module(module_text("", body))
    nodes = kernel_nodes(module)
    return module, generate(module, nodes, "phases")


@pytest.fixture(scope="module")
def layernorm_backward():
    return _generate(LAYERNORM_BACKWARD)


@pytest.fixture(scope="module")
def centered_column_sum():
    return _generate(CENTERED_COLUMN_SUM)


# The same LayerNorm backward with 512 columns: dgamma's 512 results (the last phase, read by
# no reduction) are more than one block's threads.
WIDE_LAYERNORM_BACKWARD = LAYERNORM_BACKWARD.replace("16,32", "16,512").replace(
    "f32[32]", "f32[512]").replace("0.03125", "0.001953125")


@pytest.fixture(scope="module")
def wide_layernorm_backward():
    return _generate(WIDE_LAYERNORM_BACKWARD)


def _assert_phased(spec, phases: int) -> None:
    assert spec.why.startswith(f"phased schedule: one block of {spec.block[0]} threads, "
                              f"{phases} phases"), spec.why
    assert spec.grid == (1,) and "block_composition" in spec.schemes
    # The one-space schedules were refused for the spaces, with the reason.
    assert any(r.schedule is None and r.kind is Refusal.DIFFERENT_SPACES for r in spec.refused)
    assert any("reductions over different spaces" in why and t == float("inf")
               for why, t in spec.candidates)


def test_layernorm_backward_is_one_phased_kernel_equal_to_xla(layernorm_backward):
    module, spec = layernorm_backward
    # stage 1: row sums of x and of dy*gamma, column sums of dy; stage 2: the row variance;
    # stage 3: dgamma (columns) and the row sums of g*xhat (rows).
    _assert_phased(spec, 5)
    assert sorted(name for name, _ in spec.outputs) == ["dbeta", "dgamma", "dx"]
    check_against_xla(module, spec, rtol=1e-5, atol=1e-5)
    check_against_xla(module, spec, spec.host_kernel, rtol=1e-5, atol=1e-5)
    assert spec.host_kernel.block == (1,) and spec.host_kernel.grid == (1,)


def test_column_sum_of_centered_rows_reads_the_row_means_at_any_index(centered_column_sum):
    module, spec = centered_column_sum
    _assert_phased(spec, 3)
    check_against_xla(module, spec, rtol=1e-5, atol=1e-5)
    check_against_xla(module, spec, spec.host_kernel, rtol=1e-5, atol=1e-5)
    # The unrolled variant: the full sum's 3072 points over 128 threads (24 trips) are 3 runs
    # of 8 unrolled trips, the runs' partial sums carried through their loop; equal to XLA too.
    one_block = Schedule("phases", Space(1, 0), 128, 1, 1, phases=3, unrolled=True)
    runs = build_phased_kernel(flatten(module, spec.nodes), one_block, "u")[0]
    assert "for q1_1 = 0; q1_1 < 3; q1_1 += 1" in str(runs) and "for r1_1" not in str(runs)
    check_against_xla(module, spec, runs, rtol=1e-5, atol=1e-5)


def test_last_phase_spreads_over_blocks_that_each_compute_the_row_statistics(
        wide_layernorm_backward):
    module, spec = wide_layernorm_backward
    # dgamma's 512 columns in tiles of 32 columns x 4 threads (16 blocks), modeled faster
    # than a thread per column (4 blocks) and than one block.
    assert spec.why.startswith("phased schedule: 16 blocks of 128 threads, 5 phases"), spec.why
    assert "in tiles of 32 results x 4 threads" in spec.why
    assert spec.grid == (16,) and spec.block == (128,)
    # The row statistics (16 results, 512 points each) run a warp per row.
    assert "warp_composition" in spec.schemes
    # Both are left unpriced by the choice (their least times are not below its); priced:
    pattern = flatten(module, spec.nodes)
    times = [_build_and_price(pattern, Schedule("phases", Space(1, 0), 128, 1, blocks,
                                                phases=5), "t", costmodel.load_device("h100"),
                              spec.read_bytes, spec.write_bytes)[4] for blocks in (4, 1)]
    assert spec.modeled_us < times[0] < times[1]
    check_against_xla(module, spec, rtol=1e-5, atol=1e-5)
    check_against_xla(module, spec, spec.host_kernel, rtol=1e-5, atol=1e-5)
    thread_per_column = build_phased_kernel(
        flatten(module, spec.nodes), Schedule("phases", Space(1, 0), 128, 1, 4, phases=5),
        "t")[0]
    assert thread_per_column.grid == (4,)
    check_against_xla(module, spec, thread_per_column, rtol=1e-5, atol=1e-5)
    assert spec.host_kernel.grid == (1,) and spec.host_kernel.block == (1,)
    # Each output element is stored once over the grid; the blocks' statistics re-read x.
    rng = np.random.default_rng(0)
    traffic = count_traffic(spec, *[rng.standard_normal(s.dims).astype(np.float32)
                                   for _, s in spec.inputs])
    assert (traffic.read_bytes, traffic.write_bytes) == (spec.read_bytes, spec.write_bytes)
    assert traffic.raw_write_bytes == spec.write_bytes
    assert traffic.raw_read_bytes == spec.raw_read_bytes > spec.read_bytes


def test_a_phase_of_many_results_splits_each_result_over_lanes(layernorm_backward):
    """dbeta's 32 column sums over 16 rows on 128 threads: 4 lanes per column, 8 columns side
    by side in a warp (a warp load reads 8 consecutive columns at 4 rows), a sub-warp
    butterfly (lanes congruent mod 8), instead of a thread per column running its 16 rows
    serially. The variant with short loops unrolled is chosen; the rolled one (4 rows per
    lane in a loop) equals XLA too."""
    module, spec = layernorm_backward
    assert "warp_reduce.add" in str(spec.kernel) and "(lanes mod 8)" in str(spec.kernel)
    assert spec.why.endswith("short loops unrolled")
    one_block = Schedule("phases", Space(1, 0), 128, 1, 1, phases=5)
    rolled = build_phased_kernel(flatten(module, spec.nodes), one_block, "r")[0]
    assert "(lanes mod 8)" in str(rolled) and "for m" in str(rolled)
    check_against_xla(module, spec, rolled, rtol=1e-5, atol=1e-5)


# Row sums of x[2,16] (a warp per row, no lane has two points), then the full sum of the
# centered squares (32 points over 32 threads): no thread loops over points.
NO_LOOPS = """
  %x = f32[2,16]{1,0} parameter(0)
  %zero = f32[] constant(0)
  %s = f32[2]{0} reduce(%x, %zero), dimensions={1}, to_apply=%add
  %sb = f32[2,16]{1,0} broadcast(%s), dimensions={0}
  %xc = f32[2,16]{1,0} subtract(%x, %sb)
  %sq = f32[2,16]{1,0} multiply(%xc, %xc)
  ROOT %total = f32[] reduce(%sq, %zero), dimensions={0,1}, to_apply=%add"""


def test_a_phase_loop_of_few_trips_is_unrolled_in_a_variant(wide_layernorm_backward):
    """The tile's 16 rows over 4 threads are a loop of 4 trips, which LLVM keeps a loop (one
    load in flight per trip); the variant that unrolls it equals XLA too. One block's packed
    output loop (8192 elements over 128 threads: 64 trips) is unrolled in runs of 8 in a loop
    of 8 runs, and equals XLA. A variant with no loop to unroll (NO_LOOPS) is refused as the
    same kernel."""
    module, spec = wide_layernorm_backward
    tile = Schedule("phases", Space(1, 0), 32, 4, 16, phases=5)
    pattern = flatten(module, spec.nodes)
    rolled = build_phased_kernel(pattern, tile, "r")[0]
    unrolled = build_phased_kernel(pattern, dataclasses.replace(tile, unrolled=True), "u")[0]
    assert "for r_s" in str(rolled) and "for r_s" not in str(unrolled)
    check_against_xla(module, spec, unrolled, rtol=1e-5, atol=1e-5)
    one_block = Schedule("phases", Space(1, 0), 128, 1, 1, phases=5)
    runs = build_phased_kernel(pattern, dataclasses.replace(one_block, unrolled=True), "b")[0]
    assert "for e8192 = tid" in str(build_phased_kernel(pattern, one_block, "a")[0])
    assert "for qe8192 = 0; qe8192 < 8; qe8192 += 1" in str(runs) and "for e8192" not in str(runs)
    check_against_xla(module, spec, runs, rtol=1e-5, atol=1e-5)
    # Both build: priced, or left unpriced by the choice's bounds, never refused.
    listed = {re.split(r"; grid |; refused: |; not priced: ", why)[0]: why
              for why, _ in spec.candidates}
    for variant in (tile.why, tile.why + ", short loops unrolled"):
        assert "; refused: " not in listed[variant], listed[variant]
    _, no_loops = _generate(NO_LOOPS)
    assert any(r.kind is Refusal.SAME_KERNEL and r.schedule.unrolled for r in no_loops.refused)


def test_an_output_reading_spread_results_elsewhere_refuses_the_spread():
    """dgamma broadcast back over the rows: each block would need every block's columns."""
    body = WIDE_LAYERNORM_BACKWARD.replace(
        "ROOT %out = (f32[16,512]{1,0}, f32[512]{0}, f32[512]{0}) tuple(%dx, %dgamma, %dbeta)",
        "%dgb = f32[16,512]{1,0} broadcast(%dgamma), dimensions={1}\n"
        "  %dxg = f32[16,512]{1,0} add(%dx, %dgb)\n"
        "  ROOT %out = (f32[16,512]{1,0}, f32[512]{0}) tuple(%dxg, %dbeta)")
    module, spec = _generate(body)
    assert spec.grid == (1,), spec.why
    assert any(r.schedule.why.startswith("phased schedule: 4 blocks") and
               r.kind is Refusal.CROSS_BLOCK and
               "reads results spread over blocks (512)" in r.detail
               for r in spec.refused if r.schedule is not None)
    check_against_xla(module, spec, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_phased_kernels_assemble_without_spills(arch, layernorm_backward, centered_column_sum,
                                               wide_layernorm_backward):
    assert_assembles_without_spills([layernorm_backward[1], centered_column_sum[1],
                                    wide_layernorm_backward[1]], arch)


def test_too_much_work_for_one_block_is_refused_with_its_reason():
    body = CENTERED_COLUMN_SUM.replace("64,48", "1024,512").replace("f32[64]", "f32[1024]") \
        .replace("f32[48]", "f32[512]")
    module = parse_module(module_text("", body))
    refusal = can_stitch(module, kernel_nodes(module))
    assert refusal.kind is Refusal.DIFFERENT_SPACES
    points = 3 * 1024 * 512 + 2 * 512 + 1  # three reductions' operands, the outputs
    assert f"phased schedule: {points} points (reduction operands and outputs) are too many " \
           f"for one block" in refusal.detail


def test_a_one_space_pattern_keeps_its_schedule():
    """Patterns that build with one space never see the phased schedule (no candidate)."""
    body = CENTERED_COLUMN_SUM.replace(
        "%col = f32[48]{0} reduce(%xc, %zero), dimensions={0}",
        "%col = f32[64]{0} reduce(%xc, %zero), dimensions={1}").replace(
        "%colmax = f32[48]{0} reduce(%xc, %low), dimensions={0}",
        "%colmax = f32[64]{0} reduce(%xc, %low), dimensions={1}").replace(
        "%total = f32[] reduce(%sq, %zero), dimensions={0,1}, to_apply=%add",
        "%total = f32[64]{0} reduce(%sq, %zero), dimensions={1}, to_apply=%add").replace(
        "(f32[48]{0}, f32[48]{0}, f32[])", "(f32[64]{0}, f32[64]{0}, f32[64]{0})")
    module, spec = _generate(body)
    assert not spec.why.startswith("phased")
    assert not any(why.startswith("phased") for why, _ in spec.candidates)
    check_against_xla(module, spec, rtol=1e-5, atol=1e-5)


def test_a_small_grid_streams_at_its_share_of_the_bandwidth():
    device = costmodel.load_device("h100")
    nbytes = 1 << 20
    whole = costmodel.kernel_cost(nbytes, device).memory_us
    assert whole == pytest.approx(nbytes / device.memory_bandwidth * 1e6)
    assert costmodel.kernel_cost(nbytes, device, 1).memory_us == pytest.approx(
        whole * device.sm_count)
    assert costmodel.kernel_cost(nbytes, device, 4 * device.sm_count).memory_us == \
        pytest.approx(whole)
    profile = costmodel.KernelProfile(grid_blocks=1, threads_per_block=256, regs_per_thread=16,
                                     smem_bytes=0, instructions={"ld_global": 1},
                                     bytes_read=nbytes, bytes_written=0)
    assert costmodel.kernel_latency_us(profile, device).memory_us == pytest.approx(
        whole * device.sm_count)


# A value four elementwise ops deep, read by a row sum and a column sum (two spaces: phased).
TWO_READERS = """
  %x = f32[16,32]{1,0} parameter(0)
  %zero = f32[] constant(0)
  %a = f32[16,32]{1,0} multiply(%x, %x)
  %b = f32[16,32]{1,0} add(%a, %x)
  %c = f32[16,32]{1,0} tanh(%b)
  %d = f32[16,32]{1,0} multiply(%c, %x)
  %rows = f32[16]{0} reduce(%d, %zero), dimensions={1}, to_apply=%add
  %cols = f32[32]{0} reduce(%d, %zero), dimensions={0}, to_apply=%add
  ROOT %out = (f32[16]{0}, f32[32]{0}) tuple(%rows, %cols)"""


def _statements(body: list, opcode: str) -> int:
    return sum((getattr(s, "op", None) == opcode) + _statements(getattr(s, "body", []), opcode)
               for s in body)


def test_a_host_phased_kernel_computes_a_value_two_phases_read_once():
    """On one CPU thread every recomputation is paid (zoo BERT train's phased kernels computed
    about 4x the elementwise ops their patterns hold); the GPU schedule recomputes (thread
    composition). The numbers are XLA's either way."""
    module, spec = _generate(TWO_READERS)
    _assert_phased(spec, 2)
    host = spec.host_kernel
    assert [(a.name[:4], a.size) for a in host.scratch] == [("once", 16 * 32)]
    assert _statements(host.body, "tanh") == 1
    assert _statements(spec.kernel.body, "tanh") > 1  # in each phase (its loops unrolled)
    check_against_xla(module, spec, rtol=1e-5, atol=1e-5)


# g is computed once, and filling it reads d, computed once too (nested: the two arrays were
# once given one name, and the kernel read one through the other).
NESTED = TWO_READERS.replace(
    "  %rows = f32[16]{0} reduce(%d",
    "  %e = f32[16,32]{1,0} add(%d, %x)\n  %f = f32[16,32]{1,0} multiply(%e, %d)\n"
    "  %g = f32[16,32]{1,0} tanh(%f)\n  %rows = f32[16]{0} reduce(%g").replace(
    "reduce(%d, %zero), dimensions={0}", "reduce(%g, %zero), dimensions={0}")


def test_values_computed_once_inside_another_get_arrays_of_their_own():
    module, spec = _generate(NESTED)
    names = [a.name for a in spec.host_kernel.scratch]
    assert len(names) == 2 and len(set(names)) == 2
    check_against_xla(module, spec, rtol=1e-5, atol=1e-5)


# d is computed once and is also an output (as an optimizer's new moment is both an output and
# read by the update): it is written into its output buffer and read back from there.
OUTPUT_READ_TWICE = TWO_READERS.replace(
    "ROOT %out = (f32[16]{0}, f32[32]{0}) tuple(%rows, %cols)",
    "ROOT %out = (f32[16]{0}, f32[32]{0}, f32[16,32]{1,0}) tuple(%rows, %cols, %d)")


def _buffer_accesses(body: list, kind: type, buffer: int) -> int:
    return sum((isinstance(s, kind) and s.buffer == buffer)
               + _buffer_accesses(getattr(s, "body", []), kind, buffer) for s in body)


def test_a_value_computed_once_that_is_an_output_is_kept_in_the_output_buffer():
    module, spec = _generate(OUTPUT_READ_TWICE)
    _assert_phased(spec, 2)
    host = spec.host_kernel
    (out_d,) = [i for i, b in enumerate(host.buffers) if b.is_output and b.name == "d"]
    assert host.scratch == [], host  # no scratch array, no copy into the output
    assert _buffer_accesses(host.body, GlobalStore, out_d) == 1  # the loop filling it
    assert _buffer_accesses(host.body, GlobalLoad, out_d) >= 1  # the phases read it back
    assert _statements(host.body, "tanh") == 1
    check_against_xla(module, spec, rtol=1e-5, atol=1e-5)


def _loops_storing(body: list, array: str) -> list:
    """The top-level loops of ``body`` whose inner loop stores into shared array ``array``."""
    return [s for s in body if isinstance(s, Loop) and any(
        isinstance(t, Loop) and any(isinstance(u, SharedStore) and u.array.name == array
                                    for u in t.body) for t in s.body)]


def test_a_host_phased_kernels_column_sums_read_row_by_row():
    """One result at a time, a column sum reads a cache line per element; the host's phased
    kernel loops over the points (rows) outer and the results inner, as the columns schedule
    does, so the inner loop reads a row contiguously."""
    module, spec = _generate(TWO_READERS)
    # the sums' partial values go to the array's f64 twin (kernel_ir.wide_accumulator)
    (rows_outer,) = _loops_storing(spec.host_kernel.body, "res_cols_wide")
    assert rows_outer.stop == 16 and rows_outer.body[-1].stop == 32  # 16 rows, 32 columns
    assert not _loops_storing(spec.kernel.body, "res_cols")  # the GPU schedule: per result
    check_against_xla(module, spec, rtol=1e-5, atol=1e-5)
