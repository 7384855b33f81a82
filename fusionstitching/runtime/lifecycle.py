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
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import contextmanager

from .. import job_clock
from ..options import Options
from ..report import Fallback, Report, RuntimeInfo, RuntimeReport, fallback_report
from . import files
from .plan_key import plan_cached, plan_key_and_module, plan_key_of
from .cache import CacheStats, KernelCache, share_with_group
from .planning import planning_process
from .decisions import Decision, DecisionStore
from ..logs import log
from .executor import CONFIRM_ROUNDS, Executor, lower_thread_priority

_dump_counter = itertools.count()


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

    def __init__(self, name: str, options: Options, cache_dir: str | None,
                 async_compile: bool, dump_to: str | None, module_name: str | None = None,
                 remote_cache: str | None = None, stitch_at_once: bool = False):
        self.name, self.options, self.cache_dir = name, options, cache_dir
        # keep="stitched": the user wants the stitched executable whatever it costs, so its
        # background build does not wait for the job to have run STITCH_AFTER_S
        self.stitch_at_once = stitch_at_once
        self.remote_cache = remote_cache
        self.async_compile, self.dump_to, self.module_name = async_compile, dump_to, module_name
        self.info = RuntimeInfo(mode="async" if async_compile else "sync",
                                timing_rounds=CONFIRM_ROUNDS)
        self.fallbacks: list[Fallback] = []  # the front end's own (TF: calls it leaves to TF)
        self.executor: Executor | None = None
        self.builder: threading.Thread | None = None  # the background build (async_compile)
        # the reference's optimized HLO, planned in a child process (``_plan_in_child``);
        # None until the front end has it (TF's sets it in its build, then plans there)
        self.optimized_text: Callable[[], str] | None = None
        self.reference = None  # XLA's Compiled of it (whether its plan is cached already)
        self.measure = False  # as ``build`` passes it (part of the plan's key)
        self._planning_lock = threading.Lock()
        self._planning_started = False  # _plan_in_child ran (from the builder or at exit)
        self.dump_name = f"{_file_name(name)}.{next(_dump_counter)}" if dump_to else None

    # -- build ------------------------------------------------------------------------
    def start(self, build: Callable, *args, earlier_decision: Callable | None = None) -> None:
        """``build(*args)`` now, or on a background thread with ``async_compile``: there it
        first waits for a planning process (``_plan_in_child``) and then loads its plan. A
        decision an earlier run kept (``earlier_decision()``) is applied at once: XLA's
        executable kept, nothing is built; stitched, its build runs now (loading its plan is
        quick), so that it answers the same calls in every run (the same losses, run after
        run)."""
        stored = earlier_decision() if earlier_decision is not None else None
        if stored is not None and stored.kept == "reference" and self.executor is not None:
            self.executor.keep_reference_as_decided(stored)
            return
        if self.async_compile and stored is None:
            self.info.state = "waiting"  # until the job has run STITCH_AFTER_S
            self.builder = threading.Thread(target=_in_background,
                                            args=(self, build, *args),
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
        from .build import build_stitched  # the compiler: loaded when stitching starts

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

    def _needs_planning(self) -> bool:
        """Whether the build waits for a planning process (``_plan_in_child``): a cache to
        plan into and no plan there yet (the build then loads it at once)."""
        if self.cache_dir is None or self.optimized_text is None:
            return False
        try:
            return self.reference is None or not plan_cached(
                self.reference, self.options, self.cache_dir, self.remote_cache, self.measure)
        except Exception as exc:  # the build finds out for itself
            log.info("%s: plan cache not read: %s", self.name, exc)
            return False

    def plan_in_background(self) -> bool:
        """Before a background build: the module planned by the job's planning process when
        there is a cache to plan into and no plan in it yet (the build then loads it).
        False when the job is ending meanwhile: no build starts (the next run loads the
        plan)."""
        if self._needs_planning():
            child = self._plan_in_child()
            if child is not None:
                self._wait_for_plan(child)  # else the build plans on its thread
        return not _exiting.is_set()

    def _plan_in_child(self) -> subprocess.Popen | None:
        """Queue the reference's module with the job's planning process (runtime/planning.py),
        which plans it into the cache and goes on after the job ends; None where it cannot
        (the build then plans on its thread). Once per lifecycle."""
        with self._planning_lock:
            if self._planning_started:
                return None
            self._planning_started = True
        return self._queue_planning()

    def _queue_planning(self) -> subprocess.Popen | None:
        command = ("--cache_dir", self.cache_dir, "--target", self.options.target,
                   "--explorer", self.options.explorer, "--cost_model", self.options.cost_model,
                   "--keep", "fastest" if self.measure else "stitched",
                   # no worker processes: beside the job they took cores it needed (the
                   # 95-fusion train step of a Keras convnet planned in 10.0 s and 9.2 CPU s
                   # without them, 10.9 s and 12.4 CPU s with two)
                   "--workers", "1")
        if self.remote_cache:
            command += ("--remote_cache", self.remote_cache)
        try:
            return planning_process(command).add(_file_name(self.name), self.optimized_text())
        except Exception as exc:  # the build plans on its thread instead
            log.info("%s: no planning process: %s", self.name, exc)
            return None

    def _wait_for_plan(self, child: subprocess.Popen) -> None:
        """Until the planning process has stored this module's plan (the build then loads
        it), ended without it, or the job ends. A process that had looked its folder over for
        the last time when the module was queued took it away with the folder: the module is
        queued once more, with a new one."""
        key = plan_key_of(self.reference, self.options, self.measure)
        cache = KernelCache(self.cache_dir, remote=self.remote_cache)
        for attempt in range(2):
            while child.poll() is None:
                if cache.lookup(key, CacheStats(self.cache_dir)) is not None:
                    return
                if _exiting.wait(PLAN_POLL_S):
                    return
            if attempt or cache.lookup(key, CacheStats(self.cache_dir)) is not None:
                return
            child = self._queue_planning()
            if child is None:
                return

    def earlier_decision(self, reference, measure: bool) -> Decision | None:
        """The settled decision an earlier run kept for the plan of ``reference`` (measured
        with ``measure`` as ``build`` passes it); any problem reads as none."""
        try:
            store = self.decision_store(reference, measure)
            stored = store.load() if store is not None else None
            return stored if stored is not None and stored.settled else None
        except Exception:  # the build finds out for itself
            return None

    def decision_store(self, reference, measure: bool) -> DecisionStore | None:
        """Where the decision for the plan of ``reference`` is kept (None: no cache)."""
        if self.cache_dir is None:
            return None
        key, module = plan_key_and_module(reference, self.options, measure)
        if self.module_name is None and module:
            # a decision settles it unbuilt: its Report names the module as a built one does
            self.module_name = module
        return DecisionStore(KernelCache(self.cache_dir, remote=self.remote_cache), key)

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
            base, cache = fallback_report(self.name, self.options.target, fallbacks), None
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
# EXIT_JOIN_S). A thread still waiting for planning holds no C++ frame: it is left.
EXIT_JOIN_S = 120.0
PLAN_POLL_S = 1.0  # how often a build waiting for its plan looks into the cache
_background: "weakref.WeakValueDictionary[int, Lifecycle]" = weakref.WeakValueDictionary()
_exit_lock = threading.Lock()
_exiting = threading.Event()


def _in_background(lifecycle: Lifecycle, build: Callable, *args) -> None:
    lower_thread_priority()  # the build takes only the CPU the user's job leaves
    if _exiting.wait(0.0 if lifecycle.stitch_at_once else job_clock.seconds_until_stitching()):
        return  # the job is ending: planning starts at exit, for the next run
    lifecycle.info.state = "building"
    lifecycle.plan_in_background()  # TF's front end plans once it has XLA's module
    with _exit_lock:
        if _exiting.is_set():
            return  # the job is ending; the next run loads the child's plan
        threading.current_thread().fusionstitching_building = True
    build(*args)


@atexit.register
def _join_background_work() -> None:
    with _exit_lock:
        _exiting.set()
    deadline = time.monotonic() + EXIT_JOIN_S
    for lifecycle in list(_background.values()):
        if lifecycle._needs_planning():  # not planned yet: for the next run
            lifecycle._plan_in_child()
        builder = lifecycle.builder
        if builder is not None and getattr(builder, "fusionstitching_building", False):
            builder.join(max(0.0, deadline - time.monotonic()))
        executor = lifecycle.executor
        trial = executor.trial_thread if executor is not None else None
        if trial is not None:
            trial.join(max(0.0, deadline - time.monotonic()))


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:80]
