"""Regenerate the third-party tier of the HLO corpus: tests/data/hlo/third_party/.

    python benchmarks/make_third_party.py              # all models; ~7 minutes on 2 cores
    python benchmarks/make_third_party.py -j 2         # two libraries at a time: ~4 minutes
    python benchmarks/make_third_party.py --only gpt2 llama   # just these (others kept)

Models from maintained third-party libraries, at tiny but real configurations (2 layers,
hidden size 32, sequences of 16 tokens, 32x32 images, batch 2-4), with random weights built
from constructor arguments: nothing is downloaded (no presets, no checkpoints). For each
model, the optimized HLO of

- ``train``: one full training step as the library itself writes it: forward, backward and
  the library's own optimizer update (Keras: ``model.train_step``, what ``model.fit`` jits,
  with a Keras optimizer; Flax and HuggingFace Flax models: ``jax.value_and_grad`` + an
  optax optimizer);
- ``infer``: the forward pass at inference (Keras: ``model.predict_step``),

for XLA:CPU and XLA:GPU H100 (deviceless compilation, XLA's default flags), each written
twice: as ``as_text()`` prints it (large constants elided as ``{...}``; file suffix
``_elided``) and with every constant in full (as fusionstitching.capture prints it). Where the
two texts are identical (no constant large enough to be elided) only the full file is written
and the manifest lists the elided name with ``"identical_to"`` (the two printers may still
differ in the key order of a backend_config's JSON: the elided file is as_text()'s own).

The Keras backend is chosen once per process, so each library runs in its own child process
(``--part``): Keras Hub on the JAX backend, Keras Applications on the TensorFlow backend (TF's
own XLA bridge: ``tf.function(jit_compile=True)``), Flax + optax, HuggingFace transformers'
Flax models. Each child sets JAX_PLATFORMS=cpu before JAX starts, so deviceless XLA:GPU
compiles run in that process (fusionstitching.capture needs no grandchild).

Files: ``<library>_<model>_<mode>_<target>[_elided].hlo[.gz]``; modules over 64 KiB of text
lose XLA's ``metadata={...}`` (op names and source lines: debug information only) and the
stack-frame tables only that metadata refers to, then are gzipped (no time stamp, so a rerun
gives the same bytes). A capture that fails is listed in manifest.json with
``"skipped": reason`` instead of a file.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import third_party_flax  # registers the Flax models
from hlo_files import write_hlo
import third_party_models
from third_party_models import MODELS

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "tests" / "data" / "hlo" / "third_party"
REGENERATE = "python benchmarks/make_third_party.py"
COMPRESS_ABOVE = 64 * 1024  # bytes of HLO text; above it: metadata stripped, gzipped
TARGETS = ("cpu", "h100")

# part -> (the distributions whose versions the manifest records, environment of its child).
PARTS = {
    "keras_hub": (("keras-hub", "keras", "jax"), {"KERAS_BACKEND": "jax"}),
    "keras": (("keras", "tensorflow"), {"KERAS_BACKEND": "tensorflow"}),
    "flax": (("flax", "optax", "jax"), {}),
    "transformers": (("transformers", "flax", "optax", "jax"), {}),
}


# =========================================================================== capture helpers
# JAX, TF and fusionstitching are imported inside these helpers, not at the top: the parent
# process only starts children, and each child must set KERAS_BACKEND and JAX_PLATFORMS
# (PARTS) before any of them is first imported.

def _capture():
    from fusionstitching import capture
    return capture


def jax_texts(fn, args, target: str) -> tuple[str, str]:
    """(as_text() with constants elided, text with constants in full) of ``jax.jit(fn)`` for
    abstract ``args`` on ``target``: one compile, printed both ways."""
    import jax

    capture = _capture()
    traced = jax.jit(fn).trace(*abstract_on(args, target))
    compiled = traced.lower().compile(capture._compiler_options(target, False, None))
    return compiled.as_text(), capture.optimized_hlo_text(compiled)


def abstract_on(args, target: str):
    """``args`` as ShapeDtypeStructs placed on ``target``'s device (XLA:CPU, or the deviceless
    XLA:GPU client): the placement selects the backend, and nothing is allocated."""
    import jax

    capture = _capture()
    device = jax.devices("cpu")[0] if target == "cpu" else capture._gpu_device(target)
    sharding = jax.sharding.SingleDeviceSharding(device)

    def abstract(leaf):
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        return leaf

    return jax.tree.map(abstract, args)


def tf_texts(fn, specs, target: str) -> tuple[str, str]:
    """The same for a ``tf.function(jit_compile=True)``: XLA:CPU through TF itself (TF prints
    the elided text, the serialized proto gives the full one), XLA:GPU through TF's
    pre-optimization HLO and jaxlib's deviceless compiler (as capture.tf_hlo_for_gpu)."""
    capture = _capture()
    if target == "cpu":
        elided = fn.experimental_get_compiler_ir(*specs)(stage="optimized_hlo")
        return elided, capture.tf_hlo(fn, *specs)
    modules = capture._compile_hlo_modules(capture.tf_hlo(fn, *specs, stage="hlo"),
                                           capture._gpu_device(target),
                                           capture._compiler_options(target, False, None))
    return ("\n\n".join(m.to_string() for m in modules),
            "\n\n".join(capture.hlo_module_text(m) for m in modules))


# =========================================================================== text handling

# `, metadata={...}` with quoted strings inside (which may hold braces).
_METADATA = re.compile(r', metadata=\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')
# The tables only metadata's stack_frame_id refers to (a JAX-printed module's header).
_FRAME_SECTIONS = re.compile(
    r"^(?:FileNames|FunctionNames|FileLocations|StackFrames)\n(?:.+\n)*\n", re.M)
# TF's absolute source paths, made relative to the installation.
_SITE_PACKAGES = re.compile(r'(source_file=")[^"]*?/(?:site|dist)-packages/')


# A constant as_text() printed as `{...}`.
_ELIDED_CONSTANT = re.compile(r" constant\(\{\.\.\.\}\)")


def strip_metadata(text: str) -> str:
    return _FRAME_SECTIONS.sub("", _METADATA.sub("", text))


def entry_parameters(hlo_text: str) -> list[str]:
    """The ENTRY computation's parameter types (``f32[2,16]``), from its signature line."""
    signature = re.search(r"^ENTRY \S+ \((.*)\) -> ", hlo_text, re.M).group(1)
    return [f"{dtype}[{dims}]" for dtype, dims in re.findall(r":\s*(\w+)\[([\d,]*)\]", signature)]


def manifest_json(manifest: dict) -> str:
    """One line per file (the entry parameters are in the file itself, not repeated here)."""
    rows = [f" {json.dumps(name)}: {json.dumps(entry, sort_keys=True)}"
            for name, entry in sorted(manifest.items())]
    return "{\n" + ",\n".join(rows) + "\n}\n"


def write_module(name: str, text: str) -> str:
    return write_hlo(OUT_DIR, name, text, COMPRESS_ABOVE)


# =========================================================================== one part (child)

def versions(part: str) -> dict:
    out = {}
    for dist in PARTS[part][0]:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _reason(err: BaseException) -> str:
    """The exception's first line (XLA's errors put the cause there, a stack after it)."""
    lines = str(err).strip().splitlines() or [""]
    return f"{type(err).__name__}: {lines[0][:400]}"


def _skipped(name: str, meta: dict, reason: str) -> dict:
    """Manifest entries for both variants of a capture that failed."""
    return {f"{name}{suffix}.hlo": dict(meta, elided=bool(suffix), skipped=reason)
            for suffix in ("", "_elided")}


def capture_module(name: str, meta: dict, kind: str, fn, args) -> dict:
    """Capture one (model, mode, target), write its file(s); returns their manifest entries."""
    target = meta["target"]
    started = time.perf_counter()
    try:
        elided_text, full_text = (jax_texts if kind == "jax" else tf_texts)(fn, args, target)
    except Exception as err:  # recorded: a missing file always has a stated reason
        traceback.print_exc()
        print(f"{name}: SKIPPED ({_reason(err)})", flush=True)
        return _skipped(name, meta, _reason(err))
    seconds = time.perf_counter() - started
    stripped = len(full_text.encode()) > COMPRESS_ABOVE
    if stripped:
        full_text, elided_text = strip_metadata(full_text), strip_metadata(elided_text)
    else:
        full_text = _SITE_PACKAGES.sub(r"\1", full_text)
        elided_text = _SITE_PACKAGES.sub(r"\1", elided_text)
    compile_call = ("jax.jit(fn).trace(*args).lower().compile()" if kind == "jax"
                    else "tf.function(jit_compile=True)")
    how = f"{compile_call} for {'XLA:CPU' if target == 'cpu' else 'deviceless XLA:GPU ' + target}"
    common = dict(meta, metadata_stripped=stripped,
                  parameter_count=len(entry_parameters(full_text)))
    full_name = write_module(f"{name}.hlo", full_text)
    entries = {full_name: dict(common, elided=False,
                               how=f"{how}, printed with large constants in full")}
    elided_meta = dict(common, elided=True,
                       how=f"{how}, as_text() (constants over XLA's print limit as {{...}})")
    has_elided = bool(_ELIDED_CONSTANT.search(elided_text))
    if has_elided:
        entries[write_module(f"{name}_elided.hlo", elided_text)] = elided_meta
    else:  # nothing elided: the same module
        entries[f"{name}_elided.hlo"] = dict(elided_meta, identical_to=full_name)
    print(f"{full_name}: {len(full_text)} chars, {seconds:.1f} s"
          f"{' (+ elided variant)' if has_elided else ''}", flush=True)
    return entries


def run_part(part: str, only: set[str] | None) -> dict:
    """Capture every model of one part; returns its manifest entries."""
    manifest = {}
    lib_versions = versions(part)
    for key, spec in MODELS.items():
        if spec["part"] != part or (only and spec["model"] not in only and key not in only):
            continue
        base = dict(model=spec["model"], library=spec["library"],
                    library_version=lib_versions.get(spec["library"].replace("_", "-")),
                    versions=lib_versions, framework=spec["framework"],
                    optimizer=spec["optimizer"], config=spec["config"], regenerate=REGENERATE)
        started = time.perf_counter()
        try:
            steps, build_error = spec["build"](), None
        except Exception as err:  # e.g. a library incompatible with this JAX
            traceback.print_exc()
            steps, build_error = {}, _reason(err)
        print(f"{key}: built in {time.perf_counter() - started:.1f} s", flush=True)
        for mode in spec["modes"]:
            for target in TARGETS:
                name, meta = f"{key}_{mode}_{target}", dict(base, mode=mode, target=target)
                if build_error or mode not in steps:
                    manifest.update(_skipped(name, meta, build_error or f"no {mode} step"))
                else:
                    manifest.update(capture_module(name, meta, *steps[mode]))
    return manifest


# =========================================================================== driver

def child_env(part: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), PYTHONHASHSEED="0",
               TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               JAX_HLO_SOURCE_FILE_CANONICALIZATION_REGEX=r"^.*/(?:site|dist)-packages/")
    env.update(PARTS[part][1])
    return env


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="+", help="model names (e.g. gpt2 vit) or keys "
                        "(keras_hub_gpt2): capture just these, keep the other files")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("-j", "--jobs", type=int, default=1, help="parts run at once")
    opts = parser.parse_args(argv)
    only = set(opts.only) if opts.only else None

    if opts.part:  # a child: the environment is already set up by the parent
        from jax._src import source_info_util
        for script in (__file__, third_party_models.__file__, third_party_flax.__file__):
            source_info_util.register_exclusion(script)
        Path(opts.result).write_text(json.dumps(run_part(opts.part, only)))
        return

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    manifest_path = OUT_DIR / "manifest.json"
    old = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    selected = {key for key, spec in MODELS.items() if spec["part"] in opts.parts
                and (not only or spec["model"] in only or key in only)}

    def is_selected(entry):
        return f"{entry['library']}_{entry['model']}" in selected
    for name, entry in old.items():  # files of the models about to be recaptured go
        if is_selected(entry) and "skipped" not in entry and "identical_to" not in entry:
            (OUT_DIR / name).unlink(missing_ok=True)
    manifest = {name: entry for name, entry in old.items() if not is_selected(entry)}

    with tempfile.TemporaryDirectory() as tmp:
        running = []
        for part in opts.parts:
            if not any(MODELS[k]["part"] == part for k in selected):
                continue
            result = Path(tmp) / f"{part}.json"
            argv = [sys.executable, __file__, "--part", part, "--result", str(result)]
            if only:
                argv += ["--only", *only]
            while len(running) >= max(1, opts.jobs):
                _finish(running.pop(0), manifest)
            print(f"== {part}", flush=True)
            running.append((part, result, subprocess.Popen(argv, env=child_env(part),
                                                           cwd=REPO)))
        for job in running:
            _finish(job, manifest)

    manifest_path.write_text(manifest_json(manifest))
    files = [p for p in OUT_DIR.iterdir() if p.name.endswith((".hlo", ".hlo.gz"))]
    total = sum(p.stat().st_size for p in files)
    skipped = sorted({f"{e['library']}_{e['model']}_{e['mode']}_{e['target']}: {e['skipped']}"
                      for e in manifest.values() if "skipped" in e})
    print(f"{len(files)} HLO files, {total} bytes in {OUT_DIR}; {len(skipped)} skipped")
    for line in skipped:
        print(f"  skipped {line}")


def _finish(job, manifest: dict) -> None:
    part, result, proc = job
    if proc.wait() != 0 or not result.exists():
        raise SystemExit(f"part {part} failed (exit {proc.returncode}); see its output above")
    manifest.update(json.loads(result.read_text()))


if __name__ == "__main__":
    main()
