"""``FUSIONSTITCHING`` / ``FUSIONSTITCHING_FLAGS``: parsing, and the Reports written at exit.

    FUSIONSTITCHING=1 FUSIONSTITCHING_FLAGS="--async --verify --report=/tmp/fs.json" python train.py

The flags (--async, --verify, --target, --explorer, --cost_model, --cache_dir, --cache_group,
--remote_cache, --dump_to, --report, --keep, --keras_jit; docs/usage.md says what each does)
are shared by every framework hook. An
unknown or malformed flag gives one warning naming it and is otherwise ignored: a typo in an
environment variable must not stop a training job.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import fcntl
import json
import os
import shlex
import socket
import sys
import threading
import time
from dataclasses import dataclass

from fusionstitching import job_clock  # noqa: F401 - its clock starts with the process
from fusionstitching.logs import log

_STARTED = time.time()  # this module is imported at start-up (the .pth hook)

_FALSE = ("", "0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")


@dataclass
class Flags:
    async_compile: bool = True  # builds off the call path; --async=false: in the first call
    verify: bool = True  # --verify=false: the trial call is not checked
    target: str = "h100"
    explorer: str = "beam"
    cost_model: str = "auto"  # "auto": the host CPU's model on XLA:CPU, the GPU's on a GPU
    cache_dir: str | None = None  # None: fusionstitching's default directory
    cache_group: str | None = None  # None: the cache is private to this user
    remote_cache: str | None = None  # redis:// URL of the tier shared by the job's hosts
    dump_to: str | None = None
    report: str | None = None
    keep: str = "fastest"
    # Keras 3 on TF, jit_compile="auto" on a machine without a GPU: "auto" gives a step XLA
    # once the job has run STITCH_AFTER_S (plain TF before), "always" from its first call,
    # "false" leaves Keras's choice (no XLA)
    keras_jit: str = "auto"

    def jit_options(self) -> dict:
        """Keyword arguments of ``fusionstitching.jit``."""
        options = {"async_compile": self.async_compile, "verify": self.verify,
                   "target": self.target, "explorer": self.explorer,
                   "cost_model": self.cost_model, "dump_to": self.dump_to,
                   "keep": self.keep}
        if self.cache_dir is not None:
            options["cache_dir"] = self.cache_dir
        if self.cache_group is not None:
            options["cache_group"] = self.cache_group
        if self.remote_cache is not None:
            options["remote_cache"] = self.remote_cache
        return options


# flag -> (Flags field, takes a value)
_FLAGS = {"async": ("async_compile", False), "verify": ("verify", False),
          "target": ("target", True), "explorer": ("explorer", True),
          "cost_model": ("cost_model", True),
          "cache_dir": ("cache_dir", True), "cache_group": ("cache_group", True),
          "remote_cache": ("remote_cache", True),
          "dump_to": ("dump_to", True), "report": ("report", True), "keep": ("keep", True),
          "keras_jit": ("keras_jit", True)}
_CHOICES = {"target": ("h100", "a100", "v100"), "explorer": ("beam", "greedy"),
            "cost_model": ("auto", "gpu", "cpu"),
            "keep": ("fastest", "stitched"), "keras_jit": ("auto", "always", "false")}
# --keras_jit alone, or as a boolean as it once was
_KERAS_JIT_WORDS = {"": "always", "true": "always", "1": "always", "yes": "always",
                    "on": "always", "0": "false", "no": "false", "off": "false"}


def enabled(environ=None) -> bool:
    """``FUSIONSTITCHING`` is one of the documented values (1/true/yes/on, 0/false/no/off or
    empty). Anything else ("disabled", "2") is one warning and leaves stitching off: an
    unclear setting must not change how the job runs."""
    environ = os.environ if environ is None else environ
    value = environ.get("FUSIONSTITCHING", "").strip().lower()
    if value in _TRUE:
        return True
    if value not in _FALSE:
        log.warning("FUSIONSTITCHING=%r is not one of %s; stitching stays "
                    "off", environ.get("FUSIONSTITCHING"), "/".join(_TRUE + _FALSE[1:]))
    return False


def parse(text: str) -> tuple[Flags, list[str]]:
    """(flags, problems): each problem names a flag that was ignored and why."""
    flags, problems, given = Flags(), [], set()
    for word in _words(text or "", problems):
        name, has_value, value = word.lstrip("-").partition("=")
        if not word.startswith("--") or name not in _FLAGS:
            problems.append(f"unknown flag {word!r}")
            continue
        field, takes_value = _FLAGS[name]
        if name == "keras_jit":
            value = _KERAS_JIT_WORDS.get(value.lower(), value.lower())
        if takes_value:
            if not value:
                problems.append(f"{word!r} needs a value (--{name}=...)")
                continue
            if name in _CHOICES and value not in _CHOICES[name]:
                problems.append(f"{word!r}: expected one of {', '.join(_CHOICES[name])}")
                continue
            setattr(flags, field, value)
            given.add(name)
        elif not has_value or value.lower() in _TRUE + _FALSE[1:]:
            setattr(flags, field, not has_value or value.lower() in _TRUE)
            given.add(name)
        else:
            problems.append(f"{word!r}: expected --{name} or --{name}=true/false")
    if flags.keep == "stitched":
        # the one flag of a user who wants every step stitched: unless said otherwise,
        # Keras's steps get XLA from their first call and each is built in its first call
        # (a Keras script of 6 train steps ended before background builds did)
        if "keras_jit" not in given:
            flags.keras_jit = "always"
        if "async" not in given:
            flags.async_compile = False
    return flags, problems


def _words(text: str, problems: list) -> list[str]:
    """Shell words; an unbalanced quote loses only the word it starts in (a problem), not
    the flags around it (``--cache_dir`` among them)."""
    try:
        return shlex.split(text)
    except ValueError:
        pass
    raw, words, i = text.split(), [], 0
    while i < len(raw):
        for j in range(i + 1, len(raw) + 1):  # a quoted value may span several raw words
            try:
                words += shlex.split(" ".join(raw[i:j]))
            except ValueError:
                continue
            i = j
            break
        else:
            problems.append(f"unbalanced quote in {raw[i]!r}")
            i += 1
    return words


def from_environment(environ=None) -> Flags:
    """Flags from ``FUSIONSTITCHING_FLAGS``, with one warning for everything ignored, and the
    report-at-exit set up when ``--report`` is given."""
    environ = os.environ if environ is None else environ
    flags, problems = parse(environ.get("FUSIONSTITCHING_FLAGS", ""))
    if problems:
        log.warning("ignoring part of FUSIONSTITCHING_FLAGS: %s "
                    "(known: %s)", "; ".join(problems), ", ".join("--" + f for f in _FLAGS))
    if flags.report:
        atexit.register(write_reports, flags.report)
    return flags


# A build still running at exit is not waited for: its planning goes on in a process of its
# own (runtime/lifecycle.py, _plan_in_child), for the next run. Waiting up to 120 s made the
# first run of 10 s training scripts 2.7-4.6x slower in wall time.
EXIT_WAIT_S = 0.0
_lock = threading.Lock()
_functions: list = []  # every function the hooks compiled, in creation order


def track(function) -> None:
    """Remember a stitched function (anything with ``reports(wait_s)``) for the exit report."""
    with _lock:
        _functions.append(function)


def say_if_nothing_was_stitched() -> None:
    """At exit, one warning when a job that imported jax or TF under the env var ran no
    stitched kernel, and why: no function was compiled with XLA (Keras on TF without
    jit_compile, say), or each one's decision (still deciding, XLA faster, a fallback)."""
    if not {"jax", "tensorflow"} & set(sys.modules):
        return  # a process that ran no framework (a tool, a worker) has nothing to say
    with _lock:
        functions = list(_functions)
    if not functions:
        log.warning("FUSIONSTITCHING is set but nothing was stitched: no function of this "
                    "process was compiled with XLA (JAX: functions under jax.jit; TF: "
                    "tf.function(jit_compile=True) and Keras models compiled with "
                    "jit_compile=True or 'auto')")
        return
    try:
        runtimes = [r.runtime or {} for f in functions for r in f.reports(wait_s=0.0)]
    except Exception:  # at exit there is no one to raise to
        return
    if not runtimes or any(r.get("kept") == "stitched" for r in runtimes):
        return
    whys = collections.Counter(_state_in_words(r) for r in runtimes)
    log.warning("nothing was stitched: %d compiled functions ran their own kernels (%s)",
                len(runtimes), "; ".join(f"{n}x {why}" for why, n in whys.most_common(3)))


def _state_in_words(runtime: dict) -> str:
    state = runtime.get("state")
    if state == "building":
        return "still building when the job ended (builds run off the call path; planning " \
               "goes on in a background process, for the next run)"
    if state in ("pending", "trial", "timing"):
        return "still deciding when the job ended"
    if state == "waiting" and runtime.get("kept") == "plain-tf":
        return "ran as plain TF: the job ended before XLA was worth compiling for " \
               "(--keras_jit=auto; --keras_jit=always compiles from the first call)"
    if state == "waiting":
        return "the job ended before stitching starts (30 s into a job: a shorter one " \
               "gains less than building costs; a plan not cached yet is made at exit, " \
               "for the next run)"
    return _short(f"{state}: {runtime.get('why') or 'no reason given'}")


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def write_reports(path: str) -> None:
    """One Report per compiled function signature, as a JSON list (schema
    fusionstitching.report/1, see docs/ARCHITECTURE.md), each tagged with the process that
    wrote it (``"process": {"pid", "host"}``).

    The processes of one job share the file: under a lock on its directory, each one replaces
    its own Reports and keeps the others'. A file last written before this process started
    is an earlier job's, and is replaced. Written by atomic rename (a symlink at ``path`` is
    replaced, never followed); a failure is one warning, at exit there is no one to raise to."""
    from fusionstitching.runtime import files  # not at start-up: it imports the package

    with _lock:
        functions = list(_functions)
    deadline = time.monotonic() + EXIT_WAIT_S
    me = {"pid": os.getpid(), "host": socket.gethostname()}
    reports = [dict(r.to_json(), process=me) for f in functions
               for r in f.reports(wait_s=max(0.0, deadline - time.monotonic()))]
    try:
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        with _directory_lock(directory):
            others = [r for r in _reports_of_this_job(path) if r.get("process") != me]
            files.write_atomic(path, json.dumps(others + reports, indent=1) + "\n")
    except (OSError, ValueError, TypeError) as exc:
        log.warning("could not write the report to %s: %s: %s", path,
                    type(exc).__name__, exc)


def _reports_of_this_job(path: str) -> list:
    """The Reports other processes of this job wrote to ``path`` (see write_reports)."""
    try:
        with open(path, "rb") as f:  # read only: following a symlink here writes nothing
            if os.fstat(f.fileno()).st_mtime < _STARTED:
                return []
            reports = json.loads(f.read())
    except FileNotFoundError:
        return []
    except (OSError, ValueError):  # not ours to merge with (a directory fails again later)
        return []
    if not isinstance(reports, list):
        return []
    return [r for r in reports if isinstance(r, dict)]


@contextlib.contextmanager
def _directory_lock(directory: str):
    """An exclusive flock on the directory itself: it serializes the read-merge-write of
    the processes of a job and leaves no lock file behind."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
