"""The fast host kernels' exp, log, tanh, erf, sine and cosine (codegen/host_math.py): error in ulp against
f64, the special values, and a loop of each one vectorized by LLVM."""
import ctypes
import math

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from fusionstitching.codegen import host_math
from fusionstitching.codegen.host import _host_machine
from fusionstitching.codegen.llvm_lowering import optimize

F32, I32, PTR = ir.FloatType(), ir.IntType(32), ir.PointerType()
REFERENCE = {"exponential": np.exp, "log": np.log, "tanh": np.tanh,
             "erf": np.vectorize(math.erf, otypes=[np.float64]), "sine": np.sin,
             "cosine": np.cos}
# tanh is a rational function, as XLA:CPU's own is: XLA's measures 4.27 ulp on these inputs,
# a rational with its error below 1.5 ulp would cost the exp it replaces.
MAX_ULP = {"exponential": 1.0, "log": 1.0, "tanh": 4.5, "erf": 2.5, "sine": 1.0, "cosine": 1.0}


def loop_kernel(function):
    """``out[i] = function(in[i])`` for i < n, optimized as a fast host kernel is; returns
    (call on an f32 array, the optimized IR)."""
    module = ir.Module("math")
    module.triple = llvm.get_process_triple()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I32]), "apply")
    entry, loop, done = (fn.append_basic_block() for _ in range(3))
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(I32)
    i.add_incoming(ir.Constant(I32, 0), entry)
    x = b.load(b.gep(fn.args[0], [i], source_etype=F32), typ=F32)
    b.store(function(b, x), b.gep(fn.args[1], [i], source_etype=F32))
    after = b.add(i, ir.Constant(I32, 1))
    i.add_incoming(after, loop)
    b.cbranch(b.icmp_signed("<", after, fn.args[2]), loop, done)
    b.position_at_end(done)
    b.ret_void()
    machine = _host_machine()
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    optimize(parsed, machine, unroll_and_vectorize=True)
    engine = llvm.create_mcjit_compiler(parsed, machine)
    engine.finalize_object()
    address = engine.get_function_address("apply")
    native = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)(address)

    def call(values: np.ndarray) -> np.ndarray:
        values = np.ascontiguousarray(values, np.float32)
        out = np.empty_like(values)
        native(values.ctypes.data, out.ctypes.data, values.size)
        _ = engine  # the engine owns the code: it lives as long as this function
        return out

    return call, str(parsed)


def inputs(name: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    if name == "log":  # every binade, subnormals included
        values = np.exp(rng.uniform(-103, 88, 100_000))
        extra = [1e-45, 1e-40, 1e-38, 0.5, 1.0, 2.0, 0.70710677, 0.7071068, 3.4e38]
    elif name in ("sine", "cosine"):  # every finite f32's exponent, and near multiples of pi/2
        every = rng.integers(0, 0x7F800000, 100_000, dtype=np.uint32).view(np.float32)
        near = (np.arange(1, 20_000) * np.pi / 2).astype(np.float32)
        values = np.concatenate([every, -every, rng.uniform(-1e4, 1e4, 50_000), near,
                                 np.nextafter(near, np.float32(0))])
        extra = [1e-45, -1e-45, 1e-38, np.pi, np.pi / 2, 1e5, 1.6e8, 3.4e38, -3.4e38]
    else:
        wide = {"exponential": 104.0, "tanh": 12.0, "erf": 10.0}[name]
        values = np.concatenate([rng.uniform(-wide, wide, 100_000), rng.uniform(-2, 2, 50_000),
                                 rng.uniform(-1e-3, 1e-3, 10_000)])
        extra = [0.0, 1e-30, -1e-30, 0.625, -0.625, 1.0, -1.0, 2.0, 88.7, -87.3, -103.9]
    return np.concatenate([values, extra]).astype(np.float32)


def ulp_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the f32 spacing at ``want`` (the smallest subnormal's below)."""
    spacing = np.maximum(np.spacing(np.abs(want.astype(np.float32))).astype(np.float64),
                         2.0 ** -149)
    return np.abs(got.astype(np.float64) - want) / spacing


@pytest.mark.parametrize("name", sorted(host_math.FUNCTIONS))
def test_within_a_few_ulp_of_f64(name):
    call, _ = loop_kernel(host_math.FUNCTIONS[name])
    x = inputs(name)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        want = REFERENCE[name](x.astype(np.float64))
        finite = np.isfinite(want.astype(np.float32))
        got = call(x)
    assert np.isfinite(got[finite]).all()
    error = ulp_error(got[finite], want[finite])
    assert error.max() <= MAX_ULP[name], (name, x[finite][np.argmax(error)], error.max())


@pytest.mark.parametrize("name", sorted(host_math.FUNCTIONS))
def test_special_values_as_the_c_library(name):
    call, _ = loop_kernel(host_math.FUNCTIONS[name])
    special = np.float32([np.inf, -np.inf, np.nan, 0.0, -0.0, -1.0, 200.0, -200.0, 89.0])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        want = REFERENCE[name](special.astype(np.float64)).astype(np.float32)
    got = call(special)
    # -1.0 is special for log (NaN); where a function has an ordinary value there, it is
    # held to the function's ulp bound, as every ordinary value is
    ordinary = np.isfinite(want) & (want != 0) & (np.abs(want) != 1) & (special == -1.0)
    np.testing.assert_array_equal(got[~ordinary], want[~ordinary])  # NaN, inf, signed zeros
    assert (np.signbit(got) == np.signbit(want))[~np.isnan(want)].all()
    assert (ulp_error(got[ordinary], want[ordinary].astype(np.float64)) <= MAX_ULP[name]).all()


@pytest.mark.parametrize("name", sorted(host_math.FUNCTIONS))
def test_loop_is_vectorized_without_calls(name):
    _, optimized = loop_kernel(host_math.FUNCTIONS[name])
    assert "x float>" in optimized  # a vector of f32
    calls = [line for line in optimized.splitlines() if " call " in line]
    assert all("@llvm." in line for line in calls), calls  # intrinsics only, no libm
