"""``fusionstitching.jit(fn, **opts)``: ``jax.jit`` with stitched kernels in XLA's executable.

Per input signature, on first call (or ``.lower(*a).compile()``):

1. ``jax.jit`` lowers and compiles ``fn``; its optimized HLO is the pass's input;
2. ``pipeline.stitch_module`` plans and generates the stitched kernels;
3. each kernel is compiled for the host and registered as an XLA FFI target (runtime/ffi.py);
4. ``runtime.rewrite`` replaces the stitched patterns by custom calls and XLA compiles the
   result (runtime/rewrite.py explains the route); that executable runs every call.

Any failure on the way falls back to XLA's own executable for that signature, with one
warning naming the stage and reason, and a ``fallbacks`` entry in the Report. Kernels that
fail alone (host compile, registration) are left to XLA while the others still run.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time

from . import pipeline
from .report import Fallback, PlanSummary, Report

log = logging.getLogger("fusionstitching")


def jit(fn, **opts) -> "StitchedFunction":
    """Like ``jax.jit(fn)`` (no static or donated arguments); ``opts`` are
    ``pipeline.Options`` fields (target, explorer, verify, emit_dir, ptxas). PTX is not
    assembled unless ``ptxas=True``: on the CPU it is not executed, only reported."""
    opts.setdefault("ptxas", False)
    return StitchedFunction(fn, pipeline.Options(**opts))


class StitchedFunction:
    def __init__(self, fn, options: pipeline.Options):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.options = options
        self._compiled: dict = {}  # input signature -> Compiled
        self._lock = threading.Lock()

    def reports(self) -> list[Report]:
        """One Report per input signature compiled so far."""
        with self._lock:
            return [compiled.report() for compiled in self._compiled.values()]

    def __call__(self, *args, **kwargs):
        key = _signature(args, kwargs)
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                compiled = self._compiled[key] = self.lower(*args, **kwargs).compile()
        return compiled(*args, **kwargs)

    def lower(self, *args, **kwargs) -> "Lowered":
        import jax

        # keep_unused: the rewritten module's parameters must be exactly the flattened inputs.
        lowered = jax.jit(self.fn, keep_unused=True).lower(*args, **kwargs)
        return Lowered(lowered, self.options, getattr(self.fn, "__name__", "fn"))


@dataclasses.dataclass
class Lowered:
    jax_lowered: object  # jax.stages.Lowered
    options: pipeline.Options
    name: str

    def as_text(self) -> str:
        return self.jax_lowered.as_text()

    def compile(self) -> "Compiled":
        xla_compiled = self.jax_lowered.compile()
        try:
            stitched, report = _stitch(self.jax_lowered, xla_compiled, self.options)
        except Exception as exc:  # never fail the user's job: XLA's executable runs
            reason = f"{type(exc).__name__}: {exc}"
            log.warning("fusionstitching: %s runs on XLA's own kernels: %s", self.name, reason)
            stitched, report = None, _fallback_report(self.name, self.options, reason)
        return Compiled(xla_compiled, stitched, report, self.name)


class Compiled:
    """Like ``jax.stages.Compiled``; runs XLA's executable with our custom calls, or XLA's own
    one when stitching fell back."""

    def __init__(self, xla_compiled, stitched, report: Report, name: str):
        self.xla_compiled = xla_compiled  # jax.stages.Compiled: XLA's own plan, the fallback
        self.stitched = stitched  # jax.stages.Compiled running the rewritten module, or None
        self._report = report
        self._name = name

    def as_text(self) -> str:
        """The HLO XLA executes (our kernels are ``fusionstitching...`` custom calls)."""
        return (self.stitched or self.xla_compiled).as_text()

    def report(self) -> Report:
        return self._report

    def __call__(self, *args, **kwargs):
        import jax

        if self.stitched is not None:
            try:
                return self.stitched(*args, **kwargs)
            except jax.errors.JaxRuntimeError as exc:  # XLA or one of our kernels failed
                reason = f"{type(exc).__name__}: {exc}"
                log.warning("fusionstitching: executing %s failed, XLA's own kernels take "
                            "over: %s", self._name, reason)
                self._report.fallbacks.append(Fallback("execute", [], reason))
                self.stitched = None
        return self.xla_compiled(*args, **kwargs)


def _stitch(jax_lowered, xla_compiled, options: pipeline.Options):
    """(jax Compiled running the rewritten module, or None when nothing was stitched; Report)."""
    from .codegen import compile_host
    from .hlo.parser import parse_module
    from .hlo.printer import print_module
    from .runtime import ffi, rewrite, xla

    t0 = time.perf_counter()
    module = parse_module(xla_compiled.as_text(), source="<jax>")
    parse_seconds = time.perf_counter() - t0
    _check_signature(module, xla_compiled)
    result = pipeline.stitch_module(module, options, parse_seconds=parse_seconds)
    report = result.report

    kernels, targets = [], []
    for kernel in result.kernels:
        try:
            host = kernel.host or compile_host(kernel.spec)
            targets.append(ffi.register_kernel(kernel.spec.name, host.address,
                                               len(kernel.spec.inputs),
                                               len(kernel.spec.outputs), owner=host))
            kernels.append(kernel)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            log.warning("fusionstitching: kernel %s left to XLA: %s", kernel.spec.name, reason)
            report.fallbacks.append(Fallback("host", list(kernel.pattern.nodes), reason))
            report.kernels = [k for k in report.kernels if k.name != kernel.spec.name]
    if not kernels:
        return None, report
    rewritten = rewrite.rewrite_module(module, kernels, targets)
    executable = xla.compile_hlo(print_module(rewritten))
    return xla.swap_executable(jax_lowered, xla_compiled, executable), report


def _check_signature(module, xla_compiled) -> None:
    """The rewritten module is run with the flattened inputs: jax must not have dropped or
    added parameters (unused inputs, hoisted constants)."""
    num_inputs = xla_compiled.in_tree.num_leaves
    num_params = len(module.entry.parameters)
    if num_params != num_inputs:
        raise ValueError(f"the module has {num_params} parameters for {num_inputs} inputs")


def _signature(args, kwargs):
    import jax
    from jax.api_util import shaped_abstractify

    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    return tree, tuple(shaped_abstractify(leaf) for leaf in leaves)


def _fallback_report(name: str, options: pipeline.Options, reason: str) -> Report:
    """The pass did not run to the end: no plan to count, only why."""
    empty = PlanSummary(kernels=0, mem_kernels=0, bytes=0, modeled_us=0.0)
    return Report(module=name, target=options.target, xla=empty,
                  fs=dataclasses.replace(empty, patterns=0), compulsory_bytes=0,
                  fallbacks=[Fallback("runtime", [], reason)])
