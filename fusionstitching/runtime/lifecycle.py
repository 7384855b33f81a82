"""One compiled signature's lifecycle, shared by the front ends (``stitched_jit.Compiled``
and tf_hooks' ``TfCompiled``): build the stitched executable at once or on a background thread, hand the
outcome to its ``Executor``, write the dumps, and report the executable that runs.

Dumps (``dump_to``) are written into a private staging directory inside ``dump_to`` and
renamed into place at the end of the build, so a symlink planted there is replaced, never
written through; any failure is one warning per directory and the job goes on.
"""
from __future__ import annotations

import atexit
import dataclasses
import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from .. import pipeline
from ..report import Fallback, PlanSummary, Report
from . import files
from .build import build_stitched, plan_cached, plan_key_of
from .cache import KernelCache, share_with_group
from .decisions import DecisionStore
from ..logs import log
from .executor import Executor, RuntimeInfo, lower_thread_priority

_dump_counter = itertools.count()


@dataclass
class RuntimeReport(Report):
    """A Report with what happened at run time (optional fields of the schema): ``runtime``
    (runtime/executor.py RuntimeInfo: which executable runs, measured times, swap call) and
    ``cache`` (kernel cache hits, misses, corrupt entries, LLVM seconds)."""

    runtime: dict | None = None
    cache: dict | None = None


def fallback_report(name: str, options: pipeline.Options, fallbacks: list) -> Report:
    """The pass did not run to the end: no plan to count, only why."""
    empty = PlanSummary(kernels=0, mem_kernels=0, bytes=0, modeled_us=0.0)
    return Report(module=name, target=options.target, xla=empty,
                  fs=dataclasses.replace(empty, patterns=0), compulsory_bytes=0,
                  fallbacks=fallbacks)


def share_cache(cache_dir: str, group) -> None:
    """Opt into sharing ``cache_dir`` with ``group``; an unknown group is one warning and the
    cache stays private."""
    try:
        share_with_group(cache_dir, group)
    except (KeyError, ValueError) as exc:
        files.warn_once(("cache_group", str(group)), "unknown cache group "
                        "%r (%s); the kernel cache stays private", group, exc)


class Lifecycle:
    """The build, dumps and report of one compiled signature. ``executor`` decides which
    executable runs its calls; the front end sets it (jit at once, TF once its reference is
    compiled). ``module_name``: the name its Report gives the module (None: the module's own
    once built, ``name`` before)."""

    def __init__(self, name: str, options: pipeline.Options, cache_dir: str | None,
                 async_compile: bool, dump_to: str | None, module_name: str | None = None,
                 remote_cache: str | None = None):
        self.name, self.options, self.cache_dir = name, options, cache_dir
        self.remote_cache = remote_cache
        self.async_compile, self.dump_to, self.module_name = async_compile, dump_to, module_name
        self.info = RuntimeInfo(mode="async" if async_compile else "sync")
        self.fallbacks: list[Fallback] = []  # the front end's own (TF: calls it leaves to TF)
        self.executor: Executor | None = None
        self.builder: threading.Thread | None = None  # the background build (async_compile)
        # the reference's optimized HLO, planned in a child process (``_plan_in_child``);
        # None: a front end that cannot give it before its build (it plans on the thread)
        self.optimized_text: Callable[[], str] | None = None
        self.reference = None  # XLA's Compiled of it (whether its plan is cached already)
        self.measure = False  # as ``build`` passes it (part of the plan's key)
        self.dump_name = f"{_file_name(name)}.{next(_dump_counter)}" if dump_to else None

    # -- build ------------------------------------------------------------------------
    def start(self, build: Callable, *args, decided_before: Callable | None = None) -> None:
        """``build(*args)`` now, or on a background thread with ``async_compile``: there it
        first waits for a planning process (``_plan_in_child``) and then loads its plan. A
        build whose decision an earlier run kept (``decided_before()``) runs now in any case:
        loading its plan is quick, and its executable then answers the same calls in every
        run of the job (the same losses, run after run)."""
        if self.async_compile and not (decided_before is not None and decided_before()):
            child = self._plan_in_child()
            self.builder = threading.Thread(target=_in_background, args=(child, build, *args),
                                            daemon=True, name=f"fusionstitching-{self.name}")
            _background[id(self)] = self
            self.builder.start()
        else:
            build(*args)

    def build(self, executor: Executor, jax_lowered, reference, started: float,
              dump_prefix: str | None) -> None:
        """Stitch ``reference``'s optimized module and hand the outcome to ``executor``;
        never raises (the reference keeps running)."""
        options = dataclasses.replace(self.options, verify=False)  # the trial checks instead
        if dump_prefix and not options.emit_dir:
            options.emit_dir = dump_prefix + ".kernels"
        self.measure = measures(executor)
        try:
            built = build_stitched(jax_lowered, reference, options, self.cache_dir,
                                   dump_prefix, measure=self.measure,
                                   remote_cache=self.remote_cache)
        except Exception as exc:  # never fail the user's job: the reference runs
            executor.build_failed(exc)
            self.info.build_s = round(time.perf_counter() - started, 3)
        else:
            if self.cache_dir is not None and built.plan_key:
                executor.decisions = DecisionStore(
                    KernelCache(self.cache_dir, remote=self.remote_cache), built.plan_key)
            executor.built_ok(built, time.perf_counter() - started)

    def _plan_in_child(self) -> subprocess.Popen | None:
        """``fusionstitching prewarm`` of the reference's module in a process of its own,
        detached and at a low priority, planning it into the cache; None where it cannot.

        Planning is Python: on a thread it held the GIL the training loop needs (a 12.6 s
        Keras script ran 23.8 s with its builds on threads), and a job that ended first lost
        it. The child goes on after the job ends; the next run loads its plan."""
        if self.cache_dir is None or self.optimized_text is None:
            return None
        try:
            if self.reference is not None and plan_cached(
                    self.reference, self.options, self.cache_dir, self.remote_cache,
                    self.measure):
                return None  # the build loads it at once
            folder = tempfile.mkdtemp(prefix="fusionstitching-plan-")  # private (0700)
            files.write_atomic(os.path.join(folder, f"{_file_name(self.name)}.xla.hlo.txt"),
                               self.optimized_text())
            command = [sys.executable, "-m", "fusionstitching.cli", "prewarm", folder,
                       "--cache_dir", self.cache_dir, "--target", self.options.target,
                       "--explorer", self.options.explorer,
                       "--keep", "fastest" if self.measure else "stitched"]
            if self.remote_cache:
                command += ["--remote_cache", self.remote_cache]
            # one planning process at a time per user, at the lowest priority: several at
            # once, each with XLA's thread pool, took the job's cores however nice they were
            lock = os.path.join(tempfile.gettempdir(), f"fusionstitching-planning-{os.getuid()}")
            run = f"nice -n 19 {shlex.join(command)}"
            if shutil.which("flock"):
                run = f"flock {shlex.quote(lock)} {run}"
            script = f"{run}; status=$?; rm -rf {shlex.quote(folder)}; exit $status"
            env = {k: v for k, v in os.environ.items() if k != "FUSIONSTITCHING"}
            return subprocess.Popen(["sh", "-c", script], start_new_session=True, env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        except Exception as exc:  # the build plans on its thread instead
            log.info("%s: no planning process: %s", self.name, exc)
            return None

    def decided_before(self, reference, measure: bool) -> bool:
        """Whether an earlier run kept a decision for the plan of ``reference`` (measured
        with ``measure`` as ``build`` passes it); any problem reads as no."""
        if self.cache_dir is None:
            return False
        try:
            key = plan_key_of(reference, self.options, measure)
            cache = KernelCache(self.cache_dir, remote=self.remote_cache)
            stored = DecisionStore(cache, key).load()
            return stored is not None and stored.settled
        except Exception:  # the build finds out for itself
            return False

    def wait_built(self, timeout_s: float | None = None) -> bool:
        """Wait for a background build and a background trial that has started (never needed
        for calls); True when neither is running."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        def joined(thread: threading.Thread | None) -> bool:
            if thread is not None:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            return thread is None or not thread.is_alive()

        if not joined(self.builder):
            return False
        executor = self.executor  # after the build: TF's executor comes with it
        return joined(executor.trial_thread if executor is not None else None)

    # -- report -----------------------------------------------------------------------
    def report(self) -> RuntimeReport:
        """The plan of the executable that runs (``fs`` equals ``xla`` when the reference
        runs), with the ``runtime`` and ``cache`` fields."""
        executor = self.executor
        built = executor.built if executor is not None else None
        fallbacks = self.fallbacks + (executor.fallbacks if executor is not None else [])
        if built is None:
            base, cache = fallback_report(self.name, self.options, fallbacks), None
        else:
            base = built.stitched_report if executor.runs_stitched() else built.xla_report
            cache = dataclasses.asdict(built.cache)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(Report)}
        fields["fallbacks"] = fallbacks
        if self.module_name is not None:
            fields["module"] = self.module_name
        if executor is not None:
            fields["verify"] = executor.checked
        return RuntimeReport(**fields, runtime=dataclasses.asdict(self.info), cache=cache)

    # -- dumps: optional, so any failure is one warning per directory and the job goes on --
    @contextmanager
    def dumps(self):
        """The prefix of this build's dump files (None: no dumps); on leaving, they and the
        Report are published into ``dump_to``, or dropped if the block raised."""
        staging = self._staging()
        try:
            yield os.path.join(staging, self.dump_name) if staging else None
        except BaseException:
            if staging:
                shutil.rmtree(staging, ignore_errors=True)
            raise
        if staging:
            self._publish(staging)

    def write_dump(self, path: str, text: str) -> None:
        """One more file of the dumps (``path`` under the prefix ``dumps`` gave)."""
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError as exc:
            self._dump_failed(exc)

    def _staging(self) -> str | None:
        """A fresh private directory inside ``dump_to`` (None: no dumps). Nobody else can
        plant a symlink in it, and renaming out of it replaces whatever is at the final name
        instead of writing through it."""
        if not self.dump_name:
            return None
        try:
            files.ensure_directory(self.dump_to)
            return tempfile.mkdtemp(prefix=".fusionstitching-", dir=self.dump_to)
        except OSError as exc:
            self._dump_failed(exc)
            return None

    def _publish(self, staging: str) -> None:
        try:
            files.write_atomic(os.path.join(staging, self.dump_name + ".report.json"),
                               json.dumps(self.report().to_json(), indent=1))
            for entry in sorted(os.listdir(staging)):
                files.publish_tree(os.path.join(staging, entry),
                                   os.path.join(self.dump_to, entry))
        except Exception as exc:  # dumps are optional; the job goes on
            self._dump_failed(exc)
        shutil.rmtree(staging, ignore_errors=True)

    def _dump_failed(self, exc: BaseException) -> None:
        files.warn_once(("dump_to", self.dump_to),
                        "cannot write dumps to %s (%s: %s); the job goes on "
                        "without them", self.dump_to, type(exc).__name__, exc)


def measures(executor: Executor) -> bool:
    """Whether the build times single kernels against XLA (part of the plan's key): timing
    them would give each process of a job a plan of its own."""
    return executor.keep == "fastest" and executor.coordinator is None


# Background threads inside XLA or LLVM (C++) when the interpreter finalizes abort the whole
# process ("FATAL: exception not rethrown": the thread is unwound through C++ frames), so at
# exit no new build starts and the running ones, and trials, are waited for (at most
# EXIT_JOIN_S). A thread still waiting for its planning child holds no C++ frame: it is left.
EXIT_JOIN_S = 120.0
_background: "weakref.WeakValueDictionary[int, Lifecycle]" = weakref.WeakValueDictionary()
_exit_lock = threading.Lock()
_exiting = False


def _in_background(child: subprocess.Popen | None, build: Callable, *args) -> None:
    lower_thread_priority()  # the build takes only the CPU the user's job leaves
    if child is not None:
        child.wait()  # its plan is then in the cache (else the build plans here)
    with _exit_lock:
        if _exiting:
            return  # the job is ending; the next run loads the child's plan
        threading.current_thread().fusionstitching_building = True
    build(*args)


@atexit.register
def _join_background_work() -> None:
    global _exiting
    with _exit_lock:
        _exiting = True
    deadline = time.monotonic() + EXIT_JOIN_S
    for lifecycle in list(_background.values()):
        builder = lifecycle.builder
        if builder is not None and getattr(builder, "fusionstitching_building", False):
            builder.join(max(0.0, deadline - time.monotonic()))
        executor = lifecycle.executor
        trial = executor.trial_thread if executor is not None else None
        if trial is not None:
            trial.join(max(0.0, deadline - time.monotonic()))


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:80]
