"""Host kernels timed against XLA:CPU, kernel by kernel, with what a CPU cost model can see.

For each XLA:CPU module of the third-party tier (tests/data/hlo/third_party/*_cpu.hlo*), as the
host route plans it (small loops unrolled, ``stitch_module`` with the runtime's options,
``build.plan_on_host`` with measuring on): every kernel the route times (the plan's stitched
kernels, then the XLA kernels it left alone, generated as one kernel of ours) is recorded
with its two measured times (``cpu_speed.compare``: our kernel as the stitched executable
calls it, XLA:CPU running the same instructions as a module of their own) and its features:
our kernel's bytes and instructions (counted on its CPU schedule), and per XLA kernel it
replaces the bytes and instructions of ``xla_kernel_profile``. The rows are the data
``costmodel/host.py``'s constants are fitted on and scored against (fit_host_model.py).

    python benchmarks/cpu_kernel_times.py [--only NAME ...] --json out.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.manifest import run_manifest  # noqa: E402

from costmodel import load_device  # noqa: E402
from fusionstitching import pipeline  # noqa: E402
from fusionstitching.capability import xla_kernel_us  # noqa: E402
from fusionstitching.codegen import modeled_kernel_us  # noqa: E402
from fusionstitching.codegen.cost.instructions import count_instructions  # noqa: E402
from fusionstitching.graph.xla_kernel_model import xla_kernel_profile  # noqa: E402
from fusionstitching.hlo.parser import parse_module, read_hlo_text  # noqa: E402
from fusionstitching.hlo.unroll import unroll_loops  # noqa: E402
from fusionstitching.runtime import build, cpu_speed  # noqa: E402
from fusionstitching.runtime.plan_key import open_cache  # noqa: E402

TIER = REPO / "tests" / "data" / "hlo" / "third_party"


def shape_bytes(shapes) -> int:
    return sum(s.byte_size for _, s in shapes)


def total_instructions(profile) -> dict[str, float]:
    threads = profile.grid_blocks * profile.threads_per_block
    return {cls: n * threads for cls, n in profile.instructions.items()}


def features(graph, spec, device) -> dict:
    """What a model may price ``spec`` (host kernel built) and the XLA kernels it replaces by."""
    host = spec.host_kernel
    counts: dict[str, float] = {}
    count_instructions(host, counts)
    blocks = math.prod(host.grid) * math.prod(host.block)
    xla = []
    for node in spec.nodes:
        if not graph.nodes[node].is_kernel:
            continue
        profile = xla_kernel_profile(graph, node, device)
        xla.append({"node": node, "bytes_read": profile.bytes_read,
                    "bytes_written": profile.bytes_written,
                    "instructions": total_instructions(profile),
                    "h100_us": xla_kernel_us(graph, node, device)})
    return {"nodes": list(spec.nodes), "inputs": len(spec.inputs), "outputs": len(spec.outputs),
            "bytes_read": shape_bytes(spec.inputs),
            "bytes_written": shape_bytes(spec.outputs), "schedule": spec.schedule.kind,
            "host_instructions": {cls: n * blocks for cls, n in counts.items()},
            "h100_us": modeled_kernel_us(spec, device), "xla": xla}


def measure_module(path: Path) -> list[dict]:
    module = unroll_loops(parse_module(read_hlo_text(path), source=str(path)))
    options = pipeline.Options(ptxas=False)
    device = load_device(options.target)
    result = pipeline.stitch_module(module, options)
    rows: list[dict] = []
    real_compare = cpu_speed.compare
    lone_start = len(result.kernels)

    def recording_compare(module_of_graph, spec, target):
        host_us, xla_us = real_compare(module_of_graph, spec, target)
        rows.append({"model": path.name.split("_cpu")[0], "host_us": host_us, "xla_us": xla_us,
                     "lone": len(rows) >= lone_start and len(spec.nodes) == 1,
                     **features(result.graph, spec, device)})
        return host_us, xla_us

    stats, cache = open_cache(None, None)
    cpu_speed.compare = recording_compare
    try:
        build.plan_on_host(module, result, options, cache, stats, measure=True)
    finally:
        cpu_speed.compare = real_compare
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    paths = sorted(p for p in TIER.iterdir() if "_cpu." in p.name and "elided" not in p.name)
    if args.only:
        paths = [p for p in paths if any(o in p.name for o in args.only)]
    out = {"manifest": run_manifest({"only": args.only}), "rows": []}
    for path in paths:
        started = time.perf_counter()
        try:
            rows = measure_module(path)
        except Exception as exc:  # one module's failure is reported, the rest go on
            print(f"{path.name}: failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        out["rows"] += rows
        print(f"{path.name}: {len(rows)} kernels timed in {time.perf_counter() - started:.0f} s",
              flush=True)
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
