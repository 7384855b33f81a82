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
