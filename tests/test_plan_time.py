"""Planning faster: the schedule choice prices only schedules that could win, and
still chooses what pricing every schedule would; ptxas runs side by side."""
import functools
import os
from types import SimpleNamespace

import pytest

from costmodel import load_device
from fusionstitching import capability, codegen, pipeline
from fusionstitching.codegen import compile_nvptx, find_ptxas, generate
from fusionstitching.codegen.cost.kernel_profile import (latency_lower_bound_us,
                                                         unbounded_instructions)
from fusionstitching.codegen.errors import CodegenError, NotFaster, Refusal
from fusionstitching.codegen.flatten import flatten
from fusionstitching.codegen.schedules import choose
from fusionstitching.codegen.schedules.candidates import enumerate_schedules
from fusionstitching.codegen.schedules.choose import (_build_and_price, build_kernel,
                                                      memory_bound_us, schedule_pattern)
from fusionstitching.codegen.schedules.one_space import launch_free, relaunched
from fusionstitching.codegen.schedules.space import reduction_space
from fusionstitching.graph import build_graph
from fusionstitching.hlo.parser import parse_file, parse_module
from fusionstitching.pipeline import Options, stitch_module
from fusionstitching.runtime import cache as kernel_cache
from fusionstitching.runtime import kernel_objects
from helpers import HEAD_WITH_ADD

HLO = os.path.join(os.path.dirname(__file__), "data", "hlo")
H100 = load_device("h100")
# Row reductions, a phased training step and a transformer's inference: loop, thread, warp,
# block, tile and phased schedules among their candidates.
FILES = ["layernorm_32x2048_jax_h100_classic.hlo", "softmax_32x2048_jax_h100_classic.hlo",
         "cross_entropy_64x256_jax_h100.hlo", "dien_infer_small_jax_h100.hlo.gz",
         "bert_infer_small_jax_h100.hlo", "batchnorm_train_4x8x8x32_jax_h100.hlo"]


@functools.cache
def planned(file: str):
    module = parse_file(os.path.join(HLO, file))
    return module, stitch_module(module, Options(target="h100", ptxas=False))


def patterns(file: str):
    """Every pattern the explorer's plan for ``file`` stitches, flattened."""
    module, result = planned(file)
    return [flatten(module, k.pattern.nodes) for k in result.kernels]


def test_every_file_has_patterns():
    assert all(patterns(file) for file in FILES)


@pytest.mark.parametrize("file", FILES)
def test_pruned_schedules_are_no_faster_than_the_chosen_one(file):
    """Branch and bound chooses what pricing every schedule would: each schedule left
    unpriced, priced here, is no faster than the chosen kernel."""
    for pattern in patterns(file):
        chosen = schedule_pattern(pattern, "k", H100)
        for sched, least in chosen.pruned:
            assert least >= chosen.modeled_us
            outcome = _build_and_price(pattern, sched, "k", H100, chosen.profile.bytes_read,
                                       chosen.profile.bytes_written)
            if isinstance(outcome, tuple):
                assert outcome[4] >= chosen.modeled_us, sched.why
        built = [t for _, t in chosen.candidates if t != float("inf")]
        assert chosen.modeled_us == min(built)


@pytest.mark.parametrize("file", FILES)
def test_least_times_are_below_every_schedules_modeled_time(file):
    """The bounds the choice prunes by: before building (memory alone) and before the
    registers (every occupancy, loads all in flight), for every schedule that builds."""
    checked = 0
    for pattern in patterns(file):
        read = sum(s.byte_size for _, s in pattern.inputs)
        written = sum(s.byte_size for _, s in pattern.outputs)
        chosen = schedule_pattern(pattern, "k", H100)
        for sched in [chosen.schedule] + [s for s, _ in chosen.pruned]:
            outcome = _build_and_price(pattern, sched, "k", H100, read, written)
            if not isinstance(outcome, tuple):
                continue
            kernel, modeled = outcome[0], outcome[4]
            least = latency_lower_bound_us(kernel, unbounded_instructions(kernel),
                                           read + written, H100)
            assert memory_bound_us(sched, read + written, H100) <= least <= modeled
            checked += 1
    assert checked >= len(patterns(file))


def test_the_bounds_leave_most_schedules_unpriced():
    """On the row reductions and transformer above, most built schedules are never priced
    (the register model is the costliest part of pricing)."""
    priced = pruned = 0
    for file in FILES:
        for pattern in patterns(file):
            chosen = schedule_pattern(pattern, "k", H100)
            priced += sum(1 for _, t in chosen.candidates if t != float("inf"))
            pruned += len(chosen.pruned)
    assert pruned > priced


def test_a_capability_query_stops_at_the_first_schedule_that_builds():
    module = parse_file(os.path.join(HLO, "layernorm_32x2048_jax_h100_classic.hlo"))
    pattern = patterns("layernorm_32x2048_jax_h100_classic.hlo")[0]
    first = schedule_pattern(pattern, "k", H100, fastest=False)
    assert not first.fastest and len([t for _, t in first.candidates if t != float("inf")]) == 1
    best = schedule_pattern(pattern, "k", H100)
    assert best.fastest and best.modeled_us <= first.modeled_us
    with pytest.raises(CodegenError):  # a refusal is still a refusal
        generate(module, [module.entry.parameters[0].name], "p", fastest=False)


def test_probes_leave_out_the_cpu_schedule_but_planned_kernels_have_it_when_asked():
    module, result = planned("bert_infer_small_jax_h100.hlo")
    assert result.kernels and all(k.spec.host_kernel is None for k in result.kernels)
    with_host = stitch_module(module, Options(target="h100", ptxas=False, host=True))
    assert with_host.kernels and all(k.spec.host_kernel is not None and
                                     k.spec.host_kernel.block == (1,) for k in with_host.kernels)


def test_ptxas_side_by_side_gives_what_one_at_a_time_gives():
    if find_ptxas() is None:
        pytest.skip("find_ptxas() is None: no ptxas on PATH or in nvidia-cuda-nvcc")
    module = parse_file(os.path.join(HLO, "bert_infer_small_jax_h100.hlo"))
    together = stitch_module(module, Options(target="h100")).kernels
    alone = [compile_nvptx(k.spec, "sm_90") for k in together]
    assert len(together) == 4
    for k, nv in zip(together, alone):
        assert (k.nvptx.ptx, k.nvptx.regs, k.nvptx.spills, k.nvptx.cubin) == (
            nv.ptx, nv.regs, nv.spills, nv.cubin)


def test_a_module_planned_again_with_its_schedules_builds_each_pattern_once():
    """``schedules`` kept across modules: every pattern of the second planning is built with
    the schedule chosen the first time, alone, and the kernels are the same."""
    module = parse_file(os.path.join(HLO, "dien_infer_small_jax_h100.hlo.gz"))
    schedules: dict = {}
    first = stitch_module(module, Options(target="h100", ptxas=False), schedules=schedules)
    second = stitch_module(module, Options(target="h100", ptxas=False), schedules=schedules)
    assert schedules and first.kernels
    assert [str(k.spec.kernel) for k in second.kernels] == \
        [str(k.spec.kernel) for k in first.kernels]
    for kernel in second.kernels:
        (only,) = kernel.spec.candidates
        assert only[0].endswith("chosen for an earlier pattern equal up to names")


def test_schedules_kept_in_the_cache_serve_another_process(tmp_path):
    """The runtime's ScheduleMemo: what one process chose, a new memo on the same directory
    reads back; an entry that is not a schedule is a miss, not an error."""
    module = parse_file(os.path.join(HLO, "dien_infer_small_jax_h100.hlo.gz"))
    stats = kernel_cache.CacheStats(str(tmp_path))
    writer = kernel_objects.ScheduleMemo(kernel_cache.KernelCache(str(tmp_path)), stats)
    first = stitch_module(module, Options(target="h100", ptxas=False), schedules=writer)
    reader = kernel_objects.ScheduleMemo(kernel_cache.KernelCache(str(tmp_path)), stats)
    assert len(reader) == 0 and all(reader[form] == writer[form] for form in writer)
    second = stitch_module(module, Options(target="h100", ptxas=False), schedules=reader)
    assert [k.spec.schedule for k in second.kernels] == [k.spec.schedule for k in first.kernels]
    assert all(len(k.spec.candidates) == 1 for k in second.kernels)
    cache = kernel_cache.KernelCache(str(tmp_path))
    cache.store(kernel_cache.fingerprint("schedule", "a form"), b"not a schedule",
                kind="schedule")
    assert kernel_objects.ScheduleMemo(cache, stats).get("a form") is None


def _counting_builds(monkeypatch) -> list:
    """The schedules ``choose`` builds from now on, in order."""
    built, real = [], choose.build_launched
    monkeypatch.setattr(choose, "build_launched",
                        lambda p, s, *a: built.append(s) or real(p, s, *a))
    return built


@pytest.mark.parametrize("file", FILES)
def test_below_us_gives_the_fastest_or_says_none_is_faster(file, monkeypatch):
    """With the time the caller needs beaten (XLA's kernels'), the choice is the fastest when
    it beats it, else ``NotFaster`` with a time no schedule is below; schedules that cannot
    beat it are not built or priced."""
    for pattern in patterns(file):
        built = _counting_builds(monkeypatch)
        best = schedule_pattern(pattern, "k", H100)
        every = len(built)
        above = schedule_pattern(pattern, "k", H100, below_us=best.modeled_us * 1.01)
        assert (above.schedule, above.modeled_us) == (best.schedule, best.modeled_us)
        with pytest.raises(NotFaster) as tie:  # a tie is not faster
            schedule_pattern(pattern, "k", H100, below_us=best.modeled_us)
        assert tie.value.least_us <= best.modeled_us
        del built[:]
        with pytest.raises(NotFaster) as none:  # nothing runs in under a launch
            schedule_pattern(pattern, "k", H100, below_us=0.5)
        assert none.value.least_us > 0.5 and len(built) < every or every == 1


def test_a_cross_block_refusal_stands_for_every_one_space_schedule(monkeypatch):
    """A one-space schedule refused for cross-block communication (a reduction read at
    another thread group's result): the other one-space schedules are refused unbuilt, and
    each of them, built, is refused so too."""
    module = parse_file(os.path.join(HLO, "bert_infer_small_tf_h100.hlo"))
    result = stitch_module(module, Options(target="h100", ptxas=False))
    (kernel,) = [k for k in result.kernels if k.spec.schedule.kind == "phases"]
    pattern = flatten(module, kernel.spec.nodes)
    cross = [r for r in kernel.spec.refused if r.kind is Refusal.CROSS_BLOCK
             and r.schedule is not None and r.schedule.kind != "phases"]
    assert len(cross) > 10
    for refused in cross:
        with pytest.raises(CodegenError) as built_alone:
            build_kernel(pattern, refused.schedule, "k")
        assert built_alone.value.kind is Refusal.CROSS_BLOCK
    built = _counting_builds(monkeypatch)
    again = schedule_pattern(pattern, "k", H100)
    assert again.schedule == kernel.spec.schedule
    assert len([s for s in built if s.kind != "phases"]) == 1


# Two outputs of different sizes (two grid-stride loops), and the same chain twice under
# other names (patterns equal up to names).
TWO_CHAINS = """HloModule two_chains
ENTRY e {
  a = f32[64,96] parameter(0)
  b = f32[64,96] parameter(1)
  c = f32[96] parameter(2)
  cc = f32[64,96] broadcast(c), dimensions={1}
  x1 = f32[64,96] multiply(a, cc)
  y1 = f32[64,96] exponential(x1)
  n1 = f32[96] negate(c)
  x2 = f32[64,96] multiply(b, cc)
  y2 = f32[64,96] exponential(x2)
  ROOT t = (f32[64,96], f32[96], f32[64,96]) tuple(y1, n1, y2)
}
"""


def test_loop_schedules_of_one_width_are_built_once_and_relaunched():
    """A loop schedule's kernel relaunched from another of the same vector width is the
    kernel built for it (grid-stride loops and single-chunk ifs alike), counted the same."""
    module = parse_module(TWO_CHAINS, "two_chains")
    pattern = flatten(module, ["cc", "x1", "y1", "n1"])
    schedules = [s for s in enumerate_schedules(reduction_space(pattern), H100,
                                                [s.num_elements for _, s in pattern.outputs],
                                                False) if s.kind == "loop"]
    first: dict[int, object] = {}
    relaunches = 0
    for sched in schedules:
        kernel, _ = build_kernel(pattern, sched, "k")
        if not launch_free(pattern, sched):
            continue
        if sched.vector not in first:
            first[sched.vector] = kernel
            continue
        again = relaunched(first[sched.vector], sched)
        assert str(again) == str(kernel), sched.why
        assert unbounded_instructions(again) == unbounded_instructions(kernel), sched.why
        relaunches += 1
    assert relaunches >= 4 and set(first) == {1, 4}


def test_a_pattern_equal_up_to_names_gets_the_kept_kernel_unbuilt(monkeypatch):
    """``kept``: the second of two patterns equal up to names is the first's kernel with its
    own buffers, built by no schedule, and equal to its kernel built alone."""
    module = parse_module(TWO_CHAINS, "two_chains")
    one, two = flatten(module, ["x1", "y1"]), flatten(module, ["x2", "y2"])
    chosen, kept = {}, {}
    first = schedule_pattern(one, "k", H100, chosen=chosen, kept=kept)
    assert len(kept) == 1 and not first.kernel.shared
    built = _counting_builds(monkeypatch)
    second = schedule_pattern(two, "k", H100, chosen=chosen, kept=kept)
    assert built == []
    alone = schedule_pattern(two, "k", H100, chosen=chosen)
    assert len(built) == 1
    assert str(second.kernel) == str(alone.kernel) != str(first.kernel)
    assert (second.schedule, second.profile, second.modeled_us, second.candidates) == (
        alone.schedule, alone.profile, alone.modeled_us, alone.candidates)
    assert not second.borrowed


TWO_NORMS = HEAD_WITH_ADD + """
ENTRY e {
  a = f32[8,4096] parameter(0)
  b = f32[8,4096] parameter(1)
  z = f32[] constant(0)
  e1 = f32[8,4096] exponential(a)
  s1 = f32[8] reduce(e1, z), dimensions={1}, to_apply=add
  d1 = f32[8,4096] broadcast(s1), dimensions={0}
  y1 = f32[8,4096] divide(e1, d1)
  e2 = f32[8,4096] exponential(b)
  s2 = f32[8] reduce(e2, z), dimensions={1}, to_apply=add
  d2 = f32[8,4096] broadcast(s2), dimensions={0}
  y2 = f32[8,4096] divide(e2, d2)
  ROOT t = (f32[8,4096], f32[8,4096]) tuple(y1, y2)
}
"""
NORM_1, NORM_2 = ["e1", "s1", "d1", "y1"], ["e2", "s2", "d2", "y2"]


def test_a_kept_kernel_holding_other_names_is_borrowed_unbuilt_and_priced_the_same(
        monkeypatch):
    """A kept kernel with a shared array (named after its pattern's reduction) serves an
    equal pattern unbuilt and unpriced, marked ``borrowed``: its buffers are the pattern's,
    its shared array the earlier one's; priced as the kernel built alone is."""
    module = parse_module(TWO_NORMS, "two_norms")
    chosen, kept = {}, {}
    first = schedule_pattern(flatten(module, NORM_1), "k", H100, chosen=chosen, kept=kept)
    assert [a.name for a in first.kernel.shared] == ["smem_s1"]
    built = _counting_builds(monkeypatch)
    second = schedule_pattern(flatten(module, NORM_2), "k", H100, chosen=chosen, kept=kept)
    assert built == [] and second.borrowed
    alone = schedule_pattern(flatten(module, NORM_2), "k", H100, chosen=chosen)
    assert len(built) == 1 and not alone.borrowed
    assert [a.name for a in second.kernel.shared] == ["smem_s1"]
    assert [a.name for a in alone.kernel.shared] == ["smem_s2"]
    assert second.kernel.buffers == alone.kernel.buffers
    assert (second.schedule, second.profile, second.modeled_us) == (
        alone.schedule, alone.profile, alone.modeled_us)


def test_a_borrowed_query_answer_is_generated_again_for_the_plan(monkeypatch):
    """The plan's kernels are built under their own names: a pattern whose capability query
    borrowed an equal pattern's kernel is generated with the schedule chosen then, and is
    the kernel generating it alone gives."""
    module = parse_module(TWO_NORMS, "two_norms")
    probes = {}
    real = pipeline._build_kernel
    monkeypatch.setattr(pipeline, "_build_kernel", lambda *a: probes.setdefault(
        tuple(a[1].nodes), a[7]) and real(*a))
    result = stitch_module(module, Options(target="h100", ptxas=False, workers=0))
    assert sorted(probes) == [tuple(NORM_1), tuple(NORM_2)]
    assert sorted(p.borrowed for p in probes.values()) == [False, True]  # the one asked later
    for k in result.kernels:
        assert not k.spec.borrowed
        assert str(k.spec.kernel) == str(generate(module, k.spec.nodes, k.spec.name,
                                                  H100).kernel)
    assert [a.name for k in result.kernels for a in k.spec.kernel.shared] == \
        ["smem_s1", "smem_s2"]


def test_a_borrowed_query_answer_is_assembled_under_its_own_names(monkeypatch):
    """The spill check assembles the pattern's own kernel, not the borrowed one."""
    module = parse_module(TWO_NORMS, "two_norms")
    graph = build_graph(module)
    assembled = []
    monkeypatch.setattr(capability, "MAX_REGISTERS_PER_THREAD", 0)  # every kernel is checked
    monkeypatch.setattr(codegen, "find_ptxas", lambda: "ptxas")
    monkeypatch.setattr(codegen, "compile_nvptx", lambda spec, arch: assembled.append(
        spec) or SimpleNamespace(spills=0))
    chosen = {}
    for nodes in (NORM_1, NORM_2):
        spec = capability.ask(graph, nodes, H100, "h100", True, chosen)
        assert isinstance(spec, codegen.KernelSpec), spec
    assert [[a.name for a in s.kernel.shared] for s in assembled] == [["smem_s1"], ["smem_s2"]]
    assert not any(s.borrowed for s in assembled)


def test_an_equal_pattern_not_faster_than_asked_is_answered_unbuilt(monkeypatch):
    """``not_faster``: a pattern equal up to names to one no schedule of which beat the same
    ``below_us`` gets the same answer, with no schedule built; another ``below_us`` is
    searched again."""
    module = parse_module(TWO_NORMS, "two_norms")
    chosen, kept, not_faster = {}, {}, {}
    ask = functools.partial(schedule_pattern, name="k", device=H100, chosen=chosen, kept=kept,
                            not_faster=not_faster)
    with pytest.raises(NotFaster) as first:
        ask(flatten(module, NORM_1), below_us=0.5)
    built = _counting_builds(monkeypatch)
    with pytest.raises(NotFaster) as second:
        ask(flatten(module, NORM_2), below_us=0.5)
    assert built == [] and str(second.value) == str(first.value)
    assert second.value.least_us == first.value.least_us >= 0.5
    with pytest.raises(NotFaster) as searched:
        ask(flatten(module, NORM_2), below_us=0.25)
    assert built and searched.value.below_us == 0.25 and chosen == {}
