"""Code generator coverage: one small HLO snippet per op family / schedule, stitched into one
kernel, run on the host backend and compared with XLA:CPU running the same module (jaxlib);
the same kernels assemble with ptxas (sm_80, sm_90) without spills. Also the paper's models'
patterns (BatchNorm training, softmax cross-entropy backward, Adam) as one kernel each, every
enumerated schedule checked, and shared-memory reuse."""
from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from costmodel import load_device  # noqa: E402
from fusionstitching.capture import jax_hlo  # noqa: E402
from fusionstitching.codegen import Refusal, can_stitch, compile_host, generate  # noqa: E402
from fusionstitching.codegen.flatten import flatten  # noqa: E402
from fusionstitching.codegen.kernel_ir import If, Loop  # noqa: E402
from fusionstitching.codegen.schedules.candidates import enumerate_schedules  # noqa: E402
from fusionstitching.codegen.schedules.choose import build_kernel  # noqa: E402
from fusionstitching.codegen.schedules.shared_memory import reuse_shared_memory  # noqa: E402
from fusionstitching.codegen.schedules.space import reduction_space  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402
from helpers_codegen import (assert_assembles_without_spills, check_against_xla,  # noqa: E402
                             kernel_nodes, module_text)

# name -> (entry parameters, entry body); every non-trivial instruction is one pattern.
SNIPPETS = {
    "unary_float": ("x: f32[4,64]", """
  %x = f32[4,64]{1,0} parameter(0)
  %a = f32[4,64]{1,0} tanh(%x)
  %b = f32[4,64]{1,0} logistic(%a)
  %c = f32[4,64]{1,0} exponential-minus-one(%b)
  %d = f32[4,64]{1,0} log-plus-one(%c)
  %e = f32[4,64]{1,0} sine(%d)
  %f = f32[4,64]{1,0} cosine(%e)
  %g = f32[4,64]{1,0} erf(%f)
  %h = f32[4,64]{1,0} abs(%x)
  %i = f32[4,64]{1,0} cbrt(%h)
  %j = f32[4,64]{1,0} floor(%x)
  %k = f32[4,64]{1,0} round-nearest-even(%x)
  %l = f32[4,64]{1,0} round-nearest-afz(%x)
  %m = f32[4,64]{1,0} sign(%x)
  %n = f32[4,64]{1,0} atan2(%x, %g)
  %o = f32[4,64]{1,0} remainder(%x, %i)
  %p = f32[4,64]{1,0} add(%n, %o)
  %q = f32[4,64]{1,0} add(%j, %k)
  %r = f32[4,64]{1,0} add(%l, %m)
  %s = f32[4,64]{1,0} add(%q, %r)
  %t = f32[4,64]{1,0} ceil(%x)
  %u = f32[4,64]{1,0} add(%s, %t)
  ROOT %out = (f32[4,64]{1,0}, f32[4,64]{1,0}) tuple(%p, %u)"""),
    "integer_and_compare": ("x: s32[8,32], y: s32[8,32]", """
  %x = s32[8,32]{1,0} parameter(0)
  %y = s32[8,32]{1,0} parameter(1)
  %d = s32[8,32]{1,0} divide(%x, %y)
  %r = s32[8,32]{1,0} remainder(%x, %y)
  %three = s32[] constant(3)
  %b3 = s32[8,32]{1,0} broadcast(%three), dimensions={}
  %sh = s32[8,32]{1,0} shift-right-arithmetic(%x, %b3)
  %xo = s32[8,32]{1,0} xor(%sh, %d)
  %cmp = pred[8,32]{1,0} compare(%x, %y), direction=GT
  %sel = s32[8,32]{1,0} select(%cmp, %xo, %r)
  %lo = s32[] constant(-5)
  %hi = s32[] constant(7)
  %cl = s32[8,32]{1,0} clamp(%lo, %sel, %hi)
  %w = s64[8,32]{1,0} convert(%cl)
  %f = f32[8,32]{1,0} convert(%w)
  ROOT %n = s32[8,32]{1,0} convert(%f)"""),
    # Threefry-style random bits and their uniform floats (dropout in every training model):
    # u32/u64 wrap-around arithmetic, logical shifts, unsigned compare/max/divide, constants
    # above the signed range, u64 -> u32 high word, bits -> f32 through bitcast-convert.
    "unsigned_random_bits": ("x: u32[8,32], y: u32[8,32]", """
  %x = u32[8,32]{1,0} parameter(0)
  %y = u32[8,32]{1,0} parameter(1)
  %k = u32[] constant(2654435769)
  %bk = u32[8,32]{1,0} broadcast(%k), dimensions={}
  %a = u32[8,32]{1,0} add(%x, %bk)
  %m = u32[8,32]{1,0} multiply(%a, %y)
  %c13 = u32[] constant(13)
  %b13 = u32[8,32]{1,0} broadcast(%c13), dimensions={}
  %c19 = u32[] constant(19)
  %b19 = u32[8,32]{1,0} broadcast(%c19), dimensions={}
  %l = u32[8,32]{1,0} shift-left(%m, %b13)
  %r = u32[8,32]{1,0} shift-right-logical(%m, %b19)
  %o = u32[8,32]{1,0} or(%l, %r)
  %xo = u32[8,32]{1,0} xor(%o, %y)
  %d = u32[8,32]{1,0} divide(%xo, %y)
  %rem = u32[8,32]{1,0} remainder(%xo, %y)
  %cmp = pred[8,32]{1,0} compare(%d, %rem), direction=GT
  %mx = u32[8,32]{1,0} maximum(%d, %rem)
  %sel = u32[8,32]{1,0} select(%cmp, %mx, %xo)
  %w = u64[8,32]{1,0} convert(%sel)
  %g = u64[] constant(11400714819323198485)
  %bg = u64[8,32]{1,0} broadcast(%g), dimensions={}
  %w2 = u64[8,32]{1,0} multiply(%w, %bg)
  %c32 = u64[] constant(32)
  %b32 = u64[8,32]{1,0} broadcast(%c32), dimensions={}
  %hi = u64[8,32]{1,0} shift-right-logical(%w2, %b32)
  %h32 = u32[8,32]{1,0} convert(%hi)
  %c9 = u32[] constant(9)
  %b9 = u32[8,32]{1,0} broadcast(%c9), dimensions={}
  %mant = u32[8,32]{1,0} shift-right-logical(%h32, %b9)
  %one = u32[] constant(1065353216)
  %bone = u32[8,32]{1,0} broadcast(%one), dimensions={}
  %bits = u32[8,32]{1,0} or(%mant, %bone)
  %f12 = f32[8,32]{1,0} bitcast-convert(%bits)
  %fone = f32[] constant(1)
  %bfone = f32[8,32]{1,0} broadcast(%fone), dimensions={}
  %uniform = f32[8,32]{1,0} subtract(%f12, %bfone)
  %asf = f32[8,32]{1,0} convert(%sel)
  ROOT %out = (f32[8,32]{1,0}, f32[8,32]{1,0}, u32[8,32]{1,0}) tuple(%uniform, %asf, %h32)"""),
    "half_precision": ("x: bf16[4,64], y: f16[4,64]", """
  %x = bf16[4,64]{1,0} parameter(0)
  %y = f16[4,64]{1,0} parameter(1)
  %e = bf16[4,64]{1,0} exponential(%x)
  %m = bf16[4,64]{1,0} multiply(%e, %x)
  %yb = bf16[4,64]{1,0} convert(%y)
  %s = bf16[4,64]{1,0} add(%m, %yb)
  %c = pred[4,64]{1,0} compare(%s, %x), direction=LT
  %z = bf16[4,64]{1,0} select(%c, %s, %x)
  %h = f16[4,64]{1,0} convert(%z)
  %hm = f16[4,64]{1,0} multiply(%h, %y)
  ROOT %out = (bf16[4,64]{1,0}, f16[4,64]{1,0}) tuple(%z, %hm)"""),
    "data_movement": ("x: f32[6,10], y: f32[6,4]", """
  %x = f32[6,10]{1,0} parameter(0)
  %y = f32[6,4]{1,0} parameter(1)
  %cat = f32[6,14]{1,0} concatenate(%x, %y), dimensions={1}
  %rev = f32[6,14]{1,0} reverse(%cat), dimensions={0,1}
  %zero = f32[] constant(0.5)
  %pad = f32[8,28]{1,0} pad(%rev, %zero), padding=1_1x0_1_1
  %sl = f32[4,15]{1,0} slice(%pad), slice={[1:8:2], [2:17]}
  %t = f32[15,4]{0,1} transpose(%sl), dimensions={1,0}
  %c = f32[15,4]{1,0} copy(%t)
  %r = f32[60]{0} reshape(%c)
  %io = s32[60]{0} iota(), iota_dimension=0
  %iof = f32[60]{0} convert(%io)
  %k = f32[3]{0} constant({1.5, -2, 4})
  %kb = f32[20,3]{1,0} broadcast(%k), dimensions={1}
  %kr = f32[60]{0} reshape(%kb)
  %sum = f32[60]{0} add(%r, %iof)
  ROOT %prod = f32[60]{0} multiply(%sum, %kr)"""),
    "dynamic_and_gather": ("x: f32[16,8], i: s32[], u: f32[3,8], idx: s32[5]", """
  %x = f32[16,8]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %u = f32[3,8]{1,0} parameter(2)
  %idx = s32[5]{0} parameter(3)
  %zero = s32[] constant(0)
  %ds = f32[4,8]{1,0} dynamic-slice(%x, %i, %zero), dynamic_slice_sizes={4,8}
  %dus = f32[16,8]{1,0} dynamic-update-slice(%x, %u, %i, %zero)
  %g = f32[5,8]{1,0} gather(%dus, %idx), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}
  ROOT %out = (f32[4,8]{1,0}, f32[5,8]{1,0}) tuple(%ds, %g)"""),
    # An Adam update of a weight gradient reduced in the other layout (DIEN, Transformer
    # training from TF): the reduction is read only through the transpose.
    "reduction_read_transposed": ("x: f32[16,8,6], m: f32[6,8]", """
  %x = f32[16,8,6]{2,1,0} parameter(0)
  %m = f32[6,8]{1,0} parameter(1)
  %zero = f32[] constant(0)
  %r = f32[8,6]{1,0} reduce(%x, %zero), dimensions={0}, to_apply=%add
  %t = f32[6,8]{1,0} transpose(%r), dimensions={1,0}
  %d = f32[6,8]{1,0} subtract(%t, %m)
  %s = f32[6,8]{1,0} multiply(%t, %t)
  ROOT %o = (f32[6,8]{1,0}, f32[6,8]{1,0}) tuple(%d, %s)"""),
    "reduction_of_middle_dim_read_permuted": ("x: f32[4,3,5,2]", """
  %x = f32[4,3,5,2]{3,2,1,0} parameter(0)
  %zero = f32[] constant(0)
  %r = f32[4,5,2]{2,1,0} reduce(%x, %zero), dimensions={1}, to_apply=%max
  %t = f32[2,4,5]{2,1,0} transpose(%r), dimensions={2,0,1}
  ROOT %e = f32[2,4,5]{2,1,0} exponential(%t)"""),
    "column_reduction_with_consumer": ("x: f32[64,32]", """
  %x = f32[64,32]{1,0} parameter(0)
  %z = f32[] constant(0)
  %s = f32[32]{0} reduce(%x, %z), dimensions={0}, to_apply=%add
  %n = f32[] constant(0.015625)
  %nb = f32[32]{0} broadcast(%n), dimensions={}
  %mean = f32[32]{0} multiply(%s, %nb)
  %mb = f32[64,32]{1,0} broadcast(%mean), dimensions={1}
  %d = f32[64,32]{1,0} subtract(%x, %mb)
  %sq = f32[64,32]{1,0} multiply(%d, %d)
  %v = f32[32]{0} reduce(%sq, %z), dimensions={0}, to_apply=%add
  %var = f32[32]{0} multiply(%v, %nb)
  %vb = f32[64,32]{1,0} broadcast(%var), dimensions={1}
  %y = f32[64,32]{1,0} divide(%d, %vb)
  ROOT %out = (f32[64,32]{1,0}, f32[32]{0}, f32[32]{0}) tuple(%y, %mean, %var)"""),
    "reduce_middle_dims_and_packing": ("x: f32[4,16,8], b: s32[7]", """
  %x = f32[4,16,8]{2,1,0} parameter(0)
  %b = s32[7]{0} parameter(1)
  %m = f32[] constant(-inf)
  %r = f32[4,8]{1,0} reduce(%x, %m), dimensions={1}, to_apply=%max
  %rb = f32[4,16,8]{2,1,0} broadcast(%r), dimensions={0,2}
  %e = f32[4,16,8]{2,1,0} subtract(%x, %rb)
  %bs = s32[7]{0} multiply(%b, %b)
  ROOT %out = (f32[4,16,8]{2,1,0}, s32[7]{0}) tuple(%e, %bs)"""),
}


@functools.cache
def snippet(name: str):
    params, body = SNIPPETS[name]
    module = parse_module(module_text(params, body))
    nodes = kernel_nodes(module)
    return module, nodes, generate(module, nodes, name)


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_snippet_is_one_kernel_equal_to_xla(name):
    module, nodes, spec = snippet(name)
    assert spec.nodes == nodes and spec.modeled_us > 0
    # f16/bf16 results are rounded once per op as XLA does; 1 ulp apart where XLA:CPU fuses
    # differently (bf16 has 8 bits of mantissa).
    tolerance = dict(rtol=1e-2, atol=1e-2) if name == "half_precision" else \
        dict(rtol=2e-5, atol=2e-5) if name == "unary_float" else {}
    check_against_xla(module, spec, **tolerance)


def test_column_reductions_stitch_mean_then_variance_into_one_kernel():
    _, _, spec = snippet("column_reduction_with_consumer")
    assert "block_composition" in spec.schemes or "thread" in spec.why
    assert spec.read_bytes == 64 * 32 * 4 and spec.write_bytes == (64 * 32 + 64) * 4


def bias_gradient_and_update(dy, w, gw):
    """A column sum (a bias's gradient) and an update of another size (a weight's)."""
    return jnp.sum(dy * 2.0, axis=0), w - 0.1 * gw


def test_a_column_sum_beside_an_output_of_another_size_reads_rows_contiguously():
    """The host's columns schedule (rows outer, results inner) takes outputs of other sizes
    too: the first block writes them in contiguous loops. Before, such a kernel took the
    thread schedule, one strided column per block (keras_hub Mistral's optimizer step)."""
    args = [np.zeros((64, 32), np.float32), np.zeros((16, 48), np.float32),
            np.zeros((16, 48), np.float32)]
    module = parse_module(jax_hlo(bias_gradient_and_update, *args, target="cpu"))
    spec = generate(module, kernel_nodes(module), "bias_gradient_and_update")
    kernel = spec.host_kernel
    # the columns' accumulator, and its f64 twin where the partial sums add up
    assert [(a.name.startswith("acc_"), a.dtype) for a in kernel.shared] == [
        (True, "f32"), (True, "f64")]
    (guarded,) = [s for s in kernel.body if isinstance(s, If)]  # the first block's update
    assert any(isinstance(s, Loop) for s in guarded.body)
    check_against_xla(module, spec)


def test_unrelated_shapes_are_packed():
    _, _, spec = snippet("reduce_middle_dims_and_packing")
    assert spec.schemes[0] == "kernel_packing"


@pytest.mark.parametrize("kind", ["thread", "warp", "block", "tile"])
@pytest.mark.parametrize("name", ["column_reduction_with_consumer",
                                  "reduce_middle_dims_and_packing", "reduction_read_transposed"])
def test_every_schedule_kind_matches_xla(name, kind):
    module, nodes, spec = snippet(name)
    pattern = flatten(module, nodes)
    schedules = [s for s in enumerate_schedules(reduction_space(pattern), load_device("h100"),
                                                [x.num_elements for _, x in pattern.outputs])
                 if s.kind == kind]
    kernel, _ = build_kernel(pattern, schedules[-1], name)
    reuse_shared_memory(kernel)
    check_against_xla(module, spec, kernel)



@pytest.mark.parametrize("width,depth", [(8, 8), (16, 8), (8, 16), (32, 8)])
def test_narrow_tiles_combine_with_sub_warp_shuffles(width, depth):
    """Tiles of at most four warps combine each warp's members of a result with a butterfly
    over the xor distances 16 down to the tile's width, then add the warps' totals after one
    barrier (the halving tree takes log2(depth)); wider tiles keep the tree. Both equal XLA
    through the host backend and assemble without spills."""
    module, nodes, spec = snippet("column_reduction_with_consumer")
    pattern = flatten(module, nodes)
    tile = next(s for s in enumerate_schedules(reduction_space(pattern), load_device("h100"), [])
                if s.kind == "tile" and (s.groups_per_block, s.threads_per_group) == (width, depth))
    kernel, _ = build_kernel(pattern, tile, "narrow_tile")
    text = str(kernel)
    warps = width * depth // 32
    assert ("sub-warp shuffles" in tile.why) == (width < 32 and warps <= 4), tile.why
    if width < 32 and warps <= 4:
        assert text.count("warp_reduce.add") == 2 and f"(lanes mod {width})" in text, text
        assert text.count("barrier") == 2, text  # one per statistic
    else:
        assert "warp_reduce" not in text and text.count("barrier") == 2 * (1 + depth.bit_length() - 1)
    reuse_shared_memory(kernel)
    check_against_xla(module, spec, kernel)
    for arch in ("sm_80", "sm_90"):
        assert_assembles_without_spills(
            [dataclasses.replace(spec, kernel=kernel, smem_bytes=kernel.smem_bytes)], arch)

def test_candidates_carry_modeled_times_and_the_choice_is_the_fastest():
    _, _, spec = snippet("column_reduction_with_consumer")
    kinds = {d.split(" ")[1] for d, _ in spec.candidates}
    assert {"thread", "warp", "block", "tile"} <= kinds
    assert spec.modeled_us == min(t for _, t in spec.candidates)


def test_shared_memory_buffers_are_reused_along_the_dominance_tree():
    module, nodes, _ = snippet("column_reduction_with_consumer")
    pattern = flatten(module, nodes)
    tile = next(s for s in enumerate_schedules(reduction_space(pattern), load_device("h100"), [])
                if s.kind == "tile")
    kernel, _ = build_kernel(pattern, tile, "k")
    before = reuse_shared_memory(kernel)
    # Two reductions in two stages: the second tile takes over the first one's buffer.
    assert before == 2 * kernel.smem_bytes and len(kernel.shared) == 1
    check_against_xla(module, generate(module, nodes, "k"), kernel)


def test_unsupported_ops_are_refused_with_a_reason():
    text = module_text("x: f32[8,8]", """
  %x = f32[8,8]{1,0} parameter(0)
  %y = f32[8,8]{1,0} exponential(%x)
  ROOT %s = f32[8,8]{1,0} sort(%y), dimensions={1}, to_apply=%add""")
    refusal = can_stitch(parse_module(text), ["y", "s"])
    assert refusal.kind is Refusal.UNSUPPORTED_OP and "sort s calls a computation" in str(refusal)
    text = module_text("x: f32[8,8]", """
  %x = f32[8,8]{1,0} parameter(0)
  %y = f32[8,8]{1,0} exponential(%x)
  ROOT %s = f32[8,8]{1,0} reduce-precision(%y), exponent_bits=5, mantissa_bits=10""")
    refusal = can_stitch(parse_module(text), ["y", "s"])
    assert refusal.kind is Refusal.UNSUPPORTED_OP
    assert str(refusal) == "reduce-precision s: op not supported by the code generator"
    # Bounded-dynamic arrays carry their run-time size beside the data (XLA's kernels write it).
    text = module_text("x: f32[<=8]", """
  %x = f32[<=8]{0} parameter(0)
  %y = f32[<=8]{0} exponential(%x)
  ROOT %s = f32[<=8]{0} negate(%y)""")
    refusal = can_stitch(parse_module(text), ["y", "s"])
    assert refusal.kind is Refusal.DYNAMIC_SHAPE
    assert refusal.detail.startswith("parameter x: bounded-dynamic shape f32[<=8]")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ptxas_assembles_every_snippet_without_spills(arch):
    assert_assembles_without_spills((snippet(name)[2] for name in SNIPPETS), arch)


# --- the paper's models' memory-intensive patterns, captured from JAX ------------------------
def batchnorm_train(x, gamma, beta):
    mean = jnp.mean(x, axis=(0, 1, 2))
    var = jnp.mean(jnp.square(x - mean), axis=(0, 1, 2))
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * gamma + beta, mean, var


def xent_backward(logits, labels):
    def loss(z):
        logp = jax.nn.log_softmax(z)
        return -jnp.mean(jnp.sum(logp * jax.nn.one_hot(labels, z.shape[-1]), axis=-1))
    return jax.grad(loss)(logits)


def adam_update(p, g, m, v, lr, t):
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    step = lr * (m / (1 - 0.9 ** t)) / (jnp.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    return p - step, m, v


def model_args(name):
    rng = np.random.default_rng(0)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)
    return {"batchnorm": (batchnorm_train, (f32(8, 4, 4, 32), f32(32), f32(32))),
            "xent": (xent_backward, (f32(16, 128), rng.integers(0, 128, 16).astype(np.int32))),
            "adam": (adam_update, (f32(64, 32), f32(64, 32), f32(64, 32),
                                   np.abs(f32(64, 32)), np.float32(1e-3), np.float32(3)))}[name]


def check_against_jax(module, fn, args, fast: bool = False):
    """fast: the CPU-scheduled, vectorized host kernel instead of the GPU schedule."""
    nodes = kernel_nodes(module)
    spec = generate(module, nodes, fn.__name__)
    number = {p.name: p.parameter_number for p in module.entry.parameters}
    got = compile_host(spec, fast)(*[args[number[n]] for n, _ in spec.inputs])
    expected = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    root = module.entry.root
    order = list(root.operands) if root.opcode == "tuple" else \
        [f"{root.name}#{i}" for i in range(len(expected))] if root.shape.is_tuple else [root.name]
    by_name = dict(zip(order, expected))
    assert len(got) == len(expected)
    for (out, _), value in zip(spec.outputs, got):
        np.testing.assert_allclose(value, by_name[out], rtol=1e-5, atol=1e-6, err_msg=out)
    return spec


@pytest.mark.parametrize("fast", [False, True], ids=["gpu_schedule", "host_schedule"])
@pytest.mark.parametrize("name", ["batchnorm", "xent", "adam"])
def test_model_pattern_is_one_kernel_equal_to_jax(name, fast):
    fn, args = model_args(name)
    check_against_jax(parse_module(jax_hlo(fn, *args, target="cpu")), fn, args, fast)


@pytest.mark.parametrize("name", ["batchnorm", "xent"])
def test_model_pattern_for_h100_is_one_kernel_that_assembles(name):
    fn, args = model_args(name)
    spec = check_against_jax(parse_module(jax_hlo(fn, *args, target="h100", classic=True)),
                             fn, args)
    for arch in ("sm_80", "sm_90"):
        assert_assembles_without_spills([spec], arch)
