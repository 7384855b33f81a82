"""Regenerate the HLO test corpus: tests/data/hlo/*.hlo + manifest.json, and the XLA dump
folder tests/data/dumps/tf_layernorm_cpu/.

    python benchmarks/make_corpus.py        # from anywhere; about a minute, no GPU needed

Each micro model (benchmarks/models/micro.py) x framework x shape is compiled for XLA:CPU,
XLA:GPU H100 with and without Triton normalization fusions, and XLA:GPU A100 without, all
GPU ones by deviceless compilation (fusionstitching.capture). The output depends only on the
installed jax/jaxlib/tensorflow versions: file names in JAX's metadata are made relative to
the repository, and the TF functions are traced in a fixed order (TF numbers them).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Before JAX initializes: deviceless XLA:GPU compiles then run in this process (no child per
# file), and source paths in metadata lose the checkout's location.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_HLO_SOURCE_FILE_CANONICALIZATION_REGEX"] = r"^.*/(?=benchmarks/)"
sys.path.insert(0, str(REPO))

import jax  # noqa: E402
from jax._src import source_info_util  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.models import micro  # noqa: E402
from fusionstitching import capture  # noqa: E402

# Metadata stack traces then stop at the model code, so editing this script leaves the corpus alone.
source_info_util.register_exclusion(__file__)

HLO_DIR = REPO / "tests" / "data" / "hlo"
DUMP_DIR = REPO / "tests" / "data" / "dumps" / "tf_layernorm_cpu"
REGENERATE = "python benchmarks/make_corpus.py"

# (file label, capture target, classic). Classic = XLA:GPU without triton-softmax-rewriter.
TARGETS = [("cpu", "cpu", False), ("h100_classic", "h100", True), ("h100", "h100", False),
           ("a100_classic", "a100", True)]
# [64,256]: rows fit one warp's worth of work; [32,2048]: rows longer than 1024 elements, so
# a row no longer fits one thread block's single pass; [4,16,256]: a [B,S,H] activation.
SHAPES = {"jax": [(64, 256), (32, 2048), (4, 16, 256)], "tf": [(64, 256), (32, 2048)]}

# An unchanged TF program: it knows nothing about dumps; XLA_FLAGS alone makes XLA write them.
TF_DUMP_SCRIPT = """\
from benchmarks.models import micro

layernorm = micro.tf_functions()["layernorm"]
x, gamma, beta = micro.example_inputs("layernorm", (64, 256))
print(float(layernorm(x, gamma, beta).numpy().sum()))
"""
# Dump files worth keeping: the optimized module (what replay reads), the module XLA received,
# XLA:CPU's per-kernel MLIR/LLVM IR/object files and the debug options (which name the
# temporary dump folder) are left out.
DUMP_KEEP = ("after_optimizations.txt", "before_optimizations.txt")


def capture_one(model: str, framework: str, shape, target: str, classic: bool) -> str:
    shapes = micro.arg_shapes(model, shape)
    if framework == "jax":
        args = [jax.ShapeDtypeStruct(s, np.float32) for s in shapes]
        return capture.jax_hlo(micro.JAX_FUNCTIONS[model], *args, target=target, classic=classic)
    fn = micro.tf_functions()[model]
    specs = [tf.TensorSpec(s, tf.float32) for s in shapes]
    if target == "cpu":
        return capture.tf_hlo(fn, *specs)
    return capture.tf_hlo_for_gpu(fn, *specs, target=target, classic=classic)


def entry_parameters(hlo_text: str) -> list[dict]:
    """Shapes and dtypes of the ENTRY computation's parameters, from its signature line."""
    signature = re.search(r"^ENTRY \S+ \((.*)\) -> ", hlo_text, re.M).group(1)
    return [{"dtype": dtype, "shape": [int(d) for d in dims.split(",") if d]}
            for dtype, dims in re.findall(r":\s*(\w+)\[([\d,]*)\]", signature)]


def write_hlo_corpus() -> dict:
    for old in HLO_DIR.glob("*.hlo"):
        old.unlink()
    manifest = {}
    for framework, shapes in SHAPES.items():
        for model in micro.MODELS:
            for shape in shapes:
                for label, target, classic in TARGETS:
                    name = f"{model}_{'x'.join(map(str, shape))}_{framework}_{label}.hlo"
                    text = capture_one(model, framework, shape, target, classic)
                    (HLO_DIR / name).write_text(text)
                    manifest[name] = {
                        "model": model, "framework": framework, "target": target,
                        "classic": classic, "parameters": entry_parameters(text),
                        "how": _how(model, framework, target, classic), "regenerate": REGENERATE}
                    print(f"{name}: {len(text)} chars", flush=True)
    (HLO_DIR / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def _how(model: str, framework: str, target: str, classic: bool) -> str:
    """The capture call that produced a file (arguments: f32 arrays of the listed shapes)."""
    if framework == "jax":
        call = f"capture.jax_hlo(micro.{model}, *args, target={target!r}"
    elif target == "cpu":
        return (f"capture.tf_hlo(micro.tf_functions()[{model!r}], *tensor_specs): TF "
                "experimental_get_compiler_ir(stage='optimized_hlo'), XLA:CPU")
    else:
        call = f"capture.tf_hlo_for_gpu(micro.tf_functions()[{model!r}], *tensor_specs, target={target!r}"
    return call + (", classic=True)" if classic else ")")


def write_tf_dump() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(REPO),
                   XLA_FLAGS=f"--xla_dump_to={tmp} --xla_dump_hlo_as_text")
        subprocess.run([sys.executable, "-c", TF_DUMP_SCRIPT], env=env, check=True, cwd=REPO,
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(DUMP_DIR, ignore_errors=True)
        DUMP_DIR.mkdir(parents=True)
        kept = sorted(f.name for f in Path(tmp).iterdir() if f.name.endswith(DUMP_KEEP))
        for name in kept:
            shutil.copy(Path(tmp) / name, DUMP_DIR / name)
    (DUMP_DIR / "script.py").write_text(
        "# From the repository root (benchmarks/make_corpus.py runs exactly this):\n"
        "# PYTHONPATH=. XLA_FLAGS='--xla_dump_to=DIR --xla_dump_hlo_as_text' "
        "python tests/data/dumps/tf_layernorm_cpu/script.py\n" + TF_DUMP_SCRIPT)
    return kept


def main() -> None:
    HLO_DIR.mkdir(parents=True, exist_ok=True)
    manifest = write_hlo_corpus()
    kept = write_tf_dump()
    total = sum(p.stat().st_size for p in HLO_DIR.iterdir())
    print(f"{len(manifest)} HLO files, {total} bytes in {HLO_DIR}; dump files kept: {kept}")


if __name__ == "__main__":
    main()
