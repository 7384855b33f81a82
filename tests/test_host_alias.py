"""Fast host kernels tell LLVM that their buffers never overlap (alias scopes, codegen/host.py):
an optimizer step that stores to twelve outputs is vectorized, and gives XLA:CPU's numbers.
Where a step donates its parameters, the kernels write the updates over them
(codegen/in_place.py proves where that is safe): still vectorized, the same bits."""
from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import llvmlite.binding as llvm  # noqa: E402
import numpy as np  # noqa: E402

from fusionstitching.capture import jax_hlo  # noqa: E402
from fusionstitching.codegen import compile_host  # noqa: E402
from fusionstitching.codegen import host, in_place  # noqa: E402
from fusionstitching.codegen.index_expr import Var, add, div, ix, mod, scale  # noqa: E402
from fusionstitching.codegen.kernel_ir import Buffer, Compute, Const, GlobalLoad, GlobalStore, \
    Kernel, Loop, Value  # noqa: E402
from fusionstitching.codegen.llvm_lowering import optimize  # noqa: E402
from fusionstitching.hlo.ir import Shape  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402
from fusionstitching.hlo.xla_runner import optimized_hlo_text  # noqa: E402
from fusionstitching.pipeline import Options, stitch_module  # noqa: E402
from fusionstitching.runtime import cpu_speed, ffi  # noqa: E402
from fusionstitching.runtime.build import with_in_place  # noqa: E402
from fusionstitching.runtime.rewrite import donated_parameters  # noqa: E402
from helpers import kernel_spec  # noqa: E402


def adam(p, g, m, v):
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    return p - 0.01 * m / (jnp.sqrt(v) + 1e-7), m, v


def adam_of_four(*args):
    """Four parameters' updates: 16 inputs, 12 outputs (a model's optimizer step)."""
    return [out for k in range(4) for out in adam(*args[4 * k:4 * k + 4])]


def optimized_ir(kernel) -> str:
    module = llvm.parse_assembly(host.host_ir(kernel, fast=True))
    optimize(module, host._host_machine(), unroll_and_vectorize=True)
    return str(module)


def test_updates_storing_twelve_outputs_are_vectorized_with_xlas_numbers(monkeypatch):
    rng = np.random.default_rng(0)
    args = [rng.random((64, 32)).astype(np.float32) if k % 4 == 3 else
            rng.standard_normal((64, 32)).astype(np.float32) for k in range(16)]
    module = parse_module(jax_hlo(adam_of_four, *args, target="cpu"))
    (kernel,) = stitch_module(module, Options(target="h100", ptxas=False, host=True)).kernels
    spec = kernel.spec
    assert len(spec.outputs) == 12
    assert "fdiv <" in optimized_ir(spec.host_kernel)  # the division, on vectors
    arrays = {param.name: a for param, a in zip(module.entry.parameters, args)}
    got = compile_host(spec, fast=True)(*(arrays[name] for name, _ in spec.inputs))
    outputs = module.entry.root.operands  # the step's results, in order
    want = dict(zip(outputs, jax.jit(adam_of_four)(*args)))
    for (name, _), a in zip(spec.outputs, got):  # XLA:CPU contracts multiply-adds: ulps
        np.testing.assert_allclose(a, np.asarray(want[name]), rtol=2e-6, atol=1e-7)
    # without the scopes LLVM keeps the loop scalar: the scopes are what vectorizes it, and
    # they change no bit
    monkeypatch.setattr(host, "_buffer_scopes", lambda module, kernel: None)
    assert "fdiv <" not in optimized_ir(spec.host_kernel)
    scalar = compile_host(spec, fast=True)(*(arrays[name] for name, _ in spec.inputs))
    for a, b in zip(got, scalar):
        np.testing.assert_array_equal(a, b)


def test_donated_updates_are_written_over_their_parameters_vectorized_with_the_same_bits():
    rng = np.random.default_rng(0)
    args = [rng.random((64, 32)).astype(np.float32) if k % 4 == 3 else
            rng.standard_normal((64, 32)).astype(np.float32) for k in range(16)]
    donating = jax.jit(adam_of_four, donate_argnums=[k for k in range(16) if k % 4 != 1])
    module = parse_module(optimized_hlo_text(donating.lower(*args).compile()))
    kernels = stitch_module(module, Options(target="h100", ptxas=False, host=True)).kernels
    donated = donated_parameters(module)
    arrays = {param.name: a for param, a in zip(module.entry.parameters, args)}
    pairs, candidates = 0, 0
    for kernel in kernels:
        spec = with_in_place(kernel.spec, donated)
        read = {name for name, _ in spec.inputs}
        candidates += sum(name in donated and donated[name].name in read
                          for name, _ in spec.outputs)
        for source, output in spec.host_kernel.in_place:  # an updated parameter over itself
            assert donated[spec.outputs[output - len(spec.inputs)][0]].name == \
                spec.inputs[source][0]
        pairs += len(spec.host_kernel.in_place)
        inputs = [arrays[name] for name, _ in spec.inputs]
        over = compile_host(spec, fast=True)(*inputs)
        apart = compile_host(kernel.spec, fast=True)(*inputs)
        for a, b in zip(over, apart):
            np.testing.assert_array_equal(a, b)
        if spec.host_kernel.in_place:
            assert "fdiv <" in optimized_ir(spec.host_kernel)
    # every update over its parameter where the kernel reads it (XLA's copies of
    # parameters are kernel outputs too: the kernel reads the parameter, writes the copy)
    assert pairs == candidates >= 8
    # timed alone, both sides donate what the kernel writes over (each call its own copies)
    over = next(s for s in (with_in_place(k.spec, donated) for k in kernels)
                if s.host_kernel.in_place)
    for text in (cpu_speed.call_module(over, "t"), cpu_speed.pattern_module(module, over)):
        assert "input_output_alias" in parse_module(text).header_attrs
    host = compile_host(over, fast=True)
    target = ffi.register_kernel(over.name + "_timed", host.address, len(over.inputs),
                                 len(over.outputs), owner=host)
    assert all(us > 0 for us in cpu_speed.compare(module, over, target))
    for a, b in zip(args, [np.asarray(x) for x in args]):  # the callers' arrays untouched
        np.testing.assert_array_equal(a, b)


N = 64


def one_loop_kernel(load_offset, store_offset, out_dims=(N,), stores=1) -> Kernel:
    """``for i < N: o[store_offset(i)] = a[load_offset(i)]`` (``stores`` times)."""
    i = Var("i", N)
    x = Value("x", "f32")
    body = [GlobalLoad(x, 0, load_offset(i))] + [GlobalStore(1, store_offset(i), x)] * stores
    return Kernel("k", [Buffer("a", Shape("f32", (N,), (0,)), False),
                        Buffer("o", Shape("f32", out_dims, tuple(reversed(range(len(out_dims))))),
                               True)],
                  grid=(1,), block=(1,), shared=[], body=[Loop(i, ix(0), N, 1, body)],
                  tid=Var("tid", 1), bid=Var("bid", 1))


def test_an_output_stored_where_its_input_is_read_is_written_over_it():
    kernel = one_loop_kernel(ix, ix)
    assert in_place.refusal(kernel, 0, 1) is None
    a = np.arange(N, dtype=np.float32)
    spec = dataclasses.replace(kernel_spec(kernel), host_kernel=kernel)
    over = dataclasses.replace(spec, host_kernel=in_place.written_over(kernel, ((0, 1),)))
    np.testing.assert_array_equal(compile_host(over, fast=True)(a)[0],
                                  compile_host(spec, fast=True)(a)[0])


def test_a_scalar_counter_is_written_over_itself():
    """Keras's iteration counter: an s64[] input whose update is an output."""
    x, one, y = Value("x", "s64"), Value("one", "s64"), Value("y", "s64")
    scalar = Shape("s64", (), ())
    kernel = Kernel("k", [Buffer("count", scalar, False), Buffer("next", scalar, True)],
                    grid=(1,), block=(1,), shared=[],
                    body=[GlobalLoad(x, 0, ix(0)), Const(one, 1), Compute(y, "add", [x, one]),
                          GlobalStore(1, ix(0), y)],
                    tid=Var("tid", 1), bid=Var("bid", 1))
    assert in_place.refusal(kernel, 0, 1) is None
    spec = dataclasses.replace(kernel_spec(kernel),
                               host_kernel=in_place.written_over(kernel, ((0, 1),)))
    count = np.array(41, np.int64)
    (got,) = compile_host(spec, fast=True)(count)
    assert got.shape == () and got == 42 and count == 41


def test_in_place_refusals_say_why():
    def kind(kernel):
        return in_place.refusal(kernel, 0, 1).kind

    reversed_order = one_loop_kernel(lambda i: add(N - 1, scale(i, -1)), ix)
    assert kind(reversed_order) is in_place.RefusalKind.READ_ELSEWHERE
    assert kind(one_loop_kernel(ix, ix, out_dims=(N // 2, 2))) is in_place.RefusalKind.SHAPE
    assert kind(one_loop_kernel(ix, ix, stores=2)) is in_place.RefusalKind.STORES
    each_twice = one_loop_kernel(lambda i: div(i, 2), lambda i: div(i, 2))
    assert kind(each_twice) is in_place.RefusalKind.REPEATED


def test_one_thread_may_read_the_whole_input_before_writing_over_it():
    """Like a bias that the forward pass reads at other offsets, then the update writes."""
    i, j = Var("i", N), Var("j", N)
    x, y = Value("x", "f32"), Value("y", "f32")
    first = Loop(i, ix(0), N, 1, [GlobalLoad(x, 0, add(N - 1, scale(i, -1))),
                                  GlobalStore(2, ix(i), x)])
    then = Loop(j, ix(0), N, 1, [GlobalLoad(y, 0, ix(j)), GlobalStore(1, ix(j), y)])
    shape = Shape("f32", (N,), (0,))
    kernel = Kernel("k", [Buffer("a", shape, False), Buffer("o", shape, True),
                          Buffer("reversed", shape, True)],
                    grid=(1,), block=(1,), shared=[], body=[first, then],
                    tid=Var("tid", 1), bid=Var("bid", 1))
    assert in_place.refusal(kernel, 0, 1) is None
    a = np.arange(N, dtype=np.float32)
    spec = dataclasses.replace(kernel_spec(kernel), host_kernel=kernel)
    over = dataclasses.replace(spec, host_kernel=in_place.written_over(kernel, ((0, 1),)))
    for got, want in zip(compile_host(over, fast=True)(a), compile_host(spec, fast=True)(a)):
        np.testing.assert_array_equal(got, want)
    # the same statements in every block of several: another block may write first
    blocks = dataclasses.replace(kernel, grid=(2,))
    assert in_place.refusal(blocks, 0, 1).kind is in_place.RefusalKind.READ_ELSEWHERE


def test_a_large_update_is_proved_without_enumerating_its_iterations():
    rows, cols = Var("r", 1 << 12), Var("c", 1 << 12)  # more than MAX_ITERATIONS
    x = Value("x", "f32")
    offset = add(cols, scale(rows, 1 << 12))
    inner = Loop(cols, ix(0), 1 << 12, 1, [GlobalLoad(x, 0, offset), GlobalStore(1, offset, x)])
    shape = Shape("f32", (1 << 12, 1 << 12), (1, 0))
    kernel = Kernel("k", [Buffer("a", shape, False), Buffer("o", shape, True)], grid=(1,),
                    block=(1,), shared=[], body=[Loop(rows, ix(0), 1 << 12, 1, [inner])],
                    tid=Var("tid", 1), bid=Var("bid", 1))
    assert in_place.refusal(kernel, 0, 1) is None
    # the same rows read at a remainder: not mixed radix, and too many to enumerate
    folded = add(mod(cols, 1 << 11), scale(rows, 1 << 12))
    inner = Loop(cols, ix(0), 1 << 12, 1, [GlobalLoad(x, 0, folded), GlobalStore(1, folded, x)])
    kernel = dataclasses.replace(kernel, body=[Loop(rows, ix(0), 1 << 12, 1, [inner])])
    assert in_place.refusal(kernel, 0, 1).kind is in_place.RefusalKind.TOO_MANY
