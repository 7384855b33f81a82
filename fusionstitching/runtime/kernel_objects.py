"""Host kernels' object code through the kernel cache (runtime/cache.py): compile once, load
the native code in every process of a job, and the schedule chosen for each pattern form.
"""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import MutableMapping

import llvmlite.binding as llvm

from ..codegen import Schedule
from ..codegen import host
from ..codegen.host import HostKernel
from ..codegen.schedules.space import Space
from ..codegen.llvm_lowering import optimize
from .cache import CacheStats, CorruptEntry, KernelCache, fingerprint, host_features


def host_machine():
    """A target machine for host kernels: this CPU and its features (as codegen.compile_host:
    F16C for f16, AVX), position-independent so the object loads at any address. A new one
    each time: an MCJIT engine takes ownership of its machine and destroys it with itself."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=host_features(), opt=3, reloc="pic", jit=True)


def host_ir(spec) -> str:
    """The LLVM IR the runtime compiles for the kernel on this host (what
    ``codegen.compile_host(spec, fast=True)`` compiles): its host kernel, scheduled for the
    CPU and lowered for speed."""
    if spec.host_kernel is None:
        raise ValueError(f"{spec.name} has no host kernel (codegen.add_host_kernel builds it)")
    return host.host_ir(spec.host_kernel, fast=True)


class ScheduleMemo(MutableMapping):
    """The schedule chosen for each pattern form (``pipeline.stitch_module``'s ``schedules``),
    kept in the cache: a module sharing patterns with one planned before, in this process or
    another (one more layer, a restarted job), builds their schedules alone instead of every
    candidate. An entry is the Schedule as JSON; one that does not read back is a miss."""

    def __init__(self, cache: KernelCache, stats: CacheStats):
        self.cache, self.stats = cache, stats
        self._known: dict[str, Schedule] = {}

    def __getitem__(self, form: str) -> Schedule:
        if form not in self._known:
            entry = self.cache.lookup(fingerprint("schedule", form), self.stats)
            try:
                fields = json.loads(entry[1]) if entry is not None else None
                self._known[form] = Schedule(**{**fields, "space": Space(**fields["space"])})
            except (TypeError, KeyError, ValueError):  # absent, or not a Schedule
                raise KeyError(form) from None
        return self._known[form]

    def __setitem__(self, form: str, schedule: Schedule) -> None:
        self._known[form] = schedule
        self.cache.store(fingerprint("schedule", form),
                         json.dumps(dataclasses.asdict(schedule)).encode(), kind="schedule")

    def __delitem__(self, form: str) -> None:
        del self._known[form]

    def __iter__(self):
        return iter(self._known)

    def __len__(self) -> int:
        return len(self._known)


def compile_host_cached(spec, cache: KernelCache, stats: CacheStats, check=None
                        ) -> tuple[HostKernel, str]:
    """``codegen.compile_host(spec)`` through the cache: load the object code when an intact
    entry exists, else compile (same IR, same optimization) and store it. Returns the kernel
    and its cache key. ``check(kernel, reference)``, on a miss: given also the same IR built
    without loop unrolling and vectorization, returns True to keep the vectorized build,
    False to keep (and store) the reference instead; it may raise, and nothing is stored."""
    text = host_ir(spec)
    symbol = spec.host_kernel.name
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
    kernel = load_object(spec, symbol, payload, text)
    if check is not None:
        reference_payload = _emit_object(text, vectorize=False)
        reference = load_object(spec, symbol, reference_payload, text)
        stats.compile_s += time.perf_counter() - t0
        if not check(kernel, reference):
            payload, kernel = reference_payload, reference
    else:
        stats.compile_s += time.perf_counter() - t0
    stats.misses += 1
    cache.store(key, payload, kind="kernel", symbol=symbol)  # no-op without a cache
    cache.note_refusals(stats)  # the store may have found a tier unusable
    return kernel, key


def _emit_object(text: str, vectorize: bool = True) -> bytes:
    machine = host_machine()
    parsed = llvm.parse_assembly(text)
    parsed.verify()
    # vectorize: as codegen.compile_host(fast=True)
    optimize(parsed, machine, unroll_and_vectorize=vectorize)
    return machine.emit_object(parsed)


def load_object(spec, symbol: str, payload: bytes, text: str = "") -> HostKernel:
    """Native code from object bytes (the kernel's LLVM IR text is kept for reference)."""
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), host_machine())
    engine.add_object_file(llvm.ObjectFileRef.from_data(payload))
    engine.finalize_object()
    address = engine.get_function_address(symbol)
    parts_address = engine.get_function_address(symbol + host.PARTS_SUFFIX)
    if not address or not parts_address:
        raise CorruptEntry(f"object code has no symbol {symbol} or {symbol}{host.PARTS_SUFFIX}")
    if spec is None:  # a cached plan's kernel: only XLA calls it
        return HostKernel(None, text, address, engine, parts_address)
    return HostKernel(spec, text, address, engine, parts_address,
                      host.split_extent(spec.host_kernel), spec.host_kernel.in_place)
