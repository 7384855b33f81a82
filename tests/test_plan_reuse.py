"""Plans reused across sizes (explorer/given.py, runtime/build.py ``_stitch``): the step of a
partial last batch takes the patterns planned for the full one, each built at its own sizes;
a plan that does not fit the module is refused by kind and the explorer plans instead."""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fusionstitching import pipeline  # noqa: E402
from fusionstitching.explorer import FusionPlan, GivenRefusal, given_plan  # noqa: E402
from fusionstitching.graph import build_graph  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402
from fusionstitching.report import format_summary  # noqa: E402
from fusionstitching.runtime import build  # noqa: E402
from helpers import CYCLE, accept_all, producer_with_two_consumers  # noqa: E402


def train_step(w1, w2, x, y):
    """A small regression step: a dense layer, GELU and a layer norm, and their gradients."""
    def loss(w1, w2):
        h = jax.nn.gelu(x @ w1)
        mean = h.mean(-1, keepdims=True)
        h = (h - mean) * jax.lax.rsqrt(((h - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
        return jnp.mean((h @ w2 - y) ** 2)

    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
    return w1 - 0.1 * g1, w2 - 0.1 * g2


def built_at(rows: int, cache_dir: str):
    rng = np.random.default_rng(rows)
    args = (rng.standard_normal((64, 256)).astype(np.float32) * 0.1,
            rng.standard_normal((256, 1)).astype(np.float32) * 0.1,
            rng.standard_normal((rows, 64)).astype(np.float32),
            rng.standard_normal((rows, 1)).astype(np.float32))
    lowered = jax.jit(train_step).lower(*args)
    built = build.build_stitched(lowered, lowered.compile(), pipeline.Options(host=True),
                                 cache_dir)
    return built, args


def test_a_partial_batch_takes_the_patterns_planned_for_the_full_one(tmp_path):
    cache_dir = str(tmp_path / "cache")
    full, _ = built_at(64, cache_dir)
    assert full.stitched_report.planned_by == "explorer (beam)"
    assert full.stitched_report.fs.patterns >= 1, full.stitched_report.fallbacks

    partial, args = built_at(20, cache_dir)  # XLA numbers its instructions differently
    assert partial.stitched_report.planned_by.startswith("given: the patterns of module"), \
        partial.stitched_report.planned_by
    assert "  planned: given: the patterns of module" in format_summary(partial.stitched_report)
    assert partial.stitched_report.times_s.explore < full.stitched_report.times_s.explore
    # the same patterns as the full batch's, kernel for kernel, and as exploring finds
    assert [k.nodes for k in partial.stitched_report.kernels] == [k.nodes for k in full.stitched_report.kernels]
    explored, _ = built_at(20, str(tmp_path / "fresh"))
    assert explored.stitched_report.planned_by == "explorer (beam)"
    assert [k.nodes for k in partial.stitched_report.kernels] == \
        [k.nodes for k in explored.stitched_report.kernels]
    # the given plan's executable is the explored one's, bit for bit, and close to XLA's
    for got, same, want in zip(partial.stitched(*args), explored.stitched(*args),
                               jax.jit(train_step)(*args)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(same))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_a_given_plan_naming_a_node_the_module_lacks_is_explored_instead():
    module = parse_module(producer_with_two_consumers(8, 64), source="<test>")
    refused = given_plan(build_graph(module), [["a", "nowhere"]], accept_all, "a test")
    assert refused.kind is GivenRefusal.UNKNOWN_NODE and "nowhere" in refused.detail
    result = pipeline.stitch_module(module, pipeline.Options(workers=1),
                                    given=pipeline.GivenPatterns([["a", "nowhere"]], "a test"))
    assert result.report.planned_by == "explorer (beam)"
    assert any("was not taken (a node of the given plan" in n for n in result.plan.notes)


def test_a_given_pattern_that_forms_a_cycle_is_refused():
    graph = build_graph(parse_module(CYCLE, source="<test>"))
    refused = given_plan(graph, [["a", "c"]], accept_all, "a test")  # b lies between them
    assert refused.kind is GivenRefusal.CYCLE
    taken = given_plan(graph, [["a", "b"]], accept_all, "a test")
    assert isinstance(taken, FusionPlan) and [p.nodes for p in taken.patterns] == [["a", "b"]]
