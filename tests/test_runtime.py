"""Runtime: FFI handlers called by XLA, the module rewrite, fusionstitching.jit.

Until (and besides) the code generator, the kernels here are tiny elementwise host functions
built with llvmlite that have the code generator's calling convention:
``void kernel(void** buffers)``, inputs then outputs.
"""
from __future__ import annotations

import ctypes
import os
from types import SimpleNamespace

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest

from fusionstitching.hlo.evaluator import evaluate
from fusionstitching.hlo.parser import parse_module, parse_shape
from fusionstitching.hlo.ir import print_module
from fusionstitching.hlo.xla_runner import run_hlo_with_xla
from fusionstitching.runtime import ffi, kernel_objects, rewrite, xla
from helpers import FUSED_SLICE, elementwise_kernel

def run_hlo(text: str, args):
    return [np.asarray(r) for r in xla.execute(xla.compile_hlo(text), args)]


# -- the handler's C ABI, checked from ctypes (an independent reading of c_api.h) -------------

class ExtensionBase(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int),
                ("next", ctypes.c_void_p)]


class ApiVersion(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("major_version", ctypes.c_int), ("minor_version", ctypes.c_int)]


class Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", ApiVersion),
                ("traits", ctypes.c_uint32), ("state_type_id", ctypes.c_int64)]


class MetadataExtension(ctypes.Structure):
    _fields_ = [("extension_base", ExtensionBase), ("metadata", ctypes.POINTER(Metadata))]


class Args(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("size", ctypes.c_int64), ("types", ctypes.c_void_p),
                ("args", ctypes.POINTER(ctypes.c_void_p))]


class Attrs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("size", ctypes.c_int64), ("types", ctypes.c_void_p),
                ("names", ctypes.c_void_p), ("attrs", ctypes.c_void_p)]


class CallFrame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("api", ctypes.c_void_p), ("ctx", ctypes.c_void_p), ("stage", ctypes.c_int),
                ("args", Args), ("rets", Args), ("attrs", Attrs), ("future", ctypes.c_void_p)]


class Buffer(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("dtype", ctypes.c_int), ("data", ctypes.c_void_p), ("rank", ctypes.c_int64),
                ("dims", ctypes.POINTER(ctypes.c_int64))]


def call_handler(handler: int, frame: CallFrame) -> int | None:
    return ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(CallFrame))(handler)(ctypes.byref(frame))


def frame_with_buffers(stage: int, inputs: list[np.ndarray], outputs: list[np.ndarray]):
    """A call frame as XLA builds it; returns the frame and everything it points to."""
    keep = []

    def pointer_array(arrays):
        buffers = [Buffer(dtype=11, data=a.ctypes.data, rank=a.ndim) for a in arrays]
        pointers = (ctypes.c_void_p * len(arrays))(*[ctypes.addressof(b) for b in buffers])
        keep.extend([buffers, pointers])
        return Args(size=len(arrays), args=ctypes.cast(pointers, ctypes.POINTER(ctypes.c_void_p)))

    frame = CallFrame(stage=stage, args=pointer_array(inputs), rets=pointer_array(outputs))
    return frame, keep


def test_handler_answers_the_metadata_query():
    handler = ffi.compile_handler("metadata_probe", 0, 1, 1)  # kernel never called
    metadata = Metadata(struct_size=ctypes.sizeof(Metadata), traits=0xFF, state_type_id=-1)
    extension = MetadataExtension(ExtensionBase(ctypes.sizeof(MetadataExtension), 1, None),
                                  ctypes.pointer(metadata))
    frame = CallFrame(extension_start=ctypes.addressof(extension), stage=3)
    assert call_handler(handler, frame) is None  # NULL error = OK
    version = metadata.api_version
    assert (version.major_version, version.minor_version) == (0, 2)
    assert version.struct_size == 28
    assert metadata.traits == 0 and metadata.state_type_id == 0


def test_handler_calls_kernel_only_on_execute():
    add = elementwise_kernel("probe_add", 4, [("fadd", 0, 1)])
    handler = ffi.compile_handler("probe_handler", add, 2, 1)
    a, b = np.arange(4, dtype=np.float32), np.full(4, 10, np.float32)
    out = np.zeros(4, np.float32)
    for stage in (0, 1, 2):  # instantiate, prepare, initialize: nothing to do
        frame, _keep = frame_with_buffers(stage, [a, b], [out])
        assert call_handler(handler, frame) is None
        assert not out.any()
    frame, _keep = frame_with_buffers(3, [a, b], [out])
    assert call_handler(handler, frame) is None
    np.testing.assert_array_equal(out, a + b)


# -- XLA calling the handlers ------------------------------------------------------------------

def test_xla_calls_registered_kernel():
    target = ffi.register_kernel("fusionstitching_test_add", elementwise_kernel("t_add", 8, [("fadd", 0, 1)]), 2, 1)
    assert target.startswith("fusionstitching_test_add")
    text = f"""HloModule single
ENTRY %main (a: f32[8], b: f32[8]) -> f32[8] {{
  %a = f32[8] parameter(0)
  %b = f32[8] parameter(1)
  %c = f32[8] custom-call(%a, %b), custom_call_target="{target}", api_version=API_VERSION_TYPED_FFI
  ROOT %d = f32[8] multiply(%c, %c)
}}
"""
    a, b = np.arange(8, dtype=np.float32), np.linspace(-1, 1, 8, dtype=np.float32)
    (result,) = run_hlo(text, [a, b])
    np.testing.assert_array_equal(result, (a + b) * (a + b))


def test_xla_calls_multi_output_kernel():
    address = elementwise_kernel("t_addsub", 6, [("fadd", 0, 1), ("fsub", 0, 1)])
    target = ffi.register_kernel("fusionstitching_test_addsub", address, 2, 2)
    text = f"""HloModule multi
ENTRY %main (a: f32[2,3], b: f32[2,3]) -> (f32[2,3], f32[2,3]) {{
  %a = f32[2,3] parameter(0)
  %b = f32[2,3] parameter(1)
  %c = (f32[2,3], f32[2,3]) custom-call(%a, %b), custom_call_target="{target}", api_version=API_VERSION_TYPED_FFI
  %s = f32[2,3] get-tuple-element(%c), index=0
  %d = f32[2,3] get-tuple-element(%c), index=1
  %p = f32[2,3] multiply(%s, %d)
  ROOT %r = (f32[2,3], f32[2,3]) tuple(%p, %s)
}}
"""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 0.5, np.float32)
    product, total = run_hlo(text, [a, b])
    np.testing.assert_array_equal(product, (a + b) * (a - b))
    np.testing.assert_array_equal(total, a + b)


def test_same_kernel_registers_once_other_kernel_gets_own_target():
    address = elementwise_kernel("t_mul", 8, [("fmul", 0, 1)])
    first = ffi.register_kernel("fusionstitching_test_mul", address, 2, 1)
    assert ffi.register_kernel("fusionstitching_test_mul", address, 2, 1) == first
    other = elementwise_kernel("t_mul2", 8, [("fmul", 0, 1)])
    assert ffi.register_kernel("fusionstitching_test_mul", other, 2, 1) != first
    with pytest.raises(ValueError):
        ffi.register_kernel("not_ours", address, 2, 1)


# -- the rewrite ------------------------------------------------------------------------------

# XLA-optimized style: fusions, layouts, scheduling header, a CPU backend_config.
OPTIMIZED = """HloModule small, is_scheduled=true, entry_computation_layout={(f32[8,4]{1,0}, f32[8,4]{1,0})->(f32[8,4]{1,0}, f32[32]{0})}

%fused_add (p0: f32[8,4], p1: f32[8,4]) -> f32[8,4] {
  %p0 = f32[8,4]{1,0} parameter(0)
  %p1 = f32[8,4]{1,0} parameter(1)
  ROOT %add = f32[8,4]{1,0} add(%p0, %p1)
}

%fused_sub (p0.1: f32[8,4], p1.1: f32[8,4]) -> f32[8,4] {
  %p0.1 = f32[8,4]{1,0} parameter(0)
  %p1.1 = f32[8,4]{1,0} parameter(1)
  ROOT %sub = f32[8,4]{1,0} subtract(%p0.1, %p1.1)
}

%fused_mul (p0.2: f32[8,4], p1.2: f32[8,4]) -> f32[8,4] {
  %p0.2 = f32[8,4]{1,0} parameter(0)
  %p1.2 = f32[8,4]{1,0} parameter(1)
  ROOT %mul = f32[8,4]{1,0} multiply(%p0.2, %p1.2)
}

ENTRY %main (a: f32[8,4], b: f32[8,4]) -> (f32[8,4], f32[32]) {
  %a = f32[8,4]{1,0} parameter(0)
  %b = f32[8,4]{1,0} parameter(1)
  %sum = f32[8,4]{1,0} fusion(%a, %b), kind=kLoop, calls=%fused_add, backend_config={"outer_dimension_partitions":[]}
  %diff = f32[8,4]{1,0} fusion(%a, %b), kind=kLoop, calls=%fused_sub
  %prod = f32[8,4]{1,0} fusion(%sum, %diff), kind=kLoop, calls=%fused_mul
  %flat = f32[32]{0} bitcast(%sum)
  ROOT %out = (f32[8,4]{1,0}, f32[32]{0}) tuple(%prod, %flat)
}
"""


def stitched(nodes, name, inputs, outputs):
    """A StitchedKernel as the pipeline hands it over (only the fields the runtime reads)."""
    shape = parse_shape("f32[8,4]{1,0}")
    return SimpleNamespace(pattern=SimpleNamespace(nodes=nodes),
                           spec=SimpleNamespace(name=name, inputs=[(n, shape) for n in inputs],
                                                outputs=[(n, shape) for n in outputs]))


def small_args():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((8, 4)).astype(np.float32) for _ in range(2)]


def check_against_evaluator(module_text: str, rewritten: str, args):
    expected = evaluate(parse_module(module_text), args)
    for want, got in zip(expected, run_hlo(rewritten, args), strict=True):
        np.testing.assert_array_equal(got, want)


def test_normalized_module_compiles_and_matches():
    rewritten = print_module(rewrite.normalize_for_xla(parse_module(OPTIMIZED)))
    assert "fusion(" not in rewritten and "{1,0}" not in rewritten
    assert "backend_config" not in rewritten and "is_scheduled" not in rewritten
    check_against_evaluator(OPTIMIZED, rewritten, small_args())


def test_rewrite_single_output_pattern():
    kernel = stitched(["sum"], "fusionstitching_small_0", ["a", "b"], ["sum"])
    address = elementwise_kernel("rw_add", 32, [("fadd", 0, 1)])
    target = ffi.register_kernel(kernel.spec.name, address, 2, 1)
    module = rewrite.rewrite_module(parse_module(OPTIMIZED), [kernel], [target])
    text = print_module(module)
    assert f'custom_call_target="{target}"' in text
    executable = xla.compile_hlo(text)
    assert target in xla.executable_text(executable)  # survives XLA's own optimization
    check_against_evaluator(OPTIMIZED, text, small_args())


def test_an_output_for_a_donated_parameter_it_does_not_read_gets_that_buffer():
    """``prod`` ends in parameter ``a``'s donated buffer; its kernel reads ``sum`` and
    ``diff``, not ``a``: the call takes ``a`` as one more operand that its output aliases
    (the handler ignores it), and the numbers stay XLA's."""
    donating = OPTIMIZED.replace("is_scheduled=true,",
                                 "is_scheduled=true, input_output_alias={ {0}: (0, {}, "
                                 "may-alias) },")
    module = parse_module(donating)
    kernel = stitched(["prod"], "fusionstitching_small_donated", ["sum", "diff"], ["prod"])
    address = elementwise_kernel("rw_mul", 32, [("fmul", 0, 1)])
    target = ffi.register_kernel(kernel.spec.name, address, 2, 1)
    donated = rewrite.donated_parameters(module)
    assert {name: p.name for name, p in donated.items()} == {"prod": "a"}
    text = print_module(rewrite.rewrite_module(module, [kernel], [target], donated=donated))
    call = parse_module(text).entry.by_name()["prod"]
    assert call.operands == ["sum", "diff", "a"]
    assert call.attrs["output_to_operand_aliasing"] == "{{}: (2, {})}"
    check_against_evaluator(OPTIMIZED, text, small_args())


def rewritten_with_prod_stitched(text: str, name: str):
    """``text`` (OPTIMIZED with control predecessors) with diff and prod in one kernel."""
    kernel = stitched(["diff", "prod"], f"fusionstitching_small_{name}", ["a", "b", "sum"],
                      ["prod"])
    address = elementwise_kernel(f"rw_{name}", 32, [("fadd", 0, 1)])
    target = ffi.register_kernel(kernel.spec.name, address, 3, 1)
    return rewrite.rewrite_module(parse_module(text), [kernel], [target])


def test_control_predecessors_a_kernel_replaced_are_dropped():
    """XLA orders copies of donated buffers after their readers; a reader inside a kernel
    is gone from the rewritten module, and so is the order (XLA makes its own again)."""
    module = rewritten_with_prod_stitched(OPTIMIZED.replace(
        "tuple(%prod, %flat)", "tuple(%prod, %flat), control-predecessors={%diff, %b}"),
        "ordered")
    assert module.entry.root.attrs.get("control-predecessors") == "{%b}"
    xla.compile_hlo(print_module(module))  # no name left undefined


def test_control_predecessors_naming_a_kernel_output_are_dropped():
    """A kernel's call comes after the instructions it does not feed; an order on its output
    kept there would name it before it is defined (XLA's parser: 'not defined')."""
    module = rewritten_with_prod_stitched(OPTIMIZED.replace(
        "%flat = f32[32]{0} bitcast(%sum)",
        "%neg = f32[8,4]{1,0} negate(%sum), control-predecessors={%prod}\n"
        "  %flat = f32[32]{0} bitcast(%neg)"), "ordered_out")
    assert "control-predecessors" not in module.entry.by_name()["neg"].attrs
    xla.compile_hlo(print_module(module))


def test_rewrite_multi_output_pattern():
    kernel = stitched(["sum", "diff"], "fusionstitching_small_1", ["a", "b"], ["sum", "diff"])
    address = elementwise_kernel("rw_addsub", 32, [("fadd", 0, 1), ("fsub", 0, 1)])
    target = ffi.register_kernel(kernel.spec.name, address, 2, 2)
    module = rewrite.rewrite_module(parse_module(OPTIMIZED), [kernel], [target])
    entry = module.entry.by_name()
    assert entry["sum"].opcode == entry["diff"].opcode == "get-tuple-element"
    check_against_evaluator(OPTIMIZED, print_module(module), small_args())


def test_rewrite_multi_output_pattern_with_a_scalar_output():
    """A kernel returning (f32[], f32[8,4]) (e.g. a loss and a gradient) is a tuple-shaped
    custom call XLA's parser accepts (no ``{}`` layout on the scalar)."""
    text = """HloModule scalar_out
%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}
%fused_total (p0: f32[8,4]) -> f32[] {
  %p0 = f32[8,4]{1,0} parameter(0)
  %zero = f32[] constant(0)
  ROOT %total = f32[] reduce(%p0, %zero), dimensions={0,1}, to_apply=%add
}
ENTRY %main (a: f32[8,4], b: f32[8,4]) -> (f32[], f32[8,4]) {
  %a = f32[8,4]{1,0} parameter(0)
  %b = f32[8,4]{1,0} parameter(1)
  %total = f32[] fusion(%a), kind=kLoop, calls=%fused_total
  %prod = f32[8,4]{1,0} multiply(%a, %b)
  ROOT %out = (f32[], f32[8,4]{1,0}) tuple(%total, %prod)
}
"""
    matrix, scalar = parse_shape("f32[8,4]{1,0}"), parse_shape("f32[]")
    kernel = SimpleNamespace(pattern=SimpleNamespace(nodes=["total", "prod"]),
                             spec=SimpleNamespace(name="fusionstitching_scalar_0",
                                                  inputs=[("a", matrix), ("b", matrix)],
                                                  outputs=[("total", scalar), ("prod", matrix)]))
    address = elementwise_kernel("rw_scalar", 1, [("fadd", 0, 1), ("fmul", 0, 1)])
    target = ffi.register_kernel(kernel.spec.name, address, 2, 2)
    rewritten = print_module(rewrite.rewrite_module(parse_module(text), [kernel], [target]))
    assert "(f32[], f32[8,4]{1,0}) custom-call" in rewritten
    assert target in xla.executable_text(xla.compile_hlo(rewritten))


def test_rewrite_rejects_pattern_value_missing_from_outputs():
    kernel = stitched(["sum", "diff"], "fusionstitching_small_2", ["a", "b"], ["diff"])
    with pytest.raises(rewrite.RewriteError, match="sum"):
        rewrite.rewrite_module(parse_module(OPTIMIZED), [kernel], ["fusionstitching_x"])


def test_rewrite_refuses_kernels_that_form_a_cycle():
    """A kernel holding x and z, where z needs y = f(x) computed outside: no order of the
    custom call and y exists. The rewrite says so (the build leaves the module to XLA)
    instead of looping."""
    text = """HloModule cycle
ENTRY %main (a: f32[8,4]) -> f32[8,4] {
  %a = f32[8,4]{1,0} parameter(0)
  %x = f32[8,4]{1,0} exponential(%a)
  %y = f32[8,4]{1,0} negate(%x)
  ROOT %z = f32[8,4]{1,0} add(%x, %y)
}
"""
    kernel = stitched(["x", "z"], "fusionstitching_cycle_0", ["a", "y"], ["x", "z"])
    with pytest.raises(rewrite.RewriteError, match="cycle through y"):
        rewrite.rewrite_module(parse_module(text), [kernel], ["fusionstitching_x"])


def test_bitcast_between_layouts_becomes_logical_ops():
    text = """HloModule layouts
ENTRY %main (a: f32[4,6]) -> (f32[6,4], f32[2,12], f32[24]) {
  %a = f32[4,6]{1,0} parameter(0)
  %c = f32[4,6]{0,1} copy(%a)
  %t = f32[6,4]{1,0} bitcast(%c)
  %r = f32[2,12]{0,1} bitcast(%c)
  %rc = f32[2,12]{1,0} copy(%r)
  %u = f32[24]{0} bitcast(%a)
  ROOT %out = (f32[6,4]{1,0}, f32[2,12]{1,0}, f32[24]{0}) tuple(%t, %rc, %u)
}
"""
    rewritten = print_module(rewrite.normalize_for_xla(parse_module(text)))
    assert "bitcast" not in rewritten and "copy" not in rewritten
    check_against_evaluator(text, rewritten, [np.arange(24, dtype=np.float32).reshape(4, 6)])


def test_jax_optimized_layernorm_round_trips_through_xla():
    import jax

    args = layernorm_args()
    optimized = jax.jit(layernorm).lower(*args).compile()
    rewritten = print_module(rewrite.normalize_for_xla(parse_module(optimized.as_text())))
    (result,) = run_hlo(rewritten, args)
    np.testing.assert_allclose(result, np.asarray(optimized(*args)), rtol=1e-6, atol=1e-6)


# -- fusionstitching.jit ------------------------------------------------------------------------

def layernorm(x, g, b):
    import jax

    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * g + b


def layernorm_args():
    rng = np.random.default_rng(1)
    return [rng.standard_normal((64, 256)).astype(np.float32),
            rng.standard_normal(256).astype(np.float32),
            rng.standard_normal(256).astype(np.float32)]


needs_codegen = pytest.mark.skipif(
    not hasattr(__import__("fusionstitching.codegen", fromlist=["compile_host"]), "compile_host"),
    reason="code generator not available")


@needs_codegen
def test_jit_layernorm_matches_jax_and_runs_our_kernels():
    import jax

    from fusionstitching.stitched_jit import jit

    args = layernorm_args()
    stitched = jit(layernorm, cache_dir=None, keep="stitched")
    compiled = stitched.lower(*args).compile()
    assert 'custom_call_target="fusionstitching' in compiled.as_text()
    report = compiled.report()
    assert report.fs.patterns >= 1 and report.fs.kernels < report.xla.kernels
    assert not report.fallbacks
    np.testing.assert_allclose(np.asarray(stitched(*args)), np.asarray(jax.jit(layernorm)(*args)),
                               rtol=1e-5, atol=1e-5)


@needs_codegen
def test_jit_pytrees_in_and_out():
    import jax
    import jax.numpy as jnp

    from fusionstitching.stitched_jit import jit

    def fn(params, x):
        h = layernorm(x, params["g"], params["b"])
        return {"y": jnp.tanh(h), "stats": (h.sum(), h.max(-1))}

    x, g, b = layernorm_args()
    params = {"g": g, "b": b}
    stitched = jit(fn, cache_dir=None, keep="stitched")
    got, want = stitched(params, x), jax.jit(fn)(params, x)
    (report,) = stitched.reports()
    assert report.fs.patterns >= 1 and not report.fallbacks
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, e in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-5, atol=1e-4)


@needs_codegen
def test_the_trial_checks_a_step_that_carries_a_typed_prng_key():
    """flax nnx carries ``rngs`` state as typed keys: the trial compares their key data."""
    import jax

    from fusionstitching.stitched_jit import jit

    def fn(key, x, g, b):
        key, sub = jax.random.split(key)
        return key, layernorm(x + jax.random.normal(sub, x.shape), g, b)

    args = (jax.random.key(0), *layernorm_args())
    stitched = jit(fn, cache_dir=None, keep="stitched", verify=True)
    for _ in range(2):
        (key, y), (want_key, want_y) = stitched(*args), jax.jit(fn)(*args)
    (report,) = stitched.reports()
    assert report.fs.patterns >= 1 and not report.fallbacks
    assert report.runtime["kept"] == "stitched" and report.verify.ran and report.verify.ok
    np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(want_key))
    np.testing.assert_allclose(np.asarray(y), np.asarray(want_y), rtol=1e-5, atol=1e-4)


def test_jit_falls_back_to_xla_with_one_warning(monkeypatch, caplog):
    import jax

    from fusionstitching import pipeline
    from fusionstitching.stitched_jit import jit

    def broken(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(pipeline, "stitch_module", broken)
    args = layernorm_args()
    with caplog.at_level("WARNING", logger="fusionstitching"):
        compiled = jit(layernorm, cache_dir=None).lower(*args).compile()
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "injected failure" in caplog.records[0].getMessage()
    assert "custom_call_target=\"fusionstitching" not in compiled.as_text()
    (fallback,) = compiled.report().fallbacks
    assert fallback.stage == "pipeline" and "injected failure" in fallback.reason
    np.testing.assert_array_equal(np.asarray(compiled(*args)),
                                  np.asarray(jax.jit(layernorm)(*args)))


@needs_codegen
def test_jit_kernel_that_fails_to_build_is_left_to_xla(monkeypatch):
    import jax

    from fusionstitching.stitched_jit import jit

    def broken(text):
        raise RuntimeError("no host code today")

    monkeypatch.setattr(kernel_objects, "_emit_object", broken)
    args = layernorm_args()
    compiled = jit(layernorm, cache_dir=None).lower(*args).compile()
    report = compiled.report()
    assert [f.stage for f in report.fallbacks] == ["host"]
    assert "no host code today" in report.fallbacks[0].reason
    # nothing was stitched: the plan that runs is XLA's, counted as such
    assert not report.kernels and report.fs.patterns == 0
    assert report.fs.mem_kernels == report.xla.mem_kernels
    np.testing.assert_allclose(np.asarray(compiled(*args)),
                               np.asarray(jax.jit(layernorm)(*args)), rtol=1e-6)


def test_rewrite_refuses_non_default_entry_layouts():
    text = """HloModule entry_layout
ENTRY %main (a: f32[4,6]) -> f32[4,6] {
  %a = f32[4,6]{0,1} parameter(0)
  ROOT %n = f32[4,6]{0,1} negate(%a)
}
"""
    with pytest.raises(rewrite.RewriteError, match="non-default layout"):
        rewrite.normalize_for_xla(parse_module(text))


def test_the_oracle_route_takes_entry_layouts_as_logical_arrays():
    """Where the arguments are logical arrays (XLA:CPU as the oracle, a kernel's pattern
    timed alone), an entry's own layouts say nothing about them: a bitcast of a {0,1}
    parameter is the transpose it means (the measurement refused such a pattern)."""
    text = """HloModule entry_layout
ENTRY %main (a: f32[4,6]) -> f32[6,4] {
  %a = f32[4,6]{0,1} parameter(0)
  %t = f32[6,4]{1,0} bitcast(%a)
  ROOT %n = f32[6,4]{1,0} negate(%t)
}
"""
    normalized = rewrite.normalize_for_xla(parse_module(text), caller_layouts=False)
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    (got,) = run_hlo_with_xla(print_module(normalized), [x])
    np.testing.assert_array_equal(np.asarray(got), -x.T)


ASYNC_FUSION_LOOP = FUSED_SLICE + """
%body (state: (s32[], f32[4,8], f32[1,8])) -> (s32[], f32[4,8], f32[1,8]) {
  %state = (s32[], f32[4,8]{1,0}, f32[1,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %x = f32[4,8]{1,0} get-tuple-element(%state), index=1
  %acc = f32[1,8]{1,0} get-tuple-element(%state), index=2
  ROW
  %sum = f32[1,8]{1,0} add(%acc, %row)
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %out = (s32[], f32[4,8]{1,0}, f32[1,8]{1,0}) tuple(%next, %x, %sum)
}

%cond (state: (s32[], f32[4,8], f32[1,8])) -> pred[] {
  %state = (s32[], f32[4,8]{1,0}, f32[1,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[4,8]) -> f32[1,8] {
  %x = f32[4,8]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %z = f32[] constant(0)
  %init = f32[1,8]{1,0} broadcast(%z), dimensions={}
  %s0 = (s32[], f32[4,8]{1,0}, f32[1,8]{1,0}) tuple(%zero, %x, %init)
  %w = (s32[], f32[4,8]{1,0}, f32[1,8]{1,0}) while(%s0), condition=%cond, body=%body
  ROOT %res = f32[1,8]{1,0} get-tuple-element(%w), index=2
}
"""
# XLA:GPU (jaxlib 0.11.2, seen on an H200) puts a scan's dynamic slices into async fusions.
ASYNC_ROW = """%start = ((f32[4,8]{1,0}, s32[]), f32[1,8]{1,0}, u32[]) fusion-start(%x, %i), kind=kLoop, calls=%fused_slice
  %row = f32[1,8]{1,0} fusion-done(%start)"""
PLAIN_ROW = "%row = f32[1,8]{1,0} fusion(%x, %i), kind=kLoop, calls=%fused_slice"


def test_an_async_fusion_is_inlined_like_a_plain_one():
    """Left in, XLA's HLO -> StableHLO route turns fusion-start into an mhlo.fusion that the
    compile then refuses."""
    x = [np.arange(32, dtype=np.float32).reshape(4, 8)]
    async_text = ASYNC_FUSION_LOOP.replace("ROW", ASYNC_ROW)
    rewritten = print_module(rewrite.normalize_for_xla(parse_module(async_text)))
    assert not {i.opcode for c in parse_module(rewritten).computations
                for i in c.instructions} & {"fusion", "fusion-start", "fusion-done"}
    plain = print_module(rewrite.normalize_for_xla(
        parse_module(ASYNC_FUSION_LOOP.replace("ROW", PLAIN_ROW))))
    np.testing.assert_array_equal(run_hlo(rewritten, x)[0], run_hlo(plain, x)[0])


def test_an_async_fusion_state_read_by_another_op_is_refused():
    text = ASYNC_FUSION_LOOP.replace("ROW", ASYNC_ROW + """
  %peek = u32[] get-tuple-element(%start), index=2""")
    with pytest.raises(rewrite.RewriteError, match="async fusion"):
        rewrite.normalize_for_xla(parse_module(text))
