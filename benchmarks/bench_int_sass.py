"""The latency-evaluator's integer instructions per thread against ptxas's SASS (not a test).

    PYTHONPATH=. python benchmarks/bench_int_sass.py [hlo files...]
        (default: the BERT and Transformer training modules for H100)

Each stitched kernel is assembled by ptxas for sm_90 and disassembled with nvdisasm (on PATH,
or from ``pip install nvidia-cuda-nvdisasm``). Only straight-line kernels are compared: SASS
without a backward branch, where every thread runs each instruction at most once, so the
static count of integer instructions is what a thread executes (at most: some sit under a
branch). Prints per kernel the model's ``int`` count (`kernel_profile`) and the SASS's
integer ALU instructions, and the sums.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from costmodel.instructions import overlapped
from fusionstitching import codegen
from fusionstitching.codegen.cost.kernel_profile import kernel_profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_regs import corpus_kernels  # noqa: E402

DEFAULT = ["bert_train_small_jax_h100.hlo.gz", "bert_train_small_tf_h100.hlo.gz",
           "transformer_train_small_tf_h100.hlo.gz"]
# Per-thread integer ALU opcodes (the uniform datapath's U* instructions run once per warp).
INTEGER = {"IADD3", "IMAD", "LEA", "SHF", "LOP3", "ISETP", "VIADD", "IMNMX", "VIMNMX", "SEL",
           "IABS", "PRMT", "SGXT", "BMSK", "IMUL", "MOV"}
INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)\S*\s*(.*)$")


def find_nvdisasm() -> str | None:
    found = shutil.which("nvdisasm")
    if found:
        return found
    spec = importlib.util.find_spec("nvidia") and importlib.util.find_spec("nvidia.cu13")
    for root in (spec.submodule_search_locations if spec else []):
        candidate = os.path.join(root, "bin", "nvdisasm")
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def sass_integer_count(nvdisasm: str, cubin: bytes) -> int | None:
    """Integer ALU instructions of a straight-line kernel's SASS; None if it has a loop."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    labels: dict[str, int] = {}  # label -> address of the instruction it names
    pending, branches, count = [], [], 0
    for line in sass.splitlines():
        if (label := re.match(r"^\.(L_x_\d+):", line.strip())) is not None:
            pending.append(label.group(1))
            continue
        if (m := INSTRUCTION.match(line)) is None:
            continue
        address, opcode, operands = int(m.group(1), 16), m.group(2), m.group(3)
        labels.update((name, address) for name in pending)
        pending = []
        if opcode == "BRA" and (target := re.search(r"\.(L_x_\d+)", operands)):
            branches.append((address, target.group(1)))
        count += opcode in INTEGER
    # (every kernel ends with a branch to itself after EXIT)
    if any(labels.get(target, address) < address for address, target in branches):
        return None
    return count


def main(paths: list[str]) -> None:
    nvdisasm = find_nvdisasm()
    if codegen.find_ptxas() is None or nvdisasm is None:
        sys.exit("needs ptxas and nvdisasm (pip install nvidia-cuda-nvcc nvidia-cuda-nvdisasm)")
    seen, model_total, sass_total, looped = set(), 0.0, 0, 0
    print(f"{'module':40} {'kernel':28} {'model int':>9} {'SASS int':>8}")
    for name, spec in corpus_kernels(paths):
        text = str(spec.kernel).replace(spec.name, "")
        if text in seen:
            continue
        seen.add(text)
        sass = sass_integer_count(nvdisasm, codegen.compile_nvptx(spec, "sm_90").cubin)
        if sass is None:
            looped += 1
            continue
        # waiting on a chain or issued behind it
        counts = kernel_profile(spec.kernel, spec.read_bytes, spec.write_bytes).instructions
        model = counts.get("int", 0.0) + counts.get(overlapped("int"), 0.0)
        model_total += model
        sass_total += sass
        print(f"{name[:40]:40} {spec.name[-28:]:28} {model:9.0f} {sass:8d}")
    print(f"\n{len(seen) - looped} straight-line kernels ({looped} with loops left out): "
          f"model {model_total:.0f} integer instructions, SASS {sass_total} "
          f"(model / SASS {model_total / max(sass_total, 1):.2f})")


if __name__ == "__main__":
    data = Path(__file__).resolve().parent.parent / "tests" / "data" / "hlo"
    main(sys.argv[1:] or [str(data / name) for name in DEFAULT])
