"""The post-XLA pass: optimized Module -> op graph -> fusion plan -> kernels -> Report.

``stitch_module`` is the one entry point. A failure while generating or compiling a pattern
never fails the module: the pattern is left to XLA and listed in ``Report.fallbacks``.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import costmodel

from . import capability, codegen
from .capability import (PlanRefusal, slower_than_xla, stitched_kernel_us,
                         xla_kernel_us)
from .explain import Unrefused, unstitched_kinds
from .explorer import FusionPlan, Pattern, explore, given_plan
from .explorer.index import GraphIndex
from .graph import OpClass, OpGraph, build_graph
from .graph.refusal import Refusal, internal, kind_text
from .graph.xla_kernel_model import xla_kernel_profile
from .graph.traffic import memory_intensive_regions, pattern_traffic, plan_bytes
from .hlo.ir import Module
from .query_workers import MIN_KERNELS, QueryWorkers, WorkersFailed, worker_count
from .options import Options
from .report import Fallback, KernelReport, LeftToXla, PlanSummary, Report, Times
from .verification import stitched_steps, verify


# The code generator's work a plan may ask for, in values computed (codegen.values_built), or
# statements placed where a query places more (capability.ask_counted): this many per
# memory-intensive kernel of the module, at least the floor. Models' steps use
# 700-5,700 per kernel (the zoo's and the tier's training steps; transformers Llama the
# most); a log-depth scan's gradient asks for millions (minutes of planning).
PLANNING_VALUES_PER_KERNEL = 7_500
MIN_PLANNING_VALUES = 100_000


@dataclass(frozen=True)
class GivenPatterns:
    """The patterns of a module of the same structure planned before (``stitch_module``)."""
    patterns: list[list[str]]
    source: str  # whose plan, in words


@dataclass
class StitchedKernel:
    pattern: Pattern
    spec: codegen.KernelSpec
    nvptx: codegen.NvptxKernel | None = None
    host: codegen.HostKernel | None = None  # the GPU schedule emulated thread by thread
    cpu_host: codegen.HostKernel | None = None  # the CPU schedule, as the runtime compiles it


@dataclass
class StitchResult:
    module: Module
    graph: OpGraph
    plan: FusionPlan
    kernels: list[StitchedKernel]
    report: Report
    fallbacks: list[Fallback] = field(default_factory=list)


COST_MODELS = ("auto", "gpu", "cpu")


def pricing_of(options: Options, device: costmodel.Device):
    """What prices the plan's kernels (``Options.cost_model``): the latency-evaluator of
    ``device`` ("gpu", and "auto", which the runtime turns into "cpu" on its host route), or
    the host CPU's model with this machine's numbers (measured once, kept in the user's
    cache)."""
    if options.cost_model in ("auto", "gpu"):
        return costmodel.GpuPricing(device)
    if options.cost_model == "cpu":
        return costmodel.HostPricing(costmodel.this_machine())
    raise ValueError(f"unknown cost model {options.cost_model!r}; known: "
                     f"{', '.join(COST_MODELS)}")


def report_target(options: Options) -> str:
    """What the Report's modeled times are for: the GPU target, or "cpu" (the host model)."""
    return "cpu" if options.cost_model == "cpu" else options.target


def stitch_module(module: Module, options: Options | None = None,
                  parse_seconds: float = 0.0, schedules: MutableMapping | None = None,
                  given: GivenPatterns | None = None) -> StitchResult:
    """``schedules``: the schedule chosen for each pattern form, kept by the caller across
    modules (the runtime's cache): a pattern planned before is built with its schedule alone
    (``codegen.schedules.choose.schedule_pattern``'s ``chosen``). ``given``: the patterns
    planned for a module of the same structure, taken when they build here (``plan_module``)."""
    options = options or Options()
    device = costmodel.load_device(options.target)
    pricing = pricing_of(options, device)
    started = time.perf_counter()
    times = Times(parse=parse_seconds)
    fallbacks: list[Fallback] = []

    graph = build_graph(module)
    # Instructions the graph refused (graph/refusal.py) are opaque nodes: XLA runs them.
    fallbacks += [Fallback("graph", [n.name], str(n.refusal))
                  for n in graph.nodes.values() if n.refusal is not None]
    t0 = time.perf_counter()
    built: dict[frozenset[str], codegen.KernelSpec] = {}
    chosen = {} if schedules is None else schedules
    # The explorer's queries and then the plan's assembly run in them (one per core).
    with planning_workers(graph, options, chosen, pricing) as workers:
        try:
            plan = plan_module(graph, options, device, built, chosen, workers, given, pricing)
        except Exception as exc:  # a defect of ours: the module keeps XLA's plan
            plan = FusionPlan(options.explorer, [], notes=["explorer failed; XLA's plan kept"])
            fallbacks.append(Fallback("explore", [], str(internal(exc))))
        times.explore = time.perf_counter() - t0

        kernels: list[StitchedKernel] = []
        for index, pattern in enumerate(plan.patterns):
            name = f"fusionstitching_{_c_name(module.name)[:40]}_{index}"
            kernel = _build_kernel(graph, pattern, name, options, device, times, fallbacks,
                                   built.get(frozenset(pattern.nodes)), pricing)
            if kernel is not None:
                kernels.append(kernel)
        if options.ptxas:
            kernels = _assembled(graph, kernels, options, device, times, fallbacks, workers)

    kernels = _schedulable(module, kernels, fallbacks)
    result = StitchResult(module, graph, plan, kernels, report=None, fallbacks=fallbacks)
    try:
        result.report = make_report(result, options, device, times, pricing)
    except Exception as exc:  # counting the stitched plan failed: report XLA's plan alone
        _give_back(result.kernels, "report", internal(exc), fallbacks)
        result.kernels = []
        result.report = make_report(result, options, device, times, pricing)
    if options.verify:
        result.report.verify = verify(result.module, result.kernels, result.report.fallbacks,
                                      seed=options.seed)
    if options.emit_dir:
        emit(result, options.emit_dir)
    times.total = time.perf_counter() - started + parse_seconds
    return result


def plan_module(graph: OpGraph, options: Options, device,
                built: dict[frozenset[str], codegen.KernelSpec] | None = None,
                schedules: MutableMapping | None = None,
                workers: QueryWorkers | None = None,
                given: GivenPatterns | None = None, pricing=None) -> FusionPlan:
    """The fusion plan of ``graph``, asking the code generator the question the pipeline
    will: can it build the pattern, and does the kernel pass the cost guard below? So the
    explorer plans around patterns that would be given back to XLA instead of losing them.

    The explorer prices plans as the Report will (``profile_of``): a pattern by the
    profile of the kernel the query built, one XLA kernel by ``xla_kernel_profile``. So the
    explorer's final choice ranks plans by the modeled times the Report shows, not by its own
    estimate, and each pattern is generated once. ``built`` receives the kernel of every
    accepted pattern, so that the pipeline does not generate the chosen ones again.
    ``workers``: query workers to ask through (``planning_workers``, given ``schedules`` as
    their chosen schedules); without, every query is asked in this process. ``given``: a
    plan of the same structure at other sizes, this module's plan when every pattern builds
    (``explorer.given_plan``), else the explorer plans it and the notes say why.
    ``pricing``: ``pricing_of(options, device)``, what prices the kernels (None: the
    latency-evaluator of ``device``)."""
    built = {} if built is None else built  # accepted patterns
    # schedules by pattern form: a repeated layer's patterns build one each
    chosen = {} if schedules is None else schedules
    notes: list[str] = []

    def without_workers(exc: WorkersFailed) -> None:
        nonlocal workers
        notes.append(f"query workers failed ({exc}); the rest was planned in this process")
        workers.close()
        workers = None

    budget = max(MIN_PLANNING_VALUES, PLANNING_VALUES_PER_KERNEL
                 * sum(1 for _ in graph.memory_intensive_nodes()))
    spent = 0
    # Patterns whose expression was too large: a pattern holding one computes its values at
    # as many indices or more (a log-depth scan's gradient grown one kernel at a time asked
    # 17 such patterns, 340,000 values, none of them buildable), so it is refused unasked.
    too_large: list[frozenset[str]] = []

    def can_stitch(nodes: list[str]) -> Refusal | None:
        nonlocal spent
        if spent >= budget:
            return Refusal(PlanRefusal.PLANNING_BUDGET,
                           f"{spent:,} values computed (or statements placed) for the module's "
                           f"queries, its budget "
                           f"{budget:,}: the pattern is left to XLA unasked")
        holds = next((p for p in too_large if p.issubset(nodes)), None)
        if holds is not None:
            return Refusal(codegen.Refusal.EXPRESSION_TOO_LARGE,
                           f"it holds {len(holds)} kernels whose expression was too large")
        answered = None
        if workers is not None:
            try:
                answered = workers.answer(tuple(nodes))
            except WorkersFailed as exc:
                without_workers(exc)
        if answered is None:
            answered = capability.ask_counted(graph, nodes, device, options.target,
                                              options.ptxas, chosen, pricing)
        answer, work = answered
        spent += work
        if spent >= budget:
            notes.append(f"planning stopped asking the code generator after {spent:,} values "
                         f"computed or statements placed (budget {budget:,}: "
                         f"{PLANNING_VALUES_PER_KERNEL:,} per memory-intensive kernel); "
                         f"patterns not asked were left to XLA")
        if isinstance(answer, Refusal):
            if answer.kind is codegen.Refusal.EXPRESSION_TOO_LARGE:
                too_large.append(frozenset(nodes))
            return answer
        built[frozenset(nodes)] = answer
        return None

    def ask_ahead(patterns: list[list[str]], next_up: bool) -> None:
        if workers is not None and spent < budget:
            try:
                workers.ahead([tuple(p) for p in patterns], next_up)
            except WorkersFailed as exc:
                without_workers(exc)

    host_priced = isinstance(pricing, costmodel.HostPricing)

    def profile_of(nodes: list[str]) -> costmodel.KernelProfile:
        if len(nodes) == 1:
            return xla_kernel_profile(graph, nodes[0], device)
        spec = built.get(frozenset(nodes))
        if spec is None:  # the explorer prices only patterns the query accepted
            raise ValueError(f"no stitched kernel was built for {nodes}")
        if host_priced:  # what runs on the host: the CPU schedule
            return codegen.host_profile(spec)
        return spec.profile  # as modeled_kernel_us prices it

    if given is not None:
        taken = given_plan(graph, given.patterns, can_stitch, given.source)
        if isinstance(taken, FusionPlan):
            taken.notes += notes
            return taken
        built.clear()
        spent = 0  # the explorer gets the whole budget
        notes.append(f"the plan of {given.source} was not taken ({taken}): explored instead")
    plan = explore(graph, can_stitch, options.explorer, device, profile_of,
                   lambda nodes: codegen.other_space_nodes(graph.module, nodes),
                   ask_ahead if workers is not None else None, pricing)
    plan.notes += notes
    return plan


@contextmanager
def planning_workers(graph: OpGraph, options: Options, chosen: MutableMapping, pricing=None
                     ) -> Iterator[QueryWorkers | None]:
    """Query workers for planning ``graph`` (query_workers.py), closed on leaving; None where
    the module plans in about the time they take to start (``Options.workers``), or they
    cannot start. ``chosen``: the schedules chosen by pattern form that planning keeps."""
    count = worker_count() if options.workers is None else options.workers
    workers = None
    if count >= 2 and (options.workers is not None or
                       sum(1 for _ in graph.memory_intensive_nodes()) >= MIN_KERNELS):
        try:
            workers = QueryWorkers(graph.module, options.target, options.ptxas, chosen, count,
                                   pricing)
        except WorkersFailed:
            workers = None
    try:
        yield workers
    finally:
        if workers is not None:
            workers.close()


def _c_name(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def _build_kernel(graph, pattern, name, options, device, times, fallbacks, probed=None,
                  pricing=None):
    """``probed``: the kernel the explorer's capability query built for this pattern (the
    same generation under another name, when its schedule is the fastest, or priced for the
    host, where the GPU schedule is only emulated; a ``borrowed`` one's schedule built here
    under the pattern's own names), else it is generated here."""
    t0 = time.perf_counter()
    host_priced = isinstance(pricing, costmodel.HostPricing)
    try:
        if probed is not None and probed.borrowed:
            spec = _renamed(codegen.with_own_names(graph.module, probed, name, device), name)
        elif probed is not None and (probed.fastest or host_priced):
            spec = _renamed(probed, name)
        elif host_priced:
            spec = codegen.generate(graph.module, pattern.nodes, name, device, fastest=False,
                                    priced=False)
        else:
            spec = codegen.generate(graph.module, pattern.nodes, name, device)
        if options.host:
            spec = codegen.add_host_kernel(graph.module, spec)
    except Exception as exc:  # any codegen failure leaves the pattern to XLA
        times.codegen += time.perf_counter() - t0
        why = str(Refusal(exc.kind, exc.detail)) if isinstance(exc, codegen.CodegenError) \
            else str(internal(exc))
        fallbacks.append(Fallback("codegen", list(pattern.nodes), why))
        return None
    slower = slower_than_xla(graph, spec, device, report_target(options), pricing)
    if slower:
        times.codegen += time.perf_counter() - t0
        fallbacks.append(Fallback("cost", list(pattern.nodes), slower))
        return None
    try:
        host, cpu_host = _host_builds(spec, options)
    except Exception as exc:  # LLVM refused our host IR: a defect of ours
        fallbacks.append(Fallback("host", list(pattern.nodes), str(internal(exc))))
        return None
    finally:
        times.codegen += time.perf_counter() - t0
    return StitchedKernel(pattern, spec, host=host, cpu_host=cpu_host)


def _host_builds(spec: codegen.KernelSpec, options: Options):
    """The kernel's host builds that ``options`` ask for: the GPU schedule emulated (what
    verification checks), and with ``verify`` and ``host`` the CPU schedule as the runtime
    compiles it (``fast``), which verification then checks as well."""
    host = codegen.compile_host(spec) if options.verify or options.host else None
    cpu_host = codegen.compile_host(spec, fast=True) \
        if options.verify and options.host and spec.host_kernel is not None else None
    return host, cpu_host


def lone_kernels(result: StitchResult, options: Options, fallbacks: list[Fallback]
                 ) -> list[StitchedKernel]:
    """Each memory-intensive XLA kernel that the plan leaves alone, generated as one kernel of
    ours, with its host kernel. Nothing is saved on a GPU, but XLA:CPU runs some fusions
    several times slower than ours (an argmax: a variadic reduction, as scalar code); the
    host route times each and keeps the clearly faster.
    A node the code generator refuses stays XLA's, as the plan has it: no fallback (a defect
    of ours is one, in ``fallbacks``)."""
    device = costmodel.load_device(options.target)
    # priced for the host, the GPU schedule is only emulated: the first that builds
    fastest = options.cost_model != "cpu"
    taken = {n for k in result.kernels for n in k.pattern.nodes}
    taken |= {n for f in result.fallbacks for n in f.nodes}
    kernels = []
    for node in result.graph.memory_intensive_nodes():
        if node.name in taken:
            continue
        name = f"fusionstitching_{_c_name(result.module.name)[:40]}_alone_{len(kernels)}"
        try:
            spec = codegen.generate(result.graph.module, [node.name], name, device,
                                    fastest=fastest, priced=fastest)
            spec = codegen.add_host_kernel(result.graph.module, spec)
        except codegen.CodegenError:
            continue
        except Exception as exc:  # a defect of ours: say so, the node stays XLA's
            fallbacks.append(Fallback("codegen", [node.name], str(internal(exc))))
            continue
        kernels.append(StitchedKernel(Pattern([node.name], "alone: faster than XLA:CPU's"),
                                      spec))
    return kernels


def _assembled(graph, kernels: list[StitchedKernel], options, device, times, fallbacks,
               workers: QueryWorkers | None = None) -> list[StitchedKernel]:
    """``kernels`` through ptxas side by side, each with its ``nvptx``: in the query
    workers, else a thread per core (LLVM one kernel at a time, ptxas children in parallel).
    One that spills gets its next-fastest schedules (``_fewest_spills``), one that fails is
    left to XLA."""
    t0 = time.perf_counter()

    def nvptx(spec):
        try:
            return codegen.compile_nvptx(spec, device.sm_arch)
        except Exception as exc:  # reported per kernel below
            return exc

    assembled = None
    if workers is not None and workers.alive:
        try:
            assembled = workers.assemble([k.spec for k in kernels], device.sm_arch)
        except WorkersFailed:  # assembled here instead
            assembled = None
    if assembled is None:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            assembled = list(pool.map(nvptx, [k.spec for k in kernels]))
    out = []
    for kernel, nv in zip(kernels, assembled, strict=True):
        try:
            if isinstance(nv, Exception):
                raise nv
            if nv.spills:
                spec, nv = _fewest_spills(graph, kernel.spec, nv, options, device)
                host, cpu_host = _host_builds(spec, options)
                kernel = StitchedKernel(kernel.pattern, spec, host=host, cpu_host=cpu_host)
            kernel.nvptx = nv
            out.append(kernel)
        except Exception as exc:
            fallbacks.append(Fallback("ptxas", list(kernel.pattern.nodes), _reason(exc)))
    times.ptxas += time.perf_counter() - t0
    return out


MAX_SPILL_RETRIES = 8  # each is a code generation and a ptxas run


def _fewest_spills(graph: OpGraph, spec: codegen.KernelSpec, nv: codegen.NvptxKernel,
                   options: Options, device) -> tuple[codegen.KernelSpec, codegen.NvptxKernel]:
    """The pattern's next-fastest schedules (modeled) while ptxas spills: the register model
    only estimates what ptxas allocates (BERT train TF's unrolled 4-phase kernel over 4
    blocks: 179 registers modeled with loads in place, 255 and 20 B of spill stores in
    ptxas). The first that does not spill, else the one spilling least."""
    excluded: dict[codegen.Schedule, str] = {}
    best = spec, nv
    while nv.spills and len(excluded) < MAX_SPILL_RETRIES:
        excluded[spec.schedule] = f"ptxas ({device.sm_arch}): {nv.spills} B of spill stores"
        try:
            spec = codegen.generate(graph.module, spec.nodes, spec.name, device, excluded)
        except codegen.CodegenError:
            break
        nv = codegen.compile_nvptx(spec, device.sm_arch)
        if nv.spills < best[1].spills:
            best = spec, nv
    return best


def _renamed(spec: codegen.KernelSpec, name: str) -> codegen.KernelSpec:
    host = spec.host_kernel and dataclasses.replace(spec.host_kernel, name=name)
    return dataclasses.replace(spec, name=name, kernel=dataclasses.replace(spec.kernel, name=name),
                               host_kernel=host)


def _reason(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def make_report(result: StitchResult, options: Options, device, times: Times,
                pricing=None) -> Report:
    """The Report of a plan: XLA's plan and the stitched plan counted and priced alike (by
    ``pricing``, default the latency-evaluator of ``device``)."""
    graph = result.graph
    kernel_nodes = graph.kernel_nodes()
    mem_nodes = [n.name for n in kernel_nodes if n.memory_intensive]
    opaque = sum(1 for n in kernel_nodes if n.op_class == OpClass.OPAQUE)

    xla_patterns = [[n] for n in mem_nodes]
    stitched = {n for k in result.kernels for n in k.pattern.nodes}
    fs_patterns = [k.pattern.nodes for k in result.kernels] + [
        [n] for n in mem_nodes if n not in stitched]

    # Both plans priced by the same model (modeled): XLA's kernels from the graph, stitched
    # kernels from their kernel IR.
    stitched_us = [stitched_kernel_us(k.spec, device, pricing) for k in result.kernels]
    xla_times = [xla_kernel_us(graph, n, device, pricing) for n in mem_nodes]
    fs_times = stitched_us + [xla_kernel_us(graph, n, device, pricing) for n in mem_nodes
                              if n not in stitched]

    def summary(patterns, kernel_us, with_patterns=False):
        kernel_bytes = [sum(pattern_traffic(graph, p)) for p in patterns]
        return PlanSummary(
            kernels=len(patterns) + opaque, mem_kernels=len(patterns), bytes=sum(kernel_bytes),
            modeled_us=round(sum(kernel_us), 3),
            patterns=len(result.kernels) if with_patterns else None)

    kernels = []
    for k, modeled_us in zip(result.kernels, stitched_us):
        spec, nv = k.spec, k.nvptx
        kbytes = sum(pattern_traffic(graph, k.pattern.nodes))
        kernels.append(KernelReport(
            name=spec.name, nodes=list(spec.nodes), schemes=list(spec.schemes),
            grid=list(spec.grid), block=list(spec.block), smem_bytes=spec.smem_bytes,
            regs=nv.regs if nv else None, regs_model=spec.regs_model,
            spills=nv.spills if nv else None, bytes=kbytes,
            modeled_us=round(modeled_us, 3)))
    return Report(
        module=result.module.name, target=report_target(options),
        xla=summary(xla_patterns, xla_times),
        fs=summary(fs_patterns, fs_times, with_patterns=True),
        compulsory_bytes=plan_bytes(graph, memory_intensive_regions(graph)),
        times_s=times, kernels=kernels, fallbacks=result.fallbacks,
        left_to_xla=_left_to_xla(result, device), planned_by=_planned_by(result.plan))


def _planned_by(plan: FusionPlan) -> str:
    if plan.strategy == "given":  # its first note names whose patterns (explorer.given_plan)
        return plan.notes[0]
    return f"explorer ({plan.strategy})"


def _left_to_xla(result: StitchResult, device: costmodel.Device) -> list[LeftToXla]:
    """Why each memory-intensive XLA kernel outside the stitched kernels stays XLA's, grouped
    by reason: its pattern was given back (a fallback), the code generator cannot build it
    even alone (asked only when the explorer rejected it with every neighbour, not for want
    of planning budget), or the kind of the plan's verdict on it and its neighbours
    (``explain.unstitched_kinds``)."""
    stitched = {n for k in result.kernels for n in k.pattern.nodes}
    given_back = {n: f.stage for f in result.fallbacks for n in f.nodes}
    verdicts = unstitched_kinds(GraphIndex(result.graph), result.plan)
    groups: dict[str, list[str]] = {}
    for node in (n.name for n in result.graph.memory_intensive_nodes()):
        if node in stitched:
            continue
        if node in given_back:
            reason = f"its stitched kernel was given back to XLA ({given_back[node]}, listed above)"
        else:
            kind = verdicts.get(node, Unrefused.NO_NEIGHBOUR)
            reason = f"code generator: {kind_text(kind)}" if isinstance(kind, codegen.Refusal) \
                else kind_text(kind)
            # past the planning budget, asking alone would be the work the budget refused
            if not isinstance(kind, Unrefused) and kind is not PlanRefusal.PLANNING_BUDGET:
                try:
                    refusal = codegen.can_stitch(result.module, [node], device)
                except Exception as exc:  # a defect of ours: say so instead of failing
                    refusal = internal(exc)
                if refusal is not None:
                    reason = f"the code generator cannot build it even alone: " \
                             f"{kind_text(refusal.kind)}"
        groups.setdefault(reason, []).append(node)
    return [LeftToXla(reason, nodes)
            for reason, nodes in sorted(groups.items(), key=lambda g: -len(g[1]))]


# -- verification ---------------------------------------------------------------------------

# Real data keeps a step finite; random data may not (the log or rsqrt of a negative
# variance, a NaN in every output of a Keras image model, where NaN == NaN checks nothing).
# Normal inputs first (signs exercised), then ones that keep such steps finite.
def _schedulable(module: Module, kernels: list[StitchedKernel],
                 fallbacks: list[Fallback]) -> list[StitchedKernel]:
    """The kernels less those in a cycle through the rest of the module, each left to XLA
    with a reason (what the explorer's check missed must not reach the runtime)."""
    try:
        _, stuck = stitched_steps(module, kernels)
    except Exception as exc:  # no order found: every kernel is given back
        _give_back(kernels, "schedule", internal(exc), fallbacks)
        return []
    stuck_names = {k.spec.name for k in stuck}
    for kernel in stuck:
        fallbacks.append(Fallback("schedule", list(kernel.pattern.nodes),
                                  f"{kernel.spec.name} waits on its own outputs through the "
                                  f"rest of the module (a cycle no schedule can run)"))
    return [k for k in kernels if k.spec.name not in stuck_names]


def _give_back(kernels: list[StitchedKernel], stage: str, refusal: Refusal,
               fallbacks: list[Fallback]) -> None:
    fallbacks.extend(Fallback(stage, list(k.pattern.nodes), str(refusal)) for k in kernels)


def emit(result: StitchResult, directory: str) -> None:
    """Write each kernel's kernel IR, LLVM IR, PTX and cubin."""
    os.makedirs(directory, exist_ok=True)
    for k in result.kernels:
        base = os.path.join(directory, k.spec.name)
        with open(base + ".kir", "w") as f:
            f.write(str(k.spec.kernel) + "\n")
            f.write("".join(f"# candidate {us:9.2f} us (modeled)  {what}\n"
                            for what, us in k.spec.candidates))
        if k.nvptx is not None:
            with open(base + ".ll", "w") as f:
                f.write(k.nvptx.llvm_ir)
            with open(base + ".ptx", "w") as f:
                f.write(k.nvptx.ptx)
            if k.nvptx.cubin is not None:
                with open(base + ".cubin", "wb") as f:
                    f.write(k.nvptx.cubin)
