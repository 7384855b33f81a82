"""``FUSIONSTITCHING`` / ``FUSIONSTITCHING_FLAGS``: parsing, and the Reports written at exit.

    FUSIONSTITCHING=1 FUSIONSTITCHING_FLAGS="--async --verify --report=/tmp/fs.json" python train.py

Flags (shared by every framework hook):

    --async            build stitched executables on a background thread (XLA's runs meanwhile)
    --verify           check the stitched outputs against XLA's on the first real call
    --target=NAME      GPU the plan is made for (h100, a100, v100; default h100)
    --explorer=NAME    fusion plan: beam (default, the paper's explorer) or greedy (one
                       pattern per connected region: plans large modules ~3x faster)
    --cache_dir=DIR    kernel cache directory (default ~/.cache/fusionstitching)
    --dump_to=DIR      write each module's optimized HLO, rewritten HLO, kernels and Report
    --report=PATH      write a JSON list of Reports (one per compiled function) at exit
    --keep=WHICH       fastest (default: time both executables, keep the faster) or stitched

An unknown or malformed flag gives one warning naming it and is otherwise ignored: a typo in
an environment variable must not stop a training job.
"""
from __future__ import annotations

import atexit
import logging
import os
import shlex
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("fusionstitching")

_FALSE = ("", "0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")


@dataclass
class Flags:
    async_compile: bool = False
    verify: bool = False
    target: str = "h100"
    explorer: str = "beam"
    cache_dir: str | None = None  # None: fusionstitching's default directory
    dump_to: str | None = None
    report: str | None = None
    keep: str = "fastest"

    def jit_options(self) -> dict:
        """Keyword arguments of ``fusionstitching.jit``."""
        options = {"async_compile": self.async_compile, "verify": self.verify,
                   "target": self.target, "explorer": self.explorer, "dump_to": self.dump_to,
                   "keep": self.keep}
        if self.cache_dir is not None:
            options["cache_dir"] = self.cache_dir
        return options


# flag -> (Flags field, takes a value)
_FLAGS = {"async": ("async_compile", False), "verify": ("verify", False),
          "target": ("target", True), "explorer": ("explorer", True),
          "cache_dir": ("cache_dir", True),
          "dump_to": ("dump_to", True), "report": ("report", True), "keep": ("keep", True)}
_CHOICES = {"target": ("h100", "a100", "v100"), "explorer": ("beam", "greedy"),
            "keep": ("fastest", "stitched")}


def enabled(environ=None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get("FUSIONSTITCHING", "").strip().lower() not in _FALSE


def parse(text: str) -> tuple[Flags, list[str]]:
    """(flags, problems): each problem names a flag that was ignored and why."""
    flags, problems = Flags(), []
    try:
        words = shlex.split(text or "")
    except ValueError as exc:
        return flags, [f"FUSIONSTITCHING_FLAGS cannot be split into words ({exc})"]
    for word in words:
        name, has_value, value = word.lstrip("-").partition("=")
        if not word.startswith("--") or name not in _FLAGS:
            problems.append(f"unknown flag {word!r}")
            continue
        field, takes_value = _FLAGS[name]
        if takes_value:
            if not value:
                problems.append(f"{word!r} needs a value (--{name}=...)")
                continue
            if name in _CHOICES and value not in _CHOICES[name]:
                problems.append(f"{word!r}: expected one of {', '.join(_CHOICES[name])}")
                continue
            setattr(flags, field, value)
        elif not has_value or value.lower() in _TRUE + _FALSE[1:]:
            setattr(flags, field, not has_value or value.lower() in _TRUE)
        else:
            problems.append(f"{word!r}: expected --{name} or --{name}=true/false")
    return flags, problems


def from_environment(environ=None) -> Flags:
    """Flags from ``FUSIONSTITCHING_FLAGS``, with one warning for everything ignored, and the
    report-at-exit set up when ``--report`` is given."""
    environ = os.environ if environ is None else environ
    flags, problems = parse(environ.get("FUSIONSTITCHING_FLAGS", ""))
    if problems:
        log.warning("fusionstitching: ignoring part of FUSIONSTITCHING_FLAGS: %s "
                    "(known: %s)", "; ".join(problems), ", ".join("--" + f for f in _FLAGS))
    if flags.report:
        atexit.register(write_reports, flags.report)
    return flags


EXIT_WAIT_S = 120.0
_lock = threading.Lock()
_functions: list = []  # every function the hooks compiled, in creation order


def track(function) -> None:
    """Remember a stitched function (anything with ``reports(wait_s)``) for the exit report."""
    with _lock:
        _functions.append(function)


def write_reports(path: str) -> None:
    """One Report per compiled function signature, as a JSON list (schema
    fusionstitching.report/1, see docs/ARCHITECTURE.md)."""
    import json

    with _lock:
        functions = list(_functions)
    # Builds still running (--async) are waited for, within bounds: the job is over, and a
    # report of a half-built function would say nothing.
    deadline = time.monotonic() + EXIT_WAIT_S
    reports = [r.to_json() for f in functions
               for r in f.reports(wait_s=max(0.0, deadline - time.monotonic()))]
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(reports, f, indent=1)
            f.write("\n")
    except OSError as exc:  # at exit there is no one left to raise to
        log.warning("fusionstitching: could not write the report to %s: %s", path, exc)
