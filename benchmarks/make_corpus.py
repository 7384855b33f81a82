"""Regenerate the HLO test corpus: tests/data/hlo/*.hlo[.gz] + manifest.json, and the XLA dump
folder tests/data/dumps/tf_layernorm_cpu/.

    python benchmarks/make_corpus.py        # from anywhere; ~30 minutes on 2 cores, no GPU

- Each micro model (benchmarks/models/micro.py) x framework x shape for XLA:CPU, XLA:GPU H100
  with and without Triton normalization fusions, and XLA:GPU A100 without.
- Each workload of the paper (benchmarks/models/zoo.py: BERT, DIEN, Transformer, ASR, CRNN;
  JAX, and TF/Keras for BERT, DIEN, Transformer) at its "small" size for XLA:CPU, XLA:GPU
  H100 (default and classic) and XLA:GPU A100. Their metadata (op names and source lines,
  debug information only) is removed to keep the corpus small; the rest is XLA's text.

GPU modules come from deviceless compilation (fusionstitching.capture). A capture that fails
is recorded in manifest.json as {"skipped": reason} instead of a file. The output depends
only on the installed jax/jaxlib/tensorflow versions: file names in JAX's metadata are made
relative to the repository, and the TF functions are traced in a fixed order (TF numbers
them).
"""
from __future__ import annotations

import functools
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
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

from benchmarks.hlo_files import write_hlo  # noqa: E402
from benchmarks.models import library, micro, zoo  # noqa: E402
from fusionstitching import capture  # noqa: E402

# Metadata stack traces then stop at the model code, so editing this script leaves the corpus alone.
source_info_util.register_exclusion(__file__)

HLO_DIR = REPO / "tests" / "data" / "hlo"
DUMP_DIR = REPO / "tests" / "data" / "dumps" / "tf_layernorm_cpu"
REGENERATE = "python benchmarks/make_corpus.py"
COMPRESS_ABOVE = 64 * 1024  # bytes of HLO text

# (file label, capture target, classic). Classic = XLA:GPU without triton-softmax-rewriter.
TARGETS = [("cpu", "cpu", False), ("h100_classic", "h100", True), ("h100", "h100", False),
           ("a100_classic", "a100", True)]
MODEL_TARGETS = [("cpu", "cpu", False), ("h100_classic", "h100", True), ("h100", "h100", False),
                 ("a100", "a100", False)]
# Training steps are 0.3-1 MB of HLO per target even at the small size (every parameter's
# gradient and Adam update, one threefry/Philox expansion per dropout site): XLA:CPU and the
# H100 default plan only, to keep the corpus a few MB.
TRAIN_TARGETS = MODEL_TARGETS[:1] + MODEL_TARGETS[2:3]
# [64,256]: rows fit one warp's worth of work; [32,2048]: rows longer than 1024 elements, so
# a row no longer fits one thread block's single pass; [4,16,256]: a [B,S,H] activation.
NORM_SHAPES = {"jax": [(64, 256), (32, 2048), (4, 16, 256)], "tf": [(64, 256), (32, 2048)]}
NORMALIZATIONS = ("layernorm", "softmax", "rmsnorm")
# The other micro models at one activation shape each (BatchNorm: an NHWC feature map).
MICRO_SHAPES = {"batchnorm_train": (4, 8, 8, 32)}
MICRO_SHAPE = (64, 256)
SIZE = "small"
# Library fixtures (benchmarks/models/library.py): XLA:GPU's plan with Triton GEMMs (default)
# and with cuBLAS/cuDNN custom calls (Triton GEMM off), for the GPU-library evaluator.
LIBRARY_TARGETS = [("cpu", "cpu", None), ("h100", "h100", None),
                   ("h100_cublas", "h100", "--xla_gpu_enable_triton_gemm=false")]

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


def micro_shapes(model: str, framework: str) -> list[tuple[int, ...]]:
    if model in NORMALIZATIONS:
        return NORM_SHAPES[framework]
    return [MICRO_SHAPES.get(model, MICRO_SHAPE)]


def capture_micro(model: str, framework: str, shape, target: str, classic: bool) -> str:
    specs = micro.arg_specs(model, shape, framework)
    if framework == "jax":
        args = [jax.ShapeDtypeStruct(s, dt) for s, dt in specs]
        return capture.jax_hlo(micro.JAX_FUNCTIONS[model], *args, target=target, classic=classic)
    fn = micro.tf_functions()[model]
    tensor_specs = [tf.TensorSpec(s, tf.as_dtype(dt)) for s, dt in specs]
    return _capture_tf(fn, tensor_specs, target, classic)


def capture_workload(model: str, mode: str, framework: str, target: str, classic: bool) -> str:
    if framework == "jax":
        fn, args = zoo.jax_workload(model, mode, SIZE)
        text = capture.jax_hlo(fn, *args, target=target, classic=classic)
    else:
        fn, specs = zoo.tf_workload(model, mode, SIZE)
        text = _capture_tf(fn, specs, target, classic)
    return strip_metadata(text)


def capture_library(name: str, target: str, xla_flags: str | None) -> str:
    args = [jax.ShapeDtypeStruct(s, np.float32) for s in library.ARG_SHAPES[name]]
    if xla_flags is None:
        return capture.jax_hlo(library.JAX_FUNCTIONS[name], *args, target=target)
    # XLA reads XLA_FLAGS once per process: the capture helper's CLI in a child process.
    env = dict(os.environ, XLA_FLAGS=xla_flags, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "fusionstitching.capture", "jax",
            f"benchmarks.models.library:{name}",
            *(f"f32[{','.join(map(str, s))}]" for s in library.ARG_SHAPES[name]),
            "--target", target]
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise capture.CaptureError(proc.stderr.strip().splitlines()[-1])
    return proc.stdout


def _capture_tf(fn, specs, target: str, classic: bool) -> str:
    if target == "cpu":
        return capture.tf_hlo(fn, *specs)
    return capture.tf_hlo_for_gpu(fn, *specs, target=target, classic=classic)


# `, metadata={...}` with quoted strings inside (which may hold braces).
_METADATA = re.compile(r', metadata=\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')


def strip_metadata(hlo_text: str) -> str:
    """XLA's text without op metadata (op names, source files and lines: debug info only)."""
    return _METADATA.sub("", hlo_text)


def entry_parameters(hlo_text: str) -> list[dict]:
    """Shapes and dtypes of the ENTRY computation's parameters, from its signature line."""
    signature = re.search(r"^ENTRY \S+ \((.*)\) -> ", hlo_text, re.M).group(1)
    return [{"dtype": dtype, "shape": [int(d) for d in dims.split(",") if d]}
            for dtype, dims in re.findall(r":\s*(\w+)\[([\d,]*)\]", signature)]


def corpus_entries():
    """(file name, manifest fields, capture thunk) for every corpus module, in a fixed order
    (TF numbers its functions in tracing order)."""
    for framework in ("jax", "tf"):
        for model in micro.MODELS:
            for shape in micro_shapes(model, framework):
                for label, target, classic in TARGETS:
                    name = f"{model}_{'x'.join(map(str, shape))}_{framework}_{label}.hlo"
                    meta = {"model": model, "kind": "micro", "framework": framework,
                            "target": target, "classic": classic, "shape": list(shape),
                            "how": _how_micro(model, framework, target, classic)}
                    yield name, meta, functools.partial(capture_micro, model, framework,
                                                        shape, target, classic)
    for model, mode, frameworks in zoo.WORKLOADS:
        for framework in frameworks:
            for label, target, classic in (TRAIN_TARGETS if mode == "train" else MODEL_TARGETS):
                name = f"{model}_{mode}_{SIZE}_{framework}_{label}.hlo"
                meta = {"model": model, "kind": "workload", "mode": mode, "size": SIZE,
                        "framework": framework, "target": target, "classic": classic,
                        "metadata_stripped": True,
                        "how": _how_workload(model, mode, framework, target, classic)}
                yield name, meta, functools.partial(capture_workload, model, mode, framework,
                                                    target, classic)


def library_entries():
    for name in library.JAX_FUNCTIONS:
        for label, target, xla_flags in LIBRARY_TARGETS:
            meta = {"model": name, "kind": "library", "framework": "jax", "target": target,
                    "classic": False, "xla_flags": xla_flags,
                    "how": f"capture.jax_hlo(library.{name}, *args, target={target!r})"
                           + (f" with XLA_FLAGS={xla_flags}" if xla_flags else "")}
            yield (f"{name}_jax_{label}.hlo", meta,
                   functools.partial(capture_library, name, target, xla_flags))


def all_entries():
    return itertools.chain(corpus_entries(), library_entries())


def write_module(name: str, text: str) -> str:
    """Write one module (gzipped over COMPRESS_ABOVE: the training steps are most of the
    corpus's size); returns the file name written."""
    return write_hlo(HLO_DIR, name, text, COMPRESS_ABOVE)


def write_hlo_corpus() -> dict:
    for old in [*HLO_DIR.glob("*.hlo"), *HLO_DIR.glob("*.hlo.gz")]:
        old.unlink()
    manifest = {}
    for name, meta, capture_thunk in all_entries():
        started = time.perf_counter()
        try:
            text = capture_thunk()
        except Exception as err:  # recorded, so a missing file always has a stated reason
            reason = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}"
            manifest[name] = {**meta, "skipped": reason, "regenerate": REGENERATE}
            print(f"{name}: SKIPPED ({reason})", flush=True)
            continue
        name = write_module(name, text)
        manifest[name] = {**meta, "parameters": entry_parameters(text), "regenerate": REGENERATE}
        print(f"{name}: {len(text)} chars, {time.perf_counter() - started:.1f} s", flush=True)
    (HLO_DIR / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def _how_micro(model: str, framework: str, target: str, classic: bool) -> str:
    """The capture call that produced a file (arguments: micro.arg_specs of the shape)."""
    if framework == "jax":
        call = f"capture.jax_hlo(micro.{model}, *args, target={target!r}"
    elif target == "cpu":
        return (f"capture.tf_hlo(micro.tf_functions()[{model!r}], *tensor_specs): TF "
                "experimental_get_compiler_ir(stage='optimized_hlo'), XLA:CPU")
    else:
        call = (f"capture.tf_hlo_for_gpu(micro.tf_functions()[{model!r}], *tensor_specs, "
                f"target={target!r}")
    return call + (", classic=True)" if classic else ")")


def _how_workload(model: str, mode: str, framework: str, target: str, classic: bool) -> str:
    if framework == "jax":
        call = (f"capture.jax_hlo(*zoo.jax_workload({model!r}, {mode!r}, {SIZE!r}), "
                f"target={target!r}")
    elif target == "cpu":
        return f"capture.tf_hlo(*zoo.tf_workload({model!r}, {mode!r}, {SIZE!r})) (XLA:CPU)"
    else:
        call = (f"capture.tf_hlo_for_gpu(*zoo.tf_workload({model!r}, {mode!r}, {SIZE!r}), "
                f"target={target!r}")
    return call + (", classic=True)" if classic else ")") + "; metadata stripped"


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
    total = sum(p.stat().st_size for p in HLO_DIR.iterdir() if p.is_file())
    skipped = sum("skipped" in m for m in manifest.values())
    print(f"{len(manifest) - skipped} HLO files ({skipped} skipped), {total} bytes in {HLO_DIR}; dump files kept: {kept}")


if __name__ == "__main__":
    main()
