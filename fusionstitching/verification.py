"""Verification: the stitched plan against XLA's plan on the same seeded random inputs.

The references are XLA itself (jaxlib runs the module's text) and the numpy evaluator; the
stitched plan runs its kernels' host builds and the evaluator for what is left to XLA. The
yardstick is XLA's own f32 distance from its f64 result, widened element by element to what
f32 executions with other roundings reach; a mismatch names the kernels that differ given
XLA's plan's values of their inputs.
"""
from __future__ import annotations

import dataclasses
import enum
import re

import networkx as nx
import numpy as np

from .hlo import gpu_library  # noqa: F401 - the evaluator runs XLA:GPU's library calls
from .hlo.elided import elided_constants, fill_elided
from .hlo.eval_collective import Replica, run_replicas
from .hlo.evaluator import UnsupportedOp, evaluate, evaluate_computation, evaluate_replicas
from .hlo.inputs import INPUT_KINDS, evaluation_bytes, evaluation_steps, random_inputs
from .hlo.inputs import random_array, seeded_inputs  # noqa: F401 - the runtime's trial
from .hlo.ir import Computation, Instruction, Module, Shape
from .hlo.parser import parse_module
from .hlo.verifier import module_problem
from .hlo.drift import (drift_elements, drift_problems, is_float_output, tolerance, widened_args,
                        widened_to_f64)
from .hlo.xla_runner import run_hlo_with_xla
from .report import Fallback, Verify

# The most memory one check may hold (hlo/inputs.evaluation_bytes): a larger module is "not
# run", with its size, instead of a worker the system kills.
VERIFY_MEMORY_BYTES = 6 << 30
# The most instructions one evaluation may run (hlo/inputs.evaluation_steps; ~10 us each): a
# loop of 10^5 trips is "not run" instead of a check that outlasts the replay's time limit.
VERIFY_STEPS = 2_000_000


def stitched_steps(module: Module, kernels: list):
    """The stitched plan in an order it can run: ``(instruction, None)`` for an entry
    instruction left to XLA, ``(None, kernel)`` for a stitched kernel; second, the kernels
    that wait on their own outputs through the rest of the module (a cycle: never ready)."""
    comp = module.entry
    by_name = comp.by_name()
    owner = {n: ("kernel", i) for i, k in enumerate(kernels) for n in k.pattern.nodes}

    def unit(name: str):
        """What computes an entry value: its kernel (also for a get-tuple-element of a
        kernel's multi-output node, which the kernel writes, or of such an element that is
        a tuple itself: an argmax's pair), else the instruction."""
        inst = by_name[name]
        if name not in owner and inst.opcode == "get-tuple-element":
            inner = unit(inst.operands[0])
            return inner if isinstance(inner, tuple) else name
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
    # A bitcast a kernel now reads inside (codegen/flatten.py) reads a value the kernel no
    # longer writes: dead, as the rewrite finds it.
    root = unit(comp.root.name)
    live = nx.ancestors(graph, root) | {root} if root in graph else set()
    graph.remove_nodes_from([u for u in list(graph) if isinstance(u, str) and u not in live
                             and by_name[u].opcode == "bitcast"])
    cyclic = {u for component in nx.strongly_connected_components(graph)
              if len(component) > 1 for u in component} | set(nx.nodes_with_selfloops(graph))
    stuck = [k for i, k in enumerate(kernels) if ("kernel", i) in cyclic]
    if stuck:
        return [], stuck
    return [(None, kernels[u[1]]) if isinstance(u, tuple) else (by_name[u], None)
            for u in nx.topological_sort(graph)], []


def execute_stitched(module: Module, kernels: list, args: list[np.ndarray],
                     replica: Replica | None = None):
    """Run the stitched plan: host kernels for stitched patterns, the evaluator for the rest
    (as the simulated device ``replica`` of a partitioned module)."""
    comp = module.entry
    shapes = {i.name: i.shape for i in comp.instructions}
    steps, stuck = stitched_steps(module, kernels)
    if stuck:
        raise RuntimeError(f"stitched plan cannot be scheduled: {[k.spec.name for k in stuck]} "
                           f"wait on their own outputs")
    values: dict[str, object] = dict(zip((p.name for p in comp.parameters), args))
    for inst, kernel in steps:
        if kernel is not None:
            outs = kernel.host(*[values[n] for n, _ in kernel.spec.inputs])
            values.update(zip((n for n, _ in kernel.spec.outputs), outs))
            values.update(_output_tuples(kernel.spec.outputs, values))
        else:
            values[inst.name] = evaluate_instruction(
                module, inst, [values[op] for op in inst.operands], shapes, replica)
    return values[comp.root.name]


def _output_tuples(outputs, values: dict) -> dict[str, tuple]:
    """A multi-output node a kernel writes element by element (``name#i``, as the root or a
    value read whole outside: codegen/flatten.py), as the tuple its name stands for."""
    elements: dict[str, dict[int, object]] = {}
    for name, _ in outputs:
        base, _, index = name.partition("#")
        if index:
            elements.setdefault(base, {})[int(index)] = values[name]
    return {base: tuple(parts[i] for i in range(len(parts))) for base, parts in elements.items()}


def evaluate_instruction(module: Module, inst: Instruction, operands: list,
                         shapes: dict[str, Shape], replica: Replica | None = None) -> object:
    """One instruction through the evaluator, as a computation of its own; ``shapes`` maps
    operand names to their shapes."""
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
    return evaluate_computation(scope, wrapper, [distinct[n] for n in names], replica=replica)


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
        if is_float_output(e.dtype):
            # a narrow float within two of its ulps (drift.tolerance) is as equal as f32's 1e-5
            floor = tolerance(e.dtype) if e.dtype.itemsize < 4 else 0.0
            rtol_e, atol_e = max(rtol, floor), max(atol, floor)
            wide = np.complex128 if e.dtype.kind == "c" else np.float64
            e64, a64 = e.astype(wide), a.astype(wide)
            # NaN matches NaN and an infinity itself; only finite pairs have an error (a NaN
            # or inf in the tolerance term would fail every comparison, even of equal arrays).
            exact = (e64 == a64) | (np.isnan(e64) & np.isnan(a64))
            finite = np.isfinite(e64) & np.isfinite(a64)
            # A NaN or infinity against a number is infinitely far (it reported 0 before).
            with np.errstate(invalid="ignore"):  # inf - inf where both are infinite
                diff = np.where(finite, np.abs(np.where(finite, e64 - a64, 0)),
                                np.where(exact, 0.0, np.inf))
            scale = np.where(finite, np.abs(e64), 0.0)
            if diff.size:
                max_abs = max(max_abs, float(diff.max()))
                max_rel = max(max_rel, float((diff / np.maximum(scale, 1e-30)).max()))
            ok &= bool((exact | (finite & (diff <= atol_e + rtol_e * scale))).all())
        else:
            ok &= bool(np.array_equal(e, a))
    return ok, max_abs, max_rel


def finite_fraction(value) -> float:
    """The fraction of the float elements of ``value`` that are finite (1.0 without floats)."""
    return _fraction(value, np.isfinite)


def compared_fraction(value) -> float:
    """The fraction of the float elements of ``value`` that are not NaN: a NaN equals any
    other NaN, so it compares nothing, where an infinity must have the same sign."""
    return _fraction(value, lambda leaf: ~np.isnan(leaf))


def _fraction(value, keep) -> float:
    floats = [leaf for leaf in _leaves(value) if is_float_output(leaf.dtype) and leaf.size]
    total = sum(leaf.size for leaf in floats)
    return sum(int(keep(leaf).sum()) for leaf in floats) / total if total else 1.0


VACUOUS_BELOW = 0.5  # a check where most outputs are NaN compares almost nothing


def verify(module: Module, kernels: list, notes: list[Fallback], seed: int = 0) -> Verify:
    """``verify_schedule`` of the GPU schedule emulated, then, where the kernels have CPU
    builds (``cpu_host``: what the runtime runs on a CPU, a schedule and code of its own),
    of those: the check holds only if both do."""
    outcome = verify_schedule(module, kernels, notes, seed)
    if outcome.ran:
        outcome.schedules = ["GPU (emulated)"]
    if not outcome.ran or not outcome.ok or not any(k.cpu_host for k in kernels):
        return outcome
    on_cpu = [dataclasses.replace(k, host=k.cpu_host) for k in kernels if k.cpu_host]
    cpu = verify_schedule(module, on_cpu + [k for k in kernels if not k.cpu_host], notes, seed)
    cpu.schedules = ["GPU (emulated)", "CPU"]
    if cpu.ran and not cpu.ok:
        _note_once(notes, "the CPU schedule's kernels (the runtime's on a CPU) differ where "
                          "the GPU schedule's agree")
    return cpu if not cpu.ok or cpu.vacuous else dataclasses.replace(
        outcome, schedules=cpu.schedules,
        max_abs_err=max(outcome.max_abs_err, cpu.max_abs_err),
        max_rel_err=max(outcome.max_rel_err, cpu.max_rel_err))


def verify_schedule(module: Module, kernels: list, notes: list[Fallback],
                    seed: int = 0) -> Verify:
    """Run XLA's plan and the stitched plan (``kernels``: pipeline.StitchedKernel with host
    builds) on the same random inputs and compare; notes about the check go to ``notes``.

    Elided constants get the same seeded values in both plans and in XLA's text. Inputs of
    each of INPUT_KINDS in turn until every output is finite (a mismatch on mostly finite
    outputs is a verdict at once); else the kind with the most finite outputs, and the check
    is vacuous when that is under half (an RMSprop step on normal inputs: the square root of
    a negative second moment made half of every update NaN, which compares nothing). Inputs
    on which rounding decides the outputs and no kernel check explains it give no verdict
    either: the next kind is tried, vacuous if none is left."""
    problem = module_problem(module, module.entry)
    if problem is not None:  # XLA's verifier refuses such a module: nothing runs it
        return Verify(ran=False, not_run=f"the module breaks a rule of HLO: {problem}")
    needs = evaluation_bytes(module)
    if needs > VERIFY_MEMORY_BYTES:
        return Verify(ran=False, not_run=f"the check would hold about {needs / 2**30:.1f} GiB "
                                         f"(limit {VERIFY_MEMORY_BYTES / 2**30:.0f} GiB)")
    steps = evaluation_steps(module)
    if steps > VERIFY_STEPS:
        return Verify(ran=False, not_run=f"the evaluator would run about {steps:.2g} "
                                         f"instructions (its loops' trips; limit "
                                         f"{VERIFY_STEPS:.0g})")
    if elided_constants(module):
        module = fill_elided(module, seed)
    best = chaotic = None
    for kind in INPUT_KINDS:
        outcome = _verify_on(module, kernels, notes, seed, kind)
        if outcome.vacuous:  # rounding decides these outputs
            chaotic = chaotic or outcome
            continue
        if not outcome.ran or outcome.error or outcome.finite == 1.0 or (
                not outcome.ok and outcome.compared >= VACUOUS_BELOW):
            return outcome
        if best is None or outcome.finite > best.finite:
            best = outcome
    if best is None:
        return chaotic
    if best.compared < VACUOUS_BELOW:
        best.ok, best.vacuous = False, True
    return best


def _verify_on(module: Module, kernels: list, notes: list[Fallback], seed: int,
               kind: str) -> Verify:
    """References: XLA itself running the module (where jaxlib can compile the text) and the
    numpy evaluator; the stitched plan must match every reference that ran, within 1e-5 or,
    failing that, be about as close to XLA's f64 result for the module as XLA's f32 is, or,
    element by element, as f32 executions with other roundings are (``rounding_decides``).
    A mismatch names the stitched kernels that differ given XLA's plan's inputs."""
    devices = device_count(module)
    if devices > 1:
        return _verify_on_devices(module, kernels, notes, seed, kind, devices)
    try:
        args = random_inputs(module, seed, kind)
        references = {"evaluator": evaluate(module, args)}
    except UnsupportedOp as exc:
        # The stitched plan runs its other ops through the evaluator too, so neither plan can
        # run here (e.g. collectives): say so instead of a verdict.
        return Verify(ran=False, not_run=f"this machine cannot execute the module: {exc}")
    text = str(module)
    try:
        references["xla"] = run_hlo_with_xla(text, args)
    except Exception as exc:  # noted, not fatal: the evaluator still checks
        _note_once(notes, f"XLA could not run the module as a reference: {_reason(exc)}")
    # Every reference must be mostly free of NaN: a NaN compares nothing.
    outcome = Verify(ran=True, ok=True, against=sorted(references), inputs=kind,
                     finite=min(map(finite_fraction, references.values())),
                     compared=min(map(compared_fraction, references.values())))
    try:
        stitched = execute_stitched(module, kernels, args)
    except Exception as exc:  # a defect of ours, reported as a failed check, never a crash
        outcome.ok, outcome.error = False, _reason(exc)
        return outcome
    _compare_into(outcome, [(ref, stitched) for ref in references.values()])
    if outcome.ok:
        return outcome
    exact = None
    if "xla" in references:
        # A whole step amplifies f32 rounding far past 1e-5, so two correct f32 executions
        # differ by more: then the yardstick is XLA's own distance from its f64 result
        # (xla_runner.DRIFT_FACTOR, measured on the model-zoo workloads).
        try:
            exact = _leaves(run_hlo_with_xla(widened_to_f64(text), widened_args(args)))
        except Exception as exc:  # the 1e-5 verdict stands
            _note_once(notes, f"XLA could not run the module in f64: {_reason(exc)}")
    if exact is not None:
        drift, detail = drift_verdict(module, args, _leaves(stitched), _leaves(references["xla"]),
                                      exact, _leaves(references["evaluator"]))
        if drift in (Drift.WITHIN_XLAS, Drift.WITHIN_ROUNDING):
            outcome.ok, outcome.rounding_decides = True, detail
            return outcome
        if drift is Drift.ROUNDING_DECIDES_THE_STEP:
            outcome.vacuous = True
            _note_once(notes, f"on {kind} inputs {detail}: no verdict")
            return outcome
    # A mismatch: which stitched kernels differ given XLA's plan's values of their inputs.
    wrong = kernel_mismatches(module, kernels, args)
    if wrong:
        _note_once(notes, f"on {kind} inputs, given XLA's plan's values of their inputs: "
                          f"{'; '.join(wrong[:3])}" + (f" (and {len(wrong) - 3} more)"
                                                       if len(wrong) > 3 else ""))
    return outcome


def _compare_into(outcome: Verify, pairs) -> None:
    """``compare`` each (reference, stitched) pair: ``outcome`` holds every verdict and the
    largest errors."""
    for ref, ours in pairs:
        ok, max_abs, max_rel = compare(ref, ours)
        outcome.ok &= ok
        outcome.max_abs_err = max(outcome.max_abs_err, max_abs)
        outcome.max_rel_err = max(outcome.max_rel_err, max_rel)


def device_count(module: Module) -> int:
    """How many devices run the module: its partitions (SPMD) times its replicas."""
    count = 1
    for key in ("num_partitions", "replica_count"):
        match = re.search(rf"\b{key}=(\d+)", module.header_attrs)
        count *= int(match.group(1)) if match else 1
    return count


def _verify_on_devices(module: Module, kernels: list, notes: list[Fallback], seed: int,
                       kind: str, devices: int) -> Verify:
    """``_verify_on`` for a partitioned module: every device simulated, collectives between
    them (hlo/eval_collective.py), each with inputs of its own. The reference is the
    evaluator running XLA's plan (XLA cannot run one device's program alone); beyond 1e-5,
    the stitched plan must be about as close to the module's f64 result, simulated the same
    way, as the evaluator's f32 is."""
    args = [random_inputs(module, seed + device, kind) for device in range(devices)]
    try:
        reference = evaluate_replicas(module, args)
    except UnsupportedOp as exc:
        return Verify(ran=False, not_run=f"this machine cannot execute the module: {exc}")
    outcome = Verify(ran=True, ok=True, against=[f"evaluator ({devices} devices simulated)"],
                     inputs=kind, finite=min(map(finite_fraction, reference)),
                     compared=min(map(compared_fraction, reference)))
    try:
        stitched = run_replicas(devices, lambda replica: execute_stitched(
            module, kernels, args[replica.index], replica))
    except Exception as exc:  # a defect of ours, reported as a failed check, never a crash
        outcome.ok, outcome.error = False, _reason(exc)
        return outcome
    _compare_into(outcome, zip(reference, stitched))
    if outcome.ok:
        return outcome
    try:
        wide = parse_module(widened_to_f64(str(module)))
        exact = evaluate_replicas(wide, [widened_args(device) for device in args])
    except Exception as exc:  # the 1e-5 verdict stands
        _note_once(notes, f"no f64 result of the simulated devices: {_reason(exc)}")
        return outcome
    problems = [p for ref, ours, ex in zip(reference, stitched, exact)
                for p in drift_problems(_leaves(ours), _leaves(ref), _leaves(ex))]
    if not problems:
        outcome.ok = True
        outcome.rounding_decides = "as close to the f64 result as the evaluator's f32"
    else:
        _note_once(notes, f"on {kind} inputs, simulated devices: {'; '.join(problems[:3])}")
    return outcome


class Drift(enum.Enum):
    """Where a whole step's f32 result stands against XLA's f64 result (drift_verdict)."""
    WITHIN_XLAS = "as close as XLA's own f32 result"
    WITHIN_ROUNDING = "farther in elements where f32 executions with other roundings land too"
    ROUNDING_DECIDES_THE_STEP = "rounding decides too much of the step for a verdict"
    BEYOND = "farther than f32 rounding reaches"


ROUNDING_RUNS = 8  # evaluations with rounding noise; an element f32 rounding decides
# (a sign of noise) lands on either side in about half of them
ROUNDING_DECIDES_AT_MOST = 0.01  # of the float output elements, for a verdict to mean much


def drift_verdict(module: Module, args: list, ours: list, xla: list, exact: list,
                  evaluator: list | None = None) -> tuple[Drift, str]:
    """``ours`` (output leaves) against ``exact`` (XLA's f64 result): first XLA's own f32
    distance (``xla``), then, element by element, how far f32 executions with other roundings
    land (``rounding_reach``: Adam's first step is sign(g), and a gradient that is rounding
    noise flips a whole update). With the detail: the outputs beyond XLA's own distance.
    ``evaluator`` (its result, when there is one) beyond XLA's own distance too, or too many
    elements rounding decides, leave no verdict."""
    beyond_xla = drift_problems(ours, xla, exact)
    if not beyond_xla:
        return Drift.WITHIN_XLAS, ""
    if evaluator is not None and drift_problems(evaluator, xla, exact):
        # The evaluator (f64 accumulation, no stitched kernel) misses XLA's yardstick too: on
        # these inputs rounding decides the step (a Keras MobileNetV3 step on normal inputs:
        # XLA's own f32 15% off its f64 result); other inputs give a sharper check.
        return (Drift.ROUNDING_DECIDES_THE_STEP,
                "the evaluator is beyond XLA's own f32 distance from its f64 result too")
    detail = "; ".join(beyond_xla)
    try:
        reach = rounding_reach(module, args, exact)
    except UnsupportedOp:
        return Drift.BEYOND, detail
    if drift_problems(ours, xla, exact, spread=reach):
        return Drift.BEYOND, detail
    if drift_elements(ours, xla, exact) > ROUNDING_DECIDES_AT_MOST * _float_elements(exact):
        return Drift.ROUNDING_DECIDES_THE_STEP, "rounding decides more than 1% of the outputs"
    return Drift.WITHIN_ROUNDING, detail


def rounding_reach(module: Module, args: list, exact: list, runs: int = ROUNDING_RUNS) -> list:
    """Per output and element, the farthest from ``exact`` (XLA's f64 result) that ``runs``
    evaluations with rounding noise land: what other correct f32 executions could give."""
    rng = np.random.default_rng(0)
    reach = [np.zeros(np.shape(x)) for x in exact]
    for _ in range(runs):
        for far, run, x in zip(reach, _leaves(evaluate(module, args, rounding_noise=rng)), exact):
            if is_float_output(run.dtype) and run.dtype.kind != "c":
                np.fmax(far, np.abs(run.astype(np.float64) - x), out=far)
    return reach


def _float_elements(values: list) -> int:
    return sum(v.size for v in values if is_float_output(v.dtype))


def reference_values(module: Module, args: list) -> dict[str, object]:
    """Every entry value of XLA's plan on ``args``, one instruction at a time (the evaluator)."""
    comp = module.entry
    shapes = {i.name: i.shape for i in comp.instructions}
    values: dict[str, object] = dict(zip((p.name for p in comp.parameters), args))
    for inst in comp.instructions:
        if inst.opcode != "parameter":
            values[inst.name] = evaluate_instruction(
                module, inst, [values[op] for op in inst.operands], shapes)
    return values


def kernel_mismatches(module: Module, kernels: list, args: list) -> list[str]:
    """The stitched kernels whose outputs differ (beyond 1e-5) from XLA's plan's values when
    given XLA's plan's values of their inputs, each with its error; empty when none does."""
    values = reference_values(module, args)
    wrong = []
    for kernel in kernels:
        outs = kernel.host(*[values[n] for n, _ in kernel.spec.inputs])
        ok, max_abs, max_rel = compare([_value_of(values, n) for n, _ in kernel.spec.outputs],
                                       list(outs))
        if not ok:
            wrong.append(f"{kernel.spec.name} differs (max abs err {max_abs:.3g}, max rel "
                         f"err {max_rel:.3g})")
    return wrong


def _value_of(values: dict, name: str):
    """An entry value by name, ``name#i`` being element i of a multi-output node."""
    base, _, index = name.partition("#")
    return values[base][int(index)] if index else values[name]


def _note_once(notes: list[Fallback], reason: str) -> None:
    """A verification note, once however many kinds of inputs were tried."""
    note = Fallback("verify", [], reason)
    if note not in notes:
        notes.append(note)


def _reason(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"
