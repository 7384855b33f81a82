"""The key of a module's plan in the kernel cache: XLA's optimized HLO (without source
locations), the target, the explorer and the CPU-speed rules the plan's decisions follow.
The runtime's call path computes it (is a plan or a decision stored?) without the compiler.
"""
from __future__ import annotations

import dataclasses
import re

from costmodel.host import machine_identity

from ..hlo.xla_text import optimized_hlo_text
from ..options import Options
from . import cache as kernel_cache
from . import speed_rules
from .devices import gpu_device_of, target_for

_METADATA = re.compile(r", metadata=\{[^{}]*\}")
# a number not inside a name: n12 and f32 keep theirs, [64,30]{1,0} and 0.015625 not
_NUMBERS = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_NAME = re.compile(r"%[\w.\-]+")  # %fusion.12, %wrapped_reduce-window.3
_TOKEN = re.compile(r"%?[A-Za-z_][\w.\-]*")  # a name where declared, with or without %
_MODULE_NAME = re.compile(r"HloModule ([^\s,]+)")
_STACK_SECTIONS = re.compile(r"^(FileNames|FunctionNames|FileLocations|StackFrames)\n(.+\n)*",
                             re.MULTILINE)


def without_source_locations(hlo_text: str) -> str:
    """XLA's optimized HLO without op metadata and jax's stack-frame sections: they name the
    Python call site (file, line, caller), which changes with every edit of the script and
    differs between a script and its child processes, and they do not change the plan."""
    return _STACK_SECTIONS.sub("", _METADATA.sub("", hlo_text))


def plan_key_of_text(optimized: str, options: Options, measure: bool) -> str:
    return kernel_cache.fingerprint("plan", without_source_locations(optimized),
                                    options.target, options.explorer,
                                    *_cost_model(options),
                                    # the rule is part of the decisions the plan keeps
                                    f"measure={measure and speed_rules.SLOWER_ALONE}",
                                    f"alone={measure and speed_rules.FASTER_ALONE}")


def module_structure(module_text: str, options: Options) -> tuple[str, list[str]]:
    """The key of the patterns planned for a module, shared by the modules of its structure,
    and the module's names in the order the key numbers them. The key is its text with each
    name numbered in order of first appearance (XLA numbers instructions differently at other
    sizes) and every other number taken out (sizes, layouts, slice bounds, constants): the
    step of a partial last batch or of another sequence length finds the patterns of one
    planned before, kept as those numbers (``pipeline.GivenPatterns``). Equal keys are equal
    graphs; the code generator checks each pattern at the new sizes."""
    text = without_source_locations(module_text)
    declared = {m.group(0)[1:] for m in _NAME.finditer(text)}
    names: dict[str, int] = {}

    def numbered(match: re.Match) -> str:
        token = match.group(0)
        bare = token.lstrip("%")
        if bare not in declared:  # an opcode, a type, an attribute: kept as it is
            return token
        return token[:len(token) - len(bare)] + f"n{names.setdefault(bare, len(names))}"

    shape = _NUMBERS.sub("#", _TOKEN.sub(numbered, text))
    return (kernel_cache.fingerprint("patterns", shape, options.target, options.explorer,
                                     *_cost_model(options)), list(names))


def options_for(options: Options, device) -> Options:
    """``options`` for a function that runs on ``device`` (None: XLA:CPU): planned for the
    card it runs on, and with ``cost_model="auto"`` priced by the host CPU's model on XLA:CPU
    and by the card's latency-evaluator on a GPU."""
    if device is not None:
        options = dataclasses.replace(options, target=target_for(device))
    if options.cost_model == "auto":
        options = dataclasses.replace(options, cost_model="gpu" if device else "cpu")
    return options


def _cost_model(options: Options) -> tuple[str, ...]:
    """What of the cost model a plan depends on: its kind, and for the host model the
    machine (plans priced on one CPU are not taken on another from a shared cache)."""
    if options.cost_model != "cpu":
        return (options.cost_model,)
    return ("cpu", *machine_identity())


def plan_key_of(xla_compiled, options: Options, measure: bool) -> str:
    """The key ``build_stitched`` gives the plan of ``xla_compiled`` (without building)."""
    return plan_key_and_module(xla_compiled, options, measure)[0]


def plan_key_and_module(xla_compiled, options: Options, measure: bool) -> tuple[str, str]:
    """``plan_key_of``, and the name XLA gives the module (its Report's, once built)."""
    options = options_for(options, gpu_device_of(xla_compiled))
    optimized = optimized_hlo_text(xla_compiled)
    name = _MODULE_NAME.match(optimized)
    return (plan_key_of_text(optimized, options, measure), name.group(1) if name else "")


def open_cache(cache_dir: str | None, remote_cache: str | None):
    """(stats, cache) of one build or lookup."""
    stats = kernel_cache.CacheStats(cache_dir, kernel_cache.redacted(remote_cache)
                                    if remote_cache else None)
    return stats, kernel_cache.KernelCache(cache_dir, remote=remote_cache)


def plan_cached(xla_compiled, options: Options, cache_dir: str | None,
                remote_cache: str | None, measure: bool) -> bool:
    """Whether the plan of ``xla_compiled`` (and its kernels) is in the cache already."""
    stats, cache = open_cache(cache_dir, remote_cache)
    return cache.lookup(plan_key_of(xla_compiled, options, measure), stats) is not None
