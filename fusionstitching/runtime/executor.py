"""Which executable runs a call: XLA's own, or the stitched one, swapped in without waiting.

One ``Executor`` per compiled signature; calls run ``active`` (XLA's executable first). A built
stitched executable becomes the candidate: the next call runs XLA's and keeps copies of its
inputs and outputs, on which the candidate runs once (checked with ``verify``) and both are
timed unless ``keep="stitched"`` (with ``async_compile`` on a background thread); a candidate
within TRIAL_SLACK of XLA's there is timed on real calls (on a GPU in runs of back-to-back
calls); the faster becomes ``active``.
States: building -> pending -> trial -> timing -> settled, or fallback. A front end whose calls are not jax calls
(tf_hooks) subclasses it (``_execute``, ``_trial_call``, ``_call_errors``).
"""
from __future__ import annotations

import atexit
import math
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field

import numpy as np

from ..logs import log
from ..report import Fallback, RuntimeInfo, Verify
from .built import BuildError, Built, reason
from .coordination import Coordinator
from .arrays import copies, is_float, numpy_leaves
from .decisions import Decision, DecisionStore


# Samples per executable in the trial (best of each). 5, not 3: a few more calls, against
# single steps that vary by 10% on a shared CPU (no measurement here separates 3 from 5).
TIMING_ROUNDS = 5
# Samples per executable in the confirmation at most (best of each), unless CLEAR_ROUNDS end it
# sooner. On 56 recorded decisions (benchmarks/decision_check.py --replay, transformers BERT,
# keras_hub Mistral, flax) the early stop then the best of 6 chose as the best of 15 did (1
# slower stitched executable kept, 5 wins over 1.05x missed) with 5.6 samples of each on
# average instead of 12.3; stopping at 5 kept 3 slower ones, at 4 kept 5. Fewer samples is a
# decision a short job sees: a job calling its step 100 times decides within 50 (RUN_S).
CONFIRM_ROUNDS = 6
# Real calls per confirmation sample: a run of back-to-back calls of one executable, timed from
# the first call's outputs to the last one's. Single calls, each waited for, misranked the two:
# on an H200 they ranked XLA's executable faster on six training steps whose loops ran the
# stitched one faster; on the 2-core CPU they kept a stitched flax ViT step that ran 0.83x in
# long loops (benchmarks/README.md). The first call is not timed: after
# the other executable's run it pays for cold caches and sleeping pool threads, which a job
# running one executable never does; timed from it, runs read a zoo Transformer step that runs
# 1.28x stitched as a tie (benchmarks/README.md).
RUN_CALLS = 16
# A sample's run is as many calls as fill RUN_S on XLA's executable (as the trial timed it), at
# least 2 (one timed after the cold one) and at most RUN_CALLS: a 20 ms CPU step confirms in
# runs of 4 (at most 2 x 6 x 4 = 48 calls), a 2 ms GPU step in runs of 16 (0.4 s in all).
RUN_S = 0.05
# A run's sample this many times the trial's time of the step was not of back-to-back calls:
# a Keras step called once an epoch (a partial last batch) read 176 ms a call against the
# trial's 8 ms, the epoch's other steps timed with it. Such a step is timed by single calls.
CALLS_APART = 10.0
# The confirmation ends early, after at least this many samples of each executable, once every
# sample of one is faster than every sample of the other (the stitched one's by SWAP_MARGIN):
# with 3 each, two executables of one speed fall apart so by chance once in 10 confirmations,
# and either choice is then as fast. On 46 recorded decisions (transformers BERT, keras_hub
# Mistral, flax; single-call samples) it chose as all 15 samples did, stopping at 3 on 4 of
# them (benchmarks/decision_check.py --replay).
CLEAR_ROUNDS = 3
# The stitched executable is kept only when its best time is at least this much below XLA's:
# single steps on a shared CPU vary by several percent, and a swap won by noise leaves the job
# slower than XLA.
SWAP_MARGIN = 0.02
# After a round, a stitched time this many times XLA's ends the timing: beyond the noise of
# single steps on a shared CPU.
CLEARLY_SLOWER = 3.0
# The trial keeps out only a candidate slower than XLA's by more than this factor; real calls
# decide the rest. The trial runs right after the build, and there both executables ran up to
# 1.6x slower than in the loop that followed, where a step 1.04-1.28x faster with stitched
# kernels measured even in the trial (flax ViT train: 3504 against 3532 us in the trial, then
# 1712-2821 against 2195-2941 us on real calls).
TRIAL_SLACK = 1.25
KEEP_CHOICES = ("fastest", "stitched")
# Nice value of background threads (build, trial): they take the CPU the training loop leaves.
BACKGROUND_NICE = 10


@dataclass
class Executor:
    xla: object  # jax.stages.Compiled of XLA's own plan
    name: str
    verify: bool = False
    keep: str = "fastest"
    background: bool = False  # async_compile: trial on a thread, confirmation on real calls
    rtol: float = 1e-5
    atol: float = 1e-5
    reference: str = "xla"  # label of what calls run when the stitched executable does not
    run_calls: int | None = None  # real calls per confirmation sample (None: RUN_S's worth)
    info: RuntimeInfo = field(default_factory=RuntimeInfo)
    fallbacks: list[Fallback] = field(default_factory=list)
    built: Built | None = None
    checked: Verify = field(default_factory=Verify)
    # A multi-process job: every decision is every process's (coordination.py), so trials
    # run in the call path, timings have a fixed length, and process 0's times decide.
    coordinator: Coordinator | None = None
    # keep="fastest": the decision of an earlier run of this plan on this machine, and where
    # this run's is kept (runtime/decisions.py); None: every run measures
    decisions: DecisionStore | None = None

    def __post_init__(self):
        if self.keep not in KEEP_CHOICES:
            raise ValueError(f"keep must be one of {KEEP_CHOICES}, got {self.keep!r}")
        if self.coordinator is not None:
            self.background = False  # a trial on a thread would meet its peers at other calls
            if self.run_calls is None:  # processes time runs of one length, not their own
                self.run_calls = RUN_CALLS
        self.active = self.xla  # what every call runs; replaced by one assignment
        self.candidate = None  # built stitched executable, on trial
        self.trial_thread: threading.Thread | None = None
        self._calls_lock = threading.Lock()  # one call at a time starts a trial or is timed
        self._samples: dict[str, list[float]] = {"xla": [], "stitched": []}  # timing calls
        self._first_timed_call = 0
        self._run_label, self._run_done, self._run_started = "stitched", 0, 0.0
        self._stored: Decision | None = None  # an earlier run's: keep stitched, or go on timing

    # -- the build's outcome (from the compiling thread) ------------------------------------
    def built_ok(self, built: Built, seconds: float) -> None:
        self.built = built
        self.fallbacks = built.stitched_report.fallbacks
        self.info.build_s = round(seconds, 3)
        plan = built.stitched_report.fs
        self.info.stitched_plan = {"kernels": plan.kernels, "mem_kernels": plan.mem_kernels,
                                   "patterns": plan.patterns or 0}
        agreed = self._all_agree("built", built.stitched is not None)
        if built.stitched is not None and not agreed:
            self.fail("coordination", [], "another process of the job has no stitched "
                                          "executable for this step")
            return
        if built.stitched is None:
            failed = self.fallbacks[-1] if self.fallbacks else None
            self._settle(self.reference, f"{failed.stage}: {failed.reason}" if failed
                         else "nothing was stitched")
            return
        self.candidate = built.stitched
        if self.keep == "stitched" and not self.verify:  # nothing to try it for
            self._settle("stitched", "keep='stitched'")
            return
        stored = self._stored_decision()
        if stored is not None and stored.kept == "reference":
            self._settle(self.reference, self._recorded(stored))
            return
        if stored is not None and stored.kept == "stitched" and not self.verify:
            self._settle("stitched", self._recorded(stored))
            return
        self._stored = stored  # applied once the trial has checked the candidate
        self.info.state = "pending"  # last: the next call may start the trial at once

    def keep_reference_as_decided(self, stored: Decision) -> None:
        """An earlier run measured the reference faster for this plan: it runs every call, and
        nothing is built (a build would only be thrown away)."""
        self._settle(self.reference, self._recorded(stored))

    def keep_reference_unplanned(self, reference_s: float, why: str) -> None:
        """The reference runs every call and nothing is built: measured before planning, no
        stitched executable could beat it (``why``). Kept for the next run of this plan."""
        self.info.xla_us, self.info.stitched_us = round(reference_s * 1e6, 1), None
        self.info.why = why
        self._decide(self.reference)

    def build_failed(self, error: Exception) -> None:
        stage, why = (error.stage, error.reason) if isinstance(error, BuildError) \
            else ("runtime", reason(error))
        if stage != "devices":  # said the same in every process, before any build
            self._all_agree("built", False)
        self.fail(stage, [], why)

    def _stored_decision(self) -> Decision | None:
        if self.decisions is None or self.keep != "fastest" or self.coordinator is not None:
            return None
        return self.decisions.load()

    def _recorded(self, stored: Decision) -> str:
        """The Report's times and why for a decision taken from an earlier run."""
        self.info.xla_us, self.info.stitched_us = stored.reference_us, stored.stitched_us
        return f"decided by an earlier run on this machine ({stored.where})"

    def _decide(self, kept: str) -> None:
        """Settle on ``kept`` as measured (``info`` holds the times and why), and keep the
        decision for the next run of this plan."""
        if self.decisions is not None and self.coordinator is None and \
                self.info.xla_us is not None:
            self.decisions.save(Decision(
                "stitched" if kept == "stitched" else "reference", self.info.xla_us,
                self.info.stitched_us, self.info.why))
        self._settle(kept, self.info.why)

    def keep_open_samples(self) -> None:
        """At exit: a confirmation still open keeps its samples for the next run."""
        if self.info.state != "timing" or self.decisions is None or \
                self.coordinator is not None or not any(self._samples.values()):
            return
        self.decisions.save(Decision("open", None, None, "", samples={
            k: list(v) for k, v in self._samples.items()}, run_calls=self.run_calls))

    def _all_agree(self, what: str, ok: bool) -> bool:
        return ok if self.coordinator is None else self.coordinator.all_agree(what, ok)

    def _first_says(self, what: str, value: str) -> str:
        return value if self.coordinator is None else self.coordinator.first_says(what, value)

    def fail(self, stage: str, nodes: list[str], why: str) -> None:
        log.warning("%s runs on %s's own kernels (%s): %s",
                    self.name, self.reference.upper(), stage, why)
        self.fallbacks.append(Fallback(stage, nodes, why))
        self.candidate = None
        self.active = self.xla
        self.info.state, self.info.kept = "fallback", self.reference
        self.info.why = f"{stage}: {why}"

    def _settle(self, kept: str, why: str) -> None:
        if kept == "stitched":
            self.active = self.candidate
            self.info.swapped_at_call = self.info.calls + 1
        self.candidate = None
        self.info.state, self.info.kept, self.info.why = "settled", kept, why

    # -- calls ----------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        self.info.calls += 1
        if self.info.state in ("pending", "timing") and self._calls_lock.acquire(blocking=False):
            try:
                if self.info.state == "pending":
                    return self._start_trial(args, kwargs)
                if self.info.state == "timing":
                    return self._timed_call(args, kwargs)
            finally:
                self._calls_lock.release()
        return self._run(self.active, args, kwargs)

    def _run(self, executable, args, kwargs):
        if executable is self.xla:
            return self._execute(executable, args, kwargs)
        try:
            return self._execute(executable, args, kwargs)
        except self._call_errors() as exc:  # XLA or one of our kernels failed
            self.fail("execute", [], reason(exc))
            return self._execute(self.xla, args, kwargs)

    def _execute(self, executable, args, kwargs):
        """One call run by one executable (``self.xla`` or the stitched one)."""
        return executable(*args, **kwargs)

    def _call_errors(self) -> tuple:
        """Errors of a stitched call after which XLA's executable answers it."""
        import jax

        return (jax.errors.JaxRuntimeError,)

    def _trial_call(self, args, kwargs):
        """Answer the call with XLA's executable; returns (the trial's inputs as ``(args,
        kwargs)`` of the executables, the call's result, the trial's expected outputs)."""
        inputs = copies((args, kwargs))  # before XLA's run: it may donate the originals
        result = self.xla(*args, **kwargs)
        return inputs, result, copies(result)

    def _start_trial(self, args, kwargs):
        """This call is answered by XLA; copies of its inputs and outputs are the trial's."""
        inputs, result, expected = self._trial_call(args, kwargs)
        trial = (self.candidate, inputs, expected)
        self.info.state, self.info.trial_call = "trial", self.info.calls
        if self.background:
            self.trial_thread = threading.Thread(target=self._background_trial, args=trial,
                                                 daemon=True, name=f"fusionstitching-trial-"
                                                                   f"{self.name}")
            self.trial_thread.start()
        else:
            self._checked_trial(*trial)
        return result

    def _background_trial(self, *trial) -> None:
        lower_thread_priority()
        self._checked_trial(*trial)

    def _checked_trial(self, *trial) -> None:
        try:
            self._trial(*trial)
        except Exception as exc:  # never fail the user's job: XLA's executable runs
            self.fail("trial", [], reason(exc))

    def _trial(self, candidate, inputs, expected) -> None:
        import jax

        args, kwargs = self._fresh(inputs)
        try:
            got = jax.block_until_ready(candidate(*args, **kwargs))
        except jax.errors.JaxRuntimeError as exc:
            self.fail("execute", [], reason(exc))
            return
        if self.verify:
            verified = self._verified(candidate, inputs, expected, got)
            if not self._all_agree("verified", verified):
                if verified:
                    self.fail("coordination", [], "another process's check of the stitched "
                                                  "executable failed")
                return
        if self.keep == "stitched":
            self._settle("stitched", "keep='stitched'")
            return
        if self._stored is not None and self._stored.kept == "stitched":
            self._settle("stitched", self._recorded(self._stored))
            return
        if self._stored is not None and self._stored.run_calls and \
                self.run_calls in (None, self._stored.run_calls):
            # an earlier run's confirmation, left open when that job ended: go on from it
            self.run_calls = self._stored.run_calls
            self._samples = {k: list(self._stored.samples.get(k, []))
                             for k in ("xla", "stitched")}
            self._first_timed_call = self.info.calls + 1
            self.info.state = "timing"
            _open_confirmations[id(self)] = self
            return
        xla_s, stitched_s = best_times(self.xla, candidate, lambda: self._fresh(inputs),
                                       every_round=self.coordinator is not None)
        where = "off the call path" if self.background else "in the call"
        kept = record_choice(self.info, xla_s, stitched_s, self.reference,
                             f"measured {where} on the inputs of call {self.info.trial_call}")
        promising = stitched_s < TRIAL_SLACK * xla_s
        if self.run_calls is None:
            self.run_calls = calls_per_sample(xla_s)
        decision = self._first_says("trial", "confirm" if promising else kept)
        if decision == "confirm":
            # Decided on real calls, in both modes: back-to-back runs on the trial's inputs
            # kept a stitched step 0.88x of jax.jit's in the loop that followed (zoo ASR
            # inference), and a real call is what the choice is for.
            self.info.state = "timing"
            _open_confirmations[id(self)] = self
        else:
            self._decide(decision)

    def _verified(self, candidate, inputs, expected, got) -> bool:
        """The trial's check: the candidate's outputs against the reference's on the trial
        call's inputs and, where some of those outputs are not finite (NaN == NaN compares
        nothing: one NaN in every row hid a wrong kernel), again on inputs that keep them all
        finite. A failed or impossible check is a ``verify`` fallback."""
        import jax

        what = f"inputs of call {self.info.trial_call}"
        checked = self._check(inputs, expected, got, what)
        if checked.ok and checked.finite < 1.0:
            second = self._finite_inputs(inputs)
            if second is None:
                checked.ok, checked.vacuous = False, True
                self.checked = checked
                self.fail("verify", [], f"outputs of call {self.info.trial_call} are not all "
                                        f"finite and no input tried keeps them finite: the "
                                        f"check would compare NaN with NaN")
                return False
            what, variant, variant_expected = second
            args, kwargs = self._fresh(variant)
            try:
                variant_got = jax.block_until_ready(candidate(*args, **kwargs))
            except jax.errors.JaxRuntimeError as exc:
                self.fail("execute", [], reason(exc))
                return False
            checked = self._check(variant, variant_expected, variant_got, what)
            checked.against.insert(0, f"{self.reference} (inputs of call "
                                      f"{self.info.trial_call})")
        self.checked = checked
        if not checked.ok:
            self.fail("verify", [], f"outputs differ from {self.reference.upper()}'s on the "
                                    f"{what} (max abs err {checked.max_abs_err:.3g}, max rel "
                                    f"err {checked.max_rel_err:.3g}, rtol {self.rtol}, atol "
                                    f"{self.atol})")
        return checked.ok

    def _check(self, inputs, expected, got, what: str) -> Verify:
        """``got`` against ``expected`` (the reference's outputs on ``inputs``, described by
        ``what``): within rtol/atol, or as close to the exact result as the reference's own
        f32 result is."""
        from .. import verification  # with the trial: a young job's calls never load it

        expected, got = numpy_leaves(expected), numpy_leaves(got)
        ok, max_abs, max_rel = verification.compare(expected, got, self.rtol, self.atol)
        against, rounding_decides = [f"{self.reference} ({what})"], ""
        if not ok:
            drift, detail = self._f64_drift(inputs, expected, got)
            if drift in (verification.Drift.WITHIN_XLAS, verification.Drift.WITHIN_ROUNDING):
                ok = True  # as close to the exact result as the reference's own f32 is
                against.append("XLA in f64 (the reference's own f32 drift)")
            if drift is verification.Drift.WITHIN_ROUNDING:
                rounding_decides = detail
        return Verify(ran=True, ok=ok, max_abs_err=max_abs, max_rel_err=max_rel, against=against,
                      finite=verification.finite_fraction(expected),
                      rounding_decides=rounding_decides, schedules=["the stitched executable"])

    def _finite_inputs(self, inputs):
        """(what, inputs, the reference's outputs on them) for the first of: the trial call's
        inputs with NaN/inf as 0, seeded random inputs of each verification.INPUT_KINDS, on
        which every output of the reference is finite; None when none is."""
        import jax

        from .. import verification  # with the trial: a young job's calls never load it

        def floats(make):
            return jax.tree_util.tree_map(
                lambda a: make(np.asarray(a)) if is_float(a) else a, inputs)

        rng = np.random.default_rng(0)
        variants = [("trial call's inputs with NaN/inf as 0",
                     floats(lambda a: np.where(np.isfinite(a), a, 0).astype(a.dtype)))]
        variants += [(f"seeded {kind} inputs", floats(
            lambda a, kind=kind: verification.random_array(rng, a.shape, a.dtype, kind)))
            for kind in verification.INPUT_KINDS]
        for what, variant in variants:
            args, kwargs = self._fresh(variant)
            expected = self.xla(*args, **kwargs)
            if verification.finite_fraction(numpy_leaves(expected)) == 1.0:
                return what, variant, expected
        return None

    def _f64_drift(self, inputs, expected: list, got: list) -> tuple:
        """A whole training step amplifies f32 rounding past any fixed tolerance (a Keras
        image model's step: max abs err 0.028, max rel 6e25 at a near-zero element): is the
        stitched result as close to the module's exact (f64) result as the reference's own
        f32 result is, or, element by element, as f32 executions with other roundings are?
        As ``verification.verify`` decides on random inputs. None when the module cannot run
        in f64 here."""
        # with the trial: a young job's calls never load the compiler (job_clock.py)
        from .. import verification
        from ..hlo.drift import widened_args, widened_to_f64
        from ..hlo.parser import parse_module
        from ..hlo.xla_runner import optimized_hlo_text, run_hlo_with_xla

        try:
            args, kwargs = self._fresh(inputs)
            flat = numpy_leaves((args, kwargs))
            text = optimized_hlo_text(self.xla)
            exact = [np.asarray(x) for x in run_hlo_with_xla(widened_to_f64(text),
                                                             widened_args(flat))]
            module = parse_module(text, self.name)
        except Exception as exc:  # the fixed tolerance's verdict stands
            log.info("%s: no f64 reference: %s", self.name, reason(exc))
            return None, ""
        return verification.drift_verdict(module, flat, got, expected, exact)

    def _timed_call(self, args, kwargs):
        """One call of a confirmation run: ``run_calls`` calls of one executable, timed from
        the first call's outputs to the last one's (the whole call when ``run_calls`` is 1);
        calls in between are not waited for, as a training loop does not wait. The executable
        with fewer samples runs next (stitched first). A stitched run that fails ends in XLA's
        executable answering the call (the run's earlier outputs were already returned)."""
        import jax

        if self._run_done == 0:
            if not self._first_timed_call:
                self._first_timed_call = self.info.calls
            self._run_label = min(("stitched", "xla"), key=lambda k: len(self._samples[k]))
            if self.run_calls == 1:
                # a single call is timed alone: the work the loop queued before it (a Keras
                # test step waited ~170 ms for the epoch's train steps) is waited for first
                jax.block_until_ready((args, kwargs))
            self._run_started = time.perf_counter()
        label = self._run_label
        executable = self.candidate if label == "stitched" else self.xla
        try:
            out = self._execute(executable, args, kwargs)
            self._run_done += 1
            warm_up = self._run_done == 1 and self.run_calls > 1
            if warm_up or self._run_done == self.run_calls:
                jax.block_until_ready(out)
        except self._call_errors() as exc:
            if label == "xla":
                raise
            self.fail("execute", [], reason(exc))
            return self._execute(self.xla, args, kwargs)
        if warm_up:
            self._run_started = time.perf_counter()
        if self._run_done < self.run_calls:
            return out
        timed_calls = self.run_calls - 1 if self.run_calls > 1 else 1
        sample = (time.perf_counter() - self._run_started) / timed_calls
        self._run_done = 0
        if self._calls_were_apart(sample):
            # the samples so far timed the job's work between calls: single calls from now
            self.run_calls = 1
            self._samples = {"xla": [], "stitched": []}
            self._first_timed_call = 0
            return out
        self._samples[label].append(sample)
        if all(len(s) >= CONFIRM_ROUNDS for s in self._samples.values()) or \
                clearly_apart(self._samples["xla"], self._samples["stitched"]):
            each = (f"in runs of {self.run_calls} calls of one executable" if self.run_calls > 1
                    else "each running one executable")
            if self._stored is not None and self._stored.kept == "open":
                each += (f", after {len(self._stored.samples.get('xla', []))} runs of each "
                         "in earlier runs of the job")
            kept = record_choice(self.info, min(self._samples["xla"]),
                                 min(self._samples["stitched"]), self.reference,
                                 f"measured on calls {self._first_timed_call}-"
                                 f"{self.info.calls}, {each}", self._reference_on_calls())
            self._decide(self._first_says("confirmed", kept))
        return out

    def _calls_were_apart(self, sample: float) -> bool:
        """Whether a run's calls were not back to back (a step the job calls once an epoch):
        its sample is CALLS_APART times the trial's time of the step or more."""
        return (self.run_calls > 1 and self.coordinator is None and self.info.xla_us is not None
                and sample > CALLS_APART * self.info.xla_us * 1e-6)

    def _reference_on_calls(self) -> str:
        """What a real call runs when the stitched executable does not (the Report's why)."""
        return "XLA"

    def _fresh(self, inputs):
        """The trial's inputs for one run: fresh copies of what the executables donate."""
        return copies(inputs) if self._donates() else inputs

    def _donates(self) -> bool:
        import jax

        return any(info.donated for info in jax.tree_util.tree_leaves(self.xla.args_info))

    def decided(self):
        """The executable that answers every later call once the decision is made (settled,
        or fallen back); None while it is open."""
        return self.active if self.info.state in ("settled", "fallback") else None

    def runs_stitched(self) -> bool:
        """True when the stitched executable runs now or is on trial."""
        return self.candidate is not None or self.active is not self.xla


# id -> Executor confirming (a dataclass compares by value, so it is no set member)
_open_confirmations: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


@atexit.register
def _keep_open_samples() -> None:
    for executor in list(_open_confirmations.values()):
        try:
            executor.keep_open_samples()
        except Exception:  # at exit there is no one to raise to; the next run measures
            pass


def calls_per_sample(step_s: float) -> int:
    """Real calls in a confirmation sample's run for a step of ``step_s`` (RUN_S)."""
    return max(2, min(RUN_CALLS, math.ceil(RUN_S / max(step_s, 1e-9)) + 1))


def record_choice(info, reference_s: float, stitched_s: float, reference_label: str,
                  where: str, reference_shown: str = "XLA") -> str:
    """Record the two measured times and which one is kept, with why, in ``info``; returns
    the label kept ("stitched" or ``reference_label``); ``reference_shown`` names what ran
    the reference's samples."""
    info.xla_us, info.stitched_us = round(reference_s * 1e6, 1), round(stitched_s * 1e6, 1)
    info.why = f"{where}: stitched {info.stitched_us} us vs {reference_shown} {info.xla_us} us"
    return "stitched" if stitched_wins(stitched_s, reference_s) else reference_label


def clearly_apart(reference: list[float], stitched: list[float]) -> bool:
    """After CLEAR_ROUNDS samples of each, every sample of one executable is faster than
    every sample of the other (the stitched one's by SWAP_MARGIN): more would not change
    the choice."""
    if min(len(reference), len(stitched)) < CLEAR_ROUNDS:
        return False
    return max(stitched) < (1 - SWAP_MARGIN) * min(reference) or min(stitched) > max(reference)


def stitched_wins(stitched_s: float, reference_s: float) -> bool:
    return stitched_s < (1 - SWAP_MARGIN) * reference_s


def best_times(reference, stitched, inputs, every_round: bool = False) -> tuple[float, float]:
    """Best wall time of each executable over TIMING_ROUNDS alternating runs, fewer when the
    stitched one is CLEARLY_SLOWER after a round (more rounds would not change the choice and
    only take CPU from the training loop) unless ``every_round`` (processes of a job run the
    same runs); ``inputs()`` gives each run its ``(args, kwargs)`` (made before the clock
    starts)."""
    import jax

    best = [float("inf"), float("inf")]
    for _ in range(TIMING_ROUNDS):
        for i, executable in enumerate((reference, stitched)):
            args, kwargs = inputs()
            jax.block_until_ready((args, kwargs))
            t0 = time.perf_counter()
            jax.block_until_ready(executable(*args, **kwargs))
            best[i] = min(best[i], time.perf_counter() - t0)
        if best[1] > CLEARLY_SLOWER * best[0] and not every_round:
            break
    return best[0], best[1]


def lower_thread_priority() -> None:
    """Let the calling thread (a background build or trial) take only the CPU the training
    loop leaves. Linux gives each thread its own nice value (``setpriority`` on the thread
    id); elsewhere that call would change the whole process, so it is not made."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        except OSError as exc:  # e.g. a sandbox without setpriority: run at normal priority
            log.info("background thread keeps its priority: %s", exc)
