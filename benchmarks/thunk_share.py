"""How much of XLA:CPU's step time is in memory-intensive kernels, from a jax.profiler trace
(a step is called memory-bound when that is more than half).

XLA:CPU traces each thunk it runs as an event named after its instruction. Container thunks
(while, call, conditional) are left out: their bodies' thunks are events of their own. A
thunk is memory-intensive when the op graph's class of its instruction is
(graph.opgraph.classify_instruction: a fusion takes its heaviest op's class, so XLA's library
fusion of a dot is compute and its fusion of a lone reduction is not). Tracing adds a few us
to every thunk, so the share leans towards the side with more thunks: it ranks steps, it is
not a time.
"""
from __future__ import annotations

import glob
import tempfile

import jax
from jax.profiler import ProfileData

from fusionstitching.graph.opgraph import classify_instruction
from fusionstitching.hlo.parser import parse_module
from fusionstitching.hlo.xla_runner import optimized_hlo_text

CONTAINER_OPCODES = {"while", "call", "conditional"}


def instruction_kinds(hlo_text: str) -> dict[str, str]:
    """Instruction name -> "compute", "memory" or "container", over every computation."""
    module = parse_module(hlo_text, "<xla:cpu>")
    fused_classes: dict = {}
    kinds = {}
    for computation in module.computations:
        for inst in computation.instructions:
            if inst.opcode in CONTAINER_OPCODES:
                kinds[inst.name] = "container"
            elif classify_instruction(inst, module, fused_classes).memory_intensive:
                kinds[inst.name] = "memory"
            else:
                kinds[inst.name] = "compute"
    return kinds


def share_of_events(events, kinds: dict[str, str]) -> float | None:
    """Memory-intensive share of the summed durations of ``events`` ((name, duration) pairs)
    that are thunks of the module ``kinds`` describes; None when no event is."""
    totals = {"compute": 0.0, "memory": 0.0}
    for name, duration in events:
        kind = kinds.get(name)
        if kind in totals:
            totals[kind] += duration
    spent = totals["compute"] + totals["memory"]
    return totals["memory"] / spent if spent else None


def memory_share(jitted, args, calls: int = 50) -> float | None:
    """The memory-intensive share of the thunk time of ``calls`` calls of ``jitted`` (a
    ``jax.jit`` function) on ``args``."""
    kinds = instruction_kinds(optimized_hlo_text(jitted.lower(*args).compile()))
    jax.block_until_ready(jitted(*args))
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        try:
            for _ in range(calls):
                jax.block_until_ready(jitted(*args))
        finally:
            jax.profiler.stop_trace()
        (path,) = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
        profile = ProfileData.from_file(path)
    return share_of_events(((event.name, event.duration_ns) for plane in profile.planes
                            for line in plane.lines for event in line.events), kinds)
