"""`generate`: one stitched kernel for a pattern (flatten, schedule, choose), as a `KernelSpec`."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

from costmodel import KernelProfile, kernel_latency_us, load_device
from costmodel.devices import Device

from ..hlo.ir import Module, Shape
from .cost.kernel_profile import host_kernel_profile, kernel_profile
from .errors import CodegenError
from .flatten import flatten
from .kernel_ir import Kernel
from .schedules.candidates import Schedule
from .schedules.choose import (Refused, ScheduledKernel, build_host_kernel, build_launched,
                               schedule_pattern)
from .schedules.space import outside_main_space
from .traffic import global_traffic

DEFAULT_TARGET = "h100"


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
    regs_model: int | None  # None: not priced for a GPU (``generate``'s ``priced``)
    why: str  # the chosen schedule
    modeled_us: float = 0.0  # latency-evaluator's time of the chosen schedule (modeled)
    smem_bytes_no_reuse: int = 0  # shared memory before dominance-tree reuse (paper 4.4)
    # Every enumerated schedule with its modeled time (inf: refused, with the reason).
    candidates: list[tuple[str, float]] = field(default_factory=list)
    # The same pattern scheduled for CPU speed (compile_host(spec, fast=True)): one thread per
    # block, serial loops; same buffers and ABI as `kernel`.
    host_kernel: Kernel | None = None
    # The latency-evaluator's view of `kernel` (`kernel_profile`), kept from the
    # schedule choice so that pricing the kernel again does not walk its IR again.
    profile: KernelProfile | None = None
    schedule: Schedule | None = None  # the chosen schedule
    # The schedules refused, each with its kind and detail (`candidates` lists them in words).
    refused: list[Refused] = field(default_factory=list)
    # False: the first schedule that built, not necessarily the fastest (``fastest=False``).
    fastest: bool = True
    # True: ``kernel`` is an earlier pattern's equal up to names, with these buffers but that
    # pattern's shared arrays and loop variables (``schedule_pattern``'s ``kept``): it prices
    # as this pattern's kernel would, and is generated again before it is compiled.
    borrowed: bool = False

    def __str__(self) -> str:
        return str(self.kernel)

    @property
    def raw_read_bytes(self) -> int:
        """Bytes of every global load the kernel executes (all threads): above read_bytes
        when it re-reads inputs (a stage without producer caching, a recomputed producer).
        Counted when asked: planning never reads it (3.5% of a ConvNeXt train's planning)."""
        return global_traffic(self.kernel)[0]


def generate(module: Module, nodes: list[str], name: str, device: Device | None = None,
             excluded: Mapping[Schedule, str] | None = None,
             chosen: MutableMapping[str, Schedule] | None = None, fastest: bool = True,
             with_host_kernel: bool = True, below_us: float | None = None,
             kept: MutableMapping[str, ScheduledKernel] | None = None,
             not_faster: MutableMapping[tuple, float] | None = None,
             priced: bool = True) -> KernelSpec:
    """One kernel for these entry instructions; raises CodegenError when impossible.

    ``device``: the GPU whose latency-evaluator chooses among the enumerated schedules
    (``costmodel.load_device(target)``; default the H100). ``excluded``: schedules not to
    choose, with the reason (ptxas spilled them). ``chosen``: the schedules chosen in this
    planning run so far, for patterns equal up to names (see ``schedule_pattern``).
    ``fastest=False``: the first schedule that builds (a capability query; ``spec.fastest``
    says whether it is known to be the fastest). ``with_host_kernel=False``: no
    ``host_kernel`` (``add_host_kernel`` adds it later). ``below_us``: the kernel is wanted
    only if modeled faster than this; raises ``NotFaster`` when it is not. ``kept``: the
    chosen kernels kept by pattern form (``schedule_pattern``'s), for one module's planning:
    a spec may then be ``borrowed``, for questions only, never compiled; ``not_faster``:
    the ``NotFaster`` answers kept the same way. ``priced=False`` (with ``fastest=False``):
    the GPU schedule is not priced (a host-priced pattern's: ``profile`` and ``regs_model``
    None, ``modeled_us`` NaN)."""
    pattern = flatten(module, nodes)
    scheduled = schedule_pattern(pattern, name, device or load_device(DEFAULT_TARGET), excluded,
                                 chosen, fastest, below_us, kept, not_faster, priced)
    kernel = scheduled.kernel
    spec = KernelSpec(
        name=name, nodes=list(nodes), inputs=pattern.inputs, outputs=pattern.outputs,
        schemes=scheduled.schemes, grid=kernel.grid, block=kernel.block,
        smem_bytes=kernel.smem_bytes, kernel=kernel,
        read_bytes=sum(s.byte_size for _, s in pattern.inputs),
        write_bytes=sum(s.byte_size for _, s in pattern.outputs),
        regs_model=scheduled.profile and scheduled.profile.regs_per_thread,
        why=scheduled.schedule.why,
        modeled_us=scheduled.modeled_us, smem_bytes_no_reuse=scheduled.smem_bytes_no_reuse,
        candidates=scheduled.candidates,
        host_kernel=build_host_kernel(pattern, scheduled.schedule, name)
        if with_host_kernel else None,
        profile=scheduled.profile, schedule=scheduled.schedule, refused=scheduled.refused,
        fastest=scheduled.fastest, borrowed=scheduled.borrowed)
    return spec


def with_own_names(module: Module, spec: KernelSpec, name: str, device: Device) -> KernelSpec:
    """A ``borrowed`` spec with its pattern's own kernel, named ``name``: its schedule built
    under the pattern's names, priced as the borrowed kernel was (an equal pattern's)."""
    outcome = build_launched(flatten(module, spec.nodes), spec.schedule, name, device)
    if isinstance(outcome, Refused):
        raise CodegenError(outcome.kind, outcome.detail)
    return dataclasses.replace(spec, name=name, kernel=outcome[0], borrowed=False)


def add_host_kernel(module: Module, spec: KernelSpec) -> KernelSpec:
    """``spec`` with its ``host_kernel`` (the pattern scheduled for CPU speed) built."""
    if spec.host_kernel is not None:
        return spec
    pattern = flatten(module, spec.nodes)
    host = build_host_kernel(pattern, spec.schedule, spec.name)
    return dataclasses.replace(spec, host_kernel=host)


def can_stitch(module: Module, nodes: list[str], device: Device | None = None
               ) -> CodegenError | None:
    """None when `nodes` can be one kernel, else the refusal (its kind and detail)."""
    try:
        generate(module, nodes, "probe", device, fastest=False, with_host_kernel=False)
    except CodegenError as e:
        return e
    return None


def other_space_nodes(module: Module, nodes: list[str]) -> list[str]:
    """The nodes whose reductions lie outside the main reduction space of the pattern
    ``nodes`` (`outside_main_space`); none when it does not flatten."""
    try:
        return outside_main_space(flatten(module, nodes))
    except CodegenError:
        return []


def host_profile(spec: KernelSpec) -> KernelProfile:
    """The profile of ``spec``'s CPU schedule (its ``host_kernel``), for the host model."""
    if spec.host_kernel is None:
        raise ValueError(f"kernel {spec.name} has no host kernel to price")
    return host_kernel_profile(spec.host_kernel, spec.read_bytes, spec.write_bytes)


def modeled_kernel_us(spec: KernelSpec, device: Device) -> float:
    """The latency-evaluator's time for this kernel on ``device`` (modeled, not measured),
    from the profile ``generate`` kept when there is one."""
    profile = spec.profile if spec.profile is not None else \
        kernel_profile(spec.kernel, spec.read_bytes, spec.write_bytes)
    return kernel_latency_us(profile, device).total_us
