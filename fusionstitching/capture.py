"""Capture XLA's optimized HLO text, the input of every FusionStitching stage.

``jax_hlo(fn, *args, target=...)`` (XLA:CPU, or XLA:GPU for a named GPU without a GPU),
``tf_hlo(fn, *args)``, ``tf_hlo_for_gpu(fn, *args, target=...)`` and ``hlo_for_gpu(text,
target=...)``. GPU targets use XLA's deviceless compile (the JAX CUDA plugin), which works
only in a JAX started with ``JAX_PLATFORMS=cpu``; otherwise it runs in a child process
(``python -m fusionstitching.capture``, given only shapes: ``fn`` must be importable by name).
``classic=True`` turns off XLA:GPU's Triton softmax rewriter; ``dump_to`` keeps XLA's dump.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import importlib.resources
import importlib.util
import json
import os
import re
import sys

import numpy as np

from costmodel.devices import TARGETS as DEVICE_FILES

from . import child_processes
from .hlo.ir import NUMPY_DTYPES
from .hlo.xla_runner import hlo_module_text, optimized_hlo_text

# Targets XLA can compile for: those with one of XLA's own target configs (T4 has none).
GPU_TARGETS = {name: f for name, f in DEVICE_FILES.items() if f.endswith(".txtpb")}
TARGETS = ("cpu", *GPU_TARGETS)

_CUDA_PLUGIN = "jax_plugins.xla_cuda12"
_INSTALL_HINT = "pip install fusionstitching[xla-gpu]"
_HLO_DTYPE_NAMES = {dtype: name for name, dtype in NUMPY_DTYPES.items()}
_ARRAY_SPEC = re.compile(r"^(\w+)\[([\d,\s]*)\]$")


class CaptureError(RuntimeError):
    """XLA could not produce the requested HLO; the message says why and what to do."""


def target_config(target: str) -> str:
    """The GpuTargetConfigProto text that XLA:GPU compiles for, shipped in costmodel/data/."""
    if target not in GPU_TARGETS:
        raise ValueError(f"unknown GPU target {target!r}; known: {', '.join(GPU_TARGETS)}")
    return (importlib.resources.files("costmodel") / "data" / GPU_TARGETS[target]).read_text()


# --------------------------------------------------------------------------- public API

def jax_hlo(fn, *args, target: str = "cpu", classic: bool = False, dump_to: str | None = None,
            **jit_kwargs) -> str:
    """Optimized HLO text of ``jax.jit(fn, **jit_kwargs)`` for ``args`` on ``target``.

    For GPU targets ``fn`` must be importable by ``module:qualname`` (see the module docstring).
    """
    options = _compiler_options(target, classic, dump_to)
    if target == "cpu":
        import jax
        return _jit_text(fn, args, jax.devices("cpu")[0], options, jit_kwargs)
    _require_gpu_plugin()
    if gpu_compiles_in_process():
        return _jit_text(fn, args, _gpu_device(target), options, jit_kwargs)
    argv = ["jax", _importable_name(fn), *(json.dumps(_encode_arg(a)) for a in args),
            "--jit-kwargs", json.dumps(jit_kwargs)]
    return _run_child(argv + _option_argv(target, classic, dump_to))


def tf_hlo(fn, *args, stage: str = "optimized_hlo") -> str:
    """HLO text of a ``tf.function(jit_compile=True)`` for ``args`` (tensors or TensorSpecs).

    ``stage="optimized_hlo"`` is XLA:CPU's optimized module (TF CPU); ``stage="hlo"`` is the
    module TF hands to XLA before optimization. TF prints the optimized module's large
    constants as ``{...}``, which nothing can read back, so that one comes as TF's serialized
    proto, printed by jaxlib with the constants in full.
    """
    from jax._src.lib import xla_client

    if not hasattr(fn, "experimental_get_compiler_ir"):
        raise TypeError(f"tf_hlo needs a tf.function(jit_compile=True), got {type(fn).__name__}")
    compiler_ir = fn.experimental_get_compiler_ir(*args)
    if stage != "optimized_hlo":
        return compiler_ir(stage=stage)
    proto = compiler_ir(stage="optimized_hlo_serialized")
    return hlo_module_text(xla_client.hlo.HloModule.from_serialized_hlo_module_proto(proto))


def tf_hlo_for_gpu(fn, *args, target: str = "h100", classic: bool = False,
                   dump_to: str | None = None) -> str:
    """XLA:GPU optimized HLO of a ``tf.function(jit_compile=True)``, compiled without a GPU.

    TF itself only has an XLA:CPU compiler here (tensorflow-cpu), so its pre-optimization HLO
    goes through jaxlib's deviceless XLA:GPU compiler instead (see ``hlo_for_gpu``).
    """
    return hlo_for_gpu(tf_hlo(fn, *args, stage="hlo"), target=target, classic=classic,
                       dump_to=dump_to)


def hlo_for_gpu(hlo_text: str, target: str = "h100", classic: bool = False,
                dump_to: str | None = None) -> str:
    """Compile pre-optimization HLO text with XLA:GPU for ``target``; return the optimized HLO.

    The route is HLO text -> HloModuleProto -> StableHLO (``hlo_to_stablehlo``) -> the
    deviceless GPU client's ``compile``, because jaxlib's clients only accept MLIR modules.
    """
    options = _compiler_options(target, classic, dump_to)
    if target == "cpu":
        raise ValueError("hlo_for_gpu compiles for GPU targets; for XLA:CPU use tf_hlo or jax_hlo")
    _require_gpu_plugin()
    if gpu_compiles_in_process():
        return _compile_hlo_text(hlo_text, _gpu_device(target), options)
    return _run_child(["hlo", "-"] + _option_argv(target, classic, dump_to), stdin=hlo_text)


# --------------------------------------------------------------------------- compilation

def _compiler_options(target: str, classic: bool, dump_to: str | None) -> dict:
    """XLA debug options for one compile (passed per compile, so XLA_FLAGS stays untouched)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    options = {}
    if classic:
        if target == "cpu":
            raise ValueError("classic=True selects XLA:GPU's non-Triton fusions; "
                             "it has no meaning for target='cpu'")
        options["xla_disable_hlo_passes"] = "triton-softmax-rewriter"
    if dump_to is not None:
        options["xla_dump_to"] = os.path.abspath(dump_to)
        options["xla_dump_hlo_as_text"] = True
    return options


@functools.cache
def _exclude_self_from_metadata() -> None:
    """Keep this helper out of the stack traces in the HLO's metadata, as JAX does with its
    own files: the metadata should point at the user's code only."""
    from jax._src import source_info_util
    source_info_util.register_exclusion(__file__)


def _jit_text(fn, args, device, options, jit_kwargs) -> str:
    import jax

    _exclude_self_from_metadata()

    # Abstract arguments placed on `device` select the backend (CPU, or the deviceless GPU
    # client) without touching JAX's default device.
    sharding = jax.sharding.SingleDeviceSharding(device)

    def abstract(leaf):
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        return leaf

    traced = jax.jit(fn, **jit_kwargs).trace(*jax.tree.map(abstract, args))
    return optimized_hlo_text(traced.lower().compile(options))


def _compile_hlo_text(hlo_text: str, device, options) -> str:
    return "\n\n".join(hlo_module_text(m) for m in _compile_hlo_modules(hlo_text, device, options))


def _compile_hlo_modules(hlo_text: str, device, options) -> list:
    """XLA's optimized HloModules of pre-optimization HLO text compiled for ``device``."""
    # jax internals, pinned by setup.py to jax 0.10: the same compile options jax.jit uses
    # (SPMD settings, CUDA data dir for ptxas) and its MLIR context with the needed dialects.
    from jax._src import compiler
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client as xc
    from jax._src.lib.mlir import ir

    proto = xc.hlo.hlo_module_from_text(_route_around_copies(hlo_text))
    stablehlo = xc._xla.mlir.hlo_to_stablehlo(proto.as_serialized_hlo_module_proto())
    compile_options = compiler.get_compile_options(
        num_replicas=1, num_partitions=1, env_options_overrides=options)
    with mlir.make_ir_context():
        executable = device.client.compile(
            ir.Module.parse(stablehlo), executable_devices=xc.DeviceList((device,)),
            compile_options=compile_options)
    return executable.hlo_modules()


# `%name = f32[4,8]{1,0} copy(` with an array (not tuple) result shape.
_ARRAY_COPY = re.compile(r"^(\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*[^\s(]+\s+)copy\(", re.M)


def _route_around_copies(hlo_text: str) -> str:
    """Replace every array ``copy`` by a same-shape ``reshape``.

    ``hlo_to_stablehlo`` turns ``copy`` into ``mhlo.copy``, which the StableHLO pipeline of
    the compile refuses ("failed to legalize operation 'mhlo.copy'"). In HLO before
    optimization a copy is a logical identity (at most a layout change, and XLA assigns
    layouts again), exactly what a same-shape reshape is: TF emits such reshapes itself and
    StableHLO folds them away. Keeping the instruction (instead of rewiring its users) keeps
    names, metadata and ROOT untouched.
    """
    rewritten = _ARRAY_COPY.sub(r"\1reshape(", hlo_text)
    if re.search(r"\)\s+copy\(", rewritten):
        raise CaptureError("tuple-shaped copy in the HLO: StableHLO has no copy and only "
                           "array copies are routed around; split the tuple first")
    return rewritten


# --------------------------------------------------------------------------- GPU plumbing

def xla_gpu_available() -> bool:
    """Is the JAX CUDA plugin (XLA:GPU's deviceless compiler) installed?"""
    try:
        return importlib.util.find_spec(_CUDA_PLUGIN) is not None
    except ModuleNotFoundError:  # no jax_plugins namespace at all
        return False


def _require_gpu_plugin() -> None:
    if not xla_gpu_available():
        raise CaptureError("XLA:GPU deviceless compilation needs the JAX CUDA plugin "
                           f"({_CUDA_PLUGIN}), which is not installed: {_INSTALL_HINT}")


def gpu_compiles_in_process() -> bool:
    """True when this process's JAX runs with JAX_PLATFORMS=cpu, the setting under which the
    CUDA plugin offers deviceless compilation."""
    if "jax" not in sys.modules:
        return os.environ.get("JAX_PLATFORMS") == "cpu"
    import jax
    return jax.config.jax_platforms == "cpu"


@functools.lru_cache(maxsize=None)
def _gpu_device(target: str):
    """The compile-only device of a one-GPU topology described by the target config."""
    from jax.experimental import topologies

    try:
        topology = topologies.get_topology_desc(platform="cuda", topology="1x1x1",
                                                target_config=target_config(target))
    except NotImplementedError as e:  # "topology not implemented for cuda"
        raise CaptureError("the JAX CUDA plugin did not register; deviceless XLA:GPU "
                           "compilation needs JAX_PLATFORMS=cpu before JAX initializes and "
                           f"the plugin installed ({_INSTALL_HINT})") from e
    return topology.devices[0]


def _option_argv(target, classic, dump_to) -> list[str]:
    argv = ["--target", target]
    if classic:
        argv.append("--classic")
    if dump_to is not None:
        argv += ["--dump-to", os.path.abspath(dump_to)]
    return argv


def _run_child(argv: list[str], stdin: str | None = None) -> str:
    """Run ``python -m fusionstitching.capture ARGV`` with JAX_PLATFORMS=cpu; return stdout."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    # The child imports fn by name, so it needs this process's import path ('' = cwd).
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    try:
        proc = child_processes.run([sys.executable, "-m", "fusionstitching.capture", *argv],
                                   child_processes.COMPILE_TIMEOUT_S, input=stdin, env=env)
    except child_processes.ChildTimeout as exc:
        raise CaptureError(f"XLA:GPU capture in a child process: {exc}") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise CaptureError(f"XLA:GPU capture in a child process failed "
                           f"(python -m fusionstitching.capture {' '.join(argv[:2])} ...):\n{tail}")
    return proc.stdout


def _importable_name(fn) -> str:
    """``module:qualname`` of fn, checked to import back to fn itself."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module in (None, "__main__") or "<" in qualname:
        raise CaptureError(
            f"{fn!r} cannot be imported by a child process (module {module!r}, name "
            f"{qualname!r}); GPU capture needs a function defined at the top level of an "
            "importable module, or a process started with JAX_PLATFORMS=cpu")
    name = f"{module}:{qualname}"
    try:
        same = _resolve(name) is fn
    except (ImportError, AttributeError) as e:
        raise CaptureError(f"{name} does not import back: {e}") from e
    if not same:
        raise CaptureError(f"{name} imports to a different object than the function given")
    return name


def _resolve(name: str):
    module, _, qualname = name.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


# --------------------------------------------------------------------------- argument codec

def _encode_arg(arg):
    """An argument as JSON for the child: arrays as ``f32[64,256]``, containers as JSON
    containers, other leaves as ``{"value": v}``."""
    if hasattr(arg, "shape") and hasattr(arg, "dtype"):
        dtype = np.dtype(arg.dtype)
        if dtype not in _HLO_DTYPE_NAMES:
            raise CaptureError(f"dtype {dtype} has no HLO name known to the capture helper")
        return f"{_HLO_DTYPE_NAMES[dtype]}[{','.join(str(d) for d in arg.shape)}]"
    if isinstance(arg, (list, tuple)):
        return [_encode_arg(a) for a in arg]
    if isinstance(arg, dict):
        return {str(k): _encode_arg(v) for k, v in arg.items()}
    if arg is None or isinstance(arg, (bool, int, float, str)):
        return {"value": arg}
    raise CaptureError(f"cannot pass a {type(arg).__name__} to the capture child process; "
                       "use arrays, ShapeDtypeStructs, containers of them or JSON values")


def _decode_arg(spec):
    """Inverse of ``_encode_arg``: array specs become ``jax.ShapeDtypeStruct``."""
    import jax

    if isinstance(spec, str):
        match = _ARRAY_SPEC.match(spec.strip())
        if not match or match.group(1) not in NUMPY_DTYPES:
            raise ValueError(f"not an array type like f32[64,256]: {spec!r}")
        dims = tuple(int(d) for d in match.group(2).split(",") if d.strip())
        return jax.ShapeDtypeStruct(dims, NUMPY_DTYPES[match.group(1)])
    if isinstance(spec, list):
        return [_decode_arg(s) for s in spec]
    if isinstance(spec, dict):
        if set(spec) == {"value"}:
            return spec["value"]
        return {k: _decode_arg(v) for k, v in spec.items()}
    raise ValueError(f"cannot decode argument {spec!r}")


def _parse_arg(text: str):
    """A CLI argument: JSON, or a bare array type such as f32[64,256] (not valid JSON)."""
    try:
        return _decode_arg(json.loads(text))
    except json.JSONDecodeError:
        return _decode_arg(text)


# --------------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fusionstitching.capture",
        description="Print XLA's optimized HLO of a JAX function or of pre-optimization HLO.")
    sub = parser.add_subparsers(dest="command", required=True)
    jax_cmd = sub.add_parser("jax", help="jax.jit(MODULE:QUALNAME) for the given argument types")
    jax_cmd.add_argument("function", help="module:qualname of a top-level function")
    jax_cmd.add_argument("args", nargs="*", help='f32[64,256], or JSON: a list or dict of '
                         'those, or {"value": v} for a static Python value')
    jax_cmd.add_argument("--jit-kwargs", default="{}", help="JSON object of jax.jit keywords")
    hlo_cmd = sub.add_parser("hlo", help="compile pre-optimization HLO text for a GPU target")
    hlo_cmd.add_argument("file", help="HLO text file, or - for stdin")
    for cmd in (jax_cmd, hlo_cmd):
        cmd.add_argument("--target", default="cpu" if cmd is jax_cmd else "h100", choices=TARGETS)
        cmd.add_argument("--classic", action="store_true",
                         help="disable triton-softmax-rewriter (classic XLA:GPU fusions)")
        cmd.add_argument("--dump-to", help="XLA dump folder (HLO, LLVM IR, PTX)")
        cmd.add_argument("-o", "--output", help="write the HLO here instead of stdout")
    opts = parser.parse_args(argv)

    # Deviceless GPU compilation needs JAX on the CPU platform; fine for the CPU target too.
    # Set through the config as well, in case something imported JAX before this line.
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    jax.config.update("jax_platforms", "cpu")

    try:
        if opts.command == "jax":
            args = [_parse_arg(a) for a in opts.args]
            text = jax_hlo(_resolve(opts.function), *args, target=opts.target,
                           classic=opts.classic, dump_to=opts.dump_to,
                           **json.loads(opts.jit_kwargs))
        else:
            source = sys.stdin.read() if opts.file == "-" else open(opts.file).read()
            text = hlo_for_gpu(source, target=opts.target, classic=opts.classic,
                               dump_to=opts.dump_to)
    except (CaptureError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if opts.output:
        with open(opts.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
