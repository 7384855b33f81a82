"""Collectives in partitioned modules: XLA's replica-group spellings, the mesh form parsed and
printed back, the module rewritten to run as replicas, a pattern reading through an entry
bitcast of its own value (XLA:GPU's collective combiner) instead of waiting on it, and the
zoo's partitioned H100 training steps planned around their collectives and verified."""
from __future__ import annotations

from pathlib import Path

import pytest

from fusionstitching.codegen.flatten import flatten
from fusionstitching.hlo.collectives import (GroupsError, as_replicas, explicit_replica_groups,
                                             replica_groups, without_shardings)
from fusionstitching.hlo.ir import print_module
from fusionstitching.hlo.parser import parse_file, parse_module
from fusionstitching.pipeline import Options, stitch_module


def test_replica_group_spellings():
    assert replica_groups("{{0,1},{2,3}}") == [[0, 1], [2, 3]]
    assert replica_groups("{}") == []
    assert replica_groups("[2,4]<=[8]") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert replica_groups("[4,2]<=[2,4]T(1,0)") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # mesh axes: a group per index of the other axes, devices in row-major mesh order
    assert replica_groups("mesh['x'=2,'y'=4] {'y'}") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert replica_groups("mesh['x'=2,'y'=4] {'x'}") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert replica_groups("mesh['a'=1,'b'=1,'c'=8] {'c'}") == [list(range(8))]
    with pytest.raises(GroupsError):
        replica_groups("mesh['x'=8] {'x':(1)2}")


ALL_REDUCE = """HloModule m, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (p: f32[4]) -> (f32[4], u32[]) {
  %p = f32[4]{0} parameter(0), sharding={devices=[8]<=[8]}
  %id = u32[] partition-id()
  %r = f32[4]{0} all-reduce(%p), channel_id=3, replica_groups=mesh['x'=2,'y'=4] {'y'},
    use_global_device_ids=true, to_apply=%add
  ROOT %t = (f32[4]{0}, u32[]) tuple(%r, %id)
}
"""


def test_mesh_groups_parse_print_and_become_lists():
    module = parse_module(ALL_REDUCE)
    reduce = module.entry.by_name()["r"]
    assert reduce.attrs["replica_groups"] == "mesh['x'=2,'y'=4] {'y'}"
    assert "replica_groups=mesh['x'=2,'y'=4] {'y'}" in print_module(module)
    assert "replica_groups={{0,1,2,3},{4,5,6,7}}" in explicit_replica_groups(ALL_REDUCE)


def test_as_replicas_keeps_the_program_and_drops_partition_ids_and_channels():
    text = as_replicas(ALL_REDUCE)
    assert "partition-id" not in text and "replica-id()" in text
    assert "channel_id" not in text and "use_global_device_ids" not in text
    assert "sharding=" not in text
    parse_module(text)  # still a module
    assert without_shardings("%p = f32[4] parameter(0), sharding={{replicated}, "
                             "{devices=[2]<=[2]}}, x=1") == "%p = f32[4] parameter(0), x=1"


# XLA:GPU's all-reduce combiner: two gradients concatenated through entry bitcasts into one
# all-reduce; a pattern of the producer and the concatenate must read the bitcast inside.
COMBINED = """HloModule m

%produce (a: f32[2,16]) -> f32[2,16] {
  %a = f32[2,16]{1,0} parameter(0)
  ROOT %e = f32[2,16]{1,0} exponential(%a)
}

%concatenate (x: f32[4], y: f32[32]) -> f32[36] {
  %x = f32[4]{0} parameter(0)
  %y = f32[32]{0} parameter(1)
  ROOT %c = f32[36]{0} concatenate(%x, %y), dimensions={0}
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (p: f32[2,16], q: f32[4]) -> f32[36] {
  %p = f32[2,16]{1,0} parameter(0)
  %q = f32[4]{0} parameter(1)
  %exp = f32[2,16]{1,0} fusion(%p), kind=kLoop, calls=%produce
  %flat = f32[32]{0} bitcast(%exp)
  %cat = f32[36]{0} fusion(%q, %flat), kind=kLoop, calls=%concatenate
  ROOT %r = f32[36]{0} all-reduce(%cat), replica_groups={}, to_apply=%add
}
"""


def test_a_pattern_reads_an_entry_bitcast_of_its_own_value_inside():
    module = parse_module(COMBINED)
    pattern = flatten(module, ["exp", "cat"])
    assert sorted(name for name, _ in pattern.inputs) == ["p", "q"]  # not %flat: no cycle
    assert [name for name, _ in pattern.outputs] == ["cat"]  # %flat has no user outside


def test_the_combined_pattern_is_planned_scheduled_and_verified():
    """The same module with a negate for the all-reduce, which a single device can run."""
    module = parse_module(COMBINED.replace("all-reduce(%cat), replica_groups={}, to_apply=%add",
                                           "negate(%cat)"))
    result = stitch_module(module, Options(verify=True, ptxas=False))
    (kernel,) = result.kernels
    assert {"cat", "exp"} <= set(kernel.pattern.nodes)
    assert not [f for f in result.report.fallbacks if f.stage == "schedule"]
    assert result.report.verify.ran and result.report.verify.ok


PARTITIONED = sorted((Path(__file__).parent / "data" / "hlo" / "partitioned").glob("*.hlo*"))
_COLLECTIVE = ("all-", "collective-", "reduce-scatter")


@pytest.mark.parametrize("path", PARTITIONED, ids=lambda p: p.name.split(".")[0])
def test_partitioned_h100_modules_plan_around_every_collective(path):
    """The zoo's BERT and Transformer steps over 8 H100s (benchmarks/make_partitioned.py)."""
    module = parse_file(path)
    result = stitch_module(module, Options(ptxas=False))
    by_name = module.entry.by_name()
    collectives = [i for i in module.entry.instructions if i.opcode.startswith(_COLLECTIVE)]
    assert collectives and len(result.kernels) >= 10
    assert not [n for k in result.kernels for n in k.pattern.nodes
                if by_name[n].opcode.startswith(_COLLECTIVE)]
    assert not result.report.fallbacks  # nothing given back (no schedule cycles)


def test_a_partitioned_module_verifies_on_simulated_devices():
    module = parse_file(PARTITIONED[0])  # BERT, data parallel over 8 H100s
    result = stitch_module(module, Options(verify=True, ptxas=False))
    assert result.report.verify.ran and result.report.verify.ok, result.report.verify
    assert result.report.verify.against == ["evaluator (8 devices simulated)"]
