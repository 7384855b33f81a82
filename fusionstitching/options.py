"""The options of one stitching pass (``pipeline.stitch_module``), apart from the pass so that
the runtime's call path names them without loading the compiler.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Options:
    target: str = "h100"
    # What prices kernels for the plan: "gpu", the latency-evaluator of ``target``; "cpu", the
    # host CPU's model (costmodel/host.py); "auto": "cpu" for modules XLA:CPU runs in the
    # runtime (the host route), else "gpu"
    cost_model: str = "auto"
    explorer: str = "beam"
    verify: bool = False
    emit_dir: str | None = None
    ptxas: bool = True  # assemble each kernel (registers and spills come from ptxas)
    host: bool = False  # build host kernels (always built when verifying); with ``verify``,
    # the CPU schedule the runtime runs on a CPU is verified too
    seed: int = 0
    # Processes answering the explorer's capability queries: None, one per core for a module
    # of query_workers.MIN_KERNELS memory-intensive kernels or more; 0 or 1, none.
    workers: int | None = None
