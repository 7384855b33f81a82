"""How close the register model is to ptxas over every stitched kernel of the corpus (not a test).

    PYTHONPATH=. python benchmarks/bench_regs.py [hlo files...]   (default tests/data/hlo/*.hlo*)

Each module goes through fusionstitching.pipeline.stitch_module; each stitched kernel is
assembled by ptxas for sm_80 and sm_90. Prints per kernel the model, ptxas's registers and the
ratio model / ptxas, then per architecture the distribution of the ratio (quartiles and a
histogram) and the fraction of kernels whose model is within 25% of ptxas (the goal:
at least 90%), and the fraction within 25% on both architectures.
"""
from __future__ import annotations

import glob
import math
import sys
from pathlib import Path

from fusionstitching import codegen, pipeline
from fusionstitching.codegen.cost.registers import register_model
from fusionstitching.hlo.parser import parse_file

ARCHS = ("sm_80", "sm_90")
TOLERANCE = 0.25
HISTOGRAM_EDGES = (0.5, 0.75, 0.9, 1.1, 1.25, 1.5)  # of model / ptxas


def corpus_kernels(paths: list[str]):
    """(module file, KernelSpec) for every stitched kernel; modules that fail are reported."""
    for path in paths:
        try:
            result = pipeline.stitch_module(parse_file(path), pipeline.Options(ptxas=False))
        except Exception as exc:  # a module the pipeline cannot take says why and is skipped
            print(f"# {Path(path).name}: {type(exc).__name__}: {exc}")
            continue
        for kernel in result.kernels:
            yield Path(path).name, kernel.spec


def main(paths: list[str]) -> None:
    if codegen.find_ptxas() is None:
        sys.exit("ptxas not found: install the CUDA toolkit or the nvidia-cuda-nvcc wheel")
    measured: dict[str, dict[str, int]] = {}  # kernel IR text -> arch -> ptxas registers
    rows = []
    print(f"{'module':44} {'kernel':28} {'model':>5} {'sm_80':>5} {'sm_90':>5} "
          f"{'ratio80':>7} {'ratio90':>7}")
    for name, spec in corpus_kernels(paths):
        text = str(spec.kernel).replace(spec.name, "")
        if text not in measured:  # the same kernel from another capture of the same model
            measured[text] = {arch: codegen.compile_nvptx(spec, arch).regs for arch in ARCHS}
        model, regs = register_model(spec.kernel), measured[text]
        ratios = [model / regs[arch] for arch in ARCHS]
        rows.append(ratios)
        print(f"{name[:44]:44} {spec.name[-28:]:28} {model:5d} {regs['sm_80']:5d} "
              f"{regs['sm_90']:5d} {ratios[0]:7.2f} {ratios[1]:7.2f}")
    if not rows:
        sys.exit("no stitched kernels")
    print(f"\n{len(rows)} kernels ({len(measured)} distinct)")
    for i, arch in enumerate(ARCHS):
        ratios = sorted(r[i] for r in rows)
        quartiles = [ratios[int(q * (len(ratios) - 1))] for q in (0, 0.25, 0.5, 0.75, 1)]
        within = sum(abs(r - 1) <= TOLERANCE for r in ratios) / len(ratios)
        print(f"{arch}: model/ptxas min {quartiles[0]:.2f} q1 {quartiles[1]:.2f} "
              f"median {quartiles[2]:.2f} q3 {quartiles[3]:.2f} max {quartiles[4]:.2f}; "
              f"within 25%: {within:.1%}")
        edges = list(zip((0,) + HISTOGRAM_EDGES, HISTOGRAM_EDGES + (math.inf,)))
        print("  " + "  ".join(f"[{lo:g}, {hi:g}): {sum(lo <= r < hi for r in ratios)}"
                               for lo, hi in edges))
    both = sum(all(abs(r - 1) <= TOLERANCE for r in row) for row in rows) / len(rows)
    print(f"within 25% on both: {both:.1%} (target >= 90%)")


if __name__ == "__main__":
    main(sys.argv[1:] or sorted(glob.glob("tests/data/hlo/*.hlo*")))
