"""The differential fuzzer in the default suite: 100 seeded random JAX programs (200 more with
``-m slow``) through ``jax.jit`` and ``fusionstitching.jit(keep="stitched")`` on XLA:CPU and
through H100 replay with ``--verify``, judged by the same programs run in f64: no mismatch,
crash, hang or slow plan, and no program the generator got wrong. (``fusionstitching fuzz`` runs any
number; the large run is benchmarks/fuzz.py.)"""
from __future__ import annotations

import time

import pytest

from fusionstitching.fuzz import differential
from fusionstitching.fuzz.differential import Verdict, fuzz_summary
from fusionstitching.fuzz.pool import fuzz_in_process, fuzz_in_workers
from fusionstitching.fuzz.programs import generate

SEEDS, SLOW_SEEDS = range(100), range(100, 300)


def test_a_program_is_the_same_for_the_same_seed():
    assert generate(12).source == generate(12).source
    assert generate(12).source != generate(13).source


def check_seeds(seeds, at_least_stitched: float):
    outcomes = fuzz_in_workers(list(seeds), ("cpu", "h100"), 2, lambda outcome: None)
    failed = [o.describe() for o in outcomes if o.failed or o.verdict is Verdict.INVALID]
    assert not failed, fuzz_summary(outcomes, 0) + "\n\n" + "\n\n".join(failed[:5])
    stitched = sum(any(r.stitched for r in o.routes) for o in outcomes)
    # the programs do exercise the kernels
    assert stitched >= at_least_stitched * len(outcomes), fuzz_summary(outcomes, 0)


def test_seeded_programs_give_xlas_results_on_every_route():
    check_seeds(SEEDS, 0.8)


@pytest.mark.slow
def test_more_seeded_programs_give_xlas_results_on_every_route():
    check_seeds(SLOW_SEEDS, 0.8)


def test_programs_that_once_failed():
    """1177: an argmin's (value, index) tuple inside a multi-output fusion's tuple (flatten's
    nested get-tuple-element); 102: the same pair read in the entry computation through a
    get-tuple-element of a get-tuple-element (the stitched plan's order in verify); 11541:
    a host kernel's index ``160 * ((d - 5*o + 155) // 160) + ...`` (a flip's), whose
    quotient's argument is negative for half the points, lowered as unsigned division.
    12580: a reduction of a reduction whose operand a bitcast drops a unit dimension from
    (flatten's split-row check indexed past the shorter shape). 13100: a host kernel's
    prologue (a reduce-window's gradient, a scatter) read a value computed once that the
    body fills after it: NaN.
    1195 and 1200: XLA:CPU's dynamic-update-slice reads elements it already wrote, in f32
    and f64 alike; 11245: XLA keeps excess precision where the program rounds to bf16. The
    evaluator of the module before XLA's passes says so, and the stitched run is judged
    against whichever f64 result it follows, never by XLA's numbers alone."""
    seeds = [102, 1177, 1195, 1200, 11245, 11541, 12580, 13100]
    outcomes = {o.program.seed: o for o in fuzz_in_process(seeds, ("cpu", "h100"),
                                                           lambda outcome: None)}
    assert outcomes[1177].verdict is Verdict.OK, outcomes[1177].describe()
    assert all(r.stitched for r in outcomes[1177].routes)
    assert outcomes[102].verdict is Verdict.OK, outcomes[102].describe()
    assert outcomes[102].routes[1].stitched
    assert outcomes[11541].verdict is Verdict.OK, outcomes[11541].describe()
    assert outcomes[11541].routes[0].stitched
    for seed in (12580, 13100):
        assert outcomes[seed].verdict is Verdict.OK, outcomes[seed].describe()
    assert outcomes[13100].routes[0].stitched
    for seed in (1195, 1200, 11245):
        assert outcomes[seed].verdict is Verdict.XLA_DIFFERS, outcomes[seed].describe()
        (cpu,) = [r for r in outcomes[seed].routes if r.route == "cpu"]
        assert cpu.verdict is Verdict.OK, outcomes[seed].describe()
    assert outcomes[11245].routes[1].stitched


def test_a_route_planning_past_its_limit_is_a_slow_plan(monkeypatch):
    """The planning time is the Report's, kept apart from the route's compiles: a route that
    plans for longer than PLAN_LIMIT_S fails as a slow plan, though its numbers are right."""
    monkeypatch.setattr(differential, "PLAN_LIMIT_S", 1e-6)
    outcome = differential.run_program(generate(12), ("cpu",))
    (cpu,) = outcome.routes
    assert 0 < cpu.plan_s < cpu.seconds, outcome.describe()
    assert cpu.verdict is Verdict.SLOW_PLAN and outcome.failed, outcome.describe()
    assert "planned in" in cpu.detail


def test_a_swallowed_time_limit_comes_again():
    """Python swallows an exception raised in a weakref or __del__ callback: a route's one
    alarm can be lost there, and the program then ran on unjudged (seen in a 2,000-program
    run). The alarm repeats until it reaches the route."""
    def swallows_the_first_alarm():
        try:
            time.sleep(5)
        except differential._TimeLimit:  # as "Exception ignored in ..." does
            pass
        time.sleep(5)
        return "finished"

    started = time.perf_counter()
    with pytest.raises(differential._TimeLimit):
        differential._limited(0.2, swallows_the_first_alarm)
    assert time.perf_counter() - started < 3
