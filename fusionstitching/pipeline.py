"""The post-XLA pass: optimized Module -> op graph -> fusion plan -> kernels -> Report.

``stitch_module`` is the one entry point. A failure while generating or compiling a pattern
never fails the module: the pattern is left to XLA and listed in ``Report.fallbacks``.
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

import costmodel
from costmodel.latency import MAX_REGISTERS_PER_THREAD

from . import codegen
from .codegen.profile import modeled_kernel_us
from .explain import NEVER_TOGETHER, NO_NEIGHBOUR, NOT_CHOSEN, generic_reason, unstitched_reasons
from .explorer import FusionPlan, Pattern, explore
from .explorer.index import GraphIndex
from .graph import OpClass, OpGraph, build_graph
from .graph.profile import xla_kernel_profile
from .graph.traffic import memory_intensive_regions, pattern_traffic, plan_bytes
from .hlo.elided import elided_constants, fill_elided
from .hlo.ir import NUMPY_DTYPES, Computation, Instruction, Module, Shape
from .report import Fallback, KernelReport, LeftToXla, PlanSummary, Report, Times, Verify


@dataclass
class Options:
    target: str = "h100"
    explorer: str = "beam"
    verify: bool = False
    emit_dir: str | None = None
    ptxas: bool = True  # assemble each kernel (registers and spills come from ptxas)
    host: bool = False  # build host kernels (always built when verifying)
    seed: int = 0


@dataclass
class StitchedKernel:
    pattern: Pattern
    spec: codegen.KernelSpec
    nvptx: codegen.NvptxKernel | None = None
    host: codegen.HostKernel | None = None


@dataclass
class StitchResult:
    module: Module
    graph: OpGraph
    plan: FusionPlan
    kernels: list[StitchedKernel]
    report: Report
    fallbacks: list[Fallback] = field(default_factory=list)


def stitch_module(module: Module, options: Options | None = None,
                  parse_seconds: float = 0.0) -> StitchResult:
    options = options or Options()
    device = costmodel.load_device(options.target)
    started = time.perf_counter()
    times = Times(parse=parse_seconds)
    fallbacks: list[Fallback] = []

    graph = build_graph(module)
    t0 = time.perf_counter()
    built: dict[frozenset[str], codegen.KernelSpec] = {}
    plan = plan_module(graph, options, device, built)
    times.explore = time.perf_counter() - t0

    kernels: list[StitchedKernel] = []
    for index, pattern in enumerate(plan.patterns):
        name = f"fusionstitching_{_c_name(module.name)[:40]}_{index}"
        kernel = _build_kernel(graph, pattern, name, options, device, times, fallbacks,
                               built.get(frozenset(pattern.nodes)))
        if kernel is not None:
            kernels.append(kernel)

    kernels = _schedulable(module, kernels, fallbacks)
    result = StitchResult(module, graph, plan, kernels, report=None, fallbacks=fallbacks)
    result.report = make_report(result, options, device, times)
    if options.verify:
        result.report.verify = verify(result, seed=options.seed)
    if options.emit_dir:
        emit(result, options.emit_dir)
    times.total = time.perf_counter() - started + parse_seconds
    return result


def plan_module(graph: OpGraph, options: Options, device,
                built: dict[frozenset[str], codegen.KernelSpec] | None = None) -> FusionPlan:
    """The fusion plan of ``graph``, asking the code generator the question the pipeline
    will: can it build the pattern, and does the kernel pass the cost guard below? So the
    explorer plans around patterns that would be given back to XLA instead of losing them.

    The explorer prices plans as the Report will (``profile_of``): a pattern by the
    profile of the kernel the query built, one XLA kernel by ``xla_kernel_profile``. So the
    explorer's final choice ranks plans by the modeled times the Report shows, not by its own
    estimate, and each pattern is generated once. ``built`` receives the kernel of every
    accepted pattern, so that the pipeline does not generate the chosen ones again."""
    built = {} if built is None else built  # accepted patterns
    xla_us: dict[str, float] = {}  # XLA's kernel times, asked again by every query

    def xla_kernel_us(node: str) -> float:
        if node not in xla_us:
            xla_us[node] = _xla_kernel_us(graph, node, device)
        return xla_us[node]

    def can_stitch(nodes: list[str]) -> tuple[bool, str]:
        try:
            spec = codegen.generate(graph.module, nodes, "probe", {"name": options.target})
        except codegen.CodegenError as exc:
            return False, str(exc)
        slower = _slower_than_xla(graph, spec, device, options.target, xla_kernel_us)
        if slower:
            return False, slower
        if options.ptxas and spec.regs_model >= MAX_REGISTERS_PER_THREAD and \
                codegen.find_ptxas():
            # At the register model's cap it cannot tell whether ptxas spills: ask ptxas
            # (the chosen schedule only: trying the others here made planning minutes longer).
            spills = codegen.compile_nvptx(spec, device.sm_arch).spills
            if spills:
                return False, f"ptxas ({device.sm_arch}) spills the pattern's fastest " \
                              f"schedule: {spills} B of spill stores"
        built[frozenset(nodes)] = spec
        return True, f"ok: {spec.why}; {', '.join(spec.schemes)}"

    def profile_of(nodes: list[str]) -> costmodel.KernelProfile:
        if len(nodes) == 1:
            return xla_kernel_profile(graph, nodes[0], device)
        spec = built.get(frozenset(nodes))
        if spec is None:  # the explorer prices only patterns the query accepted
            raise ValueError(f"no stitched kernel was built for {nodes}")
        return spec.profile  # as modeled_kernel_us prices it

    return explore(graph, can_stitch, options.explorer, device, profile_of,
                   lambda nodes: codegen.other_space_nodes(graph.module, nodes))


def _slower_than_xla(graph: OpGraph, spec, device, target: str,
                     xla_kernel_us=None) -> str | None:
    """No negative optimization: why a stitched kernel modeled slower than the XLA kernels it
    replaces is not used (None when it is faster). ``xla_kernel_us(node)``: XLA's kernel
    times, when the caller keeps them."""
    stitched_us = modeled_kernel_us(spec, device)
    xla_kernel_us = xla_kernel_us or (lambda n: _xla_kernel_us(graph, n, device))
    xla_us = sum(xla_kernel_us(n) for n in spec.nodes if graph.nodes[n].is_kernel)
    if stitched_us < xla_us:
        return None
    return (f"stitched kernel modeled at {stitched_us:.2f} us is not faster than XLA's "
            f"kernels at {xla_us:.2f} us (modeled, {target})")


def _c_name(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def _build_kernel(graph, pattern, name, options, device, times, fallbacks, probed=None):
    """``probed``: the kernel the explorer's capability query built for this pattern (the
    same generation under another name), else it is generated here."""
    t0 = time.perf_counter()
    try:
        spec = _renamed(probed, name) if probed is not None else codegen.generate(
            graph.module, pattern.nodes, name, {"name": options.target})
    except Exception as exc:  # any codegen failure leaves the pattern to XLA
        times.codegen += time.perf_counter() - t0
        fallbacks.append(Fallback("codegen", list(pattern.nodes), _reason(exc)))
        return None
    slower = _slower_than_xla(graph, spec, device, options.target)
    if slower:
        times.codegen += time.perf_counter() - t0
        fallbacks.append(Fallback("cost", list(pattern.nodes), slower))
        return None
    try:
        host = codegen.compile_host(spec) if options.verify or options.host else None
    except Exception as exc:
        fallbacks.append(Fallback("host", list(pattern.nodes), _reason(exc)))
        return None
    finally:
        times.codegen += time.perf_counter() - t0
    kernel = StitchedKernel(pattern, spec, host=host)
    if options.ptxas:
        t0 = time.perf_counter()
        try:
            nv = codegen.compile_nvptx(spec, arch=device.sm_arch)
            if nv.spills:
                spec, nv = _fewest_spills(graph, spec, nv, options, device)
                host = host and codegen.compile_host(spec)
                kernel = StitchedKernel(pattern, spec, host=host)
            kernel.nvptx = nv
        except Exception as exc:
            fallbacks.append(Fallback("ptxas", list(pattern.nodes), _reason(exc)))
            return None
        finally:
            times.ptxas += time.perf_counter() - t0
    return kernel


MAX_SPILL_RETRIES = 8  # each is a code generation and a ptxas run


def _fewest_spills(graph: OpGraph, spec: codegen.KernelSpec, nv: codegen.NvptxKernel,
                   options: Options, device) -> tuple[codegen.KernelSpec, codegen.NvptxKernel]:
    """The pattern's next-fastest schedules (modeled) while ptxas spills: the register model
    only estimates what ptxas allocates (BERT train TF's unrolled 4-phase kernel over 4
    blocks: 179 registers modeled with loads in place, 255 and 20 B of spill stores in
    ptxas). The first that does not spill, else the one spilling least."""
    excluded: dict[str, str] = {}
    best = spec, nv
    while nv.spills and len(excluded) < MAX_SPILL_RETRIES:
        excluded[spec.why] = f"ptxas ({device.sm_arch}): {nv.spills} B of spill stores"
        try:
            spec = codegen.generate(graph.module, spec.nodes, spec.name,
                                    {"name": options.target}, excluded)
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


def _xla_kernel_us(graph: OpGraph, node: str, device) -> float:
    """Modeled time of one of XLA's own kernels, by the same latency-evaluator."""
    return costmodel.kernel_latency_us(xla_kernel_profile(graph, node, device), device).total_us


def make_report(result: StitchResult, options: Options, device, times: Times) -> Report:
    """The Report of a plan: XLA's plan and the stitched plan counted and priced alike."""
    graph = result.graph
    kernel_nodes = graph.kernel_nodes()
    mem_nodes = [n.name for n in kernel_nodes if n.memory_intensive]
    opaque = sum(1 for n in kernel_nodes if n.op_class == OpClass.OPAQUE)

    xla_patterns = [[n] for n in mem_nodes]
    stitched = {n for k in result.kernels for n in k.pattern.nodes}
    fs_patterns = [k.pattern.nodes for k in result.kernels] + [
        [n] for n in mem_nodes if n not in stitched]

    # Both plans priced by the same latency-evaluator (modeled): XLA's kernels from the graph,
    # stitched kernels from their kernel IR.
    stitched_us = [modeled_kernel_us(k.spec, device) for k in result.kernels]
    xla_times = [_xla_kernel_us(graph, n, device) for n in mem_nodes]
    fs_times = stitched_us + [_xla_kernel_us(graph, n, device) for n in mem_nodes
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
        module=result.module.name, target=options.target,
        xla=summary(xla_patterns, xla_times),
        fs=summary(fs_patterns, fs_times, with_patterns=True),
        compulsory_bytes=plan_bytes(graph, memory_intensive_regions(graph)),
        times_s=times, kernels=kernels, fallbacks=result.fallbacks,
        left_to_xla=_left_to_xla(result, options))


def _left_to_xla(result: StitchResult, options: Options) -> list[LeftToXla]:
    """Why each memory-intensive XLA kernel outside the stitched kernels stays XLA's, grouped
    by reason: its pattern was given back (a fallback), the code generator cannot build it
    even alone (asked only when the explorer rejected it with every neighbour), or the plan's
    verdict on it and its neighbours (``explain.unstitched_reasons``)."""
    stitched = {n for k in result.kernels for n in k.pattern.nodes}
    given_back = {n: f.stage for f in result.fallbacks for n in f.nodes}
    verdicts = unstitched_reasons(GraphIndex(result.graph), result.plan)
    groups: dict[str, list[str]] = {}
    for node in (n.name for n in result.graph.memory_intensive_nodes()):
        if node in stitched:
            continue
        if node in given_back:
            reason = f"its stitched kernel was given back to XLA ({given_back[node]}, listed above)"
        else:
            reason = verdicts.get(node, NO_NEIGHBOUR)
            if reason not in (NOT_CHOSEN, NEVER_TOGETHER, NO_NEIGHBOUR):
                ok, why = codegen.can_stitch(result.module, [node], {"name": options.target})
                if not ok:
                    reason = f"the code generator cannot build it even alone: " \
                             f"{generic_reason(why)}"
        groups.setdefault(reason, []).append(node)
    return [LeftToXla(reason, nodes)
            for reason, nodes in sorted(groups.items(), key=lambda g: -len(g[1]))]


# -- verification ---------------------------------------------------------------------------

# Real data keeps a step finite; random data may not (the log or rsqrt of a negative
# variance, a NaN in every output of a Keras image model, where NaN == NaN checks nothing).
# Normal inputs first (signs exercised), then ones that keep such steps finite.
INPUT_KINDS = ("normal", "positive", "small positive")


def random_inputs(module: Module, seed: int = 0, kind: str = "normal") -> list[np.ndarray]:
    """Seeded random arguments for the entry parameters (logical numpy arrays); UnsupportedOp
    for a parameter no array stands for (a tuple, a token). ``kind``: INPUT_KINDS."""
    from .hlo.evaluator import UnsupportedOp

    rng = np.random.default_rng(seed)
    args = []
    for param in module.entry.parameters:
        shape = param.shape
        if shape.is_tuple or shape.dtype not in NUMPY_DTYPES:
            raise UnsupportedOp(f"entry parameter %{param.name} of type {shape}")
        dtype = shape.numpy_dtype
        if dtype == np.bool_:
            args.append(rng.random(shape.dims) < 0.5)
        elif np.issubdtype(dtype, np.integer):
            # Integer parameters are mostly indices (tokens, segments, labels), masks and step
            # counters: 0 and 1 are valid for all of them; larger values index out of range
            # (JAX's gathers then fill NaN, and every output of BERT was NaN, comparing equal).
            args.append(rng.integers(0, 2, size=shape.dims).astype(dtype))
        elif kind == "normal":
            args.append(rng.standard_normal(shape.dims).astype(dtype))
        elif kind == "positive":
            args.append(np.abs(rng.standard_normal(shape.dims)).astype(dtype))
        else:
            args.append(rng.uniform(0.01, 0.1, size=shape.dims).astype(dtype))
    return args


def stitched_steps(module: Module, kernels: list[StitchedKernel]):
    """The stitched plan in an order it can run: ``(instruction, None)`` for an entry
    instruction left to XLA, ``(None, kernel)`` for a stitched kernel; second, the kernels
    that wait on their own outputs through the rest of the module (a cycle: never ready)."""
    comp = module.entry
    by_name = comp.by_name()
    owner = {n: ("kernel", i) for i, k in enumerate(kernels) for n in k.pattern.nodes}

    def unit(name: str):
        """What computes an entry value: its kernel (also for a get-tuple-element of a
        kernel's multi-output node, which the kernel writes), else the instruction."""
        inst = by_name[name]
        if name not in owner and inst.opcode == "get-tuple-element":
            return owner.get(inst.operands[0], name)
        return owner.get(name, name)

    graph = nx.DiGraph()  # nodes: instruction names and ("kernel", index)
    for inst in comp.instructions:
        if inst.opcode == "parameter" or unit(inst.name) != inst.name:
            continue
        graph.add_node(inst.name)
        graph.add_edges_from((unit(op), inst.name) for op in inst.operands
                             if by_name[op].opcode != "parameter")
    for i, kernel in enumerate(kernels):
        graph.add_node(("kernel", i))
        graph.add_edges_from((unit(n), ("kernel", i)) for n, _ in kernel.spec.inputs
                             if by_name[n].opcode != "parameter")
    cyclic = {u for component in nx.strongly_connected_components(graph)
              if len(component) > 1 for u in component} | set(nx.nodes_with_selfloops(graph))
    stuck = [k for i, k in enumerate(kernels) if ("kernel", i) in cyclic]
    if stuck:
        return [], stuck
    return [(None, kernels[u[1]]) if isinstance(u, tuple) else (by_name[u], None)
            for u in nx.topological_sort(graph)], []


def _schedulable(module: Module, kernels: list[StitchedKernel],
                 fallbacks: list[Fallback]) -> list[StitchedKernel]:
    """The kernels less those in a cycle through the rest of the module, each left to XLA
    with a reason (what the explorer's check missed must not reach the runtime)."""
    _, stuck = stitched_steps(module, kernels)
    stuck_names = {k.spec.name for k in stuck}
    for kernel in stuck:
        fallbacks.append(Fallback("schedule", list(kernel.pattern.nodes),
                                  f"{kernel.spec.name} waits on its own outputs through the "
                                  f"rest of the module (a cycle no schedule can run)"))
    return [k for k in kernels if k.spec.name not in stuck_names]


def execute_stitched(result: StitchResult, args: list[np.ndarray]):
    """Run the stitched plan: host kernels for stitched patterns, the evaluator for the rest."""
    module, comp = result.module, result.module.entry
    shapes = {i.name: i.shape for i in comp.instructions}
    steps, stuck = stitched_steps(module, result.kernels)
    if stuck:
        raise RuntimeError(f"stitched plan cannot be scheduled: {[k.spec.name for k in stuck]} "
                           f"wait on their own outputs")
    values: dict[str, object] = dict(zip((p.name for p in comp.parameters), args))
    for inst, kernel in steps:
        if kernel is not None:
            outs = kernel.host(*[values[n] for n, _ in kernel.spec.inputs])
            values.update(zip((n for n, _ in kernel.spec.outputs), outs))
        else:
            values[inst.name] = evaluate_instruction(
                module, inst, [values[op] for op in inst.operands], shapes)
    return values[comp.root.name]


def evaluate_instruction(module: Module, inst: Instruction, operands: list,
                         shapes: dict[str, Shape]) -> object:
    """One instruction through the evaluator, as a computation of its own; ``shapes`` maps
    operand names to their shapes."""
    from .hlo.evaluator import evaluate_computation

    names = list(dict.fromkeys(inst.operands))
    params = [Instruction(f"{n}.arg", shapes[n], "parameter",
                          parameter_number=i) for i, n in enumerate(names)]
    renamed = dataclasses.replace(inst, operands=[f"{n}.arg" for n in inst.operands],
                                  is_root=True)
    wrapper = Computation(f"{inst.name}.eval", params + [renamed])
    # The evaluator knows the computations of the module it is given (operand shapes for
    # bitcast, called computations): give it one that holds the wrapper too.
    scope = dataclasses.replace(module, computations=module.computations + [wrapper])
    distinct = dict(zip(inst.operands, operands))
    return evaluate_computation(scope, wrapper, [distinct[n] for n in names])


def _leaves(value) -> list[np.ndarray]:
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [np.asarray(value)]


def compare(expected, actual, rtol: float = 1e-5, atol: float = 1e-5) -> tuple[bool, float, float]:
    """(ok, max abs err, max rel err): floats within rtol/atol, everything else exact."""
    ok, max_abs, max_rel = True, 0.0, 0.0
    exp_leaves, act_leaves = _leaves(expected), _leaves(actual)
    if len(exp_leaves) != len(act_leaves):
        return False, float("inf"), float("inf")
    for e, a in zip(exp_leaves, act_leaves):
        if e.shape != a.shape:
            return False, float("inf"), float("inf")
        if np.issubdtype(e.dtype, np.floating) or e.dtype.kind == "V":
            e64, a64 = e.astype(np.float64), a.astype(np.float64)
            # NaN matches NaN and an infinity itself; only finite pairs have an error (a NaN
            # or inf in the tolerance term would fail every comparison, even of equal arrays).
            exact = (e64 == a64) | (np.isnan(e64) & np.isnan(a64))
            finite = np.isfinite(e64) & np.isfinite(a64)
            # A NaN or infinity against a number is infinitely far (it reported 0 before).
            diff = np.abs(np.subtract(e64, a64, out=np.where(exact, 0.0, np.inf), where=finite))
            scale = np.where(finite, np.abs(e64), 0.0)
            if diff.size:
                max_abs = max(max_abs, float(diff.max()))
                max_rel = max(max_rel, float((diff / np.maximum(scale, 1e-30)).max()))
            ok &= bool((exact | (finite & (diff <= atol + rtol * scale))).all())
        else:
            ok &= bool(np.array_equal(e, a))
    return ok, max_abs, max_rel


def finite_fraction(value) -> float:
    """The fraction of the float elements of ``value`` that are finite (1.0 without floats)."""
    floats = [leaf for leaf in _leaves(value) if leaf.dtype.kind == "f" and leaf.size]
    total = sum(leaf.size for leaf in floats)
    return sum(int(np.isfinite(leaf).sum()) for leaf in floats) / total if total else 1.0


VACUOUS_BELOW = 0.5  # a check where most outputs are NaN/inf compares almost nothing


def verify(result: StitchResult, seed: int = 0) -> Verify:
    """Run XLA's plan and the stitched plan on the same random inputs and compare.

    Elided constants get the same seeded values in both plans and in XLA's text. Inputs of
    each of INPUT_KINDS in turn until every output is finite (a mismatch on mostly finite
    outputs is a verdict at once); else the kind with the most finite outputs, and the check
    is vacuous when that is under half (an RMSprop step on normal inputs: the square root of
    a negative second moment made half of every update NaN, which compares nothing). Inputs
    on which rounding decides the outputs (the evaluator, too, is outside XLA's f32 distance
    from its f64 result) give no verdict either: the next kind is tried, vacuous if none is
    left."""
    if elided_constants(result.module):
        result = dataclasses.replace(result, module=fill_elided(result.module, seed))
    best = chaotic = None
    for kind in INPUT_KINDS:
        outcome = _verify_on(result, seed, kind)
        if outcome.vacuous:  # rounding decides these outputs
            chaotic = chaotic or outcome
            continue
        if not outcome.ran or outcome.error or outcome.finite == 1.0 or (
                not outcome.ok and outcome.finite >= VACUOUS_BELOW):
            return outcome
        if best is None or outcome.finite > best.finite:
            best = outcome
    if best is None:
        return chaotic
    if best.finite < VACUOUS_BELOW:
        best.ok, best.vacuous = False, True
    return best


def _verify_on(result: StitchResult, seed: int, kind: str) -> Verify:
    """References: XLA itself running the module (where jaxlib can compile the text) and the
    numpy evaluator; the stitched plan must match every reference that ran, within 1e-5 or,
    failing that, be about as close to XLA's f64 result for the module as XLA's f32 is."""
    from .hlo.evaluator import UnsupportedOp, evaluate
    from .hlo.xla_runner import drift_problems, run_hlo_with_xla, widened_to_f64

    try:
        args = random_inputs(result.module, seed, kind)
        references = {"evaluator": evaluate(result.module, args)}
    except UnsupportedOp as exc:
        # The stitched plan runs its other ops through the evaluator too, so neither plan can
        # run here (e.g. collectives): say so instead of a verdict.
        return Verify(ran=False, not_run=f"this machine cannot execute the module: {exc}")
    text = str(result.module)
    try:
        references["xla"] = run_hlo_with_xla(text, args)
    except Exception as exc:  # noted, not fatal: the evaluator still checks
        _note_once(result, Fallback("verify", [], f"XLA could not run the module as a "
                                                  f"reference: {_reason(exc)}"))
    # Every reference must be mostly finite: XLA:CPU's YNNPACK fusions drop the NaN of a
    # maximum that HLO (and the evaluator) propagates, so on a NaN-laden input one reference
    # can be all NaN and the other finite, and such inputs compare nothing.
    outcome = Verify(ran=True, ok=True, against=sorted(references), inputs=kind,
                     finite=min(map(finite_fraction, references.values())))
    try:
        stitched = execute_stitched(result, args)
    except Exception as exc:  # a defect of ours, reported as a failed check, never a crash
        outcome.ok, outcome.error = False, _reason(exc)
        return outcome
    for ref in references.values():
        ok, max_abs, max_rel = compare(ref, stitched)
        outcome.ok &= ok
        outcome.max_abs_err = max(outcome.max_abs_err, max_abs)
        outcome.max_rel_err = max(outcome.max_rel_err, max_rel)
    if not outcome.ok and "xla" in references:
        # A whole step amplifies f32 rounding far past 1e-5, so two correct f32 executions
        # differ by more: then the yardstick is XLA's own distance from its f64 result
        # (xla_runner.DRIFT_FACTOR, measured on the model-zoo workloads).
        try:
            exact = run_hlo_with_xla(widened_to_f64(text), [
                a.astype(np.float64) if a.dtype == np.float32 else a for a in args])
        except Exception as exc:  # the 1e-5 verdict stands
            _note_once(result, Fallback(
                "verify", [], f"XLA could not run the module in f64: {_reason(exc)}"))
        else:
            xla, exact = _leaves(references["xla"]), _leaves(exact)
            outcome.ok = not drift_problems(_leaves(stitched), xla, exact)
            if not outcome.ok and drift_problems(_leaves(references["evaluator"]), xla, exact):
                # The evaluator (f64 accumulation, no stitched kernel) misses the yardstick
                # too: on these inputs rounding decides the step (a Keras MobileNetV3 step on
                # normal inputs: XLA's own f32 15% off its f64 result), no verdict.
                outcome.ok, outcome.vacuous = False, True
                _note_once(result, Fallback("verify", [], f"on {kind} inputs the evaluator is "
                                                          f"outside XLA's f32 distance from "
                                                          f"its f64 result too: no verdict"))
    return outcome


def _note_once(result: StitchResult, note: Fallback) -> None:
    """A verification note, once however many kinds of inputs were tried."""
    if note not in result.report.fallbacks:
        result.report.fallbacks.append(note)


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
