"""Build the stitched executable for one compiled jax function (one input signature).

    XLA's optimized HLO --parse--> Module --pipeline.stitch_module--> plan + kernel specs
      --host (kernel cache)--> native kernels --ffi--> FFI targets
      --rewrite--> HLO with custom calls --XLA compile--> executable --swap--> jax Compiled

A kernel whose host build or FFI registration fails is left to XLA (a ``host`` / ``ffi``
fallback) and the plan is recounted without it, so the Report's ``fs`` numbers describe the
kernels that are really in the executable. A failure of a whole-module step raises
``BuildError`` naming the stage; the caller then runs XLA's own executable.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass

from .. import pipeline
from ..report import Fallback, Report
from . import cache as kernel_cache

log = logging.getLogger("fusionstitching")


class BuildError(RuntimeError):
    def __init__(self, stage: str, reason: str):
        super().__init__(f"[{stage}] {reason}")
        self.stage, self.reason = stage, reason


@dataclass
class Built:
    stitched: object  # jax.stages.Compiled running the rewritten module; None: nothing stitched
    stitched_report: Report  # the plan with the kernels that made it into the executable
    xla_report: Report  # XLA's own plan counted the same way (what runs after a fallback)
    cache: kernel_cache.CacheStats
    rewritten_hlo: str | None


def reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def build_stitched(jax_lowered, xla_compiled, options: pipeline.Options, cache_dir: str | None,
                   dump_prefix: str | None = None) -> Built:
    from ..hlo.parser import parse_module
    from ..hlo.printer import print_module
    from . import ffi, rewrite, xla

    started = time.perf_counter()
    optimized = xla_compiled.as_text()
    if dump_prefix:
        _write(dump_prefix + ".xla.hlo.txt", optimized)
    module = _stage("parse", parse_module, optimized, source="<jax>")
    parse_seconds = time.perf_counter() - started
    _check_signature(module, xla_compiled)
    result = _stage("pipeline", pipeline.stitch_module, module, options,
                    parse_seconds=parse_seconds)
    fallbacks = result.report.fallbacks  # codegen/ptxas fallbacks are already in here

    stats = kernel_cache.CacheStats(cache_dir)
    cache = kernel_cache.KernelCache(cache_dir)
    kernels, targets = [], []
    for kernel in result.kernels:
        nodes = list(kernel.pattern.nodes)
        try:
            host = kernel.host or kernel_cache.compile_host_cached(kernel.spec, cache, stats)
        except Exception as exc:
            _leave_to_xla(fallbacks, "host", nodes, kernel.spec.name, reason(exc))
            continue
        try:
            targets.append(ffi.register_kernel(kernel.spec.name, host.address,
                                               len(kernel.spec.inputs),
                                               len(kernel.spec.outputs), owner=host))
        except Exception as exc:
            _leave_to_xla(fallbacks, "ffi", nodes, kernel.spec.name, reason(exc))
            continue
        kernels.append(kernel)
    for note in stats.corrupt:
        log.warning("fusionstitching: corrupt kernel cache entry rebuilt: %s", note)
        fallbacks.append(Fallback("cache", [], f"corrupt entry rebuilt: {note}"))

    stitched_report = _recount(result, kernels, options)
    xla_report = _recount(result, [], options)
    stitched, text = None, None
    if kernels:
        rewritten = _stage("rewrite", rewrite.rewrite_module, module, kernels, targets)
        text = print_module(rewritten)
        if dump_prefix:
            _write(dump_prefix + ".rewritten.hlo.txt", text)
        executable = _stage("xla-compile", xla.compile_hlo, text)
        stitched = _stage("swap", xla.swap_executable, jax_lowered, xla_compiled, executable)
    stitched_report.times_s.total = time.perf_counter() - started
    return Built(stitched, stitched_report, xla_report, stats, text)


def _stage(stage: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        raise BuildError(stage, reason(exc)) from exc


def _leave_to_xla(fallbacks: list, stage: str, nodes: list[str], name: str, why: str) -> None:
    log.warning("fusionstitching: kernel %s left to XLA (%s): %s", name, stage, why)
    fallbacks.append(Fallback(stage, nodes, why))


def _recount(result, kernels: list, options: pipeline.Options) -> Report:
    """The Report as if only ``kernels`` had been stitched (fallbacks, times and verify are
    shared with the original report)."""
    import costmodel

    recounted = dataclasses.replace(result, kernels=kernels)
    return pipeline._make_report(recounted, options, costmodel.load_device(options.target),
                                 result.report.times_s)


def _check_signature(module, xla_compiled) -> None:
    """The rewritten module is run with the flattened inputs: jax must not have dropped or
    added parameters (unused inputs, hoisted constants)."""
    num_inputs = xla_compiled.in_tree.num_leaves
    num_params = len(module.entry.parameters)
    if num_params != num_inputs:
        raise BuildError("signature", f"the module has {num_params} parameters for "
                                      f"{num_inputs} inputs")


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
