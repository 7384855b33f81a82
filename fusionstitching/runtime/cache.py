"""Kernel cache: host kernels' native object code on disk, shared by the processes of a job.

Compiling a host kernel with LLVM (0.5-1.5 s each, see rewrite.py) dominates the extra JIT
time, and every process of a data-parallel training job compiles the same kernels. So the
object code LLVM emits for a kernel is stored under a fingerprint and loaded by the next
process with MCJIT's ``add_object_file`` (milliseconds).

- Key: sha256 of the kernel's LLVM IR text (it spells out the whole kernel: shapes, layouts,
  schedule), the target triple and CPU the object was built for, and the compiler versions
  (this package and llvmlite, i.e. the LLVM inside it) plus the entry format.
- Entry: ``<dir>/<key[:2]>/<key>.kernel`` = one line of JSON (symbol, payload size and sha256,
  what was fingerprinted) followed by the raw object bytes. No pickle: a cache directory may
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
import threading
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
    compile_s: float = 0.0  # LLVM time spent on misses
    load_s: float = 0.0  # time spent loading hits


def _package_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("fusionstitching")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "source"


_machine_lock = threading.Lock()
_machine = None


def host_machine():
    """The target machine host kernels are built for: the process's triple, generic CPU
    (as codegen.compile_host), position-independent so the object loads anywhere."""
    global _machine
    with _machine_lock:
        if _machine is None:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _machine = llvm.Target.from_default_triple().create_target_machine(
                opt=3, reloc="pic", jit=True)
        return _machine


def host_ir(spec) -> str:
    """The kernel's LLVM IR for the host target (what codegen.compile_host compiles)."""
    module = ir.Module(name=spec.name)
    module.triple = llvm.get_process_triple()
    HostLowering(spec.kernel, module).build()
    return str(module)


def fingerprint(llvm_ir: str) -> str:
    h = hashlib.sha256()
    for part in (FORMAT, llvm.get_process_triple(), "cpu=generic", _package_version(),
                 llvmlite.__version__, llvm_ir):
        h.update(str(part).encode())
        h.update(b"\0")
    return h.hexdigest()


class KernelCache:
    """Object code of host kernels in ``directory`` (None: no cache, always compile)."""

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
            raise CorruptEntry("object code does not match its size/checksum")
        return header, payload

    def store(self, key: str, symbol: str, payload: bytes) -> None:
        header = {"format": FORMAT, "key": key, "symbol": symbol, "size": len(payload),
                  "sha256": hashlib.sha256(payload).hexdigest(),
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


def compile_host_cached(spec, cache: KernelCache, stats: CacheStats) -> HostKernel:
    """``codegen.compile_host(spec)`` through the cache: load the object code when an intact
    entry exists, else compile (same IR, same optimization) and store it."""
    text = host_ir(spec)
    symbol = spec.kernel.name
    key = fingerprint(text)
    if cache.directory is not None:
        t0 = time.perf_counter()
        try:
            entry = cache.load(key)
        except (CorruptEntry, OSError) as exc:
            stats.corrupt.append(f"{key[:16]}: {exc}")
            entry = None
        if entry is not None:
            kernel = _load_object(spec, text, symbol, entry[1])
            stats.hits += 1
            stats.load_s += time.perf_counter() - t0
            return kernel
    t0 = time.perf_counter()
    payload = _emit_object(text)
    stats.misses += 1
    stats.compile_s += time.perf_counter() - t0
    if cache.directory is not None:
        cache.store(key, symbol, payload)
    return _load_object(spec, text, symbol, payload)


def _emit_object(text: str) -> bytes:
    machine = host_machine()
    parsed = llvm.parse_assembly(text)
    parsed.verify()
    # As codegen.compile_host: the emulated thread loops are not unrolled or vectorized.
    optimize(parsed, machine, unroll_and_vectorize=False)
    return machine.emit_object(parsed)


def _load_object(spec, text: str, symbol: str, payload: bytes) -> HostKernel:
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), host_machine())
    engine.add_object_file(llvm.ObjectFileRef.from_data(payload))
    engine.finalize_object()
    address = engine.get_function_address(symbol)
    if not address:
        raise CorruptEntry(f"object code has no symbol {symbol}")
    return HostKernel(spec, text, address, engine)
