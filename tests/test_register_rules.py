"""The register model's rules against ptxas, each a snippet whose SASS shows the rule:
where ptxas issues loads, how it shares address registers, what takes a register."""
from __future__ import annotations

import numpy as np

from fusionstitching import codegen
from fusionstitching.codegen.cost.registers import register_model
from fusionstitching.codegen.index_expr import Var, add, ix, mod, scale
from fusionstitching.codegen.kernel_ir import (Accumulate, Barrier, Buffer, Compute, Const,
                                               ConstArray, ConstLoad, GlobalLoad, GlobalStore,
                                               If, Kernel, Loop, SharedArray, SharedLoad,
                                               SharedStore, Value)
from fusionstitching.hlo.ir import Shape
from fusionstitching.hlo.parser import parse_module

from helpers import kernel_spec, needs_ptxas, within_a_quarter


LAYERNORM_ROWS = """HloModule layernorm_rows

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[8,384], bias: f32[384], gamma: f32[384], beta: f32[384]) -> f32[8,384] {
  %x = f32[8,384]{1,0} parameter(0)
  %bias = f32[384]{0} parameter(1)
  %gamma = f32[384]{0} parameter(2)
  %beta = f32[384]{0} parameter(3)
  %bb = f32[8,384]{1,0} broadcast(%bias), dimensions={1}
  %y = f32[8,384]{1,0} add(%x, %bb)
  %zero = f32[] constant(0)
  %sum = f32[8]{0} reduce(%y, %zero), dimensions={1}, to_apply=%add
  %n = f32[] constant(0.0026041667)
  %nb = f32[8]{0} broadcast(%n), dimensions={}
  %mean = f32[8]{0} multiply(%sum, %nb)
  %mb = f32[8,384]{1,0} broadcast(%mean), dimensions={0}
  %c = f32[8,384]{1,0} subtract(%y, %mb)
  %c2 = f32[8,384]{1,0} multiply(%c, %c)
  %ss = f32[8]{0} reduce(%c2, %zero), dimensions={1}, to_apply=%add
  %var = f32[8]{0} multiply(%ss, %nb)
  %e = f32[] constant(1e-06)
  %eb = f32[8]{0} broadcast(%e), dimensions={}
  %ve = f32[8]{0} add(%var, %eb)
  %r = f32[8]{0} rsqrt(%ve)
  %rb = f32[8,384]{1,0} broadcast(%r), dimensions={0}
  %gb = f32[8,384]{1,0} broadcast(%gamma), dimensions={1}
  %betab = f32[8,384]{1,0} broadcast(%beta), dimensions={1}
  %nrm = f32[8,384]{1,0} multiply(%c, %rb)
  %sc = f32[8,384]{1,0} multiply(%nrm, %gb)
  ROOT %out = f32[8,384]{1,0} add(%sc, %betab)
}
"""


@needs_ptxas
def test_loads_after_a_warp_reduction_are_issued_in_its_latency_not_at_the_blocks_start():
    """ConvNeXt's LayerNorm rows (one warp per row of 384): ptxas issues gamma's and beta's
    loads inside the first warp reduction (SASS), not above the row's own loads, so they do
    not live beside them (model 64 when hoisted to the block's start; ptxas 48)."""
    module = parse_module(LAYERNORM_ROWS)
    nodes = [i.name for i in module.entry.instructions
             if i.opcode not in ("parameter", "constant")]
    spec = codegen.generate(module, nodes, "layernorm_rows")
    assert "warp schedule" in spec.why
    assert within_a_quarter(register_model(spec.kernel), codegen.compile_nvptx(spec, "sm_90").regs)


@needs_ptxas
def test_stores_to_one_buffer_at_constant_distances_share_one_address():
    """A thread schedule's stages store one thread's 8 results to one buffer, 40 elements
    apart: the SASS addresses all of them from one register pair ([R2.64+0xa0], ...), so
    the block's stores hold one address, not 8 (model 32, ptxas 22, when it held 8)."""
    tid, bid = Var("tid", 64), Var("bid", 1)
    rows, n = 40, 8
    shape = Shape("f32", (n, rows), (1, 0))
    xs = [Value(f"x{k}", "f32") for k in range(n)]
    body = [GlobalLoad(x, 0, add(tid, rows * k)) for k, x in enumerate(xs)]
    total = xs[0]
    for k, x in enumerate(xs[1:]):
        partial = Value(f"s{k}", "f32")
        body.append(Compute(partial, "add", [total, x]))
        total = partial
    for k, x in enumerate(xs):
        centered = Value(f"d{k}", "f32")
        body += [Compute(centered, "subtract", [x, total]),
                 GlobalStore(1, add(tid, rows * k), centered)]
    kernel = Kernel("centered_columns", [Buffer("x", shape, False), Buffer("out", shape, True)],
                    (1,), (64,), [], [If(ix(tid), ix(rows), body, cmp="lt")], tid, bid)
    spec = kernel_spec(kernel)
    assert within_a_quarter(register_model(spec.kernel), codegen.compile_nvptx(spec, "sm_90").regs)


def _one_wave(name: str, buffers: list, body: list, shared=(), constants=()) -> Kernel:
    """One block of 128 threads, marked one block per SM (as the tier's kernels are)."""
    kernel = Kernel(name, buffers, (1,), (128,), list(shared), body, Var("tid", 128),
                    Var("bid", 1), list(constants))
    kernel.min_blocks_per_sm = 1
    return kernel


def _fold(n: int, term, combine: str) -> tuple[list, Value]:
    """Statements of combine(term(0), ..., term(n - 1)) left to right, and its value;
    ``term(k)`` gives a term's statements and value."""
    body, total = [], None
    for k in range(n):
        statements, value = term(k)
        body += statements
        if total is not None:
            body.append(Compute(Value(f"acc{k}", "f32"), combine, [total, value]))
            value = body[-1].dst
        total = value
    return body, total


def _assert_within_ptxas(kernel: Kernel) -> None:
    spec = kernel_spec(kernel)
    for arch in ("sm_80", "sm_90"):
        assert within_a_quarter(register_model(spec.kernel),
                                codegen.compile_nvptx(spec, arch).regs), arch


@needs_ptxas
def test_a_rolled_loops_loads_issue_at_its_top_from_one_pointer():
    """A rolled loop whose body loads one buffer at 16 constant distances: the SASS issues
    all 16 LDGs at the body's top, [R4.64], [R4.64+0x200], ... from one stepped pointer
    (model 59 with a pointer per access and the loads where they stand; ptxas 27)."""
    tid, row, n = Var("tid", 128), Var("r", 64), 16
    xs = [Value(f"x{k}", "f32") for k in range(n)]
    body = [GlobalLoad(x, 0, add(scale(row, 128 * n), tid, 128 * k)) for k, x in enumerate(xs)]
    total = xs[0]
    for k, x in enumerate(xs[1:]):
        body.append(Compute(Value(f"c{k}", "f32"), "multiply" if k % 2 else "add", [total, x]))
        total = body[-1].dst
    zero, summed = Value("zero", "f32"), Value("sum", "f32")
    _assert_within_ptxas(_one_wave(
        "rolled_loads", [Buffer("x", Shape("f32", (64, n, 128), (2, 1, 0)), False),
                         Buffer("y", Shape("f32", (128,), (0,)), True)],
        [Const(zero, 0.0), Loop(row, ix(0), 64, 1, body, [Accumulate(summed, "add", zero, total)]),
         GlobalStore(1, ix(tid), summed)]))


@needs_ptxas
def test_shared_loads_issue_at_their_blocks_start():
    """After the barrier each thread reads 16 rows of a neighbour's shared values and stores
    them scaled: the SASS issues the 16 LDS right after the barrier, before the multiplies
    that read them (model 14 with them where they stand; ptxas 32)."""
    tid, n = Var("tid", 128), 16
    rows = SharedArray("rows", "f32", 128 * n)
    x, g = Value("x", "f32"), Value("g", "f32")
    body = [GlobalLoad(x, 0, ix(tid))] + \
        [SharedStore(rows, add(tid, 128 * k), x) for k in range(n)] + \
        [Barrier(), GlobalLoad(g, 1, ix(tid))]
    for k in range(n):
        read, scaled = Value(f"r{k}", "f32"), Value(f"s{k}", "f32")
        body += [SharedLoad(read, rows, add(mod(add(tid, 1), 128), 128 * k)),
                 Compute(scaled, "multiply", [read, g]),
                 GlobalStore(2, add(tid, 128 * k), scaled)]
    column = Shape("f32", (128,), (0,))
    _assert_within_ptxas(_one_wave(
        "shared_rows", [Buffer("x", column, False), Buffer("g", column, False),
                        Buffer("y", Shape("f32", (128 * n,), (0,)), True)], body, [rows]))


@needs_ptxas
def test_a_constant_table_at_a_varying_index_is_loaded_like_an_input():
    """y = sum_k x[k] * table[k] at tid-dependent indices (a rotary table): the table's
    elements are LDG.E.CONSTANTs issued with x's (model 27 with them as values defined
    where they stand; ptxas 40)."""
    tid, n = Var("tid", 128), 16
    table = ConstArray("table", "f32", np.linspace(0, 1, 128 * n, dtype=np.float32))

    def term(k):
        a, c, p = (Value(f"{v}{k}", "f32") for v in "acp")
        return [GlobalLoad(a, 0, add(tid, 128 * k)), ConstLoad(c, table, add(tid, 128 * k)),
                Compute(p, "multiply", [a, c])], p
    body, total = _fold(n, term, "add")
    body.append(GlobalStore(1, ix(tid), total))
    _assert_within_ptxas(_one_wave(
        "const_table", [Buffer("x", Shape("f32", (128 * n,), (0,)), False),
                        Buffer("y", Shape("f32", (128,), (0,)), True)], body,
        constants=[table]))


@needs_ptxas
def test_a_loaded_bool_takes_a_register():
    """A masked maximum over 16 bool and 16 float inputs: each bool is an LDG.E.U8 into a
    register, all hoisted with the floats (model 27 with bools in predicates; ptxas 40)."""
    tid, n = Var("tid", 128), 16
    low = Value("low", "f32")

    def term(k):
        m, a, s = Value(f"m{k}", "pred"), Value(f"a{k}", "f32"), Value(f"s{k}", "f32")
        return [GlobalLoad(m, 0, add(tid, 128 * k)), GlobalLoad(a, 1, add(tid, 128 * k)),
                Compute(s, "select", [m, a, low])], s
    body, total = _fold(n, term, "maximum")
    body = [Const(low, -1e9)] + body + [GlobalStore(2, ix(tid), total)]
    _assert_within_ptxas(_one_wave(
        "bool_mask", [Buffer("m", Shape("pred", (128 * n,), (0,)), False),
                      Buffer("x", Shape("f32", (128 * n,), (0,)), False),
                      Buffer("y", Shape("f32", (128,), (0,)), True)], body))


@needs_ptxas
def test_store_addresses_are_hoisted_only_up_to_the_full_occupancy():
    """12 loads, then 12 results each stored to its own buffer: the SASS reads 7 of the 12
    store bases (LDC.64) before the first store and the other 5 into the registers the first
    stores free, staying at 32, the full occupancy of 128 threads (model 44 when every
    store's address was hoisted to the block's start; ptxas 32 on sm_80 and sm_90)."""
    tid, n = Var("tid", 128), 12
    column = Shape("f32", (128,), (0,))
    decay = Value("decay", "f32")
    xs = [Value(f"x{k}", "f32") for k in range(n)]
    body = [Const(decay, 0.9)] + [GlobalLoad(x, k, ix(tid)) for k, x in enumerate(xs)]
    for k in range(n):
        a, b = Value(f"a{k}", "f32"), Value(f"b{k}", "f32")
        body += [Compute(a, "multiply", [xs[k], decay]),
                 Compute(b, "add", [a, xs[(k + 1) % n]]),
                 GlobalStore(n + k, ix(tid), b)]
    _assert_within_ptxas(_one_wave(
        "many_stores", [Buffer(f"x{k}", column, False) for k in range(n)] +
        [Buffer(f"y{k}", column, True) for k in range(n)], body))
