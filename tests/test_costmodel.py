"""costmodel/: occupancy, latency-evaluator, delta-evaluator (all modeled; no GPU needed)."""
from __future__ import annotations

import glob
import shutil
import subprocess
from pathlib import Path

import pytest

import costmodel
from costmodel.occupancy import ARCH_LIMITS, occupancy

# --- occupancy ------------------------------------------------------------------------------
#
# Each case is worked by hand from the calculator's rules (costmodel/occupancy.py docstring).
# Device numbers: V100 (sm_70) 96 KB shared/SM, 256 B unit, no reserve; A100 (sm_80) 167936 B
# shared/SM, 128 B unit, 1024 B reserved per block, opt-in 166912; H100 (sm_90) 233472 B/SM,
# 128 B unit, 1024 B reserve, opt-in 232448; T4 (sm_75) 64 KB/SM, 256 B unit, 32 warps and 16
# blocks per SM. All: 64K registers per SM split over 4 sub-partitions (16384 each), 256-register
# units per warp, 48 KB default per-block shared memory. Warp limit = max warps // warps/block.
# Columns: target, threads/block, regs/thread, smem/block -> blocks/SM, warps/SM, limiter.
OCCUPANCY_CASES = [
    # --- sm_70 (V100): 64 warps, 32 blocks
    # 4 warps; warps 64//4=16; regs 16*32=512/warp -> 16384//512=32 per SP -> 128//4=32; smem none
    ("v100", 128, 16, 0, 16, 64, "warps"),
    # 1 warp; warps 64; regs 128 warps -> 128; the 32-block cap binds
    ("v100", 32, 16, 0, 32, 32, "blocks"),
    # 8 warps; regs 64*32=2048/warp -> 16384//2048=8 per SP -> 32 warps -> 32//8=4; warps 8
    ("v100", 256, 64, 0, 4, 32, "registers"),
    # regs 255*32=8160 -> 8192/warp -> 2 per SP -> 8 warps -> 1 block; hw check 8192*8=65536 ok
    ("v100", 256, 255, 0, 1, 8, "registers"),
    # 32 warps; regs 2048/warp, hw check 2048*32=65536 ok; 8 per SP -> 32 warps -> 1; warps 2
    ("v100", 1024, 64, 0, 1, 32, "registers"),
    # regs 72*32=2304/warp; 2304*32=73728 > 65536 registers per block: cannot launch
    ("v100", 1024, 72, 0, 0, 0, "registers"),
    # smem 49152 (no rounding, within the 48 KB default) -> 98304//49152=2; warps 16; regs 16
    ("v100", 128, 32, 49152, 2, 8, "shared_memory"),
    # smem 100 -> 256 -> 384 blocks; regs 1024/warp -> 16 per SP -> 64//8=8; warps 64//8=8: tie
    ("v100", 256, 32, 100, 8, 64, "registers+warps"),
    # 2 warps; warps 32; regs 24*32=768/warp -> 16384//768=21 per SP -> 84//2=42;
    # smem 4000 -> 4096 (16*256) -> 98304//4096=24
    ("v100", 64, 24, 4000, 24, 48, "shared_memory"),
    # 3 warps; warps 64//3=21; regs 40*32=1280/warp -> 16384//1280=12 per SP -> 48//3=16
    ("v100", 96, 40, 0, 16, 48, "registers"),
    # smem 98305 -> 98560 > opt-in 98304: cannot launch
    ("v100", 256, 32, 98305, 0, 0, "shared_memory"),
    # --- sm_80 (A100): 64 warps, 32 blocks; every block takes >= 1024 B of shared memory
    # warps 64//4=16; regs 512/warp -> 32 per SP -> 128//4=32; smem 1024 -> 167936//1024=164
    ("a100", 128, 16, 0, 16, 64, "warps"),
    # 1 warp: warps 64, regs 128, smem 164; the 32-block cap binds
    ("a100", 32, 16, 0, 32, 32, "blocks"),
    # regs 128*32=4096/warp -> 16384//4096=4 per SP -> 16 warps -> 16//8=2
    ("a100", 256, 128, 0, 2, 16, "registers"),
    # smem 16384+1024=17408 (=136*128) -> 167936//17408=9; warps 16; regs 1024/warp -> 64//4=16
    ("a100", 128, 32, 16384, 9, 36, "shared_memory"),
    # smem 49152+1024=50176 (= 48 KB default + reserve, allowed) -> 167936//50176=3; warps 8
    ("a100", 256, 32, 49152, 3, 24, "shared_memory"),
    # smem 100000 > 48 KB so opt-in (166912+1024); 101024 -> 101120 (790*128) -> 1;
    # 32 warps: warps 2, regs 1024/warp -> 64//32=2
    ("a100", 1024, 32, 100000, 1, 32, "shared_memory"),
    # 4 warps; regs 40*32=1280/warp -> 12 per SP -> 48//4=12; smem 2000+1024=3024 -> 3072 -> 54
    ("a100", 128, 40, 2000, 12, 48, "registers"),
    # smem 166913+1024=167937 -> 168064 > 166912+1024: cannot launch
    ("a100", 256, 32, 166913, 0, 0, "shared_memory"),
    # 16 warps; regs 8192/warp; hw check 8192*16=131072 > 65536: cannot launch
    ("a100", 512, 255, 0, 0, 0, "registers"),
    # 3 warps; warps 64//3=21; regs 512/warp -> 128//3=42; smem 164
    ("a100", 96, 16, 0, 21, 63, "warps"),
    # --- sm_90 (H100): 64 warps, 32 blocks, 233472 B shared/SM
    # warps 16; regs 32; smem 233472//1024=228
    ("h100", 128, 16, 0, 16, 64, "warps"),
    # 1 warp; regs 8*32=256/warp -> 64 per SP -> 256; the 32-block cap binds
    ("h100", 32, 8, 0, 32, 32, "blocks"),
    # regs 96*32=3072/warp -> 16384//3072=5 per SP -> 20 warps -> 20//8=2
    ("h100", 256, 96, 0, 2, 16, "registers"),
    # smem 65536 > 48 KB, opt-in; 66560 (=520*128) -> 233472//66560=3; warps 8
    ("h100", 256, 32, 65536, 3, 24, "shared_memory"),
    # smem 232448+1024=233472 = exactly the opt-in limit and the SM -> 1; warps 2, regs 4
    ("h100", 1024, 16, 232448, 1, 32, "shared_memory"),
    # one byte more: 233473 -> 233600 > 233472: cannot launch
    ("h100", 1024, 16, 232449, 0, 0, "shared_memory"),
    # regs 64*32=2048/warp -> 8 per SP -> 32//4=8; smem 8192+1024=9216 -> 25; warps 16
    ("h100", 128, 64, 8192, 8, 32, "registers"),
    # 6 warps; warps 64//6=10; regs 512 -> 128//6=21; smem 31024 -> 31104 (243*128) -> 7
    ("h100", 192, 16, 30000, 7, 42, "shared_memory"),
    # regs 33*32=1056 -> 1280/warp (5 units); 16384//1280=12 per SP -> 48//32=1; warps 2
    ("h100", 1024, 33, 0, 1, 32, "registers"),
    # 2 warps; warps 64//2=32 and the 32-block cap: tie
    ("h100", 64, 16, 0, 32, 64, "warps+blocks"),
    # --- sm_75 (T4): 32 warps, 16 blocks, 64 KB shared/SM, 256 B unit
    # warps 32//4=8; regs 1024/warp -> 64 warps -> 16; blocks 16
    ("t4", 128, 32, 0, 8, 32, "warps"),
    # 1 warp: warps 32, the 16-block cap binds
    ("t4", 32, 16, 0, 16, 16, "blocks"),
    # regs 4096/warp -> 4 per SP -> 16 warps -> 16//8=2; warps 32//8=4
    ("t4", 256, 128, 0, 2, 16, "registers"),
    # smem 20000 -> 20224 (79*256) -> 65536//20224=3; warps 8
    ("t4", 128, 32, 20000, 3, 12, "shared_memory"),
]


@pytest.mark.parametrize("target,threads,regs,smem,blocks,warps,limiter", OCCUPANCY_CASES)
def test_occupancy_by_hand(target, threads, regs, smem, blocks, warps, limiter):
    device = costmodel.load_device(target)
    occ = occupancy(device, threads, regs, smem)
    assert (occ.active_blocks_per_sm, occ.active_warps_per_sm, occ.limiter) == (
        blocks, warps, limiter)
    assert occ.occupancy_fraction == warps / ARCH_LIMITS[device.sm_arch].max_warps_per_sm


def test_occupancy_table_matches_devices():
    for target in costmodel.TARGETS:
        device = costmodel.load_device(target)
        assert ARCH_LIMITS[device.sm_arch].max_threads_per_sm == device.max_threads_per_sm


def _cuda_occupancy_header() -> str | None:
    headers = sorted(glob.glob("/usr/local/cuda*/include/cuda_occupancy.h"))
    return headers[-1] if headers else None


@pytest.mark.skipif(_cuda_occupancy_header() is None or shutil.which("g++") is None,
                    reason="needs NVIDIA's cuda_occupancy.h and g++")
def test_occupancy_agrees_with_cuda_occupancy_h(tmp_path: Path):
    """Our port against NVIDIA's own calculator over a grid of launches, every target."""
    program = tmp_path / "occ.cpp"
    program.write_text(r"""
#include <cstdio>
#include <cuda_occupancy.h>
int main() {
  int major, minor, tpsm, smem_sm, smem_blk, optin, reserved, threads, regs, smem;
  while (scanf("%d %d %d %d %d %d %d %d %d %d", &major, &minor, &tpsm, &smem_sm, &smem_blk,
               &optin, &reserved, &threads, &regs, &smem) == 10) {
    cudaOccDeviceProp p;
    p.computeMajor = major; p.computeMinor = minor; p.maxThreadsPerBlock = 1024;
    p.maxThreadsPerMultiprocessor = tpsm; p.regsPerBlock = 65536; p.regsPerMultiprocessor = 65536;
    p.warpSize = 32; p.sharedMemPerBlock = smem_blk; p.sharedMemPerMultiprocessor = smem_sm;
    p.numSms = 1; p.sharedMemPerBlockOptin = optin; p.reservedSharedMemPerBlock = reserved;
    cudaOccFuncAttributes a;
    a.maxThreadsPerBlock = 1024; a.numRegs = regs; a.sharedSizeBytes = 0;
    a.maxDynamicSharedSizeBytes = optin; a.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN;
    a.numBlockBarriers = 1;
    cudaOccDeviceState s;
    s.carveoutConfig = SHAREDMEM_CARVEOUT_MAX_SHARED;
    cudaOccResult r;
    cudaOccError e = cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &a, &s, threads, smem);
    printf("%d\n", e ? -1 : r.activeBlocksPerMultiprocessor);
  }
}
""")
    header_dir = str(Path(_cuda_occupancy_header()).parent)
    binary = tmp_path / "occ"
    subprocess.run(["g++", "-O1", "-I", header_dir, str(program), "-o", str(binary)], check=True)
    launches, lines = [], []
    for target in costmodel.TARGETS:
        d = costmodel.load_device(target)
        major, minor = int(d.sm_arch[3:-1]), int(d.sm_arch[-1])
        reserved = ARCH_LIMITS[d.sm_arch].reserved_smem_per_block
        for threads in (32, 64, 96, 128, 160, 256, 384, 512, 640, 1024):
            for regs in (0, 8, 16, 24, 32, 33, 40, 48, 64, 96, 128, 168, 255):
                for smem in (0, 1, 1000, 4096, 12345, 49152, 49153, 65536, 100000, 166912,
                             232448):
                    launches.append((d, threads, regs, smem))
                    lines.append(f"{major} {minor} {d.max_threads_per_sm} "
                                 f"{d.shared_memory_per_sm} {d.shared_memory_per_block} "
                                 f"{d.shared_memory_per_block_optin} {reserved} "
                                 f"{threads} {regs} {smem}")
    out = subprocess.run([str(binary)], input="\n".join(lines), capture_output=True, text=True,
                         check=True).stdout.split()
    assert len(out) == len(launches)
    for (d, threads, regs, smem), expected in zip(launches, out):
        ours = occupancy(d, threads, regs, smem).active_blocks_per_sm
        # The calculator reports an over-limit launch as an error (-1); ours as 0 blocks.
        assert ours == max(int(expected), 0), (d.name, threads, regs, smem, expected)


# --- latency-evaluator ----------------------------------------------------------------------

from costmodel.latency import (KernelProfile, REGISTER_OVERHEAD, estimate_registers,  # noqa: E402
                               kernel_latency_us)

ALL_TARGETS = sorted(costmodel.TARGETS)


def _copy_profile(nbytes: int) -> KernelProfile:
    """y[i] = x[i] for f32, one element per thread, 256-thread blocks."""
    elements = nbytes // 8  # 4 bytes read + 4 written per element
    return KernelProfile(grid_blocks=elements // 256, threads_per_block=256,
                         regs_per_thread=estimate_registers([1]), smem_bytes=0,
                         instructions={"int": 4, "ld_global": 1, "st_global": 1},
                         bytes_read=nbytes // 2, bytes_written=nbytes // 2)


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_large_copy_is_bandwidth_plus_launch(target):
    device = costmodel.load_device(target)
    nbytes = 1 << 30
    floor_us = nbytes / device.memory_bandwidth * 1e6
    got = kernel_latency_us(_copy_profile(nbytes), device)
    assert got.memory_us == pytest.approx(floor_us)
    assert got.launch_us == costmodel.LAUNCH_US
    assert floor_us + costmodel.LAUNCH_US <= got.total_us <= 1.10 * floor_us + costmodel.LAUNCH_US
    # kernel_time's roofline is the same memory floor
    assert costmodel.kernel_cost(nbytes, device).memory_us == pytest.approx(floor_us)


def _row_reduce_profile(rows: int, cols: int, threads: int) -> KernelProfile:
    """Sum each f32 row with one block of ``threads`` threads: strided loads, a tree of warp
    shuffles, warp partials through shared memory."""
    per_thread = -(-cols // threads)
    return KernelProfile(grid_blocks=rows, threads_per_block=threads, regs_per_thread=16,
                         smem_bytes=4 * (threads // 32),
                         instructions={"ld_global": per_thread, "fp32": per_thread + 10,
                                       "int": 2 * per_thread + 6, "shfl": 10, "barrier": 1,
                                       "st_shared": 1, "ld_shared": 1, "st_global": 1},
                         bytes_read=4 * rows * cols, bytes_written=4 * rows)


@pytest.mark.parametrize("target", ALL_TARGETS)
@pytest.mark.parametrize("rows,cols", [(1, 1 << 24), (8, 1 << 20), (128, 4096), (4096, 1024),
                                       (1 << 16, 32), (1 << 20, 128)])
@pytest.mark.parametrize("threads", [32, 256, 1024])
def test_row_reduction_never_beats_its_bytes(target, rows, cols, threads):
    device = costmodel.load_device(target)
    got = kernel_latency_us(_row_reduce_profile(rows, cols, threads), device)
    floor_us = 4 * (rows * cols + rows) / device.memory_bandwidth * 1e6
    assert got.total_us >= floor_us + costmodel.LAUNCH_US
    assert got.compute_us > 0 and got.waves >= 1


def test_few_rows_leave_the_gpu_latency_bound():
    """8 long rows on 8 blocks: the reduction is far slower than its bytes allow on the whole
    device, and still latency-bound on the 8 SMs it runs on (8/132 of the bandwidth)."""
    device = costmodel.load_device("h100")
    got = kernel_latency_us(_row_reduce_profile(8, 1 << 20, 1024), device)
    whole_device = costmodel.kernel_cost(4 * (8 << 20) + 4 * 8, device).memory_us
    assert got.waves == 1 and got.compute_us > 10 * whole_device
    assert got.memory_us == pytest.approx(whole_device * device.sm_count / 8)
    assert got.compute_us > got.memory_us


def test_waves_and_warps_per_scheduler():
    device = costmodel.load_device("a100")  # 108 SMs; 256 threads, 32 regs -> 8 blocks per SM
    one = KernelProfile(grid_blocks=108 * 8, threads_per_block=256, regs_per_thread=32,
                        smem_bytes=0, instructions={"fp32": 100}, bytes_read=0,
                        bytes_written=0)
    got = kernel_latency_us(one, device)
    # 64 warps per SM / 4 schedulers = 16 warps each; FP32 at 64 per SM per clock keeps a
    # scheduler 2 cycles per warp instruction: max(4, 16 * 2) = 32 cycles per instruction.
    assert got.waves == 1 and got.occupancy.active_blocks_per_sm == 8
    assert got.warp_cycles == 100 * 32
    two = kernel_latency_us(KernelProfile(**{**one.__dict__, "grid_blocks": 108 * 8 + 1}),
                            device)
    assert two.waves == 2 and two.compute_us == pytest.approx(2 * got.compute_us)
    # A lone warp waits out the latency: the paper's CPI.
    lone = kernel_latency_us(KernelProfile(**{**one.__dict__, "grid_blocks": 1,
                                              "threads_per_block": 32}), device)
    assert lone.warp_cycles == 100 * 4


def test_latency_rejects_unknown_ops_and_unlaunchable_kernels():
    device = costmodel.load_device("h100")
    with pytest.raises(KeyError):
        kernel_latency_us(KernelProfile(1, 32, 8, 0, {"tensor_core": 1}, 0, 0), device)
    with pytest.raises(ValueError):
        kernel_latency_us(KernelProfile(1, 1024, 255, 0, {"fp32": 1}, 0, 0), device)


def test_estimate_registers():
    assert estimate_registers([3, 9, 5]) == 9 + REGISTER_OVERHEAD
    assert estimate_registers([]) == REGISTER_OVERHEAD
    assert estimate_registers([400]) == 255


# --- delta-evaluator ------------------------------------------------------------------------

from costmodel.delta import DeltaEvaluator, PatternSummary, delta_evaluate  # noqa: E402

MIB = 1 << 20


def _layernorm(rows=4096, cols=1024) -> PatternSummary:
    """LayerNorm over [rows, cols] f32 as one kernel instead of XLA's 5 (mean, centre,
    variance, normalize, scale+shift): a 256-thread block per row, 4 elements per thread;
    3 intermediates of the tensor's size stay on chip (centred and normalized values in
    registers, the input row cached in shared memory), each once written and once read before.
    """
    tensor = 4 * rows * cols
    return PatternSummary(
        register_bytes=2 * 2 * tensor, shared_bytes=2 * tensor, kernels_merged=5,
        grid_blocks=rows, threads_per_block=256, max_shared_memory=4 * cols,
        instructions={"ld_global": 4, "st_global": 4, "fp32": 28, "int": 12, "sfu": 1,
                      "shfl": 10, "barrier": 4, "st_shared": 6, "ld_shared": 10},
        global_bytes=2 * tensor + 2 * 4 * cols)


def _softmax_block_per_row(rows: int, cols: int, threads: int) -> PatternSummary:
    """Softmax over [rows, cols] f32 (max, exp, sum, divide: 4 kernels) as one kernel with one
    block per row; a row too long for shared memory is read twice from global memory. The
    exponentials (2 intermediates) stay in registers."""
    tensor = 4 * rows * cols
    per_thread = -(-cols // threads)
    return PatternSummary(
        register_bytes=2 * 2 * tensor, shared_bytes=0, kernels_merged=4, grid_blocks=rows,
        threads_per_block=threads, max_shared_memory=4 * (threads // 32),
        instructions={"ld_global": 2 * per_thread, "st_global": per_thread,
                      "fp32": 4 * per_thread, "int": 3 * per_thread, "sfu": per_thread,
                      "shfl": 10, "barrier": 4, "st_shared": 2, "ld_shared": 2},
        global_bytes=3 * tensor)


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_delta_favours_fusing_layernorm(target):
    got = delta_evaluate(_layernorm(), costmodel.load_device(target))
    assert got.reduced_calls_us == 4 * costmodel.LAUNCH_US
    assert got.reduced_mem_us > 0 and got.penalty_us < got.reduced_mem_us
    assert got.score > 0


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_delta_refuses_one_block_per_row_when_rows_are_few(target):
    device = costmodel.load_device(target)
    few = delta_evaluate(_softmax_block_per_row(8, 1 << 20, 1024), device)
    assert few.score < 0  # 8 blocks leave most SMs idle; the latency penalty dominates
    # The same fusion over many short rows fills the GPU and pays.
    many = delta_evaluate(_softmax_block_per_row(4096, 2048, 256), device)
    assert many.score > 0


def test_delta_never_fuses_an_unlaunchable_kernel():
    device = costmodel.load_device("a100")
    too_big = PatternSummary(0, 1 << 20, 3, 1024, 256, device.shared_memory_per_block_optin + 1,
                             {"fp32": 1}, 1 << 20)
    assert delta_evaluate(too_big, device).score == float("-inf")


def test_delta_prices_memory_levels():
    """Registers are free, shared memory is not: the same traffic saves more from registers."""
    evaluator = DeltaEvaluator(costmodel.load_device("h100"))
    base = dict(kernels_merged=2, grid_blocks=1024, threads_per_block=256,
                max_shared_memory=1024, instructions={"fp32": 8}, global_bytes=1 << 20)
    in_registers = evaluator.evaluate(PatternSummary(register_bytes=64 * MIB, shared_bytes=0,
                                                     **base))
    in_shared = evaluator.evaluate(PatternSummary(register_bytes=0, shared_bytes=64 * MIB,
                                                  **base))
    assert in_registers.reduced_mem_us > in_shared.reduced_mem_us > 0
    # one DRAM latency (400 cycles at 1.98 GHz) + 64 MiB at 3.35 TB/s
    assert in_registers.reduced_mem_us == pytest.approx(400 / 1.98e3 + 64 * MIB / 3.35232e12 * 1e6)
