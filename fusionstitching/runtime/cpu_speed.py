"""No stitched kernel clearly slower than XLA's on this CPU: each host kernel is timed against
XLA:CPU running the same instructions alone, and left to XLA when more than SLOWER_ALONE
slower (closer, the trial of the whole step decides).

The plan is chosen by a cost model (the host CPU's, costmodel/host.py, by default) that cannot
tell every kernel XLA:CPU runs well from one it runs slowly: the pattern's CPU schedule may be
slower than XLA's own code (a column reduction read with a stride of a row, say).
XLA's side is the pattern as a module of its own (its instructions, their computations, its
inputs as parameters, its outputs as the result); ours is a module of one custom call to the
registered kernel, as the stitched executable calls it (its parts on XLA's thread pool).
Both are compiled by XLA:CPU and run on the same seeded inputs; each side is the median of
repeated calls.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from ..hlo.ir import Computation, Instruction, Module, Shape, print_module
from ..hlo.xla_runner import prepared_for_xla_cpu
from ..hlo.inputs import seeded_inputs
from .rewrite import custom_call, output_name
from .speed_rules import FASTER_ALONE, SLOWER_ALONE  # noqa: F401 - build.py reads them here

# Timed calls per side, after WARMUP: MIN_CALLS, then more up to CALLS while under BUDGET_S
# (per side, on average).
WARMUP = 5
MIN_CALLS = 5
CALLS = 31
BUDGET_S = 0.25


def pattern_module(module: Module, spec) -> str:
    """HLO text of the pattern alone: ``spec.inputs`` as parameters, its entry instructions
    (and the entry constants they read), the tuple of ``spec.outputs`` as the root."""
    entry = module.entry
    by_name = entry.by_name()
    inputs = {name for name, _ in spec.inputs}
    nodes = set(spec.nodes)
    body = [Instruction(name, shape, "parameter", parameter_number=i)
            for i, (name, shape) in enumerate(spec.inputs)]
    wanted = set(nodes)
    for inst in entry.instructions:  # their get-tuple-elements and the constants they read
        if inst.opcode == "get-tuple-element" and inst.operands[0] in nodes:
            wanted.add(inst.name)
    for name in list(wanted):
        wanted.update(o for o in by_name[name].operands
                      if by_name[o].opcode == "constant" and o not in inputs)
    # without control predecessors: they order the whole module's buffers (copies of
    # donated parameters) and may name instructions outside the pattern
    body += [Instruction(i.name, i.shape, i.opcode, list(i.operands), dict(i.attrs),
                         literal=i.literal, operand_shapes=i.operand_shapes
                         ).without_control_predecessors(i.control_predecessors)
             for i in entry.instructions if i.name in wanted and i.name not in inputs]
    results = []
    for name, shape in spec.outputs:
        if "#" in name:  # an element of a multi-output node
            node, index = name.split("#")
            results.append(Instruction(f"{node}.element{index}", shape, "get-tuple-element",
                                       [node], {"index": index}))
            body.append(results[-1])
        else:
            results.append(by_name[name])
    body = _with_root(body, results, "pattern.result", spec)
    called = module.called_by(body)
    computations = [c for c in module.computations if c.name in called]
    # the debug-info sections too: the instructions' metadata points into them
    sub = Module(f"{module.name}.pattern", computations +
                 [Computation("pattern", body, is_entry=True)],
                 header_attrs=donation_header(spec), sections=module.sections)
    return print_module(sub)


def call_module(spec, target: str) -> str:
    """HLO text of one call of the kernel registered as ``target``: ``spec.inputs`` as
    parameters, the tuple of ``spec.outputs`` as the root."""
    body = [Instruction(name, shape, "parameter", parameter_number=i)
            for i, (name, shape) in enumerate(spec.inputs)]
    body += custom_call(spec, target)
    by_name = {i.name: i for i in body}
    results = [by_name[output_name(name)] for name, _ in spec.outputs]
    body = _with_root(body, results, "call.result", spec)
    return print_module(Module(f"{spec.name}.call", [Computation("call", body, is_entry=True)],
                               header_attrs=donation_header(spec)))


def in_place_inputs(spec) -> list[int]:
    """The inputs the host kernel writes an output over (``Kernel.in_place``)."""
    host = getattr(spec, "host_kernel", None)
    return [source for source, _ in host.in_place] if host is not None else []


def donation_header(spec) -> str:
    """The ``input_output_alias`` of both modules `compare` runs: each input the kernel
    writes over is donated to its output, as the job's module donates it, so that XLA's
    fusion writes in place too. Without it, XLA copied the parameter before our call and
    not before its own fusion (keras_encoder's Adam kernel: 53.6 -> 87.3 us alone)."""
    host = getattr(spec, "host_kernel", None)
    if host is None or not host.in_place:
        return ""
    n = len(spec.inputs)
    index = (lambda out: "{}") if len(spec.outputs) == 1 else (lambda out: f"{{{out}}}")
    return "input_output_alias={ " + ", ".join(
        f"{index(output - n)}: ({source}, {{}}, may-alias)"
        for source, output in host.in_place) + " }"


def _with_root(body: list[Instruction], results: list[Instruction], name: str, spec
               ) -> list[Instruction]:
    """``body`` returning ``results``: their tuple, or the one result itself where an input
    is donated to it (an alias names a whole result as ``{}``, not element ``{0}``)."""
    if len(results) == 1 and in_place_inputs(spec):
        return [dataclasses.replace(i, is_root=True) if i is results[0] else i for i in body]
    root_shape = Shape("tuple", tuple_shapes=tuple(r.shape for r in results))
    return body + [Instruction(name, root_shape, "tuple", [r.name for r in results],
                               is_root=True)]


def median_us(*calls, fresh=None) -> list[float]:
    """Median us of each of ``calls``, timed alternately (a change of the machine's load then
    falls on every side alike): up to CALLS rounds, at least MIN_CALLS, then until BUDGET_S is
    spent, after WARMUP rounds. ``fresh[i]()``, if given, makes the argument of call i before
    its clock starts (copies of what it donates); otherwise the calls take none."""
    calls = calls if fresh else tuple(lambda _, call=call: call() for call in calls)
    fresh = fresh or [lambda: None] * len(calls)
    for _ in range(WARMUP):
        for call, make in zip(calls, fresh):
            call(make())
    times: list[list[float]] = [[] for _ in calls]
    while len(times[0]) < MIN_CALLS or (len(times[0]) < CALLS
                                         and sum(map(sum, times)) < BUDGET_S * len(calls)):
        for call, make, kept in zip(calls, fresh, times):
            argument = make()
            started = time.perf_counter()
            call(argument)
            kept.append(time.perf_counter() - started)
    return [float(np.median(t)) * 1e6 for t in times]


def slower_alone(host_us: float, xla_us: float) -> bool:
    """Whether a kernel timed alone at ``host_us`` against XLA's ``xla_us`` is left to XLA."""
    return host_us > SLOWER_ALONE * xla_us


def faster_alone(host_us: float, xla_us: float) -> bool:
    """Whether a kernel of ours replaces an XLA kernel the plan left alone."""
    return host_us * FASTER_ALONE <= xla_us


def compare(module: Module, spec, target: str) -> tuple[float, float]:
    """(stitched kernel us, XLA:CPU us) for the pattern of ``spec`` (registered as FFI target
    ``target``), each a module XLA:CPU runs on the same seeded inputs."""
    inputs = seeded_inputs([shape for _, shape in spec.inputs])
    donated = in_place_inputs(spec)
    sides, fresh = [], []
    for text in (call_module(spec, target), pattern_module(module, spec)):
        # XLA's side as hlo.xla_runner runs a module: fusions as calls, XLA re-fuses them
        executable, buffers = prepared_for_xla_cpu(text, inputs)
        sides.append(lambda arguments, executable=executable: [
            out.block_until_ready() for out in executable.execute(arguments)])
        fresh.append(lambda buffers=buffers: _donated_copies(buffers, donated))
    host_us, xla_us = median_us(*sides, fresh=fresh)  # the kernel's module first
    return host_us, xla_us


def _donated_copies(buffers: list, donated: list[int]) -> list:
    """``buffers`` with copies of those a call donates (it deletes them)."""
    if not donated:
        return buffers
    import jax  # as runtime/xla.py: jax is imported only once a build runs

    copies = dict(zip(donated, jax.block_until_ready(  # done before the clock starts
        jax.device_put([buffers[i] for i in donated], may_alias=False))))
    return [copies.get(i, b) for i, b in enumerate(buffers)]
