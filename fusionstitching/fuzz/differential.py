"""One fuzz program through XLA and through the stitched routes, judged by its f64 result.

``run_program`` runs the program through ``jax.jit`` (XLA:CPU, the reference), through
``fusionstitching.jit(keep="stitched")`` on XLA:CPU, and through XLA:GPU's deviceless H100
compile followed by ``replay --verify`` (``stitch_module`` with ``verify``); the same source
under x64 with ``F = float64`` is the yardstick. The stitched CPU result must be as close to
it as XLA's own f32 result is (the drift rule, ``verification.drift_verdict``); the H100 route
must verify. A defect stopped at a stage's boundary counts as a crash.
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import signal
import time
import traceback

import numpy as np

from ..capture import jax_hlo
from ..hlo.evaluator import UnsupportedOp, evaluate
from ..hlo.parser import parse_module
from ..hlo.xla_runner import optimized_hlo_text
from ..pipeline import Options, stitch_module
from ..stitched_jit import jit as stitched_jit
from ..verification import Drift, drift_verdict
from .programs import Program

PLAN_LIMIT_S = 30.0  # a route's planning (explorer and code generator), at most
# A route in all (XLA's compiles, planning, host builds, verify), at most: a time limit that
# catches a hang without taking a slow compile for one.
ROUTE_LIMIT_S = 2 * PLAN_LIMIT_S
ORACLE_RTOL = 1e-6  # two f64 results of one program further apart than this: not rounding


class Verdict(str, enum.Enum):
    OK = "ok"
    MISMATCH = "mismatch"  # beyond the drift rule, or replay's verify failed
    CRASH = "crash"  # an exception of ours, or a defect stopped at a stage's boundary
    HANG = "hang"  # a route ran past its time limit
    SLOW_PLAN = "slow plan"  # a route planned for longer than PLAN_LIMIT_S
    NO_VERDICT = "no verdict"  # rounding decides the outputs: nothing to compare
    INVALID = "invalid program"  # jax.jit itself refuses it: a defect of the generator
    XLA_DIFFERS = "XLA differs"  # XLA's f64 result is not the program's: no yardstick


@dataclasses.dataclass
class RouteOutcome:
    route: str  # "cpu" or "h100"
    verdict: Verdict
    detail: str = ""
    stitched: int = 0  # stitched kernels in the plan (0: XLA's plan kept)
    seconds: float = 0.0
    plan_s: float = 0.0  # of ``seconds``, the planning (the Report's explore and codegen)


@dataclasses.dataclass
class ProgramOutcome:
    program: Program
    routes: list[RouteOutcome]

    @property
    def verdict(self) -> Verdict:
        """The worst route's verdict."""
        order = [Verdict.CRASH, Verdict.HANG, Verdict.MISMATCH, Verdict.SLOW_PLAN,
                 Verdict.INVALID, Verdict.XLA_DIFFERS, Verdict.NO_VERDICT, Verdict.OK]
        return min((r.verdict for r in self.routes), key=order.index, default=Verdict.OK)

    @property
    def failed(self) -> bool:
        return self.verdict in (Verdict.CRASH, Verdict.HANG, Verdict.MISMATCH,
                                Verdict.SLOW_PLAN)

    def to_json(self) -> dict:
        return {"seed": self.program.seed, "verdict": self.verdict.value,
                "gradient": self.program.gradient,
                "routes": [{"route": r.route, "verdict": r.verdict.value, "detail": r.detail,
                            "stitched": r.stitched, "seconds": round(r.seconds, 2),
                            "plan_s": round(r.plan_s, 2)}
                           for r in self.routes],
                **({"source": self.program.source}
                   if self.failed or self.verdict is Verdict.XLA_DIFFERS else {})}

    def describe(self) -> str:
        """The routes' verdicts, then the program's seed and source: what a failure prints."""
        lines = [f"program {self.program.seed}: {self.verdict.value}"]
        lines += [f"  {r.route}: {r.verdict.value} ({r.stitched} stitched kernels, "
                  f"{r.seconds:.1f} s, planned in {r.plan_s:.1f} s)"
                  f"{': ' + r.detail if r.detail else ''}" for r in self.routes]
        return "\n".join(lines + ["", self.program.source])


class _Defects(logging.Handler):
    """Collects the defects stages stop at their boundary (graph.refusal.defects)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record):
        self.seen.append(record.getMessage())


class _TimeLimit(BaseException):  # not an Exception: no stage may catch it as its own defect
    pass


# After the limit, the alarm comes again this often: Python swallows an exception raised in
# a weakref or __del__ callback ("Exception ignored in ..."), and with it a one-shot alarm.
REALARM_S = 1.0


def _limited(seconds: float, fn, *args):
    """``fn(*args)``, raising _TimeLimit after ``seconds`` (in the main thread: SIGALRM), and
    again every REALARM_S until it reaches this frame."""
    def expire(signum, frame):
        raise _TimeLimit()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, REALARM_S)
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_program(program: Program, routes=("cpu", "h100"),
                limit_s: float = ROUTE_LIMIT_S) -> ProgramOutcome:
    """The program's verdict on each route: a route running past ``limit_s`` is a hang, one
    planning for longer than PLAN_LIMIT_S a slow plan (judged otherwise as usual)."""
    import jax
    import jax.numpy as jnp

    args = program.arguments()
    f32 = program.function(jnp.float32)
    try:
        # keep_unused: the module's parameters are then the program's arguments, one for one
        compiled = jax.jit(f32, keep_unused=True).lower(*args).compile()
        xla = [np.asarray(x) for x in jax.tree_util.tree_leaves(compiled(*args))]
        with jax.enable_x64(True):
            f64 = program.function(jnp.float64)
            wide = [a.astype(np.float64) if a.dtype == np.float32 else a for a in args]
            exact = [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.jit(f64)(*wide))]
            unoptimized = jax.jit(f64, keep_unused=True).lower(*wide).as_text(dialect="hlo")
    except Exception as exc:
        return ProgramOutcome(program, [RouteOutcome("xla", Verdict.INVALID, _reason(exc))])
    split, second = _oracle_split(unoptimized, wide, exact)
    outcomes = []
    if split:
        # No one f64 yardstick: the host route is judged against both opinions (ours may
        # follow XLA's passes or the program), replay's verify, whose references include
        # XLA's run of the module, not at all.
        outcomes.append(RouteOutcome("xla", Verdict.XLA_DIFFERS, split))
        routes = [r for r in routes if r == "cpu"]
        exact = (exact, second)
    else:
        exact = (exact,)
    for route in routes:
        started = time.perf_counter()
        defects = _Defects()
        logger = logging.getLogger("fusionstitching.defects")
        logger.addHandler(defects)
        level = logger.level
        logger.setLevel(logging.DEBUG)
        try:
            if route == "cpu":
                outcome = _limited(limit_s, _cpu_route, program, f32, args, compiled, xla, exact)
            else:
                outcome = _limited(limit_s, _gpu_route, f32, args, route)
        except _TimeLimit:
            outcome = RouteOutcome(route, Verdict.HANG, f"still running after {limit_s:g} s")
        except Exception as exc:  # a defect of ours that reached the caller
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            outcome = RouteOutcome(route, Verdict.CRASH, f"{_reason(exc)} at "
                                                         f"{frame.filename}:{frame.lineno}")
        finally:
            logger.removeHandler(defects)
            logger.setLevel(level)
        if defects.seen and outcome.verdict is not Verdict.CRASH:
            outcome = dataclasses.replace(outcome, verdict=Verdict.CRASH,
                                          detail="; ".join(defects.seen[:3]))
        outcome.seconds = time.perf_counter() - started
        # A slow plan fails whatever else the route found, unless that is a failure already.
        if outcome.plan_s > PLAN_LIMIT_S and outcome.verdict in (Verdict.OK,
                                                                  Verdict.NO_VERDICT):
            outcome = dataclasses.replace(outcome, verdict=Verdict.SLOW_PLAN, detail="; ".join(
                filter(None, [f"planned in {outcome.plan_s:.1f} s (at most {PLAN_LIMIT_S:g} s)",
                              outcome.detail])))
        outcomes.append(outcome)
    return ProgramOutcome(program, outcomes)


def _oracle_split(unoptimized: str, wide: list, exact: list) -> tuple[str, list]:
    """Where XLA's f64 result is not what the program computes: the evaluator's f64 result of
    the module before XLA's passes, outside XLA's compiler and runtime, is the second opinion.
    XLA:CPU 0.10.2 lets a dynamic-update-slice's update read elements it already wrote,
    converts f64 to f16 through f32 (rounding twice), and by default keeps excess precision
    where a program rounds to bf16 or f16 and back. The split's detail and the evaluator's
    values ("" and [] where they agree)."""
    try:
        values = evaluate(parse_module(unoptimized, "unoptimized"), wide)
    except UnsupportedOp:
        return "", []
    values = list(values) if isinstance(values, tuple) else [values]
    split = []
    for i, (mine, xla) in enumerate(zip(values, exact)):
        mine, xla = np.asarray(mine), np.asarray(xla)
        if mine.dtype.kind in "fc":
            with np.errstate(invalid="ignore"):
                apart = ~np.isclose(xla, mine, rtol=ORACLE_RTOL, atol=ORACLE_RTOL, equal_nan=True)
        else:
            apart = xla != mine
        if apart.any():
            split.append(f"output {i}: {int(apart.sum())} of {apart.size} elements")
    if not split:
        return "", []
    return ("XLA's f64 result differs from the evaluator's on the module before XLA's "
            "passes at " + "; ".join(split)), [np.asarray(v) for v in values]


def _cpu_route(program: Program, f32, args, compiled, xla, exacts) -> RouteOutcome:
    """``fusionstitching.jit(keep="stitched")`` on XLA:CPU against the drift rule, from the
    f64 result of ``exacts`` that it is closest to (one but where the oracle splits)."""
    import jax

    # verify=False: the stitched kernels' own outputs are judged here, not the runtime's
    # check of them (which would fall back to XLA where they differ)
    stitched = stitched_jit(f32, keep="stitched", verify=False, cache_dir=None)
    ours = [np.asarray(x) for x in jax.tree_util.tree_leaves(stitched(*args))]
    report = stitched.reports()[0]
    outcome = _cpu_judged(program, report, ours, compiled, args, xla, exacts)
    return dataclasses.replace(outcome, plan_s=_plan_seconds(report))


def _cpu_judged(program: Program, report, ours, compiled, args, xla, exacts) -> RouteOutcome:
    kernels = report.fs.patterns or 0
    internal = [f"{f.stage}: {f.reason}" for f in report.fallbacks if "internal error" in f.reason]
    if internal:
        return RouteOutcome("cpu", Verdict.CRASH, "; ".join(internal[:3]), kernels)
    if (report.runtime or {}).get("kept") != "stitched":
        return RouteOutcome("cpu", Verdict.OK, "XLA's executable kept: "
                            + (report.runtime or {}).get("why", ""), 0)
    module = parse_module(optimized_hlo_text(compiled), f"fuzz_{program.seed}")
    rank = [Drift.WITHIN_XLAS, Drift.WITHIN_ROUNDING, Drift.ROUNDING_DECIDES_THE_STEP,
            Drift.BEYOND]
    drift, detail = min((drift_verdict(module, args, ours, xla, exact) for exact in exacts),
                        key=lambda verdict: rank.index(verdict[0]))
    if drift is Drift.BEYOND:
        return RouteOutcome("cpu", Verdict.MISMATCH, detail, kernels)
    if drift is Drift.ROUNDING_DECIDES_THE_STEP:
        return RouteOutcome("cpu", Verdict.NO_VERDICT, detail, kernels)
    return RouteOutcome("cpu", Verdict.OK, detail, kernels)


def _gpu_route(f32, args, target: str) -> RouteOutcome:
    """XLA:GPU's optimized module for ``target`` (deviceless), replayed with ``verify``."""
    text = jax_hlo(f32, *args, target=target)
    result = stitch_module(parse_module(text, "fuzz"), Options(target=target, verify=True,
                                                               ptxas=False, workers=0))
    return dataclasses.replace(_gpu_judged(result, target), plan_s=_plan_seconds(result.report))


def _gpu_judged(result, target: str) -> RouteOutcome:
    report = result.report
    kernels = len(result.kernels)
    internal = [f"{f.stage}: {f.reason}" for f in report.fallbacks if "internal error" in f.reason]
    if internal:
        return RouteOutcome(target, Verdict.CRASH, "; ".join(internal[:3]), kernels)
    check = report.verify
    if not kernels:
        return RouteOutcome(target, Verdict.OK, "XLA's plan kept", 0)
    if check.error:
        return RouteOutcome(target, Verdict.CRASH, check.error, kernels)
    if check.vacuous or not check.ran:
        return RouteOutcome(target, Verdict.NO_VERDICT, check.not_run or "vacuous", kernels)
    if not check.ok:
        notes = [f.reason for f in report.fallbacks if f.stage == "verify"]
        return RouteOutcome(target, Verdict.MISMATCH, f"max abs err {check.max_abs_err:.3g}, "
                            f"max rel err {check.max_rel_err:.3g}; " + "; ".join(notes[:2]),
                            kernels)
    return RouteOutcome(target, Verdict.OK, check.rounding_decides, kernels)


def _plan_seconds(report) -> float:
    """A Report's planning: the explorer's and the code generator's seconds."""
    times = report.times_s
    return times.explore + times.codegen + times.ptxas


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:500]}"


def fuzz_summary(outcomes: list[ProgramOutcome], wall_s: float) -> str:
    """The count of each verdict, overall and per route, how many programs were stitched,
    and the longest planning."""
    def counts(verdicts) -> str:
        tally = {v: 0 for v in Verdict}
        for v in verdicts:
            tally[v] += 1
        return ", ".join(f"{n} {v.value}" for v, n in tally.items() if n)

    lines = [f"{len(outcomes)} programs in {wall_s:.0f} s: "
             f"{counts(o.verdict for o in outcomes)}"]
    routes = sorted({r.route for o in outcomes for r in o.routes})
    for route in routes:
        mine = [r for o in outcomes for r in o.routes if r.route == route]
        stitched = sum(r.stitched > 0 for r in mine)
        planned = max((r.plan_s for r in mine), default=0.0)
        lines.append(f"  {route}: {counts(r.verdict for r in mine)}; {stitched} of {len(mine)} "
                     f"with stitched kernels" + (f"; planned in at most {planned:.1f} s"
                                                 if planned else ""))
    return "\n".join(lines)
