"""Run the FusionStitching pipeline over the HLO corpus and write the results table, and the
list of ops the corpus contains outside XLA:GPU's opaque library nodes, into
benchmarks/README.md (between the generated-section markers).

    python benchmarks/corpus_table.py [--jobs 2] [--timeout 900]

Rows: every workload module (tests/data/hlo/manifest.json, kind "workload") for XLA:CPU and
XLA:GPU H100 (default plan), then the micro models at [64,256] (BatchNorm [4,8,8,32]).
Each module runs in its own process (``fusionstitching.pipeline.stitch_module`` with
``Options(ptxas=False)``) so a slow or failing module shows as such in its row instead of
stopping the table. Counts are static: kernels in the module's entry computation.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fusionstitching.hlo.parser import parse_file  # noqa: E402

DATA = REPO / "tests" / "data" / "hlo"
README = REPO / "benchmarks" / "README.md"
BEGIN, END = "<!-- corpus-table:begin -->", "<!-- corpus-table:end -->"
OPS_BEGIN, OPS_END = "<!-- corpus-ops:begin -->", "<!-- corpus-ops:end -->"
COMMAND = "python benchmarks/corpus_table.py"

# Paper Table 2 (Zheng et al., FusionStitching): memory-intensive kernel calls per iteration
# with XLA and with FusionStitching, TensorFlow models at Table 1's batch sizes on a V100.
PAPER_MEM_KERNELS = {("bert", "train"): (200, 98), ("bert", "infer"): (277, 77),
                     ("dien", "train"): (6842, 2109), ("dien", "infer"): (2585, 815),
                     ("transformer", "train"): (903, 423), ("asr", "infer"): (386, 187),
                     ("crnn", "infer"): (993, 311)}
TARGET_NAMES = {"cpu": "XLA:CPU", "h100": "XLA:GPU H100"}

_CHILD = """
import json, sys, time
from fusionstitching.hlo.parser import parse_file
from fusionstitching.pipeline import Options, stitch_module
started = time.perf_counter()
module = parse_file(sys.argv[1])
parsed = time.perf_counter() - started
report = stitch_module(module, Options(ptxas=False), parse_seconds=parsed).report
print(json.dumps({"xla": report.xla.mem_kernels, "fs": report.fs.mem_kernels,
                  "xla_bytes": report.xla.bytes, "fs_bytes": report.fs.bytes,
                  "compulsory": report.compulsory_bytes, "fallbacks": len(report.fallbacks),
                  "seconds": time.perf_counter() - started}))
"""


def selected_files(manifest: dict) -> list[str]:
    rows = []
    for name, entry in manifest.items():
        if "skipped" in entry or entry["target"] not in TARGET_NAMES or entry["classic"]:
            continue
        if entry.get("kind") == "workload":
            rows.append(name)
        elif entry.get("kind", "micro") == "micro" and entry.get("shape") in (
                [64, 256], [4, 8, 8, 32]):
            rows.append(name)
    return sorted(rows, key=lambda n: (manifest[n].get("kind") != "workload", n))


def run_child(child: str, name: str, timeout: float) -> dict:
    """``child`` (a Python program printing one JSON line last) on corpus file ``name``, in a
    process of its own so that one module's failure or time-out is one row's."""
    try:
        proc = subprocess.run([sys.executable, "-c", child, str(DATA / name)], cwd=REPO,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"pipeline did not finish within {timeout:.0f} s"}
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["no output"]
        return {"error": "pipeline failed: " + lines[-1][:160]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _row(name: str, entry: dict, result: dict) -> str:
    mode = entry.get("mode", "")
    label = f"{entry['model']}" + (f" {mode}" if mode else "")
    paper = PAPER_MEM_KERNELS.get((entry["model"], mode))
    paper_text = f"{paper[0]} → {paper[1]}" if paper else ""
    cells = [label, entry["framework"], TARGET_NAMES[entry["target"]]]
    if "error" in result:
        return "| " + " | ".join(cells + [result["error"], "", "", "", "", "", "", paper_text]) + " |"
    return "| " + " | ".join(cells + [
        str(result["xla"]), str(result["fs"]), f"{result['xla_bytes']:,}",
        f"{result['fs_bytes']:,}", f"{result['compulsory']:,}", str(result["fallbacks"]),
        f"{result['seconds']:.1f}", paper_text]) + " |"


def results_table(manifest: dict, jobs: int, timeout: float) -> str:
    names = selected_files(manifest)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        results = dict(zip(names, pool.map(lambda n: run_child(_CHILD, n, timeout), names)))
    header = ("| model | framework | target | XLA mem kernels | stitched mem kernels | "
              "XLA bytes | stitched bytes | compulsory bytes | fallbacks | pipeline s | "
              "paper Table 2: XLA → FS mem kernels |\n|" + "---|" * 11)
    return "\n".join([header] + [_row(n, manifest[n], results[n]) for n in names])


def _opaque_computations(module) -> set[str]:
    """Computations that belong to XLA:GPU's library nodes (Triton GEMM fusions, nested)."""
    comps = module.computation_map()
    opaque: set[str] = set()

    def mark(name):
        if name in opaque:
            return
        opaque.add(name)
        for inst in comps[name].instructions:
            for called in inst.called_computations:
                mark(called)

    for comp in module.computations:
        for inst in comp.instructions:
            kind = (inst.attr_json() or {}).get("fusion_backend_config", {}).get("kind", "") \
                if inst.opcode == "fusion" else ""
            if "gemm" in kind:
                for called in inst.called_computations:
                    mark(called)
    return opaque


def op_inventory(manifest: dict) -> str:
    """Opcode counts (and convert dtype pairs) over every corpus module, outside opaque
    nodes: the code generator's to-do list."""
    counts, files = collections.Counter(), collections.defaultdict(set)
    converts = collections.Counter()
    opaque_ops = collections.Counter()
    for name, entry in manifest.items():
        if "skipped" in entry:
            continue
        module = parse_file(DATA / name)
        opaque = _opaque_computations(module)
        for comp in module.computations:
            if comp.name in opaque:
                continue
            table = comp.by_name()
            for inst in comp.instructions:
                if inst.opcode == "custom-call":
                    opaque_ops[f"custom-call {inst.custom_call_target}"] += 1
                    continue
                if inst.opcode == "fusion" and inst.called_computations[0] in opaque:
                    opaque_ops["fusion (Triton GEMM)"] += 1
                    continue
                counts[inst.opcode] += 1
                files[inst.opcode].add(name)
                if inst.opcode == "convert":
                    source = table[inst.operands[0]].shape.dtype
                    converts[f"{source}->{inst.shape.dtype}"] += 1
    lines = ["| op | instructions | files |", "|---|---|---|"]
    lines += [f"| {op} | {n} | {len(files[op])} |" for op, n in sorted(
        counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    lines += ["", "convert, by dtypes: " + ", ".join(
        f"{pair} ({n})" for pair, n in sorted(converts.items(), key=lambda kv: -kv[1]))]
    lines += ["", "Opaque library nodes (evaluated by `fusionstitching/hlo/gpu_library.py`, "
              "never stitched): " + ", ".join(f"{op} ({n})" for op, n in sorted(
                  opaque_ops.items(), key=lambda kv: -kv[1]))]
    return "\n".join(lines)


def replace_section(text: str, begin: str, end: str, body: str) -> str:
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per module")
    opts = parser.parse_args(argv)
    manifest = json.loads((DATA / "manifest.json").read_text())
    started = time.perf_counter()
    table = results_table(manifest, opts.jobs, opts.timeout)
    stamp = (f"Generated by `{COMMAND}` ({time.perf_counter() - started:.0f} s, "
             f"--jobs {opts.jobs}, --timeout {opts.timeout:.0f}).")
    text = README.read_text()
    text = replace_section(text, BEGIN, END, f"{stamp}\n\n{table}")
    text = replace_section(text, OPS_BEGIN, OPS_END, op_inventory(manifest))
    README.write_text(text)
    print(table)


if __name__ == "__main__":
    main()
