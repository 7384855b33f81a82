"""Small while loops unrolled on the host route (hlo/unroll.py): the unrolled module gives
XLA:CPU's numbers bit for bit, a loop of floats, of dots or of unknown trip count stays rolled
(and says why), and dropout's threefry loops are stitched into kernels by fusionstitching.jit."""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fusionstitching.hlo import unroll  # noqa: E402
from fusionstitching.hlo.ir import print_module  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402
from fusionstitching.hlo.xla_runner import optimized_hlo_text, run_hlo_with_xla  # noqa: E402
from fusionstitching.pipeline import Options, stitch_module  # noqa: E402
from fusionstitching.stitched_jit import jit  # noqa: E402

# XLA:CPU's optimized form of a fori_loop of integer arithmetic: the state copied each
# iteration (with control predecessors), one loop fusion, the counter's add; XLA annotated the
# trip count.
LOOP = """HloModule loop, entry_computation_layout={(u32[8,16]{1,0})->u32[8,16]{1,0}}

%fused_step (p0: u32[8,16], p1: s32[]) -> u32[8,16] {
  %p0 = u32[8,16]{1,0} parameter(0)
  %c = u32[] constant(2654435761)
  %b = u32[8,16]{1,0} broadcast(%c), dimensions={}
  %m = u32[8,16]{1,0} multiply(%p0, %b)
  %p1 = s32[] parameter(1)
  %f = u32[] convert(%p1)
  %bf = u32[8,16]{1,0} broadcast(%f), dimensions={}
  ROOT %a = u32[8,16]{1,0} xor(%m, %bf)
}

%add_one (q0: s32[], q1: s32[]) -> s32[] {
  %q0 = s32[] parameter(0)
  %q1 = s32[] parameter(1)
  ROOT %s = s32[] add(%q0, %q1)
}

%body (state: (s32[], u32[8,16])) -> (s32[], u32[8,16]) {
  %state = (s32[], u32[8,16]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %x = u32[8,16]{1,0} get-tuple-element(%state), index=1
  %i.copy = s32[] copy(%i)
  %x.copy = u32[8,16]{1,0} copy(%x), control-predecessors={%i.copy}
  %one = s32[] constant(1)
  %next = u32[8,16]{1,0} fusion(%x.copy, %i.copy), kind=kLoop, calls=%fused_step
  %i.next = s32[] fusion(%i.copy, %one), kind=kLoop, calls=%add_one
  ROOT %out = (s32[], u32[8,16]{1,0}) tuple(%i.next, %next)
}

%less (c: s32[], d: s32[]) -> pred[] {
  %c = s32[] parameter(0)
  %d = s32[] parameter(1)
  ROOT %lt = pred[] compare(%c, %d), direction=LT
}

%cond (cstate: (s32[], u32[8,16])) -> pred[] {
  %cstate = (s32[], u32[8,16]{1,0}) parameter(0)
  %ci = s32[] get-tuple-element(%cstate), index=0
  %n = s32[] constant(4)
  ROOT %go = pred[] fusion(%ci, %n), kind=kLoop, calls=%less
}

ENTRY %main (x0: u32[8,16]) -> u32[8,16] {
  %x0 = u32[8,16]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], u32[8,16]{1,0}) tuple(%zero, %x0)
  %loop = (s32[], u32[8,16]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"},"known_init_step":{"init":"0","step":"1"},"known_induction_variable":{"tuple_index":"0"}}
  %last = u32[8,16]{1,0} get-tuple-element(%loop), index=1
  ROOT %result = u32[8,16]{1,0} negate(%last)
}
"""


def loop_module(text: str = LOOP):
    return parse_module(text, "loop.hlo")


def reads(module):
    return [module.entry.by_name()[u] for u in module.entry.users()["loop"]]


def test_a_loop_of_known_trip_count_is_unrolled_and_gives_xlas_numbers():
    module = loop_module()
    unrolled = unroll.unroll_loops(module)
    opcodes = [i.opcode for i in unrolled.entry.instructions]
    assert "while" not in opcodes
    # four iterations of the step's fusion; the state's copies went, and so did the counter
    # after the last step (nothing reads it)
    assert opcodes.count("fusion") == 4 + 3 and "copy" not in opcodes
    assert {c.name for c in unrolled.computations} == {"fused_step", "add_one", "main"}
    x = np.random.default_rng(0).integers(0, 2**32, (8, 16), dtype=np.uint32)
    (want,) = run_hlo_with_xla(LOOP, [x])
    (got,) = run_hlo_with_xla(print_module(unrolled), [x])
    np.testing.assert_array_equal(got, want)


def test_a_loop_read_by_the_root_gives_xlas_numbers():
    text = LOOP.replace("%last = u32[8,16]{1,0}", "ROOT %last = u32[8,16]{1,0}").replace(
        "  ROOT %result = u32[8,16]{1,0} negate(%last)\n", "")
    unrolled = unroll.unroll_loops(loop_module(text))
    assert unrolled.entry.root.name == "last"
    assert unrolled.entry.by_name()["loop"].opcode == "tuple"
    x = np.random.default_rng(0).integers(0, 2**32, (8, 16), dtype=np.uint32)
    (want,) = run_hlo_with_xla(text, [x])
    (got,) = run_hlo_with_xla(print_module(unrolled), [x])
    np.testing.assert_array_equal(got, want)


def test_a_loop_of_float_arithmetic_stays_rolled():
    module = loop_module(LOOP.replace("u32[8,16]", "f32[8,16]").replace(
        "u32[] constant(2654435761)", "f32[] constant(1.5)").replace(
        "%f = u32[] convert", "%f = f32[] convert").replace("xor(%m, %bf)", "add(%m, %bf)"))
    loop = module.entry.by_name()["loop"]
    why = unroll.unrollable_trips(module, loop, reads(module))
    assert why.kind is unroll.RolledKind.FLOATING_POINT
    assert unroll.unroll_loops(module) is module


def test_a_loop_of_dots_stays_rolled():
    text = LOOP.replace("%m = u32[8,16]{1,0} multiply(%p0, %b)",
                        "%m = u32[8,16]{1,0} dot(%p0, %b), lhs_contracting_dims={1}, "
                        "rhs_contracting_dims={0}")
    text = text.replace("%b = u32[8,16]{1,0} broadcast(%c), dimensions={}",
                        "%b = u32[16,16]{1,0} broadcast(%c), dimensions={}")
    module = loop_module(text)
    loop = module.entry.by_name()["loop"]
    why = unroll.unrollable_trips(module, loop, reads(module))
    assert why.kind is unroll.RolledKind.KEPT_OPCODE and "dot" in why.detail
    assert unroll.unroll_loops(module) is module


def test_a_loop_without_a_known_trip_count_stays_rolled():
    module = loop_module(LOOP.replace('"known_trip_count":{"n":"4"},', ""))
    loop = module.entry.by_name()["loop"]
    why = unroll.unrollable_trips(module, loop, reads(module))
    assert why.kind is unroll.RolledKind.NO_TRIP_COUNT
    assert unroll.unroll_loops(module) is module


def test_a_loop_too_large_to_unroll_stays_rolled(monkeypatch):
    monkeypatch.setattr(unroll, "MAX_UNROLLED_INSTRUCTIONS", 4 * 9 - 1)  # the body has 9
    module = loop_module()
    loop = module.entry.by_name()["loop"]
    why = unroll.unrollable_trips(module, loop, reads(module))
    assert why.kind is unroll.RolledKind.TOO_LARGE


def dropout(key, x):
    keys = jax.random.split(key, 3)
    return [jnp.where(jax.random.bernoulli(k, 0.9, x.shape), x / 0.9, 0.0) for k in keys]


@pytest.mark.parametrize("keep", ["stitched"])
def test_dropouts_threefry_loops_are_stitched_with_xlas_bits(keep):
    key, x = jax.random.key(0), jnp.asarray(
        np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32))
    fn = jit(dropout, cache_dir=None, keep=keep)
    got = fn(key, x)
    (compiled,) = fn._compiled.values()
    assert compiled.wait_built(120)
    built = compiled.executor.built
    xla_text = jax.jit(dropout).lower(key, x).compile().as_text()
    assert " while(" in xla_text  # XLA:CPU runs jax's threefry as a rolled loop
    assert built.rewritten_hlo is not None and " while(" not in built.rewritten_hlo
    assert built.stitched_report.fallbacks == []
    for a, b in zip(fn(key, x), jax.jit(dropout)(key, x)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert len(got) == 3


def folded_dropout(key, x):
    """fold_in's loop result is read through a bitcast (u32[1] as u32[]) by the next loop."""
    return jnp.where(jax.random.bernoulli(jax.random.fold_in(key, 3), 0.9, x.shape),
                     x / 0.9, 0.0)


def test_a_bitcast_between_unrolled_loops_is_a_reshape_the_kernel_computes():
    key, x = jax.random.key(0), jnp.zeros((4, 32))
    module = parse_module(optimized_hlo_text(jax.jit(folded_dropout).lower(key, x).compile()))
    assert any(i.opcode == "bitcast" for i in module.entry.instructions)
    unrolled = unroll.unroll_loops(module)
    assert not any(i.opcode == "bitcast" for i in unrolled.entry.instructions)
    # as a bitcast the plan looked through it, and the kernel read it from outside: a cycle
    result = stitch_module(unrolled, Options(target="h100", ptxas=False, host=True))
    assert result.report.fallbacks == [] and len(result.kernels) == 1
    args = [np.asarray(jax.random.key_data(key)), np.zeros((4, 32), np.float32)]
    for a, b in zip(run_hlo_with_xla(print_module(unrolled), args),
                    run_hlo_with_xla(print_module(module), args)):
        np.testing.assert_array_equal(a, b)
