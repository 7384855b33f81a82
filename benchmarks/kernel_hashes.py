"""Hashes of every corpus module's plan and kernels: a refactor shows the kernels did not change.

    python benchmarks/kernel_hashes.py --out /tmp/before.json [--jobs 2] [FILE ...]
    python benchmarks/kernel_hashes.py --out /tmp/after.json --compare /tmp/before.json

Per module (default: tests/data/hlo and its third-party tier), planned for the H100 without
ptxas: the plan (kernels' XLA kernels, schedule, launch, shared memory, modeled registers and
time, bytes; fallbacks' stages and nodes, not any wording), and per kernel the sha256 of its
kernel IR, NVPTX LLVM IR, PTX, host LLVM IR and CPU-scheduled kernel IR. ``--compare`` lists
the modules whose hashes differ (only those given, with FILEs) and exits 1 if any do.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import sys
import time
from pathlib import Path

from fusionstitching.codegen.nvptx import ptx_of
from fusionstitching.hlo.parser import parse_file
from fusionstitching.pipeline import Options, stitch_module

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "hlo"


def corpus_files() -> list[Path]:
    return sorted(p for p in CORPUS.rglob("*") if p.name.endswith((".hlo", ".hlo.gz")))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def module_hashes(path: Path) -> dict:
    """The plan and kernel hashes of one module (or the error that stopped it)."""
    started = time.perf_counter()
    try:
        result = stitch_module(parse_file(path), Options(target="h100", ptxas=False, host=True))
    except Exception as exc:  # reported, and compared like any other hash
        return {"error": f"{type(exc).__name__}: {exc}"}
    kernels = {}
    for kernel in result.kernels:
        spec = kernel.spec
        llvm_text, ptx = ptx_of(spec.kernel, "sm_90")
        kernels[spec.name] = {
            "plan": [spec.nodes, spec.schemes, list(spec.grid), list(spec.block), spec.smem_bytes,
                     spec.regs_model, round(spec.modeled_us, 6), spec.read_bytes,
                     spec.write_bytes, spec.raw_read_bytes],
            "kernel_ir": digest(str(spec.kernel)),
            "nvptx_llvm": digest(llvm_text),
            "ptx": digest(ptx),
            "host_llvm": digest(kernel.host.llvm_ir) if kernel.host is not None else None,
            "cpu_kernel_ir": digest(str(spec.host_kernel)) if spec.host_kernel else None,
        }
    fallbacks = sorted((f.stage, sorted(f.nodes)) for f in result.report.fallbacks)
    return {"kernels": kernels, "fallbacks": fallbacks,
            "bytes": [result.report.xla.bytes, result.report.fs.bytes],
            "seconds": round(time.perf_counter() - started, 1)}


def _one(path: Path) -> tuple[str, dict]:
    name = str(path.relative_to(CORPUS)) if path.is_relative_to(CORPUS) else path.name
    return name, module_hashes(path)


def differences(before: dict, after: dict) -> list[str]:
    lines = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old is None or new is None:
            lines.append(f"{name}: only {'after' if old is None else 'before'}")
            continue
        old, new = ({k: v for k, v in h.items() if k != "seconds"} for h in (old, new))
        if old == new:
            continue
        if "error" in old or "error" in new:
            lines.append(f"{name}: {old.get('error', 'planned')} -> {new.get('error', 'planned')}")
            continue
        for kernel in sorted(set(old["kernels"]) | set(new["kernels"])):
            a, b = old["kernels"].get(kernel), new["kernels"].get(kernel)
            if a != b:
                what = "added" if a is None else "removed" if b is None else \
                    ", ".join(k for k in a if a[k] != b[k])
                lines.append(f"{name}: {kernel}: {what}")
        for key in ("fallbacks", "bytes"):
            if old[key] != new[key]:
                lines.append(f"{name}: {key} {old[key]} -> {new[key]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compare", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    files = [p.resolve() for p in args.files] or corpus_files()
    started = time.perf_counter()
    hashes = {}
    with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=8) as pool:
        for done, (name, h) in enumerate(pool.imap_unordered(_one, files), 1):
            hashes[name] = h
            print(f"[{done}/{len(files)}] {name}: {len(h.get('kernels', {}))} kernels, "
                  f"{h.get('seconds', '-')} s {h.get('error', '')}", flush=True)
    args.out.write_text(json.dumps(dict(sorted(hashes.items())), indent=1))
    print(f"{len(files)} modules in {time.perf_counter() - started:.0f} s -> {args.out}")
    if args.compare is None:
        return 0
    before = json.loads(args.compare.read_text())
    if args.files:  # a subset: compared with the same modules of the earlier run
        before = {name: h for name, h in before.items() if name in hashes}
    lines = differences(before, hashes)
    print("\n".join(lines) if lines else f"identical to {args.compare}")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
