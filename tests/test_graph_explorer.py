"""Op graph classes, traffic accounting and the baseline plan on small HLO snippets."""
import enum
from pathlib import Path

from fusionstitching.explorer import Decision, KernelDag, connected_region_plan
from fusionstitching.graph import OpClass, build_graph
from fusionstitching.graph.refusal import Refusal
from fusionstitching.graph.traffic import (acyclic_lower_bound_bytes, memory_intensive_regions,
                                          pattern_traffic, plan_bytes)
from fusionstitching.hlo.parser import parse_file, parse_module
from fusionstitching.pipeline import Options, stitch_module
from helpers import FUSED_SLICE, INTERLOCKED, kernels_form_a_cycle

DATA = Path(__file__).parent / "data" / "hlo"

# XLA:CPU's LayerNorm plan shape, reduced: reduce -> subtract -> reduce -> rsqrt -> output.
LAYERNORM = """
HloModule ln

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%f_sum (p0: f32[8,16], p1: f32[]) -> f32[8] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[] parameter(1)
  ROOT %r = f32[8]{0} reduce(%p0, %p1), dimensions={1}, to_apply=%add
}

%f_center (p0: f32[8,16], p1: f32[8]) -> f32[8,16] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[8]{0} parameter(1)
  %b = f32[8,16]{1,0} broadcast(%p1), dimensions={0}
  ROOT %d = f32[8,16]{1,0} subtract(%p0, %b)
}

%f_sq (p0: f32[8,16], p1: f32[]) -> f32[8] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[] parameter(1)
  %m = f32[8,16]{1,0} multiply(%p0, %p0)
  ROOT %r = f32[8]{0} reduce(%m, %p1), dimensions={1}, to_apply=%add
}

%f_rsqrt (p0: f32[8]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  ROOT %r = f32[8]{0} rsqrt(%p0)
}

%f_out (p0: f32[8,16], p1: f32[8]) -> f32[8,16] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[8]{0} parameter(1)
  %b = f32[8,16]{1,0} broadcast(%p1), dimensions={0}
  ROOT %m = f32[8,16]{1,0} multiply(%p0, %b)
}

ENTRY %main (x: f32[8,16], w: f32[16,16]) -> (f32[8,16], f32[8,16]) {
  %x = f32[8,16]{1,0} parameter(0)
  %w = f32[16,16]{1,0} parameter(1)
  %zero = f32[] constant(0)
  %sum = f32[8]{0} fusion(%x, %zero), kind=kInput, calls=%f_sum
  %center = f32[8,16]{1,0} fusion(%x, %sum), kind=kLoop, calls=%f_center
  %sq = f32[8]{0} fusion(%center, %zero), kind=kInput, calls=%f_sq
  %rs = f32[8]{0} fusion(%sq), kind=kLoop, calls=%f_rsqrt
  %out = f32[8,16]{1,0} fusion(%center, %rs), kind=kLoop, calls=%f_out
  %dot = f32[8,16]{1,0} dot(%out, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (f32[8,16]{1,0}, f32[8,16]{1,0}) tuple(%out, %dot)
}
"""

ROW, FULL, W = 8 * 4, 8 * 16 * 4, 16 * 16 * 4


def test_op_classes_and_kernel_nodes():
    graph = build_graph(parse_module(LAYERNORM))
    classes = {n.name: n.op_class for n in graph.nodes.values()}
    assert classes["sum"] == OpClass.REDUCTION
    assert classes["center"] == OpClass.LIGHT_ELEMENTWISE
    assert classes["rs"] == OpClass.EXPENSIVE_ELEMENTWISE
    assert classes["dot"] == OpClass.OPAQUE
    assert classes["zero"] == classes["t"] == OpClass.NOOP
    assert [n.name for n in graph.kernel_nodes()] == ["sum", "center", "sq", "rs", "out", "dot"]
    assert graph.outputs == ["out", "dot"]


def test_traffic_counts_boundary_tensors_once():
    graph = build_graph(parse_module(LAYERNORM))
    # one XLA kernel: reads x once, writes the row sums; the scalar constant is an immediate
    assert pattern_traffic(graph, ["sum"]) == (FULL, ROW)
    assert pattern_traffic(graph, ["center"]) == (FULL + ROW, FULL)
    # the whole region: reads x, writes only `out` (used by the dot and returned)
    region = ["sum", "center", "sq", "rs", "out"]
    assert memory_intensive_regions(graph) == [region]
    assert pattern_traffic(graph, region) == (FULL, FULL)
    assert plan_bytes(graph, [region]) == 2 * FULL


def test_cycle_through_outside_node_is_detected():
    graph = build_graph(parse_module(LAYERNORM))
    assert not KernelDag(graph).creates_cycle(frozenset(["sum", "center"]))
    # center -> sq -> rs -> out: leaving out sq and rs makes {center, out} cyclic
    assert KernelDag(graph).creates_cycle(frozenset(["center", "out"]))


def test_baseline_merges_a_buildable_region_and_records_why():
    graph = build_graph(parse_module(LAYERNORM))
    plan = connected_region_plan(graph, lambda nodes: None)
    assert [p.nodes for p in plan.patterns] == [["sum", "center", "sq", "rs", "out"]]
    assert plan.decisions[0] == Decision(("sum", "center", "sq", "rs", "out"), None, "buildable")


def test_baseline_cuts_an_unbuildable_region_greedily():
    graph = build_graph(parse_module(LAYERNORM))

    class Stub(enum.Enum):
        TOO_MANY_REDUCTIONS = "too many reductions"

    def at_most_two(nodes):
        return None if len(nodes) <= 2 else Refusal(Stub.TOO_MANY_REDUCTIONS, "3 or more")

    plan = connected_region_plan(graph, at_most_two)
    assert [p.nodes for p in plan.patterns] == [["sum", "center"], ["sq", "rs"]]
    assert any(d.kind is Stub.TOO_MANY_REDUCTIONS for d in plan.decisions)


def test_the_baseline_names_each_run_s_next_patterns_ahead_and_plans_the_same():
    """Query workers start on what a run asks next, whether the pattern being asked builds
    or not: every pattern a run grows to, and every fresh start, was named before it was
    asked; the plan is the one planned without naming ahead."""
    graph = build_graph(parse_module(LAYERNORM))

    class Stub(enum.Enum):
        TOO_MANY_REDUCTIONS = "too many reductions"

    named, asked = [], []

    def at_most_two(nodes):
        asked.append(list(nodes))
        return None if len(nodes) <= 2 else Refusal(Stub.TOO_MANY_REDUCTIONS, "3 or more")

    plan = connected_region_plan(graph, at_most_two, ask_ahead=named.extend)
    assert [p.nodes for p in plan.patterns] == [["sum", "center"], ["sq", "rs"]]
    region, first, *rest = asked
    assert len(region) == 5 and first == ["sum", "center"] and rest
    assert all(p in named for p in rest)
    assert [p.nodes for p in connected_region_plan(graph, at_most_two).patterns] == \
        [p.nodes for p in plan.patterns]


def chain_module(length: int) -> str:
    lines = ["HloModule chain", "", "ENTRY %e (p: f32[64]) -> f32[64] {",
             "  %k0 = f32[64]{0} parameter(0)"]
    lines += [f"  %k{i} = f32[64]{{0}} negate(%k{i - 1})" for i in range(1, length)]
    lines += [f"  ROOT %out = f32[64]{{0}} negate(%k{length - 1})", "}"]
    return "\n".join(lines)


def test_a_long_run_grows_by_doubling_steps_and_ends_where_it_stops_building():
    """A region of 200 kernels of which at most 150 build together: the runs are the longest
    buildable prefixes, as growing one kernel at a time finds them, asked about far fewer
    kernels in all (one at a time: 2 + 3 + ... + 151, over 11,000)."""
    graph = build_graph(parse_module(chain_module(200)))

    class Stub(enum.Enum):
        TOO_LONG = "too long"

    asked = []

    def at_most_150(nodes):
        asked.append(len(nodes))
        return None if len(nodes) <= 150 else Refusal(Stub.TOO_LONG, "over 150")

    plan = connected_region_plan(graph, at_most_150)
    region = [n for n in graph.nodes if graph.nodes[n].is_kernel]
    assert len(region) == 200
    assert [p.nodes for p in plan.patterns] == [region[:150], region[150:]]
    assert sum(asked) < 3000


def test_a_bitcast_between_pattern_kernels_is_not_a_cycle():
    module = parse_module("""
HloModule m

%f_neg (p: f32[4,8]) -> f32[4,8] {
  %p = f32[4,8]{1,0} parameter(0)
  ROOT %n = f32[4,8]{1,0} negate(%p)
}

%f_abs (p: f32[32]) -> f32[32] {
  %p = f32[32]{0} parameter(0)
  ROOT %a = f32[32]{0} abs(%p)
}

ENTRY %main (x: f32[4,8]) -> f32[32] {
  %x = f32[4,8]{1,0} parameter(0)
  %neg = f32[4,8]{1,0} fusion(%x), kind=kLoop, calls=%f_neg
  %flat = f32[32]{0} bitcast(%neg)
  ROOT %abs = f32[32]{0} fusion(%flat), kind=kLoop, calls=%f_abs
}
""")
    graph = build_graph(module)
    assert not KernelDag(graph).creates_cycle(frozenset(["neg", "abs"]))


# a = exp(x) is read by c after a GEMM that b feeds: {a, b, c} is one region, but c cannot
# share a kernel with a.
GEMM_BETWEEN = """
HloModule gemm_between

ENTRY %main (x: f32[16,16], w: f32[16,16]) -> f32[16,16] {
  %x = f32[16,16]{1,0} parameter(0)
  %w = f32[16,16]{1,0} parameter(1)
  %a = f32[16,16]{1,0} exponential(%x)
  %b = f32[16,16]{1,0} negate(%a)
  %d = f32[16,16]{1,0} dot(%b, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %c = f32[16,16]{1,0} add(%a, %d)
}
"""


def test_lower_bound_counts_values_read_after_a_gemm_and_is_reached():
    graph = build_graph(parse_module(GEMM_BETWEEN))
    regions = memory_intensive_regions(graph)
    assert regions == [["a", "b", "c"]]
    square = 16 * 16 * 4
    compulsory = plan_bytes(graph, regions)  # reads x and d, writes b and c
    assert compulsory == 4 * square
    # a is written (c needs it) and read again (by c's kernel): the best acyclic plan
    bound = acyclic_lower_bound_bytes(graph)
    assert bound == compulsory + 2 * square == plan_bytes(graph, [["a", "b"], ["c"]])
    # and no plan of acyclic kernels goes below it
    assert plan_bytes(graph, [["a"], ["b"], ["c"]]) >= bound


def test_lower_bound_is_below_xlas_plan_on_the_gpu_corpus():
    for path in sorted(DATA.glob("*_h100.hlo*")):
        graph = build_graph(parse_file(path))
        xla = plan_bytes(graph, [[n.name] for n in graph.memory_intensive_nodes()])
        assert acyclic_lower_bound_bytes(graph) <= xla, path.name


def test_kernels_acyclic_alone_can_form_a_cycle_together():
    graph = build_graph(parse_module(INTERLOCKED))
    dag = KernelDag(graph)
    ab, cd = frozenset(["a", "b"]), frozenset(["c", "d"])
    assert not dag.creates_cycle(ab) and not dag.creates_cycle(cd)
    assert kernels_form_a_cycle(dag, [ab, cd])
    assert not kernels_form_a_cycle(dag, [ab]) and not kernels_form_a_cycle(dag, [cd])
    assert not kernels_form_a_cycle(dag, [frozenset(["a", "c"]), frozenset(["b", "d"])])


def test_interlocked_kernels_are_split_a_pack_into_its_units_first():
    dag = KernelDag(build_graph(parse_module(INTERLOCKED)))
    ab, cd = frozenset(["a", "b"]), frozenset(["c", "d"])
    # two patterns: the later one is left to XLA as its kernels
    kernels, split = dag.split_cycles([ab, cd], [[ab], [cd]])
    assert split == [cd] and sorted(map(sorted, kernels)) == [["a", "b"], ["c"], ["d"]]
    # {a, b} a pack of two units: it is split into them, and {c, d} stays
    a, b = frozenset(["a"]), frozenset(["b"])
    kernels, split = dag.split_cycles([cd, ab], [[cd], [a, b]])
    assert split == [ab] and sorted(map(sorted, kernels)) == [["a"], ["b"], ["c", "d"]]
    assert not kernels_form_a_cycle(dag, kernels)
    assert dag.split_cycles([ab], [[ab]]) == ([ab], [])


def test_a_kernel_on_a_cycle_is_split_in_two_where_both_halves_build():
    dag = KernelDag(build_graph(parse_module(INTERLOCKED)))
    ab, cd = frozenset(["a", "b"]), frozenset(["c", "c2", "d", "d2"])
    asked = []

    def buildable(nodes):
        asked.append(nodes)
        return True

    kernels, split = dag.split_cycles([ab, cd], [[ab], [cd]], buildable)
    # what the cycle's entry d feeds inside the kernel, and the rest
    assert split == [cd] and sorted(map(sorted, kernels)) == [["a", "b"], ["c", "c2"],
                                                              ["d", "d2"]]
    assert sorted(map(sorted, asked)) == [["c", "c2"], ["d", "d2"]]
    assert not kernels_form_a_cycle(dag, kernels)
    # a half the code generator refuses: the kernel goes back to XLA's kernels
    kernels, _ = dag.split_cycles([ab, cd], [[ab], [cd]], lambda nodes: nodes != asked[0])
    assert sorted(map(sorted, kernels)) == [["a", "b"], ["c"], ["c2"], ["d"], ["d2"]]
    assert not kernels_form_a_cycle(dag, kernels)


ZERO_SIZED = """HloModule zero_sized

ENTRY %main (p: f32[8]) -> (f32[8], u8[0]) {
  %p = f32[8]{0} parameter(0)
  %c = u8[] constant(0)
  %b = u8[0]{0} broadcast(%c), dimensions={}
  %n = f32[8]{0} negate(%p)
  %e = f32[8]{0} exponential(%n)
  ROOT %t = (f32[8]{0}, u8[0]{0}) tuple(%e, %b)
}
"""


def test_an_empty_array_launches_nothing_and_does_not_stop_the_plan():
    # cuDNN's workspace written as HLO is a u8[0]; the explorer divided by its 0 threads.
    module = parse_module(ZERO_SIZED)
    graph = build_graph(module)
    assert graph.nodes["b"].op_class == OpClass.NOOP and not graph.nodes["b"].is_kernel
    result = stitch_module(module, Options(verify=True))
    assert [sorted(k.pattern.nodes) for k in result.kernels] == [["e", "n"]]
    assert result.report.verify.ok and not result.report.verify.vacuous


COUNTED_LOOP = """HloModule counted_loop

%cond (c: (s32[], f32[64])) -> pred[] {
  %c = (s32[], f32[64]{0}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(8)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (b: (s32[], f32[64])) -> (s32[], f32[64]) {
  %b = (s32[], f32[64]{0}) parameter(0)
  %j = s32[] get-tuple-element(%b), index=0
  %one = s32[] constant(1)
  %next = s32[] add(%j, %one)
  %v = f32[64]{0} get-tuple-element(%b), index=1
  %w = f32[64]{0} negate(%v)
  ROOT %r = (s32[], f32[64]{0}) tuple(%next, %w)
}

ENTRY %main (x: f32[64]) -> (s32[], f32[64]) {
  %x = f32[64]{0} parameter(0)
  %zero = s32[] constant(0)
  %first = s32[] copy(%zero)
  %start = s32[] copy(%first)
  %e = f32[64]{0} exponential(%x)
  %m = f32[64]{0} multiply(%e, %x)
  %t = (s32[], f32[64]{0}) tuple(%start, %m)
  ROOT %loop = (s32[], f32[64]{0}) while(%t), condition=%cond, body=%body
}
"""


def test_a_loops_counter_start_stays_xlas():
    # XLA:GPU reads a loop's trip count from the counter's start value; from our kernel's
    # output it could not, and each iteration would wait on the host.
    module = parse_module(COUNTED_LOOP)
    graph = build_graph(module)
    assert {n for n in ("zero", "first", "start", "e") if graph.nodes[n].op_class
            == OpClass.OPAQUE} == {"first", "start"}
    result = stitch_module(module, Options(verify=True))
    assert [sorted(k.pattern.nodes) for k in result.kernels] == [["e", "m"]]
    assert result.report.verify.ok


ASYNC_FUSION = FUSED_SLICE + """
ENTRY %main (x: f32[4,8], i: s32[]) -> f32[1,8] {
  %x = f32[4,8]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %e = f32[4,8]{1,0} exponential(%x)
  %start = ((f32[4,8]{1,0}, s32[]), f32[1,8]{1,0}, u32[]) fusion-start(%e, %i), kind=kLoop, calls=%fused_slice
  %done = f32[1,8]{1,0} fusion-done(%start)
  ROOT %n = f32[1,8]{1,0} negate(%done)
}
"""


def test_an_async_fusion_stays_xlas():
    # XLA:GPU (jaxlib 0.11.2) writes some of a loop body's slices as fusion-start/fusion-done;
    # classed by default as elementwise, a pattern could take in half of the pair.
    graph = build_graph(parse_module(ASYNC_FUSION))
    assert graph.nodes["start"].op_class == graph.nodes["done"].op_class == OpClass.OPAQUE
