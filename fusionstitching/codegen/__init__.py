"""codegen/: stitched kernels for fusion patterns (paper section 4).

    Module + pattern nodes --flatten--> Pattern --schedule--> Kernel IR --host--> CPU code
                                                                        --nvptx--> PTX, cubin

`generate` runs the first two stages and returns a `KernelSpec`; `compile_host` and
`compile_nvptx` lower the same kernel IR for the CPU and for NVIDIA GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from costmodel import KernelProfile

from ..hlo.ir import Module, Shape
from .flatten import CodegenError, flatten
from .host import HostKernel, Traffic, compile_host, count_traffic
from .kernel_ir import Kernel
from .nvptx import NvptxKernel, compile_nvptx, find_ptxas
from .schedule import build_kernel, host_schedule, outside_main_space, schedule_pattern
from .traffic import global_traffic

__all__ = ["CodegenError", "HostKernel", "KernelSpec", "NvptxKernel", "Traffic", "can_stitch",
           "compile_host", "compile_nvptx", "count_traffic", "find_ptxas", "generate",
           "other_space_nodes"]


@dataclass
class KernelSpec:
    """One stitched kernel. Buffers are `inputs` then `outputs`, each in its Shape's layout.

    Outputs are arrays: a multi-output fusion's results are named after their
    get-tuple-element users (``name#i`` when the tuple itself is used, see flatten.py).
    """

    name: str
    nodes: list[str]
    inputs: list[tuple[str, Shape]]
    outputs: list[tuple[str, Shape]]
    schemes: list[str]
    grid: tuple[int, ...]
    block: tuple[int, ...]
    smem_bytes: int
    kernel: Kernel
    read_bytes: int  # distinct global bytes read: each input once (every element is used)
    write_bytes: int
    regs_model: int
    why: str  # the chosen schedule
    modeled_us: float = 0.0  # latency-evaluator's time of the chosen schedule (modeled)
    smem_bytes_no_reuse: int = 0  # shared memory before dominance-tree reuse (paper 4.4)
    # Every enumerated schedule with its modeled time (inf: refused, with the reason).
    candidates: list[tuple[str, float]] = field(default_factory=list)
    # The same pattern scheduled for CPU speed (compile_host(spec, fast=True)): one thread per
    # block, serial loops; same buffers and ABI as `kernel`.
    host_kernel: Kernel | None = None
    # Bytes of every global load the kernel executes (all threads): above read_bytes when it
    # re-reads inputs (a stage without producer caching, a recomputed producer).
    raw_read_bytes: int = 0
    # The latency-evaluator's view of `kernel` (profile.kernel_profile), kept from the
    # schedule choice so that pricing the kernel again does not walk its IR again.
    profile: KernelProfile | None = None

    def __str__(self) -> str:
        return str(self.kernel)


def generate(module: Module, nodes: list[str], name: str, device: dict | None = None,
             excluded: dict[str, str] | None = None) -> KernelSpec:
    """One kernel for these entry instructions; raises CodegenError(reason) when impossible.

    ``device``: {"name": "h100"|"a100"|...} (default h100), the GPU whose latency-evaluator
    chooses among the enumerated schedules. ``excluded``: schedules (``Schedule.why``) not to
    choose, with the reason (ptxas spilled them)."""
    pattern = flatten(module, nodes)
    scheduled = schedule_pattern(pattern, name, device, excluded)
    kernel = scheduled.kernel
    spec = KernelSpec(
        name=name, nodes=list(nodes), inputs=pattern.inputs, outputs=pattern.outputs,
        schemes=scheduled.schemes, grid=kernel.grid, block=kernel.block,
        smem_bytes=kernel.smem_bytes, kernel=kernel,
        read_bytes=sum(s.byte_size for _, s in pattern.inputs),
        write_bytes=sum(s.byte_size for _, s in pattern.outputs),
        regs_model=scheduled.profile.regs_per_thread, why=scheduled.schedule.why,
        modeled_us=scheduled.modeled_us, smem_bytes_no_reuse=scheduled.smem_bytes_no_reuse,
        candidates=scheduled.candidates,
        host_kernel=build_kernel(pattern, host_schedule(pattern, scheduled.schedule), name)[0],
        profile=scheduled.profile)
    spec.raw_read_bytes = global_traffic(kernel)[0]
    return spec


def can_stitch(module: Module, nodes: list[str], device: dict | None = None
               ) -> tuple[bool, str]:
    """Whether `nodes` can be one kernel, and why (or why not)."""
    try:
        spec = generate(module, nodes, "probe", device)
    except CodegenError as e:
        return False, str(e)
    return True, f"ok: {spec.why}; {', '.join(spec.schemes)}"


def other_space_nodes(module: Module, nodes: list[str]) -> list[str]:
    """The nodes whose reductions lie outside the main reduction space of the pattern
    ``nodes`` (schedule.outside_main_space); none when it does not flatten."""
    try:
        return outside_main_space(flatten(module, nodes))
    except CodegenError:
        return []
