"""Prepare the GPU run kit (benchmarks/gpu_check.py runs it): plan every module here, on CPU.

    python benchmarks/gpu_kit.py [--out .gpu_kit] [--jobs 2] [--budget_s S] [files...]

Planning takes minutes per training step, far more than a lent GPU's 15 minutes, so the kit
carries the results: for each module one ``NAME.json.gz`` with XLA:GPU's module rewritten
for the GPU launch path (runtime/gpu.py: each stitched kernel a launcher custom call holding
its PTX), the same module with no kernel replaced (XLA re-fuses it: the baseline), the entry
parameters, and every stitched kernel's PTX, launch and modeled time. Resumable: a module
whose file exists is skipped. Default corpus: the zoo's and the third-party tier's H100
modules, plus the micro models at sizes where kernels are bandwidth-bound.
"""
from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fusionstitching import pipeline  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402
from fusionstitching.hlo.ir import print_module  # noqa: E402
from fusionstitching.runtime import gpu  # noqa: E402
from fusionstitching.runtime.rewrite import rewrite_module  # noqa: E402

DATA = ROOT / "tests" / "data" / "hlo"
# Micro models at sizes whose buffers exceed the H100's 50 MB L2 several times over.
LARGE_MICRO = [("layernorm", (16384, 4096)), ("rmsnorm", (16384, 4096)),
               ("softmax", (16384, 4096)), ("cross_entropy", (16384, 4096)),
               ("gelu_tanh", (16384, 4096)), ("bias_dropout_residual", (16384, 4096)),
               ("batchnorm_train", (64, 32, 32, 256)), ("adam", (4096, 4096))]


def corpus_files() -> list[Path]:
    """The zoo's and the tier's full (not elided) XLA:GPU H100 modules, smallest first."""
    tier = json.loads((DATA / "third_party" / "manifest.json").read_text())
    files = [DATA / "third_party" / n for n, e in tier.items() if e["target"] == "h100"
             and not e["elided"] and "skipped" not in e and "identical_to" not in e]
    files += [p for p in DATA.glob("*h100*.hlo*") if "cublas" not in p.name]
    files.append(DATA / "unseen" / "vocab_cross_entropy_8x4096_h100.hlo")
    return sorted(files, key=lambda p: p.stat().st_size * (4 if p.suffix == ".gz" else 1))


def module_name(path: Path) -> str:
    return path.name.split(".")[0]


def read_text(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return f.read()


def large_micro_text(model: str, shape) -> str:
    from benchmarks.models import micro
    from fusionstitching.capture import jax_hlo

    return jax_hlo(micro.JAX_FUNCTIONS[model], *micro.example_inputs(model, shape),
                   target="h100", classic=True)


def kit_entry(name: str, text: str, source: str) -> dict:
    """Plan one module for H100 and describe what the GPU needs to run it both ways."""
    started = time.perf_counter()
    module = parse_module(text)
    result = pipeline.stitch_module(module, pipeline.Options(target="h100"))
    stitched = gpu.rewrite_for_gpu(module, result)  # cuDNN calls as plain convolutions
    baseline = print_module(rewrite_module(module, [], []))
    launched = {t for t in gpu.launch_targets(stitched)}
    kernels = []
    for k in result.kernels:
        if k.spec.name not in launched:
            continue
        nv = k.nvptx
        kernels.append(dict(
            name=k.spec.name, entry=k.spec.kernel.name, ptx=nv.ptx, grid=list(k.spec.grid),
            block=list(k.spec.block), nodes=list(k.pattern.nodes), why=k.spec.why,
            inputs=[[s.dtype, list(s.dims)] for _, s in k.spec.inputs],
            outputs=[[s.dtype, list(s.dims)] for _, s in k.spec.outputs],
            read_bytes=k.spec.read_bytes, write_bytes=k.spec.write_bytes,
            modeled_us=k.spec.modeled_us, regs=nv.regs))
    report = result.report
    return dict(
        name=name, source=source, target="h100",
        params=[[p.shape.dtype, list(p.shape.dims)] for p in module.entry.parameters],
        baseline_hlo=baseline, stitched_hlo=stitched, kernels=kernels,
        modeled=dict(xla_mem_kernels=report.xla.mem_kernels, fs_mem_kernels=report.fs.mem_kernels,
                     xla_bytes=report.xla.bytes, fs_bytes=report.fs.bytes,
                     xla_us=report.xla.modeled_us, fs_us=report.fs.modeled_us),
        fallbacks=[f"{f.stage}: {f.reason}" for f in report.fallbacks],
        plan_s=time.perf_counter() - started)


def prepare(job: tuple[str, str, str], out: Path) -> str:
    name, kind, where = job
    path = out / f"{name}.json.gz"
    if path.exists():
        return f"{name}: kept"
    try:
        text = read_text(Path(where)) if kind == "file" else large_micro_text(*json.loads(where))
        entry = kit_entry(name, text, where)
    except Exception as exc:  # recorded, so that the kit says why a module is missing
        entry = dict(name=name, source=where, error=f"{type(exc).__name__}: {exc}",
                     trace=traceback.format_exc()[-2000:])
    with tempfile.NamedTemporaryFile("wb", dir=out, delete=False) as tmp:
        tmp.write(gzip.compress(json.dumps(entry).encode()))
    os.replace(tmp.name, path)
    return f"{name}: {entry.get('error') or str(len(entry['kernels'])) + ' kernels'}"


def _prepare(args):
    return prepare(*args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".gpu_kit")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no_micro", action="store_true", help="skip the large micro models")
    ap.add_argument("files", nargs="*", type=Path)
    opts = ap.parse_args(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    jobs = [] if opts.no_micro or opts.files else [
        (f"{m}_{'x'.join(map(str, s))}_jax_h100", "micro", json.dumps([m, s]))
        for m, s in LARGE_MICRO]
    jobs += [(module_name(p), "file", str(p)) for p in (opts.files or corpus_files())]
    with multiprocessing.get_context("spawn").Pool(opts.jobs, maxtasksperchild=1) as pool:
        for line in pool.imap_unordered(_prepare, [(j, opts.out) for j in jobs]):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
