"""NVPTX backend: the kernel IR as LLVM IR with NVVM intrinsics -> PTX (llvmlite) -> cubin (ptxas).

One kernel parameter per buffer (inputs then outputs). Thread and block indices come from
``llvm.nvvm.read.ptx.sreg.{tid,ctaid}.x``, warp_reduce is five ``shfl.sync.bfly`` steps,
barriers are ``llvm.nvvm.barrier0``, shared arrays are ``addrspace(3)`` globals, and
exp/log/tanh/pow/sqrt/rsqrt call libdevice (linked from the CUDA installation) and f32
division is div.full.f32, as in XLA:GPU, so a stitched kernel's numbers are those of the XLA
kernels it replaces (the host backend computes them correctly rounded, as XLA:CPU does).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir

from .. import child_processes
from .kernel_ir import Barrier, ConstArray, Kernel, SharedArray, WarpReduce, expand_block_reduce
from .llvm_lowering import F32, I32, I64, PTR, STORAGE_TYPES, ThreadLowering, optimize

TRIPLE = "nvptx64-nvidia-cuda"
DATA_LAYOUT = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"
_LIBDEVICE = {"exponential": "__nv_expf", "log": "__nv_logf", "tanh": "__nv_tanhf",
              "power": "__nv_powf", "sine": "__nv_sinf", "cosine": "__nv_cosf",
              "tan": "__nv_tanf", "atan2": "__nv_atan2f", "exponential-minus-one": "__nv_expm1f",
              "log-plus-one": "__nv_log1pf", "cbrt": "__nv_cbrtf", "erf": "__nv_erff"}


class NvptxLowering(ThreadLowering):
    def __init__(self, kernel: Kernel, module: ir.Module):
        params = [PTR] * len(kernel.buffers)
        function = ir.Function(module, ir.FunctionType(ir.VoidType(), params), kernel.name)
        for arg, buf in zip(function.args, kernel.buffers):
            arg.name = re.sub(r"[^\w.]", "_", buf.name)
            arg.add_attribute("noalias")  # buffers never overlap: lets loads go through the
            # read-only cache path and be reordered around stores
        super().__init__(kernel, module, function)
        self.shared = {}
        for a in kernel.shared:
            g = ir.GlobalVariable(module, ir.ArrayType(STORAGE_TYPES[a.dtype], a.size), a.name,
                                  addrspace=3)
            g.linkage = "internal"
            g.align = 16
            g.initializer = ir.Constant(g.value_type, ir.Undefined)
            # A generic pointer indexes like any buffer; LLVM's infer-address-spaces pass turns
            # the accesses back into ld/st.shared.
            self.shared[a.name] = self.builder.addrspacecast(g, PTR)
        # Constants live in global memory (addrspace 1), read through generic pointers.
        self.constants = {c.name: self.builder.addrspacecast(self.constant_global(c, 1), PTR)
                          for c in kernel.constants}
        self.vars[kernel.tid] = self.intrinsic("llvm.nvvm.read.ptx.sreg.tid.x", I32, [])
        self.vars[kernel.bid] = self.intrinsic("llvm.nvvm.read.ptx.sreg.ctaid.x", I32, [])
        annotations = module.add_named_metadata("nvvm.annotations")
        annotations.add(module.add_metadata([function, "kernel", ir.Constant(I32, 1)]))
        annotations.add(module.add_metadata([function, "maxntidx",
                                             ir.Constant(I32, kernel.block[0])]))
        if kernel.min_blocks_per_sm:
            annotations.add(module.add_metadata([function, "minctasm",
                                                 ir.Constant(I32, kernel.min_blocks_per_sm)]))

    def buffer_pointer(self, i: int) -> ir.Value:
        return self.function.args[i]

    def shared_pointer(self, array: SharedArray) -> ir.Value:
        return self.shared[array.name]

    def math_call(self, op: str, args: list[ir.Value]) -> ir.Value:
        return self.intrinsic(_LIBDEVICE[op], F32, args)

    def root(self, op: str, x: ir.Value) -> ir.Value:
        # XLA:GPU calls libdevice for both; without __CUDA_PREC_SQRT its functions are
        # sqrt.approx.f32 and rsqrt.approx.f32, so our results equal XLA:GPU's.
        return self.intrinsic({"sqrt": "__nv_sqrtf", "rsqrt": "__nv_rsqrtf"}[op], F32, [x])

    def constant_pointer(self, array: ConstArray) -> ir.Value:
        return self.constants[array.name]

    def collective(self, s: WarpReduce | Barrier) -> None:
        b = self.builder
        if isinstance(s, Barrier):
            self.intrinsic("llvm.nvvm.barrier0", ir.VoidType(), [])
            return
        value = self.values[s.src]
        ty = value.type
        if ty == I64:  # two 32-bit shuffles
            self.values[s.dst] = self.shuffle_reduce64(s, value)
            return
        to_bits = {F32: lambda v: b.bitcast(v, I32), I32: lambda v: v}.get(ty, lambda v: b.zext(v, I32))
        from_bits = {F32: lambda v: b.bitcast(v, F32), I32: lambda v: v}.get(ty, lambda v: b.trunc(v, ty))
        for offset in s.offsets():  # lane l combines its own value with lane l^offset
            other = self.intrinsic("llvm.nvvm.shfl.sync.bfly.i32", I32, [
                ir.Constant(I32, -1), to_bits(value), ir.Constant(I32, offset),
                ir.Constant(I32, 31)])
            value = self.combine(s, value, from_bits(other))
        self.values[s.dst] = value

    def shuffle_reduce64(self, s: WarpReduce, value):
        b = self.builder
        for offset in s.offsets():
            halves = [b.trunc(value, I32), b.trunc(b.lshr(value, ir.Constant(I64, 32)), I32)]
            lo, hi = (b.zext(self.intrinsic("llvm.nvvm.shfl.sync.bfly.i32", I32, [
                ir.Constant(I32, -1), h, ir.Constant(I32, offset), ir.Constant(I32, 31)]), I64)
                for h in halves)
            value = self.combine(s, value, b.or_(lo, b.shl(hi, ir.Constant(I64, 32))))
        return value

    def build(self) -> None:
        if self.kernel.prologue or self.kernel.part_prologue or self.kernel.scratch:
            # a host schedule's (build_host_kernel)
            raise ValueError(f"{self.kernel.name}: a prologue and scratch arrays are host-only")
        self.lower(expand_block_reduce(self.kernel))
        self.finish()


def llvm_ir(kernel: Kernel) -> str:
    module = ir.Module(name=kernel.name)
    module.triple, module.data_layout = TRIPLE, DATA_LAYOUT
    NvptxLowering(kernel, module).build()
    return str(module)


def find_ptxas() -> str | None:
    """ptxas on PATH, else from the nvidia-cuda-nvcc pip package; None if neither exists."""
    found = shutil.which("ptxas")
    if found:
        return found
    spec = importlib.util.find_spec("nvidia.cuda_nvcc") if importlib.util.find_spec("nvidia") \
        else None
    for root in (spec.submodule_search_locations if spec else []):
        candidate = os.path.join(root, "bin", "ptxas")
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def find_libdevice() -> str | None:
    roots = []
    ptxas = find_ptxas()
    if ptxas:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(ptxas))))
    roots += [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    spec = importlib.util.find_spec("nvidia.cuda_nvcc") if importlib.util.find_spec("nvidia") \
        else None
    roots += list(spec.submodule_search_locations) if spec else []
    for root in roots:
        path = os.path.join(root, "nvvm", "libdevice", "libdevice.10.bc")
        if root and os.path.exists(path):
            return path
    return None


@dataclass
class NvptxKernel:
    name: str
    arch: str
    llvm_ir: str
    ptx: str
    cubin: bytes | None  # None when no ptxas exists
    regs: int | None
    spills: int | None  # bytes of spill stores
    smem_bytes: int | None
    ptxas_log: str


def _ptx(text: str, name: str, arch: str) -> str:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    module = llvm.parse_assembly(text)
    module.verify()
    machine = llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=arch, opt=3)
    if "__nv_" in text:
        called = frozenset(f.name for f in module.functions
                           if f.is_declaration and f.name.startswith("__nv_"))
        module.link_in(_libdevice_part(called), preserve=True)
        for f in module.functions:  # only the kernel stays visible
            if not f.is_declaration and f.name != name:
                f.linkage = "internal"
        _drop_dead_globals(module, machine)
    # Division as XLA:GPU emits it (its NVPTX backend feeds LLVM -nvptx-prec-divf32=1):
    # div.full.f32, so that a stitched kernel divides exactly as the XLA kernel it replaces.
    llvm.set_option("", "-nvptx-prec-divf32=1")
    optimize(module, machine)
    return machine.emit_assembly(module)


@functools.cache
def _libdevice():
    """libdevice parsed once per process (kernels link parts of it: `_libdevice_part`)."""
    path = find_libdevice()
    if path is None:
        raise RuntimeError("libdevice.10.bc not found (needed for exp/log/tanh/pow)")
    with open(path, "rb") as f:
        lib = llvm.parse_bitcode(f.read())
    lib.triple, lib.data_layout = TRIPLE, DATA_LAYOUT
    return lib


@functools.cache
def _libdevice_part(functions: frozenset[str]):
    """libdevice cut down to ``functions`` and what they call, once per process and set: a
    kernel links a copy, and copying all of libdevice cost more than the kernel's own
    compile (ConvNeXt's 120 GELU kernels: 8.6 -> 2.1 s, the same PTX)."""
    lib = _libdevice().clone()
    for f in lib.functions:
        if not f.is_declaration and f.name not in functions:
            f.linkage = "internal"
    _drop_dead_globals(lib, llvm.Target.from_triple(TRIPLE).create_target_machine())
    return lib


def _drop_dead_globals(module, machine) -> None:
    """Global dead code elimination: the internal functions and globals nothing uses go
    (before O3, which would otherwise first optimize them)."""
    dce = llvm.create_new_module_pass_manager()
    dce.add_global_dead_code_eliminate_pass()
    dce.run(module, llvm.create_pass_builder(
        machine, llvm.create_pipeline_tuning_options(speed_level=0)))


def ptx_of(kernel: Kernel, arch: str = "sm_90") -> tuple[str, str]:
    """The kernel's LLVM IR and its PTX for ``arch`` (no ptxas)."""
    with _LLVM:
        text = llvm_ir(kernel)
        return text, _ptx(text, kernel.name, arch)


_LLVM = threading.Lock()  # llvmlite parses into LLVM's global context: one thread at a time


def compile_nvptx(spec, arch: str = "sm_90") -> NvptxKernel:
    """The kernel's PTX, assembled by ptxas when there is one. Threads may call it side by
    side: LLVM runs one at a time (its global context), ptxas children in parallel."""
    text, ptx = ptx_of(spec.kernel, arch)
    return _assembled(spec, arch, text, ptx)


def _assembled(spec, arch: str, text: str, ptx: str) -> NvptxKernel:
    ptxas = find_ptxas()
    if ptxas is None:
        return NvptxKernel(spec.name, arch, text, ptx, None, None, None, None, "")
    kernel = _assemble(ptxas, spec.name, arch, text, ptx)
    if kernel.spills and _MAXNTID.search(ptx) and not spec.kernel.min_blocks_per_sm:
        # ptxas reads ".maxntid N" as "keep the SM's every thread slot": with 256-thread blocks
        # it caps registers at 32 and spills a kernel that needs a few more; without the bound
        # it may use 64 (BERT train's packed optimizer kernel: 32 registers + 8 B of spills
        # with it, 40 and none without). The launch is the same either way.
        # A kernel marked .minnctapersm 1 has no such cap (and ptxas ignores that mark
        # without .maxntid).
        unbounded = _assemble(ptxas, spec.name, arch, text, _MAXNTID.sub("", ptx))
        if unbounded.spills == 0:
            return unbounded
    return kernel


_MAXNTID = re.compile(r"^\.maxntid [^\n]*\n", re.M)


def _assemble(ptxas: str, name: str, arch: str, text: str, ptx: str) -> NvptxKernel:
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        run = child_processes.run([ptxas, f"-arch={arch}", "-v", src, "-o", out],
                                  child_processes.PTXAS_TIMEOUT_S)
        if run.returncode != 0:
            raise RuntimeError(f"ptxas failed for {name}:\n{run.stderr}")
        with open(out, "rb") as f:
            cubin = f.read()
    log = run.stdout + run.stderr
    number = lambda pattern: int(m.group(1)) if (m := re.search(pattern, log)) else 0
    return NvptxKernel(name, arch, text, ptx, cubin, number(r"Used (\d+) registers"),
                       number(r"(\d+) bytes spill stores"), number(r"(\d+) bytes smem"), log)
