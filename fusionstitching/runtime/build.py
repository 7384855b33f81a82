"""Build the stitched executable for one compiled jax function (one input signature).

    XLA's optimized HLO -> pipeline.stitch_module -> host kernels (kernel cache) -> FFI
    targets -> rewrite (custom calls) -> XLA compile -> the stitched jax Compiled

With a cache directory the module's plan is stored too: another process compiling the same
function only loads object code and runs XLA's compile. A kernel whose host build, FFI
registration or forked trial fails is left to XLA and the plan recounted without it (one the
code generator refuses, or measured slower, too: decisions the stored plan keeps); a failed
whole-module step raises ``BuildError`` naming the stage.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from dataclasses import dataclass

import costmodel

from .. import codegen, pipeline
from ..codegen import in_place
from ..hlo.parser import parse_module
from ..hlo.unroll import unroll_loops
from ..hlo.ir import print_module
from ..hlo.xla_runner import optimized_hlo_text
from ..logs import log
from ..report import Fallback, KernelReport, LeftToXla, PlanSummary, Report, Times, Verify
from . import cache as kernel_cache
from . import cpu_speed, crash_check, ffi, gpu, kernel_objects, rewrite, xla
from .built import BuildError, Built, reason
from .devices import device_compute_capability, gpu_device_of
from .plan_key import module_structure, open_cache, options_for, plan_key_of_text



def build_stitched(jax_lowered, xla_compiled, options: pipeline.Options, cache_dir: str | None,
                   dump_prefix: str | None = None, measure: bool = False,
                   remote_cache: str | None = None) -> Built:
    """``remote_cache``: a ``redis://`` URL, the cache's tier shared by the job's hosts
    (runtime/cache_redis.py). ``measure``: on the host route, each kernel is timed against
    XLA:CPU running its instructions alone and left to XLA when clearly slower (`cpu_speed`;
    the default ``keep="fastest"`` asks for it)."""

    started = time.perf_counter()
    # Constants in full: ``as_text()`` elides large ones as ``{...}``, and the rewritten
    # module is compiled from this text (a flax position table was lost that way).
    optimized = optimized_hlo_text(xla_compiled)
    _check_devices(xla_compiled, optimized)
    device = gpu_device_of(xla_compiled)
    options = options_for(options, device)
    if dump_prefix:
        _write(dump_prefix + ".xla.hlo.txt", optimized)
    stats, cache = open_cache(cache_dir, remote_cache)
    plan_key = plan_key_of_text(optimized, options, measure)
    cached = cache.lookup(plan_key, stats)
    if cached is not None:
        try:
            return dataclasses.replace(
                _from_cached_plan(json.loads(cached[1]), cache, stats, jax_lowered,
                                  xla_compiled, started, dump_prefix), plan_key=plan_key)
        except (kernel_cache.CorruptEntry, KeyError, TypeError, ValueError) as exc:
            stats.corrupt.append(f"{plan_key[:16]}: {reason(exc)}")  # rebuilt below

    module = _stage("parse", parse_module, optimized, source="<jax>")
    parse_seconds = time.perf_counter() - started
    _check_signature(module, xla_compiled)
    if device is None:  # XLA:CPU runs small loops rolled, a dozen thunks an iteration
        module = _stage("unroll", unroll_loops, module)
    result = _stitch(module, options, cache, stats, parse_seconds)
    fallbacks = result.report.fallbacks  # codegen/ptxas fallbacks are already in here
    if device is not None:
        return dataclasses.replace(
            _build_for_gpu(module, result, options, device, cache, plan_key, stats,
                           jax_lowered, xla_compiled, started, dump_prefix), plan_key=plan_key)
    plan = plan_on_host(module, result, options, cache, stats, measure)
    stitched, stitched_report, complete = None, plan.stitched_report, plan.complete
    if plan.text is not None:
        try:
            stitched = _compile(plan.text, jax_lowered, xla_compiled, dump_prefix)
        except BuildError as exc:  # the plan stands; XLA's own executable runs it
            nodes = [n for k in plan.kernels for n in k.pattern.nodes]
            _leave_to_xla(fallbacks, exc.stage, nodes, f"module {module.name}", exc.reason)
            stitched_report, complete = plan.xla_report, False
    if cache.enabled and complete:  # nothing failed: remember the plan
        _remember(cache, plan_key, plan)
    _note_corrupt_entries(stats, fallbacks)  # this process's notes, not part of the plan
    stitched_report.times_s.total = time.perf_counter() - started
    return Built(stitched, stitched_report, plan.xla_report, stats, plan.text, plan_key)


def _stitch(module, options, cache, stats, parse_seconds: float) -> pipeline.StitchResult:
    """``pipeline.stitch_module``, given the patterns planned for a module of the same
    structure at other sizes when the cache holds them (``module_structure``); the patterns
    the explorer plans are kept for the module's other sizes."""
    key, names = module_structure(print_module(module), options)
    given = None
    stored = cache.lookup(key, stats)
    if stored is not None:
        try:
            entry = json.loads(stored[1])
            given = pipeline.GivenPatterns(
                [[names[i] for i in pattern] for pattern in entry["patterns"]],
                f"module {entry['module']} at other sizes (patterns {key[:12]})")
        except (IndexError, KeyError, TypeError, ValueError) as exc:
            stats.corrupt.append(f"{key[:16]}: {reason(exc)}")  # planned afresh below
    result = _stage("pipeline", pipeline.stitch_module, module, options,
                    parse_seconds=parse_seconds,
                    schedules=kernel_objects.ScheduleMemo(cache, stats), given=given)
    numbers = {name: i for i, name in enumerate(names)}
    explored = result.plan.strategy != "given" and \
        not any(f.stage == "explore" for f in result.fallbacks)
    if explored and all(n in numbers for p in result.plan.patterns for n in p.nodes):
        cache.store(key, json.dumps({"module": module.name, "patterns": [
            [numbers[n] for n in p.nodes] for p in result.plan.patterns]}).encode(),
            kind="patterns")
    return result


@dataclass(frozen=True)
class HostPlan:
    """The host route's plan of one module before XLA compiles it: what the cache keeps."""
    kernels: list  # pipeline.StitchedKernel, each with its host kernel
    targets: list[str]  # their FFI targets, in order
    entries: list[dict]  # per kernel: name, symbol, cache key, inputs, outputs, parts
    stitched_report: Report
    xla_report: Report
    text: str | None  # the rewritten module; None: nothing stitched
    complete: bool  # nothing failed (decisions aside): the plan may be remembered


def plan_on_host(module, result, options, cache, stats, measure: bool) -> HostPlan:
    """The stitched plan's kernels built for this CPU (through the cache), each tried, and
    with ``measure`` timed against XLA:CPU; then the module rewritten around them."""
    fallbacks = result.report.fallbacks
    kernels, targets, cached_kernels = [], [], []
    left = []  # kernels given back to XLA here: one warning for all of them, below
    slower: list[Fallback] = []  # measured slower than XLA: a decision the plan remembers
    not_faster: list[str] = []  # XLA kernels timed alone against ours, and kept
    module_of_graph = result.graph.module
    donated = rewrite.donated_parameters(module)
    # The plan's kernels, then (measured only) the XLA kernels it left alone, each kept
    # where ours is clearly faster on this CPU.
    lone = pipeline.lone_kernels(result, options, fallbacks) if measure else []
    for index, kernel in enumerate(result.kernels + lone):
        is_lone = index >= len(result.kernels)
        nodes = list(kernel.pattern.nodes)
        try:
            spec, host, key, target, parts = _host_target(module_of_graph, kernel, cache, stats,
                                                          donated)
        except _GivenBack as exc:
            left.append((kernel.spec.name, exc.fallback, exc.decided))
            continue
        if measure:
            try:
                host_us, xla_us = cpu_speed.compare(module_of_graph, spec, target)
            except Exception as exc:
                left.append((kernel.spec.name, Fallback("measure", nodes, reason(exc)), False))
                continue
            if is_lone and not cpu_speed.faster_alone(host_us, xla_us):
                not_faster += nodes  # XLA's, as the plan has it
                continue
            if not is_lone and cpu_speed.slower_alone(host_us, xla_us):
                slower.append(Fallback("measured", nodes, (
                    f"host kernel measured at {host_us:.1f} us against XLA:CPU's "
                    f"{xla_us:.1f} us for the same instructions on this CPU (more than "
                    f"{cpu_speed.SLOWER_ALONE}x)")))
                continue
        targets.append(target)
        kernels.append(dataclasses.replace(kernel, spec=spec))  # with its host kernel
        cached_kernels.append({"name": kernel.spec.name, "symbol": spec.host_kernel.name,
                               "key": key, "inputs": len(kernel.spec.inputs),
                               "outputs": len(kernel.spec.outputs), "parts": parts})

    # decisions, not failures: the plan is still remembered
    fallbacks.extend(slower)
    fallbacks.extend(fallback for _, fallback, decided in left if decided)
    before_host = len(fallbacks)
    fallbacks.extend(fallback for _, fallback, decided in left if not decided)
    if slower:
        log.info("%d kernels measured slower than XLA:CPU left to XLA",
                 len(slower))
    if left:
        (name, first, _), more = left[0], f" (and {len(left) - 1} more)" if len(left) > 1 \
            else ""
        log.warning("kernel %s left to XLA (%s): %s%s", name, first.stage,
                    first.reason, more)
    stitched_report = _recount(result, kernels, options)
    xla_report = _recount(result, [], options)
    for report in (stitched_report, xla_report):
        _timed_alone(report, not_faster)
    text = None
    if kernels:
        try:
            rewritten = _stage("rewrite", rewrite.rewrite_module, module, kernels, targets,
                               donated=donated)
            text = print_module(dataclasses.replace(
                rewritten, header_attrs=donation_attrs(module.header_attrs)))
        except BuildError as exc:  # the plan stands; XLA's own executable runs it
            nodes = [n for k in kernels for n in k.pattern.nodes]
            _leave_to_xla(fallbacks, exc.stage, nodes, f"module {module.name}", exc.reason)
            stitched_report = xla_report
    return HostPlan(kernels, targets, cached_kernels, stitched_report, xla_report, text,
                    complete=len(fallbacks) == before_host)


def _remember(cache, plan_key: str, plan: HostPlan) -> None:
    entry = {"kernels": plan.entries, "xla_report": plan.xla_report.to_json(),
             "stitched_report": plan.stitched_report.to_json(),
             "hlo": _placeholders(plan.text, plan.targets) if plan.text else None}
    cache.store(plan_key, json.dumps(entry).encode(), kind="plan")


def prewarm(optimized: str, options: pipeline.Options, cache_dir: str | None,
            remote_cache: str | None = None, measure: bool = True,
            source: str = "<prewarm>") -> tuple[str, kernel_cache.CacheStats]:
    """Plan an XLA:CPU module (its optimized HLO, as the runtime sees it) ahead of the job
    and keep the plan and kernels in the cache, so the job's first step loads them. Returns
    "hit" (the plan was there), "stored", or "not stored" (something failed: the job builds
    it), with the cache's stats. ``options`` and ``measure`` (keep="fastest") must be the
    job's: they key the plan. Raises BuildError as ``build_stitched`` does."""
    options = options_for(options, None)  # XLA:CPU's module, as the runtime plans it
    stats, cache = open_cache(cache_dir, remote_cache)
    plan_key = plan_key_of_text(optimized, options, measure)
    if cache.lookup(plan_key, stats) is not None:
        return "hit", stats
    started = time.perf_counter()
    module = _stage("parse", parse_module, optimized, source=source)
    module = _stage("unroll", unroll_loops, module)
    result = _stitch(module, options, cache, stats, time.perf_counter() - started)
    plan = plan_on_host(module, result, options, cache, stats, measure)
    if not (cache.enabled and plan.complete):
        return "not stored", stats
    _remember(cache, plan_key, plan)
    return "stored", stats


def _timed_alone(report: Report, nodes: list[str]) -> None:
    """The Report says why these XLA kernels stayed XLA's: timed alone against ours on this
    CPU, ours was not clearly faster (not what the plan said of them and their neighbours)."""
    if not nodes:
        return
    for group in report.left_to_xla:
        group.nodes = [n for n in group.nodes if n not in nodes]
    report.left_to_xla = [g for g in report.left_to_xla if g.nodes] + [LeftToXla(
        f"timed alone on this CPU, a kernel of ours was not {cpu_speed.FASTER_ALONE}x faster "
        f"than XLA's", sorted(nodes))]


class _GivenBack(Exception):
    """A kernel given back to XLA; ``decided``: for a reason every run would meet (the plan
    is still remembered), not a failure of this run."""

    def __init__(self, fallback: Fallback, decided: bool = False):
        super().__init__(fallback.reason)
        self.fallback = fallback
        self.decided = decided


def _host_target(module, kernel, cache, stats, donated: dict):
    """(host spec, host kernel, cache key, FFI target, parts) of a kernel: its
    pattern scheduled for the CPU (the spec's own kernel is a GPU schedule), writing over
    the donated parameters it updates where that is safe (`with_in_place`), compiled
    through the kernel cache, tried in a child process, registered. Raises _GivenBack with
    the stage that failed."""
    nodes = list(kernel.pattern.nodes)
    failed = (crash_check.Outcome.CRASHED, crash_check.Outcome.HUNG, crash_check.Outcome.FAILED)
    tried = []  # the kept build already ran in a trial process (a cache miss)

    def vectorized_agrees(vectorized, reference) -> bool:
        """Run both in a trial process: the vectorized build is kept where it computes what
        the reference does (LLVM's vectorizer has miscompiled a kernel of ours)."""
        outcome, why = crash_check.run_in_child(vectorized, reference=reference)
        tried.append(outcome)
        if outcome in failed:
            raise _GivenBack(Fallback("trial", nodes, why))
        if outcome is crash_check.Outcome.DIFFERS:
            log.warning("kernel %s, vectorized by LLVM, %s; its build "
                        "without the loop vectorizer runs instead", kernel.spec.name, why)
        return outcome is not crash_check.Outcome.DIFFERS

    try:
        spec = with_in_place(codegen.add_host_kernel(module, kernel.spec), donated)
        host, key = kernel_objects.compile_host_cached(spec, cache, stats,
                                                     check=vectorized_agrees)
    except _GivenBack:
        raise
    except codegen.CodegenError as exc:  # a rule of the code generator: the same every run
        raise _GivenBack(Fallback("codegen", nodes, exc.detail), decided=True) from exc
    except Exception as exc:
        raise _GivenBack(Fallback("host", nodes, reason(exc))) from exc
    if not tried:  # a cached build: tried here too, before this process ever runs it
        outcome, why = crash_check.run_in_child(host)
        if outcome in failed:
            raise _GivenBack(Fallback("trial", nodes, why))
    try:  # before the measurement, which runs the kernel as the executable will: a
        # kernel then measured slower stays registered (XLA keeps targets for good)
        parts = ffi.kernel_parts(host)
        target = _register(kernel.spec.name, host, len(kernel.spec.inputs),
                           len(kernel.spec.outputs), parts)
    except Exception as exc:
        raise _GivenBack(Fallback("ffi", nodes, reason(exc))) from exc
    return spec, host, key, target, parts


def with_in_place(spec, donated: dict):
    """``spec`` whose host kernel writes each output that becomes a donated parameter it
    reads over that input, where codegen/in_place.py proves it safe (XLA's own fusions
    update parameters in place; without this, each such output is copied into its
    parameter after the kernel)."""
    read = {name: j for j, (name, _) in enumerate(spec.inputs)}
    pairs = []
    for i, (name, _) in enumerate(spec.outputs):
        param = donated.get(name)
        source = read.get(param.name) if param is not None else None
        if source is not None and in_place.refusal(
                spec.host_kernel, source, len(spec.inputs) + i) is None:
            pairs.append((source, len(spec.inputs) + i))
    if not pairs:
        return spec
    return dataclasses.replace(spec, host_kernel=in_place.written_over(spec.host_kernel,
                                                                       tuple(pairs)))


def _build_for_gpu(module, result, options, device, cache, plan_key, stats, jax_lowered,
                   xla_compiled, started: float, dump_prefix: str | None) -> Built:
    """The GPU route: each kernel's PTX behind jaxlib's launcher (runtime/gpu.py), so no host
    code is built; the plan remembers the rewritten HLO, whose target names are the kernels'
    own (nothing process-specific to replace)."""
    fallbacks = result.report.fallbacks
    before = len(fallbacks)
    arch = f"sm_{device_compute_capability(device)}"
    kernels, launches = _stage("gpu-launch", gpu.launchable, result, arch)
    xla_report = _recount(result, [], options)
    stitched_report = _recount(result, kernels, options)
    stitched, text = None, None
    if kernels:
        try:
            rewritten = _stage("rewrite", rewrite.rewrite_module, module, kernels,
                               [launch.target for launch in launches],
                               [gpu.backend_config(launch) for launch in launches])
            text = print_module(dataclasses.replace(
                rewritten, header_attrs=donation_attrs(module.header_attrs)))
            stitched = _compile_for_gpu(text, device, jax_lowered, xla_compiled, dump_prefix)
        except BuildError as exc:  # the plan stands; XLA's own executable runs it
            nodes = [n for k in kernels for n in k.pattern.nodes]
            _leave_to_xla(fallbacks, exc.stage, nodes, f"module {module.name}", exc.reason)
            stitched_report = xla_report
    if cache.enabled and len(fallbacks) == before:
        plan = {"route": "gpu", "kernels": [], "xla_report": xla_report.to_json(),
                "stitched_report": stitched_report.to_json(), "hlo": text}
        cache.store(plan_key, json.dumps(plan).encode(), kind="plan")
    _note_corrupt_entries(stats, fallbacks)
    stitched_report.times_s.total = time.perf_counter() - started
    return Built(stitched, stitched_report, xla_report, stats, text)


def _compile_for_gpu(text: str, device, jax_lowered, xla_compiled, dump_prefix: str | None):
    if dump_prefix:
        _write(dump_prefix + ".rewritten.hlo.txt", text)
    _stage("gpu-register", gpu.register_launch_targets, gpu.launch_targets(text))
    executable = _stage("xla-compile", xla.compile_hlo, text, device)
    return _stage("swap", xla.swap_executable, jax_lowered, xla_compiled, executable)


def _from_cached_plan(plan: dict, cache, stats, jax_lowered, xla_compiled, started: float,
                      dump_prefix: str | None) -> Built:
    """Everything the first build decided (plan, kernels, rewritten HLO, Reports), without
    parsing, exploring or generating code: load each kernel's object code, register it, put
    this process's target names into the HLO, compile. (A GPU plan has no object code: its
    HLO holds each kernel's PTX.)"""
    targets = []
    for k in plan["kernels"]:
        entry = cache.lookup(k["key"], stats)
        if entry is None:
            raise kernel_cache.CorruptEntry(f"kernel {k['name']} of the plan is not cached")
        t0 = time.perf_counter()
        host = kernel_objects.load_object(None, k["symbol"], entry[1])
        stats.load_s += time.perf_counter() - t0
        stats.hits += 1
        targets.append(_register(k["name"], host, k["inputs"], k["outputs"], k["parts"]))
    stats.plan = "hit"
    times = Times()  # nothing was parsed, explored or generated in this process
    fallbacks: list[Fallback] = []
    reports = [_report_from_json(plan[which], times, fallbacks)
               for which in ("stitched_report", "xla_report")]
    fallbacks += reports[0].fallbacks
    for report in reports:
        report.fallbacks = fallbacks
    _note_corrupt_entries(stats, fallbacks)
    text = plan["hlo"]
    stitched = None
    device = gpu_device_of(xla_compiled)
    if (plan.get("route") == "gpu") != (device is not None):
        raise kernel_cache.CorruptEntry("the plan was made for another device")
    if text is not None and device is not None:
        stitched = _compile_for_gpu(text, device, jax_lowered, xla_compiled, dump_prefix)
    elif text is not None:
        for i, target in enumerate(targets):
            text = text.replace(_placeholder(i), target)
        stitched = _compile(text, jax_lowered, xla_compiled, dump_prefix)
    times.total = time.perf_counter() - started
    return Built(stitched, reports[0], reports[1], stats, text)


DONATION_ATTRS = ("input_output_alias", "buffer_donor")


def donation_attrs(header_attrs: str) -> str:
    """The module-header attributes through which XLA donates parameters, from XLA's optimized
    module (``input_output_alias={ {0}: (0, {}, may-alias) }``, ``buffer_donor={...}``).
    The rewrite drops the header (layouts, scheduling); these must stay, or the stitched
    executable would not reuse the buffers that ``donate_argnums`` hands over while XLA's
    does. Parameters and results are the same in both modules, so the aliases are too."""
    kept, depth, start = [], 0, 0
    for i, char in enumerate(header_attrs + ","):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            attr = header_attrs[start:i].strip()
            if attr.split("=", 1)[0].strip() in DONATION_ATTRS:
                kept.append(attr)
            start = i + 1
    return ", ".join(kept)


def _register(name: str, host, num_inputs: int, num_outputs: int, parts: int) -> str:
    return ffi.register_host_kernel(name, host, num_inputs, num_outputs, parts)


def _compile(text: str, jax_lowered, xla_compiled, dump_prefix: str | None):
    if dump_prefix:
        _write(dump_prefix + ".rewritten.hlo.txt", text)
    executable = _stage("xla-compile", xla.compile_hlo, text,
                        devices=xla.executable_devices(xla_compiled))
    return _stage("swap", xla.swap_executable, jax_lowered, xla_compiled, executable)


def _placeholder(i: int) -> str:
    return f"@fusionstitching_target_{i}@"


def _placeholders(text: str, targets: list[str]) -> str:
    """The HLO with this process's FFI target names (they contain kernel addresses) replaced
    by placeholders; target names are unique, so plain replacement is exact."""
    for i, target in enumerate(targets):
        text = text.replace(f'"{target}"', f'"{_placeholder(i)}"')
    return text


def _note_corrupt_entries(stats, fallbacks: list) -> None:
    """One fallback per damaged entry, one warning for all of them (a truncated cache gave
    one warning per kernel of the function)."""
    for note in stats.corrupt:
        fallbacks.append(Fallback("cache", [], f"corrupt entry rebuilt: {note}"))
    if stats.corrupt:
        more = f" (and {len(stats.corrupt) - 1} more)" if len(stats.corrupt) > 1 else ""
        log.warning("corrupt kernel cache entry rebuilt: %s%s",
                    stats.corrupt[0], more)


def _report_from_json(data: dict, times: Times, fallbacks: list) -> Report:
    return Report(
        module=data["module"], target=data["target"], xla=PlanSummary(**data["xla"]),
        fs=PlanSummary(**data["fs"]), compulsory_bytes=data["compulsory_bytes"],
        verify=Verify(**data["verify"]), times_s=times,
        kernels=[KernelReport(**k) for k in data["kernels"]],
        fallbacks=[Fallback(**f) for f in data["fallbacks"]],
        planned_by=data.get("planned_by", ""))


def _stage(stage: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        raise BuildError(stage, reason(exc)) from exc


def _leave_to_xla(fallbacks: list, stage: str, nodes: list[str], name: str, why: str) -> None:
    log.warning("kernel %s left to XLA (%s): %s", name, stage, why)
    fallbacks.append(Fallback(stage, nodes, why))


def _recount(result, kernels: list, options: pipeline.Options) -> Report:
    """The Report as if only ``kernels`` had been stitched (fallbacks, times and verify are
    shared with the original report)."""
    recounted = dataclasses.replace(result, kernels=kernels)
    device = costmodel.load_device(options.target)
    return pipeline.make_report(recounted, options, device, result.report.times_s,
                                pipeline.pricing_of(options, device))


def _check_signature(module, xla_compiled) -> None:
    """The rewritten module is run with the flattened inputs: jax must not have dropped or
    added parameters (unused inputs, hoisted constants)."""
    num_inputs = xla_compiled.in_tree.num_leaves
    num_params = len(module.entry.parameters)
    if num_params != num_inputs:
        raise BuildError("signature", f"the module has {num_params} parameters for "
                                      f"{num_inputs} inputs")


def _check_devices(xla_compiled, optimized: str) -> None:
    """A step jax runs on several devices (of this process or of the job's processes) is one
    program each device runs (an SPMD partition, or a replica), planned once and compiled
    for the same devices (``xla.compile_hlo``). Said before any planning, these keep XLA's
    executable: one both partitioned and replicated, and a sharded step on GPUs."""
    devices = xla.executable_devices(xla_compiled)
    header = optimized.split("\n", 1)[0]
    partitions, replicas = (int(m.group(1)) if m else 1 for m in (
        re.search(r"\bnum_partitions=(\d+)", header), re.search(r"\breplica_count=(\d+)", header)))
    if partitions > 1 and replicas > 1:
        raise BuildError("devices", f"the step runs as {replicas} replicas of {partitions} "
                                    "partitions; stitched executables run one of the two so far")
    if partitions * replicas != len(devices):
        raise BuildError("devices", f"the module runs on {partitions * replicas} devices, "
                                    f"the executable on {len(devices)}")
    if len(devices) > 1 and devices[0].platform != "cpu":
        raise BuildError("devices", f"the step runs on {len(devices)} {devices[0].platform} "
                                    "devices; sharded steps are stitched on the host so far")


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
