"""The HLO files a folder holds, as users keep them: what replay and prewarm read.

Files named on the command line are taken as they are. In folders (searched recursively):
``*.hlo``, ``*.hlo.txt``, XLA's dumps (``*after_optimizations.txt``), any other ``*.txt`` whose
text starts with ``HloModule``, each also gzipped (``.gz``). The runtime's own dump files are
left out with a reason: a rewritten module (our custom calls, not XLA's plan) and the copy of
a module whose XLA dump lies beside it.
"""
from __future__ import annotations

import gzip
import re
from pathlib import Path

# What an HLO text file starts with (after blank lines).
_HEAD = b"HloModule"
_NAMED = (".hlo", ".hlo.txt", "after_optimizations.txt")
REWRITTEN = ".rewritten.hlo.txt"  # the runtime's rewritten module (--dump_to)
RUNTIME_COPY = ".xla.hlo.txt"  # the runtime's copy of XLA's module (--dump_to)
_XLA_DUMP = re.compile(r"module_\d+\.")  # XLA_FLAGS=--xla_dump_to's names


def collect_hlo_files(paths: list[str]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(the HLO files to replay, in order; the files of the folders left out, with why)."""
    files: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    for p in map(Path, paths):
        if not p.is_dir():
            files.append(p)
            continue
        for f in sorted(f for f in p.rglob("*") if f.is_file()):
            why = _why_not(f)
            if why is None:
                files.append(f)
            elif why:
                skipped.append((f, why))
    return files, skipped


def collect_runtime_modules(paths: list[str]) -> list[Path]:
    """The runtime's copies of XLA's modules (``*.xla.hlo.txt``, what prewarm plans), and
    files named on the command line."""
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(f for f in p.rglob(f"*{RUNTIME_COPY}") if f.is_file()) \
            if p.is_dir() else [p]
    return files


def _why_not(path: Path) -> str | None:
    """None for an HLO file to replay; why not for one that looks like HLO but is left out;
    "" for files that are not HLO text at all (not reported)."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    if name.endswith(REWRITTEN):
        return "the runtime's rewritten module (FusionStitching's kernels, not XLA's plan)"
    if name.endswith(RUNTIME_COPY):
        stem = path.parent / name[:-len(RUNTIME_COPY)]
        if any(Path(f"{stem}.{backend}.after_optimizations.txt").exists()
               for backend in ("cpu", "h100", "a100", "v100")) \
                or any(path.parent.glob(f"{stem.name}.*after_optimizations.txt")):
            return "the runtime's copy of a module whose XLA dump lies beside it"
        return None
    if name.endswith("before_optimizations.txt"):
        return "XLA's module before optimization (replay reads XLA's fused plan)"
    if name.endswith(_NAMED):
        return None
    if not name.endswith(".txt") or not _starts_with_hlo(path):
        return ""
    if _XLA_DUMP.match(name):  # before optimizations, or after one pass of many
        return "XLA's module at another stage than after optimizations"
    return None


def _starts_with_hlo(path: Path) -> bool:
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as f:
            return f.read(4096).lstrip().startswith(_HEAD)
    except (OSError, EOFError):
        return False
