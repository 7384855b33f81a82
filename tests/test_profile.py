"""Kernel IR -> KernelProfile, the register model against ptxas, and XLA's kernels' profiles."""
from __future__ import annotations

import functools
import glob
import os
from dataclasses import dataclass

import pytest

import costmodel
from fusionstitching import codegen, pipeline
from fusionstitching.codegen import modeled_kernel_us
from fusionstitching.codegen.cost.kernel_profile import kernel_profile
from fusionstitching.codegen.cost.lowered import unrolled_trips
from fusionstitching.codegen.cost.registers import register_model
from fusionstitching.codegen.index_expr import Var, add, div, ix, mod, scale
from fusionstitching.codegen.kernel_ir import (Accumulate, Barrier, BlockReduce, Buffer,
                                               Compute, Const, DynamicIndex, GlobalLoad,
                                               GlobalStore, If, IndexLet, Kernel, Loop,
                                               SharedArray, Value)
from fusionstitching.graph import build_graph
from fusionstitching.graph.xla_kernel_model import fused_instructions, load_levels, xla_kernel_profile
from fusionstitching.graph.traffic import pattern_traffic
from fusionstitching.hlo.ir import Shape
from fusionstitching.hlo.parser import parse_file, parse_module
from helpers import kernel_spec, needs_ptxas, within_a_quarter

HLO = os.path.join(os.path.dirname(__file__), "data", "hlo")


def _row_sum_kernel(threads: int, cols: int, start_of, step: int | None = None) -> Kernel:
    """Threads sum a row of x[rows, cols] (``step`` apart) and one thread stores the sum."""
    rows = 4
    tid, bid, row, col = Var("tid", threads), Var("bid", rows), Var("row", rows), Var("col", cols)
    x, total = Shape("f32", (rows, cols), (1, 0)), Shape("f32", (rows,), (0,))
    loaded, zero, partial, summed = (Value(n, "f32") for n in ("x", "zero", "partial", "sum"))
    scratch = SharedArray("scratch", "f32", 32)
    body = [IndexLet(row, ix(bid)), Const(zero, 0.0),
            Loop(col, start_of(tid), cols, step or threads,
                 [GlobalLoad(loaded, 0, add(scale(row, cols), col))],
                 [Accumulate(partial, "add", zero, loaded)]),
            BlockReduce(summed, partial, "add", scratch),
            If(ix(tid), ix(0), [GlobalStore(1, ix(row), summed)])]
    return Kernel("row_sum", [Buffer("x", x, False), Buffer("sum", total, True)], (rows,),
                  (threads,), [scratch], body, tid, bid)


def _profile(kernel: Kernel):
    spec = kernel_spec(kernel)
    return kernel_profile(kernel, spec.read_bytes, spec.write_bytes)


def test_instructions_follow_trip_counts_and_block_reduce():
    # 2048 columns over 512 threads starting at tid: 4 trips, which LLVM leaves a loop (it
    # unrolls by 8), so 4 iterations each wait for their load.
    profile = _profile(_row_sum_kernel(512, 2048, ix))
    counts = profile.instructions
    assert counts["ld_global"] == 4 and "ld_global_overlapped" not in counts
    assert counts["shfl"] == 10  # two butterflies of a block reduce
    assert counts["barrier"] == 1 and counts["st_shared"] == 1 and counts["ld_shared"] == 1
    assert counts["fp32"] == 4 + 10 + 1  # accumulate per iteration, butterfly combines, select
    assert counts["st_global"] == 1
    assert (profile.grid_blocks, profile.threads_per_block) == (4, 512)
    assert profile.smem_bytes == 32 * 4
    assert profile.bytes_read == 4 * 2048 * 4 and profile.bytes_written == 4 * 4


def test_unrolled_loop_overlaps_its_loads():
    # A lane start (tid % 32) with 8 iterations for every lane: LLVM unrolls it fully.
    kernel = _row_sum_kernel(64, 256, lambda tid: mod(tid, 32), step=32)
    counts = _profile(kernel).instructions
    assert counts["ld_global"] == 1 and counts["ld_global_overlapped"] == 7


def test_index_arithmetic_is_counted_once_per_sub_expression():
    """LLVM computes a thread's base offset once and, in a loop it unrolls, turns the loop
    variable into immediate offsets: 8 unrolled copies cost no more integer instructions than
    one (no step either), while a loop that stays a loop pays per iteration for its step,
    compare-and-branch and pointer."""
    def ints(cols: int, start_of, step: int | None, threads: int) -> float:
        kernel = _row_sum_kernel(threads, cols, start_of, step)
        return _profile(kernel).instructions["int"]

    lane = lambda tid: mod(tid, 32)
    assert ints(256, lane, 32, 64) <= ints(32, lane, 32, 64)  # 8 copies against one
    # Loops of 2, 3 and 4 trips: per iteration a step and a compare-and-branch, the loop
    # variable added to the row's offset, and the 64-bit address.
    two, three, four = (ints(512 * trips, ix, None, 512) for trips in (2, 3, 4))
    assert three - two == four - three == 2 + 1 + 2


def test_copies_of_an_unrolled_body_issue_behind_the_first():
    """An op in each of 8 unrolled copies waits for its operands once; the other 7 copies are
    independent of it and cost their issue cycles. The accumulation joining them is a chain."""
    tid, bid, col = Var("tid", 64), Var("bid", 4), Var("col", 256)
    x, out = Shape("f32", (4, 256), (1, 0)), Shape("f32", (4,), (0,))
    loaded, squared, zero, partial = (Value(n, "f32") for n in ("x", "sq", "zero", "partial"))
    body = [Const(zero, 0.0),
            Loop(col, mod(tid, 32), 256, 32,
                 [GlobalLoad(loaded, 0, add(scale(bid, 256), col)),
                  Compute(squared, "multiply", [loaded, loaded])],
                 [Accumulate(partial, "add", zero, squared)]),
            If(ix(tid), ix(0), [GlobalStore(1, ix(bid), partial)])]
    kernel = Kernel("k", [Buffer("x", x, False), Buffer("out", out, True)], (4,), (64,), [],
                    body, tid, bid)
    counts = _profile(kernel).instructions
    assert counts["fp32"] == 1 + 8 and counts["fp32_overlapped"] == 7

@needs_ptxas
@pytest.mark.parametrize("threads, cols, start, step", [
    (512, 2048, ix, None), (64, 512, ix, None), (256, 2048, ix, None), (256, 1792, ix, None),
    (512, 256, lambda tid: div(tid, 16), 32), (512, 128, lambda tid: div(tid, 16), 32),
    (64, 128, lambda tid: mod(tid, 32), 32), (64, 256, lambda tid: mod(tid, 32), 32)])
def test_unrolled_loops_are_the_ones_llvm_unrolls(threads, cols, start, step):
    """The profile's unroll rule against the PTX: a loop of exactly 8 trips for every thread
    of the block (LLVM bounds tid by the kernel's maxntidx) is straight-line code, loops of
    2-7 trips keep one load in a loop."""
    kernel = _row_sum_kernel(threads, cols, start, step)
    loop = next(s for s in kernel.body if isinstance(s, Loop))
    ptx = codegen.compile_nvptx(kernel_spec(kernel), "sm_90").ptx
    straight = ptx.count("ld.global") > 1 and "bra" not in ptx.split("ld.global")[1]
    assert (unrolled_trips(loop, kernel) is not None) == straight, ptx


def test_unknown_ir_nodes_are_counted_generically():
    @dataclass
    class Prefetch:  # a node type the profiler has never seen
        buffer: int
        offset: object

    kernel = _row_sum_kernel(512, 2048, ix)
    kernel.body.insert(1, Prefetch(0, ix(kernel.tid)))
    spec = kernel_spec(kernel)
    profile = _profile(kernel)
    assert profile.instructions["other"] == 1
    assert register_model(spec.kernel) == register_model(_row_sum_kernel(512, 2048, ix))
    for target in costmodel.TARGETS:
        assert modeled_kernel_us(spec, costmodel.load_device(target)) > 0


def _chained_inputs_kernel(threads: int, inputs: int = 48) -> Kernel:
    """y = ((x0 + x1) * x2 + x3) * ...: each input loaded right before the op that reads it."""
    tid, bid = Var("tid", threads), Var("bid", 4)
    shape = Shape("f32", (4 * threads,), (0,))
    buffers = [Buffer(f"x{i}", shape, False) for i in range(inputs)] + [Buffer("y", shape, True)]
    offset = add(scale(bid, threads), tid)
    loaded = [Value(f"x{i}", "f32") for i in range(inputs)]
    body, total = [GlobalLoad(loaded[0], 0, offset)], loaded[0]
    for i, x in enumerate(loaded[1:], 1):
        combined = Value(f"c{i}", "f32")
        body += [GlobalLoad(x, i, offset),
                 Compute(combined, "multiply" if i % 2 else "add", [total, x])]
        total = combined
    body.append(GlobalStore(inputs, offset, total))
    return Kernel(f"chained_{threads}", buffers, (4,), (threads,), [], body, tid, bid)


@needs_ptxas
def test_loads_are_hoisted_while_the_block_size_keeps_its_occupancy():
    """The same straight-line kernel: one-warp blocks (an SM holds 32 of them, so 64 registers
    keep its occupancy) hold all 48 loads issued early; blocks of 128 threads stay at 32
    registers with loads issued where they are used."""
    one_warp, four_warps = (kernel_spec(_chained_inputs_kernel(t)) for t in (32, 128))
    assert register_model(one_warp.kernel) > 40 and register_model(four_warps.kernel) == 32
    for spec in (one_warp, four_warps):
        for arch in ("sm_80", "sm_90"):
            assert within_a_quarter(register_model(spec.kernel),
                                    codegen.compile_nvptx(spec, arch).regs), (spec.name, arch)


@needs_ptxas
def test_a_one_wave_kernel_may_take_every_register_for_its_loads():
    """The same 128-thread kernel in a grid that runs one block per SM
    (``min_blocks_per_sm`` 1): no register costs occupancy, so the PTX says so
    (.minnctapersm 1), ptxas hoists all 48 loads (sm_90: 64 registers, SASS waiting on a load
    once, against 40 registers and 3 waits without it) and the model waits one latency."""
    kernel = _chained_inputs_kernel(128)
    kernel.min_blocks_per_sm = 1
    spec = kernel_spec(kernel)
    loads = _profile(spec.kernel).instructions
    assert loads["ld_global"] == 1 and loads["ld_global_overlapped"] == 47
    assert register_model(spec.kernel) > 40
    for arch in ("sm_80", "sm_90"):
        assembled = codegen.compile_nvptx(spec, arch)
        assert ".minnctapersm 1" in assembled.ptx and assembled.spills == 0
        assert within_a_quarter(register_model(spec.kernel), assembled.regs), arch
    assert ".minnctapersm" not in codegen.compile_nvptx(
        kernel_spec(_chained_inputs_kernel(128)), "sm_90").ptx


def test_only_grids_of_one_block_per_sm_are_marked_so():
    """The scheduler marks a kernel whose grid fits the device's SMs (H100: 132) at one block
    each, not one of more blocks."""
    def grid_and_mark(n: int) -> tuple[int, int]:
        module = parse_module(f"""HloModule m
ENTRY %main {{
  %x = f32[{n}]{{0}} parameter(0)
  ROOT %y = f32[{n}]{{0}} exponential(%x)
}}
""")
        spec = codegen.generate(module, ["y"], "k")
        return spec.grid[0], spec.kernel.min_blocks_per_sm

    small, large = grid_and_mark(4096), grid_and_mark(1 << 22)
    assert small[0] <= 132 and small[1] == 1
    assert large[0] > 132 and large[1] == 0


def test_straight_line_loads_overlap_while_their_registers_allow():
    """48 independent loads in one straight-line block: in one-warp blocks, where ptxas hoists
    them all, the block waits one load latency; in blocks of 128 threads, capped at 32
    registers, only a window of them is in flight at once, so it waits once per window."""
    one_warp = _profile(_chained_inputs_kernel(32)).instructions
    assert one_warp["ld_global"] == 1 and one_warp["ld_global_overlapped"] == 47
    four_warps = _profile(_chained_inputs_kernel(128)).instructions
    assert 1 < four_warps["ld_global"] < 48
    assert four_warps["ld_global"] + four_warps["ld_global_overlapped"] == 48


def _gather_kernel(barrier: bool = False) -> Kernel:
    """y[t] = table[idx[t]] + x[t]: the table's load waits for the index's (a dependency
    level); x's load is independent of both. ``barrier``: one between the two loads."""
    tid, bid, row = Var("tid", 32), Var("bid", 1), Var("row", 16)
    idx, x, table, y = (Value(n, "s32" if n == "idx" else "f32") for n in ("idx", "x", "t", "y"))
    flat = Shape("f32", (32,), (0,))
    body = [GlobalLoad(idx, 0, ix(tid)), GlobalLoad(x, 1, ix(tid))] + \
        ([Barrier()] if barrier else []) + \
        [DynamicIndex(row, idx), GlobalLoad(table, 2, ix(row)),
         Compute(y, "add", [table, x]), GlobalStore(3, ix(tid), y)]
    buffers = [Buffer("idx", Shape("s32", (32,), (0,)), False), Buffer("x", flat, False),
               Buffer("table", Shape("f32", (16,), (0,)), False), Buffer("y", flat, True)]
    return Kernel("gather", buffers, (1,), (32,), [], body, tid, bid)


def test_a_load_at_a_loaded_index_waits_for_it():
    counts = _profile(_gather_kernel()).instructions
    assert counts["ld_global"] == 2 and counts["ld_global_overlapped"] == 1


def test_a_barrier_ends_the_block_of_loads_in_flight():
    counts = _profile(_gather_kernel(barrier=True)).instructions
    # idx and x overlap before the barrier; the table's load after it waits on its own.
    assert counts["ld_global"] == 2 and counts["ld_global_overlapped"] == 1
    spec = kernel_spec(_gather_kernel(barrier=True))
    spec.kernel.body.remove(next(s for s in spec.kernel.body if isinstance(s, Barrier)))
    spec.kernel.body.insert(1, Barrier())  # now between idx and x: x overlaps the table
    counts = _profile(spec.kernel).instructions
    assert counts["ld_global"] == 2 and counts["ld_global_overlapped"] == 1
    spec.kernel.body.insert(0, Barrier())  # a barrier before every load changes no load
    again = _profile(spec.kernel).instructions
    assert (again["ld_global"], again["ld_global_overlapped"]) == (2, 1)

@needs_ptxas
def test_a_dead_let_takes_no_register():
    """A guarded store of a scalar to a constant address: the let of the guarded element is
    never read, LLVM deletes it, and ptxas's minimum remains."""
    tid, bid, e = Var("tid", 32), Var("bid", 1), Var("e", 1)
    zero = Value("zero", "s32")
    scalar = Shape("s32", (), ())
    kernel = Kernel("guarded_scalar", [Buffer("a", scalar, True), Buffer("b", scalar, True)],
                    (1,), (32,), [],
                    [Const(zero, 0),
                     If(add(scale(bid, 32), tid), ix(1),
                        [IndexLet(e, add(scale(bid, 32), tid)),
                         GlobalStore(0, ix(0), zero), GlobalStore(1, ix(0), zero)], cmp="lt")],
                    tid, bid)
    spec = kernel_spec(kernel)
    for arch in ("sm_80", "sm_90"):
        assert within_a_quarter(register_model(spec.kernel),
                                codegen.compile_nvptx(spec, arch).regs), arch


@needs_ptxas
@pytest.mark.parametrize("stores", [2, 15])
def test_a_block_of_stores_holds_its_addresses(stores):
    """Beam's packs zero many scalar outputs in one guarded block: ptxas reads every store's
    base address at the block's start (SASS), so all of them are live before the first store
    (15 stores: 42 registers on sm_90, where the model said 15 when it counted one address
    at a time); the first two fit in ptxas's minimum."""
    tid, bid = Var("tid", 32), Var("bid", 1)
    zero = Value("zero", "s32")
    scalar = Shape("s32", (), ())
    buffers = [Buffer(f"out{i}", scalar, True) for i in range(stores)]
    kernel = Kernel("scalar_stores", buffers, (1,), (32,), [],
                    [Const(zero, 0),
                     If(add(scale(bid, 32), tid), ix(1),
                        [GlobalStore(i, ix(0), zero) for i in range(stores)], cmp="lt")],
                    tid, bid)
    spec = kernel_spec(kernel)
    assert within_a_quarter(register_model(spec.kernel), codegen.compile_nvptx(spec, "sm_90").regs)

def _stitched(paths: list[str]):
    # greedy: the kernels the floors below were measured on, planned 3x faster than beam's
    for path in paths:
        result = pipeline.stitch_module(parse_file(path),
                                        pipeline.Options(explorer="greedy", ptxas=False))
        yield from (k.spec for k in result.kernels)


@functools.lru_cache(maxsize=None)
def _one_capture_per_model() -> tuple:
    """One capture per model and size (the other captures stitch the same kernels)."""
    return tuple(_stitched(sorted(glob.glob(os.path.join(HLO, "*_jax_cpu.hlo*")))))


def _check_registers(specs, archs, share_within: float) -> None:
    outcomes = [(spec.name, arch, register_model(spec.kernel),
                 codegen.compile_nvptx(spec, arch).regs) for spec in specs for arch in archs]
    assert outcomes, "no stitched kernels in the corpus"
    misses = [o for o in outcomes if not within_a_quarter(o[2], o[3])]
    assert len(misses) <= (1 - share_within) * len(outcomes), f"model vs ptxas misses: {misses}"


@needs_ptxas
def test_register_model_no_worse_than_measured():
    """A regression floor, not the goal: 104 of 126 kernels (82.5%) were within 25% of
    ptxas after the vector and straight-line lowering of e4654b1, 108 of 125 (86.4%) after the
    Philox, vector-lane and occupancy rules of 803cfa3, 94 of 117 (80.3%) on the kernels of
    2026-11-23 and 100 of 117 (85.5%) with their store addresses read at their block's start;
    the goal of 90% is the slow test below."""
    _check_registers(_one_capture_per_model(), ["sm_90"], share_within=0.84)


@pytest.mark.slow
@needs_ptxas
def test_register_model_within_25_percent_of_ptxas_whole_corpus():
    """The goal, 90% within 25%: 92.1% sm_80, 90.0% sm_90 of 470 corpus kernels (bench_regs after
    803cfa3; 83.4% and 82.8% before it). Not met on 2026-11-23: 85.8% and 83.4% of the 445
    kernels stitched then, 87.4% and 85.8% with store addresses read at their block's start;
    on ac9f8a8 85.0% and 80.9% of 534 kernels, the largest overshoots being grids of one
    block per SM (.minnctapersm 1, modeled with every load hoisted: BERT train JAX H100's
    kernel 1 at 109 against 55 and 35)."""
    specs = list(_stitched(sorted(glob.glob(os.path.join(HLO, "*.hlo*")))))
    _check_registers(specs, ["sm_80", "sm_90"], share_within=0.90)


COPY_HLO = """HloModule copy

ENTRY e {
  p = f32[4096,4096]{1,0} parameter(0)
  ROOT n = f32[4096,4096]{1,0} negate(p)
}
"""


@pytest.mark.parametrize("target", sorted(costmodel.TARGETS))
def test_stitched_copy_is_bandwidth_plus_launch(target):
    device = costmodel.load_device(target)
    spec = codegen.generate(parse_module(COPY_HLO), ["n"], "copy")
    floor = costmodel.kernel_cost(spec.read_bytes + spec.write_bytes, device)
    modeled = modeled_kernel_us(spec, device)
    assert modeled >= floor.total_us
    assert modeled - floor.launch_us <= 1.10 * floor.memory_us


@pytest.mark.parametrize("target", sorted(costmodel.TARGETS))
def test_stitched_reductions_never_beat_their_bytes(target):
    device = costmodel.load_device(target)
    for spec in _one_capture_per_model():
        floor = costmodel.kernel_cost(spec.read_bytes + spec.write_bytes, device).total_us
        assert modeled_kernel_us(spec, device) >= floor, spec.name


def test_xla_kernel_profiles_take_bytes_from_the_graph():
    device = costmodel.load_device("h100")
    graph = build_graph(parse_file(os.path.join(HLO, "layernorm_64x256_jax_a100_classic.hlo")))
    nodes = [n for n in graph.kernel_nodes() if n.memory_intensive]
    assert nodes
    reductions = 0
    for node in nodes:
        profile = xla_kernel_profile(graph, node.name, device)
        assert (profile.bytes_read, profile.bytes_written) == pattern_traffic(graph, [node.name])
        assert profile.grid_blocks * profile.threads_per_block >= 1
        if profile.instructions.get("shfl"):
            reductions += 1
            # one warp per row: 64 rows of LayerNorm
            assert profile.grid_blocks * profile.threads_per_block == 64 * 32
        breakdown = costmodel.kernel_latency_us(profile, device)
        floor = costmodel.kernel_cost(profile.bytes_read + profile.bytes_written, device)
        assert breakdown.total_us >= floor.total_us
    assert reductions >= 1


DYNAMIC_SLICE_HLO = """HloModule ds

fused (p0: f32[64,256], p1: s32[], p2: f32[1,256]) -> f32[1,256] {
  p0 = f32[64,256]{1,0} parameter(0)
  p1 = s32[] parameter(1)
  z = s32[] constant(0)
  ds = f32[1,256]{1,0} dynamic-slice(p0, p1, z), dynamic_slice_sizes={1,256}
  p2 = f32[1,256]{1,0} parameter(2)
  ROOT a = f32[1,256]{1,0} add(ds, p2)
}

ENTRY e {
  t = f32[64,256]{1,0} parameter(0)
  i = s32[] parameter(1)
  b = f32[1,256]{1,0} parameter(2)
  ROOT f = f32[1,256]{1,0} fusion(t, i, b), kind=kLoop, calls=fused
}
"""


def test_only_the_longest_chain_of_a_block_waits():
    """y = exp(x) + x * x: the exponential's chain (SFU, fp32 and integer steps) and the add
    after it wait their latency; the multiply beside it issues while they wait."""
    tid, bid = Var("tid", 128), Var("bid", 1)
    shape = Shape("f32", (128,), (0,))
    x, e, sq, y = (Value(n, "f32") for n in ("x", "e", "sq", "y"))
    body = [GlobalLoad(x, 0, ix(tid)), Compute(e, "exponential", [x]),
            Compute(sq, "multiply", [x, x]), Compute(y, "add", [e, sq]),
            GlobalStore(1, ix(tid), y)]
    kernel = Kernel("k", [Buffer("x", shape, False), Buffer("y", shape, True)], (1,), (128,),
                    [], body, tid, bid)
    counts = _profile(kernel).instructions
    assert (counts["sfu"], counts["fp32"], counts["fp32_overlapped"]) == (1, 8 + 1, 1)


CHAINS_HLO = """
HloModule chains

fused {
  p0 = f32[4096]{0} parameter(0)
  e = f32[4096]{0} exponential(p0)
  sq = f32[4096]{0} multiply(p0, p0)
  ROOT y = f32[4096]{0} add(e, sq)
}

ENTRY e {
  x = f32[4096]{0} parameter(0)
  ROOT f = f32[4096]{0} fusion(x), kind=kLoop, calls=fused
}
"""


def test_xla_kernels_wait_for_the_longest_chain_of_an_element():
    """The same y = exp(x) + x * x as an XLA loop fusion, one element per thread: the
    exponential and the add wait, the multiply issues behind them."""
    graph = build_graph(parse_module(CHAINS_HLO))
    counts = xla_kernel_profile(graph, "f", costmodel.load_device("h100")).instructions
    assert (counts["sfu"], counts["fp32"], counts["fp32_overlapped"]) == (1, 8 + 1, 1)


def test_xla_kernels_wait_once_per_dependency_level():
    """XLA's dynamic-slice fusion: the start index and the added row are loaded on one level,
    the sliced table on the next (its address needs the index)."""
    graph = build_graph(parse_module(DYNAMIC_SLICE_HLO))
    assert load_levels(fused_instructions(graph, "f")) == {"p0": 2, "p1": 1, "p2": 1}
    counts = xla_kernel_profile(graph, "f", costmodel.load_device("h100")).instructions
    # 256 threads: one element of the sliced row per thread on level 2 (XLA reads only the
    # slice, graph/demand.py), one index and one row element on level 1
    assert counts["ld_global"] == 1 + 1 and counts["ld_global_overlapped"] == 1


def test_gather_form_scatter_is_modeled_faster_than_xla_kernels_it_replaces():
    """BERT training on H100: the token-type embedding's gradient (32 windows of straight-line
    code whose loads are all independent) with its zero table and Adam step is priced below
    XLA's three kernels (the pipeline's cost guard); with every load waiting a full latency it
    was modeled at 10.9 us against XLA's 5.2 us."""
    module = parse_file(os.path.join(HLO, "bert_train_small_jax_h100.hlo.gz"))
    nodes = ["loop_broadcast_fusion", "input_scatter_fusion", "loop_add_subtract_fusion.10"]
    device = costmodel.load_device("h100")
    graph = build_graph(module)
    xla = sum(costmodel.kernel_latency_us(xla_kernel_profile(graph, n, device), device).total_us
              for n in nodes)
    assert modeled_kernel_us(codegen.generate(module, nodes, "k"), device) < xla
