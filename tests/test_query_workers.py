"""Capability queries in worker processes: the same answers, plan and PTX as in the
planning process, whatever order the explorer's patterns are built in; planning that goes on
in its own process when a worker dies; workers started by the runtime inside a JAX process."""
import collections
import os

import jax
import numpy as np
import pytest

from costmodel import load_device
from fusionstitching import capability, codegen, pipeline
from fusionstitching.capability import PlanRefusal
from fusionstitching.codegen.errors import Refusal as CodegenRefusal
from fusionstitching.codegen.schedules import emitter
from fusionstitching.explorer import explore
from fusionstitching.graph import build_graph
from fusionstitching.graph.refusal import Refusal
from fusionstitching.hlo.parser import parse_file, parse_module
from fusionstitching.pipeline import Options, stitch_module
from fusionstitching.query_workers import QueryWorkers
from fusionstitching.stitched_jit import jit
from helpers import args, layernorm

HLO = os.path.join(os.path.dirname(__file__), "data", "hlo")
H100 = load_device("h100")
# 27 memory-intensive kernels, planned in about a second: accepted and refused patterns
FILE = os.path.join(HLO, "bert_infer_small_jax_cpu.hlo.gz")


def plan_of(result):
    """What a plan is made of: its patterns, each kernel's IR and the Report's totals."""
    return ([k.pattern.nodes for k in result.kernels], [str(k.spec.kernel) for k in result.kernels],
            result.report.fs, [(d.nodes, d.kind, d.reason) for d in result.plan.decisions])


def asked_patterns(graph):
    """Every pattern the explorer asks the code generator about, in order, with its answer."""
    asked = []

    def can_stitch(nodes):
        answer = capability.ask(graph, nodes, H100, "h100", False, {})
        asked.append((tuple(nodes), answer))
        return answer if isinstance(answer, Refusal) else None

    explore(graph, can_stitch, "beam", H100)
    return asked


@pytest.mark.parametrize("file", [FILE, os.path.join(HLO, "dien_infer_small_tf_h100.hlo")])
def test_workers_answer_as_the_planning_process_does(file):
    """Each answer from a worker, asked ahead in reverse order, equals the in-process one:
    the same refusal, or the same kernel at the same modeled time."""
    graph = build_graph(parse_file(file))
    asked = asked_patterns(graph)
    assert any(not isinstance(a, Refusal) for _, a in asked)
    if "dien" in file:  # a refused pattern among them
        assert any(isinstance(a, Refusal) for _, a in asked)
    chosen = {}
    workers = QueryWorkers(graph.module, "h100", False, chosen, count=2)
    try:
        workers.ahead([nodes for nodes, _ in asked][::-1], next_up=False)
        for nodes, expected in asked:
            answer, _ = workers.answer(nodes)  # and its work
            if isinstance(expected, Refusal):
                assert answer == expected
            else:
                assert (str(answer.kernel), answer.modeled_us, answer.schedule) == \
                       (str(expected.kernel), expected.modeled_us, expected.schedule)
    finally:
        workers.close()
    assert chosen  # the schedules the workers chose are kept by the planning process


def test_a_plan_with_query_workers_is_the_plan_without():
    module = parse_file(FILE)
    alone = stitch_module(module, Options(target="h100", ptxas=False, workers=0))
    with_workers = stitch_module(module, Options(target="h100", ptxas=False, workers=2))
    assert plan_of(with_workers) == plan_of(alone)
    assert len(alone.kernels) > 1
    assert not [n for n in with_workers.plan.notes if "query workers" in n]


def test_looking_ahead_decides_nothing():
    """The explorer names patterns ahead (its next vertices' candidates, the connected-region
    plan's regions) without deciding on them: its decisions and plan are those of a run that
    does not look ahead."""
    graph = build_graph(parse_file(FILE))
    named = []

    def can_stitch(nodes):
        answer = capability.ask(graph, nodes, H100, "h100", False, {})
        return answer if isinstance(answer, Refusal) else None

    looking = explore(graph, can_stitch, "beam", H100,
                      ask_ahead=lambda patterns, next_up: named.append((patterns, next_up)))
    plain = explore(graph, can_stitch, "beam", H100)
    assert [p.nodes for p in looking.patterns] == [p.nodes for p in plain.patterns]
    assert looking.decisions == plain.decisions
    assert any(next_up and patterns for patterns, next_up in named)
    assert any(not next_up and patterns for patterns, next_up in named)


def test_the_plans_kernels_assemble_in_the_workers_as_here():
    """With workers, the plan's kernels go through LLVM and ptxas in them: the same PTX
    (and cubin, where ptxas is installed) as assembled in this process."""
    module = parse_file(FILE)
    assembled = [[(k.spec.name, k.nvptx.ptx, k.nvptx.cubin, k.nvptx.spills)
                  for k in stitch_module(module, Options(target="h100", workers=w)).kernels]
                 for w in (0, 2)]
    assert assembled[0] == assembled[1]
    assert len(assembled[0]) > 1 and all(ptx for _, ptx, _, _ in assembled[0])


class DyingWorkers(QueryWorkers):
    """Query workers that are killed after the first answer."""

    def answer(self, nodes):
        answer = super().answer(nodes)
        for proc in self._procs:
            proc.kill()
        return answer


def test_planning_goes_on_in_process_when_a_worker_dies(monkeypatch):
    module = parse_file(FILE)
    alone = stitch_module(module, Options(target="h100", ptxas=False, workers=0))
    monkeypatch.setattr(pipeline, "QueryWorkers", DyingWorkers)
    result = stitch_module(module, Options(target="h100", ptxas=False, workers=2))
    assert plan_of(result)[:3] == plan_of(alone)[:3]
    (note,) = [n for n in result.plan.notes if "query workers" in n]
    assert "the rest was planned in this process" in note


class CountedWorkers(QueryWorkers):
    started = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        CountedWorkers.started += 1


def test_a_jit_step_plans_with_query_workers_inside_a_jax_process(monkeypatch):
    """The runtime plans in the user's process, where JAX has threads: its query workers are
    fresh interpreters, and the stitched step gives XLA's numbers."""
    monkeypatch.setattr(pipeline, "MIN_KERNELS", 0)  # workers even for this small step
    monkeypatch.setattr(pipeline, "worker_count", lambda: 2)
    monkeypatch.setattr(pipeline, "QueryWorkers", CountedWorkers)
    CountedWorkers.started = 0
    x, g, b = args()
    stitched = jit(layernorm, cache_dir=None, keep="stitched")
    got = stitched(x, g, b)
    (report,) = stitched.reports()
    assert CountedWorkers.started == 1
    assert report.fs.patterns >= 1 and not report.fallbacks
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(layernorm)(x, g, b)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("workers", [None, 0])
def test_a_small_module_plans_in_its_own_process(monkeypatch, workers):
    """Below MIN_KERNELS memory-intensive kernels (or with ``workers=0``) no worker starts:
    starting one would cost about as long as the planning."""
    def no_workers(*args, **kwargs):
        raise AssertionError("a query worker was started")

    monkeypatch.setattr(pipeline, "QueryWorkers", no_workers)
    result = stitch_module(parse_file(FILE), Options(target="h100", ptxas=False,
                                                     workers=workers))
    assert result.kernels


@pytest.mark.parametrize("workers", [0, 2])
def test_planning_stops_asking_when_its_budget_is_spent(monkeypatch, workers):
    """The code generator's work a plan asks for is bounded by the module's size: once the
    values computed for its queries pass the budget, the remaining patterns are refused
    unasked, with their kind, and the plan says so (a log-depth scan's gradient planned for
    minutes). The workers' answers carry their work as the planning process's do."""
    module = parse_file(FILE)
    unbounded = stitch_module(module, Options(target="h100", ptxas=False, workers=workers))
    assert not [n for n in unbounded.plan.notes if "planning stopped" in n]
    monkeypatch.setattr(pipeline, "MIN_PLANNING_VALUES", 2_000)
    monkeypatch.setattr(pipeline, "PLANNING_VALUES_PER_KERNEL", 0)
    asked_alone = []
    monkeypatch.setattr(pipeline.codegen, "can_stitch",
                        lambda module, nodes, device: asked_alone.append(nodes))
    bounded = stitch_module(module, Options(target="h100", ptxas=False, workers=workers,
                                            verify=True))
    (note,) = [n for n in bounded.plan.notes if "planning stopped" in n]
    assert "budget 2,000" in note
    unasked = [d for d in bounded.plan.decisions if d.kind is PlanRefusal.PLANNING_BUDGET]
    assert unasked and "left to XLA unasked" in unasked[0].reason
    assert len(bounded.plan.decisions) < len(unbounded.plan.decisions) or \
        len(bounded.kernels) < len(unbounded.kernels)
    assert bounded.report.verify.ok and bounded.report.verify.ran
    # the Report says why those kernels stayed XLA's without asking the code generator again
    (budget,) = [g for g in bounded.report.left_to_xla if "budget" in g.reason]
    assert not [n for n in budget.nodes if [n] in asked_alone]


def test_a_pattern_holding_a_too_large_one_is_refused_unasked(monkeypatch):
    """A pattern whose expression was too large makes every pattern holding it too large
    without asking the code generator again (a scan's gradient grown one kernel at a time)."""
    monkeypatch.setattr(emitter, "MAX_VALUES", 60)
    asked = []
    ask_counted = capability.ask_counted

    def recording(graph, nodes, *rest):
        answer, work = ask_counted(graph, nodes, *rest)
        asked.append((frozenset(nodes), getattr(answer, "kind", None)))
        return answer, work

    monkeypatch.setattr(pipeline.capability, "ask_counted", recording)
    result = stitch_module(parse_file(FILE), Options(target="h100", ptxas=False, workers=0,
                                                     verify=True))
    too_large = []
    for nodes, kind in asked:  # never asked about a pattern holding one found too large
        assert not [t for t in too_large if t < nodes]
        if kind is CodegenRefusal.EXPRESSION_TOO_LARGE:
            too_large.append(nodes)
    assert too_large, collections.Counter(kind for _, kind in asked)
    inherited = [d for d in result.plan.decisions if "whose expression was too large" in d.reason]
    assert inherited and all(d.kind is CodegenRefusal.EXPRESSION_TOO_LARGE for d in inherited)
    assert result.report.verify.ok


# A running sum over windows of 32 (straight-line code): 32 positions combined per value.
WINDOWS = """HloModule windows

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

%fused_window (p0: f32[1024]) -> f32[1024] {
  %p0 = f32[1024]{0} parameter(0)
  %zero = f32[] constant(0)
  ROOT %rw = f32[1024]{0} reduce-window(f32[1024]{0} %p0, f32[] %zero), window={size=32 pad=31_0}, to_apply=%add
}

%fused_square (p0: f32[1024]) -> f32[1024] {
  %p0 = f32[1024]{0} parameter(0)
  ROOT %m = f32[1024]{0} multiply(f32[1024]{0} %p0, f32[1024]{0} %p0)
}

ENTRY %main (x: f32[1024]) -> f32[1024] {
  %x = f32[1024]{0} parameter(0)
  %w = f32[1024]{0} fusion(f32[1024]{0} %x), kind=kLoop, calls=%fused_window
  ROOT %sq = f32[1024]{0} fusion(f32[1024]{0} %w), kind=kLoop, calls=%fused_square
}
"""


def test_a_querys_work_is_the_statements_it_placed_where_those_are_more():
    """The planning budget bounds pricing too: a query whose kernels place more statements
    than they compute values (a gradient of cummin placed 11.5 per value, and planned for 54 s
    under a budget of values) counts the statements."""
    graph = build_graph(parse_module(WINDOWS, "windows"))
    values, statements = codegen.values_built(), codegen.statements_placed()
    answer, work = capability.ask_counted(graph, ["w", "sq"], H100, "h100", False, {})
    placed = codegen.statements_placed() - statements
    assert not isinstance(answer, Refusal), answer
    assert placed > 4 * (codegen.values_built() - values)
    assert work == placed
