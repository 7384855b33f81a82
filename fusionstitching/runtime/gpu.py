"""GPU launch path: the stitched kernels as custom calls that launch their PTX on XLA's stream.

The module rewrite is the CPU route's (``rewrite.py``); behind each kernel's custom-call target
is jaxlib's Triton kernel-call FFI handler (``triton_kernel_call_ffi``), registered under the
kernel's own name, which launches any PTX on XLA's stream with the buffers in our kernel ABI's
order (inputs, then outputs). Targets are registered before XLA:GPU compiles
(``register_launch_targets``). Entry points: ``rewrite_for_gpu(module, result, arch)`` and
``compile_for_gpu_deviceless(text, target)`` (XLA:GPU's optimized HLO without a GPU).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import zlib
from dataclasses import dataclass

import costmodel
from costmodel import WARP

from .. import child_processes
from ..codegen import compile_nvptx
from ..hlo.ir import Module, Shape, print_module
from ..logs import log
from ..report import Fallback
from .ffi import TARGET_PREFIX
from .rewrite import RewriteError, rewrite_module


LAUNCHER = "triton_kernel_call_ffi"  # jaxlib's FFI handler that launches a PTX kernel
MAX_THREADS_PER_BLOCK = 1024
MAX_GRID_X = 2**31 - 1
MAX_STATIC_SMEM_BYTES = 48 * 1024
PTR_DIVISIBILITY = 16


@dataclass
class LaunchParameter:
    """One kernel argument: the device pointer of one buffer, in its physical layout."""

    name: str  # the HLO value
    shape: Shape  # with the layout the kernel indexes
    is_output: bool
    ptr_divisibility: int = PTR_DIVISIBILITY
    bytes_to_zero: int = 0


@dataclass
class Launch:
    """How jaxlib's launcher runs one stitched kernel."""

    target: str  # custom-call target, registered to the launcher
    kernel_name: str  # the PTX entry
    grid: tuple[int, int, int]
    num_warps: int
    dynamic_smem_bytes: int
    static_smem_bytes: int  # shared arrays declared in the PTX (ptxas's count when known)
    compute_capability: int  # 90 for sm_90
    parameters: list[LaunchParameter]
    ptx: str

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.num_warps * WARP, 1, 1)


# -- launch description ----------------------------------------------------------------------

def compute_capability(arch: str) -> int:
    """``sm_90`` / ``sm_90a`` -> 90."""
    match = re.fullmatch(r"sm_(\d+)a?", arch)
    if not match:
        raise ValueError(f"not an NVIDIA architecture name like sm_90: {arch!r}")
    return int(match.group(1))


def ptx_entry_parameters(ptx: str, kernel_name: str) -> int:
    """Number of parameters of entry ``kernel_name`` in the PTX (each one a buffer pointer)."""
    match = re.search(rf"\.entry\s+{re.escape(kernel_name)}\s*\(([^)]*)\)", ptx)
    if match is None:
        raise RewriteError(f"the PTX has no entry {kernel_name!r}")
    return len(re.findall(r"\.param\b", match.group(1)))


def launch_for(spec, nvptx) -> Launch:
    """The launch of kernel ``spec`` (codegen.KernelSpec) from its PTX (codegen.NvptxKernel).

    Raises RewriteError when the kernel cannot be launched this way (the caller leaves the
    pattern to XLA)."""
    block, grid = tuple(spec.block), tuple(spec.grid)
    if any(d != 1 for d in block[1:]) or any(d != 1 for d in grid[1:]):
        raise RewriteError(f"{spec.name}: block {block} / grid {grid} use y or z, but the "
                           "kernel indexes threads and blocks in x only")
    threads, blocks = block[0], grid[0]
    if threads % WARP or not WARP <= threads <= MAX_THREADS_PER_BLOCK:
        raise RewriteError(f"{spec.name}: {threads} threads per block is not a whole number "
                           f"of warps up to {MAX_THREADS_PER_BLOCK} (the launcher starts "
                           "32 * num_warps threads)")
    if not 1 <= blocks <= MAX_GRID_X:
        raise RewriteError(f"{spec.name}: grid of {blocks} blocks is outside 1..{MAX_GRID_X}")
    static_smem = nvptx.smem_bytes if nvptx.smem_bytes is not None else spec.smem_bytes
    if static_smem > MAX_STATIC_SMEM_BYTES:
        raise RewriteError(f"{spec.name}: {static_smem} bytes of static shared memory exceed "
                           f"the {MAX_STATIC_SMEM_BYTES}-byte limit per block")
    parameters = ([LaunchParameter(n, s, False) for n, s in spec.inputs]
                  + [LaunchParameter(n, s, True) for n, s in spec.outputs])
    buffers = [(b.name, b.is_output) for b in spec.kernel.buffers]
    if buffers != [(p.name, p.is_output) for p in parameters]:
        raise RewriteError(f"{spec.name}: kernel buffers {buffers} are not the spec's inputs "
                           "then outputs")
    declared = ptx_entry_parameters(nvptx.ptx, spec.kernel.name)
    if declared != len(parameters):
        raise RewriteError(f"{spec.name}: the PTX entry takes {declared} parameters for "
                           f"{len(parameters)} buffers")
    return Launch(target=spec.name, kernel_name=spec.kernel.name, grid=(blocks, 1, 1),
                  num_warps=threads // WARP, dynamic_smem_bytes=0,
                  static_smem_bytes=static_smem,
                  compute_capability=compute_capability(nvptx.arch), parameters=parameters,
                  ptx=nvptx.ptx)


# -- the custom call's attribute ---------------------------------------------------------------

def _triton_lib():
    """jaxlib's kernel-call bindings (present with the CUDA plugin)."""
    from jax._src.lib import gpu_triton

    if not hasattr(gpu_triton, "TritonKernelCall"):
        raise RewriteError("the GPU launch path needs jaxlib's Triton kernel call from the JAX "
                           "CUDA plugin (pip install fusionstitching[xla-gpu]); it is not "
                           "installed")
    return gpu_triton


def opaque(launch: Launch) -> bytes:
    """The launcher's ``opaque`` attribute: the zlib-compressed kernel-call proto."""
    lib = _triton_lib()
    kernel = lib.TritonKernel(launch.kernel_name, launch.num_warps, 1,  # one CTA per cluster
                              launch.dynamic_smem_bytes, launch.ptx, "",  # no Triton IR
                              launch.compute_capability)
    call = lib.TritonKernelCall(kernel, *launch.grid, [
        lib.create_array_parameter(p.bytes_to_zero, p.ptr_divisibility)
        for p in launch.parameters])
    return zlib.compress(call.to_proto(launch.target, b""))


def backend_config(launch: Launch) -> str:
    """The custom call's ``backend_config`` as HLO attribute text: a typed-FFI call's
    attributes are an MLIR dictionary (``{opaque = "..."}``, bytes escaped as ``\\XX``) held
    in an HLO string (C escapes)."""
    mlir_bytes = "".join(f"\\{b:02X}" for b in opaque(launch))
    dictionary = '{opaque = "' + mlir_bytes + '"}'
    return '"' + dictionary.replace("\\", "\\\\").replace('"', '\\"') + '"'


# -- targets ---------------------------------------------------------------------------------

def register_launch_targets(names) -> None:
    """Register jaxlib's launcher as the CUDA FFI handler of each custom-call target name.

    XLA refuses to compile a custom call without a handler ("No FFI handler registered for
    ..."), so this runs before compiling, in the process that compiles and in the one that
    runs. Registering a name again is harmless (same handler)."""
    import jax

    handler = _triton_lib()._cuda_triton.registrations()[LAUNCHER]
    for name in names:
        if not name.startswith(TARGET_PREFIX):
            raise ValueError(f"{name!r} is not a FusionStitching target")
        jax.ffi.register_ffi_target(name, handler, platform="CUDA", api_version=1)


_CUSTOM_CALL_TARGET = re.compile(r'custom_call_target="(' + TARGET_PREFIX + r'[\w.\-]*)"')


def launch_targets(hlo_text: str) -> list[str]:
    """The FusionStitching custom-call targets in the HLO text, in order of appearance."""
    return list(dict.fromkeys(_CUSTOM_CALL_TARGET.findall(hlo_text)))


# -- public entry points ---------------------------------------------------------------------

def rewrite_for_gpu(module: Module, result, arch: str | None = None) -> str:
    """XLA:GPU's optimized ``module`` with the kernels of ``result`` (pipeline.StitchResult)
    as launcher custom calls, as HLO text for XLA:GPU to compile again.

    ``arch`` (default: the report's target GPU) is the architecture the PTX is for; a kernel
    whose PTX was built for another one (or not built) is generated again. A kernel that
    cannot be launched this way is left to XLA, with a warning and a ``gpu-launch`` entry in
    ``result.report.fallbacks``. A module that cannot be rewritten raises RewriteError."""
    kernels, launches = launchable(result, arch)
    configs = [backend_config(launch) for launch in launches]
    rewritten = rewrite_module(module, kernels, [launch.target for launch in launches], configs)
    return print_module(rewritten)


def launchable(result, arch: str | None = None) -> tuple[list, list[Launch]]:
    """The kernels of ``result`` that the launcher can run, with their launches (see
    ``rewrite_for_gpu``); the others are left to XLA with a ``gpu-launch`` fallback."""
    arch = arch or costmodel.load_device(result.report.target).sm_arch
    kernels, launches = [], []
    for kernel in result.kernels:
        try:
            nvptx = kernel.nvptx
            if nvptx is None or nvptx.arch != arch:
                nvptx = compile_nvptx(kernel.spec, arch)
            launches.append(launch_for(kernel.spec, nvptx))
        except Exception as exc:  # that pattern stays XLA's
            why = f"{type(exc).__name__}: {exc}"
            log.warning("kernel %s left to XLA (gpu-launch): %s",
                        kernel.spec.name, why)
            result.report.fallbacks.append(Fallback("gpu-launch", list(kernel.pattern.nodes),
                                                    why))
            continue
        kernels.append(kernel)
    return kernels, launches


def compile_for_gpu_deviceless(hlo_text: str, target: str = "h100") -> str:
    """Compile rewritten HLO with XLA:GPU for ``target`` without a GPU; return XLA's final
    optimized HLO (where our custom calls must appear).

    Needs the JAX CUDA plugin and JAX started with JAX_PLATFORMS=cpu; otherwise the compile
    runs in a child process (``python -m fusionstitching.runtime.gpu``) that registers the
    launch targets itself."""
    from .. import capture

    if capture.gpu_compiles_in_process():
        register_launch_targets(launch_targets(hlo_text))
        return capture.hlo_for_gpu(hlo_text, target=target)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    proc = child_processes.run([sys.executable, "-m", "fusionstitching.runtime.gpu",
                                "--target", target], child_processes.COMPILE_TIMEOUT_S,
                               input=hlo_text, env=env)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise capture.CaptureError(f"deviceless XLA:GPU compile in a child process failed:\n"
                                   f"{tail}")
    return proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fusionstitching.runtime.gpu",
        description="Compile rewritten HLO (stdin) with XLA:GPU for a target without a GPU; "
                    "print XLA's optimized HLO.")
    parser.add_argument("--target", default="h100")
    opts = parser.parse_args(argv)
    os.environ["JAX_PLATFORMS"] = "cpu"  # before JAX initializes: the plugin compiles deviceless
    import jax
    jax.config.update("jax_platforms", "cpu")
    try:
        text = compile_for_gpu_deviceless(sys.stdin.read(), opts.target)
    except Exception as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
