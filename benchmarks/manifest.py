"""What a result file records about the run that made it: commit, host, versions, flags."""
from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys

PACKAGES = ("jax", "jaxlib", "jax-cuda12-plugin", "numpy", "ml_dtypes", "llvmlite")


def run_manifest(flags: dict) -> dict:
    """The manifest of a run started now with ``flags`` (its command-line options)."""
    return {"commit": _git("rev-parse", "HEAD"),
            "tree_clean": _git("status", "--porcelain", "--untracked-files=no") == "",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": {"node": platform.node(), "machine": platform.machine(),
                     "processor": _cpu_model(), "cores": os.cpu_count(),
                     "system": platform.platform()},
            "python": sys.version.split()[0],
            "versions": {name: _version(name) for name in PACKAGES},
            "flags": flags}


def _git(*args: str) -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        return subprocess.run(["git", *args], cwd=here, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
