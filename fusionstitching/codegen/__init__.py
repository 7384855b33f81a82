"""codegen/: stitched kernels for fusion patterns (paper section 4).

    Module + pattern nodes --flatten--> Pattern --schedules--> Kernel IR --host--> CPU code
                                                                         --nvptx--> PTX, cubin

`generate` runs the first two stages and returns a `KernelSpec`; `compile_host` and
`compile_nvptx` lower the same kernel IR for the CPU and for NVIDIA GPUs.
"""
from .errors import CodegenError, NotFaster, Refusal
from .generate import (KernelSpec, add_host_kernel, can_stitch, generate, host_profile,
                       modeled_kernel_us, other_space_nodes, with_own_names)
from .host import HostKernel, Traffic, compile_host, count_traffic
from .nvptx import NvptxKernel, compile_nvptx, find_ptxas
from .schedules.candidates import Schedule
from .schedules.choose import Refused
from .schedules.emitter import statements_placed, values_built

__all__ = ["CodegenError", "HostKernel", "KernelSpec", "NotFaster", "NvptxKernel", "Refusal",
           "Refused", "Schedule", "Traffic", "add_host_kernel", "can_stitch", "compile_host",
           "compile_nvptx", "count_traffic", "find_ptxas", "generate", "host_profile",
           "modeled_kernel_us",
           "other_space_nodes", "statements_placed", "values_built", "with_own_names"]
