"""The host CPU as a cost model prices it: XLA:CPU's kernels and ours (modeled, not measured).

A kernel called by an XLA:CPU executable costs a call, then the longer of its memory time
(bytes over the bandwidth of the smallest level its working set fits in) and its compute
time (instructions by class, counted as for one GPU thread per element, times a cost each),
shared over the cores when it is large enough for XLA's thread pool. The bandwidths and
cores are this machine's, measured once (``measure_machine``) and kept in the cache; the
costs per call and per instruction are fitted on measured kernels (data/host_cpu.json).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .latency import KernelProfile

DATA = Path(__file__).parent / "data" / "host_cpu.json"
# A working set this far below a cache level's size is modeled as staying in it.
CACHE_SHARE = 0.5


@dataclass(frozen=True)
class HostMachine:
    name: str
    cores: int  # this process may run on
    vector_bytes: int  # widest SIMD register: 16 (SSE), 32 (AVX2), 64 (AVX-512)
    cache_bytes: tuple[int, ...]  # data cache levels, L1 first (L3 shared by its cores)
    bandwidth: tuple[float, ...]  # bytes/s within each cache level, then from DRAM


@dataclass(frozen=True)
class HostConstants:
    """Fitted per-call and per-instruction costs (data/host_cpu.json says on what)."""
    call_us: float  # the cost of one kernel of an XLA:CPU executable, XLA's or ours
    ns_per_instruction: dict[str, float]  # by op class, for one element
    parallel_bytes: int  # a kernel moving fewer bytes runs on one core
    fitted_on: str


@lru_cache(maxsize=None)
def constants() -> HostConstants:
    data = json.loads(DATA.read_text())
    return HostConstants(**{k: data[k] for k in HostConstants.__dataclass_fields__})


def host_kernel_us(profile: KernelProfile, machine: HostMachine,
                   fitted: HostConstants | None = None) -> float:
    """Modeled time of one kernel, XLA's or ours (a custom call). ``profile``: instructions
    per thread times its threads are the kernel's instructions (one thread per element, or
    per row of a reduction). ``fitted``: the constants (default data/host_cpu.json's)."""
    c = fitted or constants()
    threads = profile.grid_blocks * profile.threads_per_block
    compute_us = sum(count * threads * c.ns_per_instruction.get(cls, 0.0)
                     for cls, count in profile.instructions.items()) / 1e3
    moved = profile.bytes_read + profile.bytes_written
    memory_us = moved / bandwidth_for(moved, machine) * 1e6
    work_us = max(compute_us, memory_us)
    if moved >= c.parallel_bytes:
        work_us /= machine.cores
    return c.call_us + work_us


def bandwidth_for(working_set: int, machine: HostMachine) -> float:
    """Bytes/s of the smallest cache level that holds ``working_set``, else of DRAM."""
    for size, bandwidth in zip(machine.cache_bytes, machine.bandwidth):
        if working_set <= size * CACHE_SHARE:
            return bandwidth
    return machine.bandwidth[-1]


class HostPricing:
    """Kernels priced for the host CPU: what the explorer and the capability query ask."""

    name = "cpu"

    def __init__(self, machine: HostMachine):
        self.machine = machine
        self.launch_us = constants().call_us

    def kernel_us(self, profile: KernelProfile) -> float:
        return host_kernel_us(profile, self.machine)

    def packed_us(self, parts: list[KernelProfile]) -> float:
        """Kernels packed into one call: their work in turn, one call."""
        return sum(self.kernel_us(p) for p in parts) - (len(parts) - 1) * self.launch_us


# ---------------------------------------------------------------- the machine, measured once

def _cache_levels() -> tuple[int, ...]:
    """Data and unified cache sizes of CPU 0, by level (Linux sysfs); L1 32K, L2 1M, L3 32M
    where sysfs does not say."""
    sizes: dict[int, int] = {}
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(root.glob("index*")) if root.is_dir() else []:
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
        sizes[level] = int(size.rstrip("KM")) * scale
    return tuple(sizes[k] for k in sorted(sizes)) or (32 << 10, 1 << 20, 32 << 20)


def _vector_bytes() -> int:
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), "").split()
    except OSError:
        flags = []
    return 64 if "avx512f" in flags else 32 if "avx2" in flags or "avx" in flags else 16


def _processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _stream_bandwidth(working_set: int) -> float:
    """Bytes/s of c = a + b over arrays of ``working_set`` bytes in all, best of repeats
    (numpy, one core)."""
    n = max(working_set // 12, 1024)
    a, b, c = np.ones(n, np.float32), np.ones(n, np.float32), np.empty(n, np.float32)
    repeats = max(2, min(1000, (16 << 20) // working_set))
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(repeats):
            np.add(a, b, out=c)
        best = min(best, (time.perf_counter() - started) / repeats)
    return 12 * n / best


def machine_identity() -> tuple[str, str, str]:
    """(processor, cores, vector bytes): what tells machines apart without measuring them."""
    return _processor(), str(len(os.sched_getaffinity(0))), str(_vector_bytes())


def measure_machine() -> HostMachine:
    """This machine's numbers: cores, SIMD width, caches, and a bandwidth per level measured
    at a quarter of its size (DRAM: four times the last level)."""
    caches = _cache_levels()
    sizes = [max(size // 4, 48 << 10) for size in caches] + [4 * caches[-1]]
    measured = [_stream_bandwidth(s) for s in sizes]
    # numpy's cost per call weighs on the smallest arrays: a level is at least as fast as
    # the one outside it
    bandwidth = [max(measured[i:]) for i in range(len(measured) - 1)] + measured[-1:]
    return HostMachine(name=_processor(), cores=len(os.sched_getaffinity(0)),
                       vector_bytes=_vector_bytes(), cache_bytes=caches,
                       bandwidth=tuple(bandwidth))


def default_dir() -> str:
    """``$XDG_CACHE_HOME/fusionstitching`` (``~/.cache/fusionstitching``), the runtime's cache."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fusionstitching")


@lru_cache(maxsize=None)
def this_machine(cache_dir: str | None = "") -> HostMachine:
    """The machine's numbers from ``cache_dir``/host_machine.json (default the user's cache,
    ``default_dir``), measured and kept there the first time (None: measured, not kept);
    once per process."""
    cache_dir = default_dir() if cache_dir == "" else cache_dir
    path = Path(cache_dir) / "host_machine.json" if cache_dir else None
    cores = len(os.sched_getaffinity(0))
    if path is not None and path.is_file():
        try:
            data = json.loads(path.read_text())
            machine = HostMachine(**{**data, "cache_bytes": tuple(data["cache_bytes"]),
                                     "bandwidth": tuple(data["bandwidth"])})
            if machine.cores == cores and machine.name == _processor():
                return machine
        except (OSError, TypeError, ValueError, KeyError):
            pass  # measured again below
    machine = measure_machine()
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(asdict(machine)))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache: measured again next time
    return machine
