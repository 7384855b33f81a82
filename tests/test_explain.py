"""``fusionstitching explain``: reasons per neighbour, the plan as DOT (and SVG with dot)."""
import enum
import shutil

import pytest

import costmodel
from fusionstitching.cli import main
from fusionstitching.explain import Unrefused, blocked_edges, explain_text, plan_dot, write_svg
from fusionstitching.explorer import explore
from fusionstitching.explorer.index import GraphIndex
from fusionstitching.graph import build_graph
from fusionstitching.graph.refusal import Refusal
from fusionstitching.hlo.parser import parse_module

from helpers import CYCLE, accept_all, producer_with_two_consumers


def plan_of(text):
    graph = build_graph(parse_module(text))
    return graph, explore(graph, accept_all, "beam", costmodel.load_device("h100"))


def test_explain_names_every_neighbour_and_why():
    graph, plan = plan_of(CYCLE)
    text = explain_text(graph, plan, "a")
    assert "consumer b" in text and "consumer d" in text
    assert "opaque kernels" in text  # the dot
    together = [p for p in plan.patterns if "a" in p.nodes]
    assert (": stitched together" in text.split("consumer b")[1].splitlines()[0]) == bool(together)
    # the cyclic candidate {a, b, c} appears with its reason under neighbour b
    assert "rejected {a, b, c}: cycle" in text


def test_plan_text_counts_the_edges_left_unfused_by_reason():
    graph, plan = plan_of(CYCLE)
    text = explain_text(graph, plan)
    # the plan is {a, b} or {b, c} (by cost); the other pair was buildable but not taken,
    # and the edges to the dot are not between memory-intensive kernels
    assert "edges between memory-intensive kernels left unfused: 1," in text
    assert f"     1  {Unrefused.NOT_CHOSEN.value}" in text


class Stub(enum.Enum):
    LAUNCHES = "needs more launches"


def test_code_generator_refusals_are_counted_by_their_kind():
    graph = build_graph(parse_module(producer_with_two_consumers(64, 4096)))

    def not_c(nodes):
        return Refusal(Stub.LAUNCHES, "c needs 3 launches") if "c" in nodes else None

    plan = explore(graph, not_c, "beam", costmodel.load_device("h100"))
    assert [set(p.nodes) for p in plan.patterns] == [{"a", "b"}]
    blocked = blocked_edges(GraphIndex(graph), plan)
    # the edge a -> c, by the code generator's kind (the latest query on {a, c} may be
    # remote fusion's)
    assert blocked == {Stub.LAUNCHES: 1}
    assert f"     1  {Stub.LAUNCHES.value}" in explain_text(graph, plan)


def test_dot_draws_kernels_and_stitched_clusters(tmp_path):
    graph, plan = plan_of(CYCLE)
    dot = plan_dot(graph, plan)
    assert dot.count("subgraph cluster_") == len(plan.patterns) == 1
    for name in ("a", "b", "c", "d"):
        assert f'"{name}" [label="{name}\\n' in dot
    assert '"v"' not in dot  # the bitcast launches nothing
    assert '"a" -> "b";' in dot and '"a" -> "d";' in dot


def test_cli_explain_writes_dot_and_says_when_dot_is_missing(tmp_path, capsys):
    hlo = tmp_path / "m.hlo"
    hlo.write_text(CYCLE)
    svg = tmp_path / "plan.svg"
    assert main(["explain", str(hlo), "--node", "b", "--svg", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "b: light_elementwise, f32[64,256]" in out
    assert (tmp_path / "plan.dot").read_text().startswith("digraph")
    if shutil.which("dot") is None:
        assert "Graphviz's `dot` program is not installed" in out
        assert not svg.exists()
    else:
        assert svg.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_unknown_node_is_an_error(tmp_path, capsys):
    hlo = tmp_path / "m.hlo"
    hlo.write_text(CYCLE)
    assert main(["explain", str(hlo), "--node", "nope"]) == 1
    assert "no node 'nope'" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot program is not installed")
def test_svg_renders(tmp_path):
    graph, plan = plan_of(CYCLE)
    ok, message = write_svg(plan_dot(graph, plan), str(tmp_path / "p.svg"))
    assert ok, message
    assert "stitched kernel 0" in (tmp_path / "p.svg").read_text()
