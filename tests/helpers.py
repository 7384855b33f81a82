"""Helpers and HLO snippets shared by several test files (the code generator's: helpers_codegen.py;
the training scripts run under the hook: helpers_hook.py)."""
from __future__ import annotations

import ctypes
import os
import socket

import jax
import llvmlite.binding as llvm
import llvmlite.ir as lir
import numpy as np
import pytest

from fusionstitching import codegen
from fusionstitching.codegen.host import to_physical
from fusionstitching.codegen.kernel_ir import Kernel
from fusionstitching.explorer import KernelDag
from fusionstitching.runtime import ffi

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- plans and their cycles: test_graph_explorer.py, test_explorer.py, test_explain.py --------
# Two packs of unrelated kernels, {a, b} and {c, d}: each alone is acyclic, but a reaches d
# and c reaches b through GEMMs, so together they form a cycle. With the chains after c and d,
# {c, c2, d, d2} enters that cycle at d (from g1) and leaves it at c2 (to g2).
INTERLOCKED = """
HloModule interlocked

ENTRY %main (x: f32[16,16], y: f32[16,16], w: f32[16,16]) -> (f32[16,16], f32[16,16]) {
  %x = f32[16,16]{1,0} parameter(0)
  %y = f32[16,16]{1,0} parameter(1)
  %w = f32[16,16]{1,0} parameter(2)
  %a = f32[16,16]{1,0} exponential(%x)
  %g1 = f32[16,16]{1,0} dot(%a, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %d = f32[16,16]{1,0} negate(%g1)
  %d2 = f32[16,16]{1,0} exponential(%d)
  %c = f32[16,16]{1,0} exponential(%y)
  %c2 = f32[16,16]{1,0} negate(%c)
  %g2 = f32[16,16]{1,0} dot(%c2, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %b = f32[16,16]{1,0} negate(%g2)
  ROOT %t = (f32[16,16]{1,0}, f32[16,16]{1,0}) tuple(%d2, %b)
}
"""


def kernels_form_a_cycle(dag: KernelDag, kernels) -> bool:
    """The tests' own check, apart from ``KernelDag.split_cycles``: a topological sort of the
    kernel DAG with each of ``kernels`` one node gets stuck."""
    owner = {n: i for i, kernel in enumerate(kernels) for n in kernel}
    unit = lambda n: owner.get(n, n)
    edges = {(unit(n), unit(s)) for n in dag.kernels for s in dag.succs[n] if unit(n) != unit(s)}
    waiting = {unit(n): 0 for n in dag.kernels}
    for _, v in edges:
        waiting[v] += 1
    ready, sorted_units = [u for u, count in waiting.items() if count == 0], 0
    while ready:
        u = ready.pop()
        sorted_units += 1
        for a, v in edges:
            if a == u:
                waiting[v] -= 1
                if waiting[v] == 0:
                    ready.append(v)
    return sorted_units < len(waiting)


# A module's head with the %add combiner; an ENTRY follows.
# --- async fusions (jaxlib 0.11.2's XLA:GPU puts a scan body's slices in fusion-start/done):
# test_runtime.py, test_graph_explorer.py. The fused computation both modules call.
FUSED_SLICE = """HloModule async_fusion

%fused_slice (p0: f32[4,8], p1: s32[]) -> f32[1,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  ROOT %ds = f32[1,8]{1,0} dynamic-slice(%p0, %p1, %zero), dynamic_slice_sizes={1,8}
}
"""


HEAD_WITH_ADD = """HloModule t
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
"""


def accept_all(nodes):
    """A code generator stub that builds every candidate."""
    return None


def producer_with_two_consumers(rows: int, cols: int) -> str:
    return HEAD_WITH_ADD + f"""
ENTRY %main (x: f32[{rows},{cols}], y: f32[{rows},{cols}]) -> (f32[{rows}], f32[{rows},{cols}]) {{
  %x = f32[{rows},{cols}]{{1,0}} parameter(0)
  %y = f32[{rows},{cols}]{{1,0}} parameter(1)
  %a = f32[{rows},{cols}]{{1,0}} exponential(%x)
  %zero = f32[] constant(0)
  %b = f32[{rows}]{{0}} reduce(%a, %zero), dimensions={{1}}, to_apply=%add
  %c = f32[{rows},{cols}]{{1,0}} add(%a, %y)
  ROOT %t = (f32[{rows}]{{0}}, f32[{rows},{cols}]{{1,0}}) tuple(%b, %c)
}}
"""


CYCLE = HEAD_WITH_ADD + """
ENTRY %main (x: f32[64,256], w: f32[256,256]) -> f32[64,256] {
  %x = f32[64,256]{1,0} parameter(0)
  %w = f32[256,256]{1,0} parameter(1)
  %a = f32[64,256]{1,0} negate(%x)
  %v = f32[64,256]{1,0} bitcast(%a)
  %b = f32[64,256]{1,0} abs(%v)
  %d = f32[64,256]{1,0} dot(%a, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %c = f32[64,256]{1,0} add(%b, %d)
}
"""


# --- kernels against ptxas: test_profile.py, test_register_rules.py ---------------------------
needs_ptxas = pytest.mark.skipif(codegen.find_ptxas() is None, reason="ptxas not installed")


def kernel_spec(kernel: Kernel) -> codegen.KernelSpec:
    inputs = [(b.name, b.shape) for b in kernel.buffers if not b.is_output]
    outputs = [(b.name, b.shape) for b in kernel.buffers if b.is_output]
    return codegen.KernelSpec(
        name=kernel.name, nodes=[], inputs=inputs, outputs=outputs, schemes=[],
        grid=kernel.grid, block=kernel.block, smem_bytes=kernel.smem_bytes, kernel=kernel,
        read_bytes=sum(s.byte_size for _, s in inputs),
        write_bytes=sum(s.byte_size for _, s in outputs), regs_model=0, why="test")


def within_a_quarter(model: int, regs: int) -> bool:
    """The register model ``model`` is within 25% of ptxas's ``regs``."""
    return abs(model - regs) <= 0.25 * regs


# --- a jitted LayerNorm and its arguments: test_runtime_faults.py, test_cache.py,
# test_hardening_runtime.py -----------------------------------------------------------------
def layernorm(x, g, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * g + b


def args(rows=16, cols=128):
    rng = np.random.default_rng(3)
    return [rng.standard_normal((rows, cols)).astype(np.float32),
            rng.standard_normal(cols).astype(np.float32),
            rng.standard_normal(cols).astype(np.float32)]


def expected(*a):
    return np.asarray(jax.jit(layernorm)(*a))


def run_in_parts(host, spec, inputs, parts: int | None) -> list[np.ndarray]:
    """The kernel whole (``parts`` None) or as each of ``parts`` parts in turn, on outputs
    first filled with NaN (an element no part writes stays NaN)."""
    ins = [to_physical(x, s) for x, (_, s) in zip(inputs, spec.inputs)]
    outs = [np.full(s.num_elements, np.nan, s.numpy_dtype) for _, s in spec.outputs]
    pointers = (ctypes.c_void_p * len(ins + outs))(*[a.ctypes.data for a in ins + outs])
    if parts is None:
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(host.address)(pointers)
    else:
        call = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)(
            host.parts_address)
        for part in reversed(range(parts)):  # any order: the parts are independent
            call(pointers, part, parts)
    return outs


# -- native test kernels (for the FFI tests) -------------------------------------------------

_engines = []  # the test kernels' code must outlive every executable that calls it


def elementwise_kernel(symbol: str, size: int, outputs: list[tuple[str, int, int]]) -> int:
    """``out_k[e] = op_k(in_i[e], in_j[e])`` over ``size`` f32 elements, for each output
    ``(op, i, j)`` (op: fadd/fsub/fmul); returns the native address."""
    f32, ptr = lir.FloatType(), lir.PointerType()
    module = lir.Module(symbol)
    fn = lir.Function(module, lir.FunctionType(lir.VoidType(), [ptr]), symbol)
    b = lir.IRBuilder(fn.append_basic_block("entry"))
    num_inputs = max(max(i, j) for _, i, j in outputs) + 1
    buffers = [b.load(b.gep(fn.args[0], [lir.Constant(lir.IntType(64), k)], source_etype=ptr), typ=ptr)
               for k in range(num_inputs + len(outputs))]
    entry = b.block
    loop = fn.append_basic_block("loop")
    b.branch(loop)
    b.position_at_end(loop)
    index = b.phi(lir.IntType(64))
    index.add_incoming(lir.Constant(lir.IntType(64), 0), entry)
    values = [b.load(b.gep(buf, [index], source_etype=f32), typ=f32) for buf in buffers[:num_inputs]]
    for k, (op, i, j) in enumerate(outputs):
        result = getattr(b, op)(values[i], values[j])
        b.store(result, b.gep(buffers[num_inputs + k], [index], source_etype=f32))
    following = b.add(index, lir.Constant(lir.IntType(64), 1))
    index.add_incoming(following, loop)
    done = fn.append_basic_block("done")
    b.cbranch(b.icmp_unsigned("==", following, lir.Constant(lir.IntType(64), size)), done, loop)
    b.position_at_end(done)
    b.ret_void()
    parsed = llvm.parse_assembly(str(module))
    engine = llvm.create_mcjit_compiler(parsed, ffi._host_target_machine())
    engine.finalize_object()
    _engines.append(engine)
    return engine.get_function_address(symbol)


def free_port() -> int:
    """A TCP port on localhost that nothing listens on (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
