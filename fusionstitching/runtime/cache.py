"""Kernel cache: host kernels' native object code on disk, shared by the processes of a job.

Compiling a host kernel with LLVM (0.5-1.5 s each, see rewrite.py) dominates the extra JIT
time, and every process of a data-parallel training job compiles the same kernels. So the
object code LLVM emits for a kernel is stored under a fingerprint and loaded by the next
process with MCJIT's ``add_object_file`` (milliseconds).

Plans (runtime/build.py) are entries of the same format keyed by XLA's optimized HLO: they
name their kernels by key, so a process that finds the plan loads everything it needs.

- Key: sha256 of the kernel's LLVM IR text (it spells out the whole kernel: shapes, layouts,
  schedule), the target triple, CPU and CPU features the object was built for, and the compiler versions
  (this package and llvmlite, i.e. the LLVM inside it) plus the entry format.
- Entry: ``<dir>/<key[:2]>/<key>.kernel`` = one line of JSON (symbol, payload size and sha256,
  what was fingerprinted) followed by the raw payload (object bytes, or a plan's JSON). No pickle: a cache directory may
  be shared or tampered with, and reading an entry never executes anything but the object code
  it names under the key the reader computed itself.
- Concurrency: entries are written to a temporary file in the same directory and published
  with ``os.replace`` (atomic on POSIX), so a reader sees either no entry or a whole one; two
  processes missing at once both compile and the last ``replace`` wins with identical bytes.
- Corruption (truncated file, flipped bytes, other format) is detected by the size and
  checksum in the header: the entry is rebuilt and overwritten, and the caller is told so it
  can note it in the Report.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field

import llvmlite
import llvmlite.binding as llvm
from llvmlite import ir

from ..codegen.host import HostKernel, HostLowering
from ..codegen.llvm_lowering import optimize

FORMAT = "fusionstitching.kernel/1"


def default_dir() -> str:
    """``$XDG_CACHE_HOME/fusionstitching`` (``~/.cache/fusionstitching``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fusionstitching")


class CorruptEntry(ValueError):
    """A cache entry failed its size/checksum/format check."""


@dataclass
class CacheStats:
    """What the cache did for one compiled function (goes into the Report)."""

    dir: str | None
    hits: int = 0
    misses: int = 0
    corrupt: list[str] = field(default_factory=list)  # keys rebuilt, with the reason
    plan: str = "miss"  # "hit": plan, kernels and rewritten HLO all came from the cache
    compile_s: float = 0.0  # LLVM time spent on misses
    load_s: float = 0.0  # time spent loading hits


def _package_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("fusionstitching")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "source"


def host_machine():
    """A target machine for host kernels: this CPU and its features (as codegen.compile_host:
    F16C for f16, AVX), position-independent so the object loads at any address. A new one
    each time: an MCJIT engine takes ownership of its machine and destroys it with itself."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=_host_features(), opt=3, reloc="pic", jit=True)


def _host_features() -> str:
    return llvm.get_host_cpu_features().flatten()


def host_ir(spec) -> str:
    """The kernel's LLVM IR for the host target (what codegen.compile_host compiles)."""
    module = ir.Module(name=spec.name)
    module.triple = llvm.get_process_triple()
    HostLowering(spec.kernel, module).build()
    return str(module)


def fingerprint(*parts: str) -> str:
    """sha256 of ``parts`` (e.g. a kernel's LLVM IR) with the target and compiler versions."""
    h = hashlib.sha256()
    # The CPU and its features are part of the key: a cache directory shared by machines of
    # different CPUs must not hand one the other's instructions.
    for part in (FORMAT, llvm.get_process_triple(), llvm.get_host_cpu_name(), _host_features(),
                 _package_version(), llvmlite.__version__, *parts):
        h.update(str(part).encode())
        h.update(b"\0")
    return h.hexdigest()


class KernelCache:
    """Entries in ``directory`` (None: no cache, always compile): host kernels' object code,
    and plans (runtime/build.py) that name their kernels by key."""

    def __init__(self, directory: str | None):
        self.directory = directory

    def path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key + ".kernel")

    def load(self, key: str) -> tuple[dict, bytes] | None:
        """(header, object bytes), None when absent; raises CorruptEntry when unreadable."""
        try:
            with open(self.path(key), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        line, newline, payload = data.partition(b"\n")
        try:
            header = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptEntry(f"header is not JSON ({exc})") from None
        if not newline or not isinstance(header, dict) or header.get("format") != FORMAT:
            raise CorruptEntry(f"not a {FORMAT} entry")
        if header.get("key") != key:
            raise CorruptEntry("entry was written under another key")
        if len(payload) != header.get("size") or \
                hashlib.sha256(payload).hexdigest() != header.get("sha256"):
            raise CorruptEntry("payload does not match its size/checksum")
        return header, payload

    def lookup(self, key: str, stats: CacheStats) -> tuple[dict, bytes] | None:
        """``load`` for callers that rebuild on any problem: a corrupt or unreadable entry
        is noted in ``stats`` and reads as absent (it is overwritten by the rebuild)."""
        if self.directory is None:
            return None
        try:
            return self.load(key)
        except (CorruptEntry, OSError) as exc:
            stats.corrupt.append(f"{key[:16]}: {exc}")
            return None

    def store(self, key: str, payload: bytes, **about) -> None:
        """Publish ``payload`` under ``key``; ``about`` goes into the header (JSON values)."""
        header = {"format": FORMAT, "key": key, "size": len(payload),
                  "sha256": hashlib.sha256(payload).hexdigest(), **about,
                  "llvmlite": llvmlite.__version__, "package": _package_version(),
                  "triple": llvm.get_process_triple(), "created": time.time()}
        directory = os.path.dirname(self.path(key))
        os.makedirs(directory, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{key[:16]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(header).encode() + b"\n" + payload)
            os.replace(temp, self.path(key))
        except BaseException:
            os.unlink(temp)
            raise


def compile_host_cached(spec, cache: KernelCache, stats: CacheStats) -> tuple[HostKernel, str]:
    """``codegen.compile_host(spec)`` through the cache: load the object code when an intact
    entry exists, else compile (same IR, same optimization) and store it. Returns the kernel
    and its cache key."""
    text = host_ir(spec)
    symbol = spec.kernel.name
    key = fingerprint("kernel", text)
    t0 = time.perf_counter()
    entry = cache.lookup(key, stats)
    if entry is not None:
        try:
            kernel = load_object(spec, symbol, entry[1], text)
        except CorruptEntry as exc:
            stats.corrupt.append(f"{key[:16]}: {exc}")
        else:
            stats.hits += 1
            stats.load_s += time.perf_counter() - t0
            return kernel, key
    t0 = time.perf_counter()
    payload = _emit_object(text)
    stats.misses += 1
    stats.compile_s += time.perf_counter() - t0
    if cache.directory is not None:
        cache.store(key, payload, kind="kernel", symbol=symbol)
    return load_object(spec, symbol, payload, text), key


def _emit_object(text: str) -> bytes:
    machine = host_machine()
    parsed = llvm.parse_assembly(text)
    parsed.verify()
    # As codegen.compile_host: the emulated thread loops are not unrolled or vectorized.
    optimize(parsed, machine, unroll_and_vectorize=False)
    return machine.emit_object(parsed)


def load_object(spec, symbol: str, payload: bytes, text: str = "") -> HostKernel:
    """Native code from object bytes (the kernel's LLVM IR text is kept for reference)."""
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), host_machine())
    engine.add_object_file(llvm.ObjectFileRef.from_data(payload))
    engine.finalize_object()
    address = engine.get_function_address(symbol)
    if not address:
        raise CorruptEntry(f"object code has no symbol {symbol}")
    return HostKernel(spec, text, address, engine)
