"""The third-party tier of the HLO corpus (tests/data/hlo/third_party/, made by
benchmarks/make_third_party.py): optimized HLO of training steps and inference of models from
Keras Hub, Keras Applications (TF), Flax + optax and HuggingFace transformers (Flax), for
XLA:CPU and XLA:GPU H100, with constants in full and as ``as_text()`` elides them.

Default run: the manifest and the files agree, the tier covers what it promises, every file
parses and XLA's own parser (jaxlib) reads the same instructions, elided files really are the
elided print of their full twin. Slow (``pytest -m slow``): every module goes through the
whole pipeline as ``fusionstitching replay`` runs it.
"""
from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import pytest

from fusionstitching.hlo.parser import parse_file, read_hlo_text
from fusionstitching.pipeline import Options, stitch_module

DATA = Path(__file__).parent / "data" / "hlo" / "third_party"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
FILES = sorted(name for name, entry in MANIFEST.items()
               if "skipped" not in entry and "identical_to" not in entry)
FULL_FILES = [name for name in FILES if not MANIFEST[name]["elided"]]
ELIDED_FILES = [name for name in FILES if MANIFEST[name]["elided"]]
REQUIRED = {"model", "library", "library_version", "framework", "target", "mode", "elided",
            "optimizer", "config", "regenerate"}
NAME = re.compile(r"^(?P<stem>[a-z0-9_]+)_(?P<mode>train|infer)_(?P<target>cpu|h100)"
                  r"(?P<elided>_elided)?\.hlo(\.gz)?$")


def _twin(name: str) -> str:
    """The full-constants file of an elided file."""
    stem = NAME.match(name).group(0).split("_elided")[0]
    return next(n for n in FULL_FILES if n.startswith(stem + ".hlo"))


# -- manifest -------------------------------------------------------------------------------

def test_manifest_lists_every_file_and_every_file_exists():
    on_disk = {p.name for p in DATA.iterdir() if p.name.endswith((".hlo", ".hlo.gz"))}
    assert on_disk == set(FILES)
    for name, entry in MANIFEST.items():
        assert REQUIRED <= set(entry), name
        match = NAME.match(name)
        assert match, name
        assert match["stem"] == f"{entry['library']}_{entry['model']}", name
        assert (match["mode"], match["target"]) == (entry["mode"], entry["target"]), name
        assert bool(match["elided"]) == entry["elided"], name
        if "skipped" in entry:
            assert entry["skipped"].strip(), f"{name}: a skip must say why"
            assert not (DATA / name).exists()
        elif "identical_to" in entry:  # nothing was elided: the full file is the module
            assert entry["elided"] and entry["identical_to"] in FULL_FILES, name
            assert not (DATA / name).exists()
        else:
            assert entry["parameter_count"] > 0, name
            assert entry["metadata_stripped"] or len(read_hlo_text(DATA / name)) <= 64 * 1024


def test_tier_covers_a_dozen_models_from_four_libraries_with_training_steps():
    trained = {(e["library"], e["model"]) for name, e in MANIFEST.items()
               if name in FULL_FILES and e["mode"] == "train"}
    assert len(trained) >= 12, sorted(trained)
    assert len({library for library, _ in trained}) >= 4, sorted(trained)
    # every model has both targets, or a stated reason why not
    by_model = collections.defaultdict(set)
    for entry in MANIFEST.values():
        by_model[(entry["library"], entry["model"], entry["mode"])].add(entry["target"])
    for key, targets in by_model.items():
        assert targets == {"cpu", "h100"}, key


def test_tier_stays_a_few_megabytes():
    total = sum(p.stat().st_size for p in DATA.iterdir() if p.is_file())
    assert total < 6_000_000, f"{total} bytes"
    for name in FILES:
        assert name.endswith(".gz") or (DATA / name).stat().st_size <= 64 * 1024, name


# -- parsing --------------------------------------------------------------------------------

def _xla_computations(text: str) -> dict[str, list[tuple[str, str]]]:
    """Per computation, (instruction name, opcode) as XLA's parser (jaxlib) reads the text."""
    from jax._src.lib import xla_client

    module = xla_client.hlo.hlo_module_from_text(text)
    out = {}
    for comp in module.computations():
        rows = []
        for inst in comp.instructions():
            head = inst.to_string().split(" = ", 1)[1]
            # `SHAPE opcode(`: tuple shapes hold spaces but never ' word('.
            rows.append((inst.name, re.search(r" ([\w\-]+)\(", head).group(1)))
        out[comp.name] = sorted(rows)
    return out


@pytest.mark.parametrize("name", FILES)
def test_file_parses_and_agrees_with_xla(name):
    path = DATA / name
    module = parse_file(path)
    ours = {c.name: sorted((i.name, i.opcode) for i in c.instructions)
            for c in module.computations}
    assert ours == _xla_computations(read_hlo_text(path))
    assert len(module.entry.parameters) == MANIFEST[name]["parameter_count"]
    elided = [i for c in module.computations for i in c.instructions if i.literal_elided]
    assert bool(elided) == MANIFEST[name]["elided"], name


@pytest.mark.parametrize("name", ELIDED_FILES)
def test_elided_file_is_its_full_twin_with_constants_elided(name):
    """Same computations, instructions, opcodes and shapes; only constants' values differ,
    and exactly the large ones are ``{...}``."""
    elided, full = parse_file(DATA / name), parse_file(DATA / _twin(name))
    full_insts = {(c.name, i.name): i for c in full.computations for i in c.instructions}
    seen = set()
    for comp in elided.computations:
        for inst in comp.instructions:
            twin = full_insts[(comp.name, inst.name)]
            seen.add((comp.name, inst.name))
            assert (inst.opcode, inst.shape) == (twin.opcode, twin.shape), inst.name
            if inst.literal_elided:
                assert not twin.literal_elided and twin.literal, inst.name
            elif inst.opcode == "constant":
                assert inst.literal == twin.literal, inst.name
    assert seen == set(full_insts)


# -- the pipeline (slow) --------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", FULL_FILES)
def test_replay_plans_and_builds_every_module(name):
    """What ``fusionstitching replay FILE --no-ptxas`` does, as a test: parse, graph, plan,
    code generation. Compiler defects show up here, not in the default run."""
    result = stitch_module(parse_file(DATA / name), Options(ptxas=False))
    assert result.report.ok


@pytest.mark.slow
@pytest.mark.parametrize("name", ELIDED_FILES)
def test_replay_reads_elided_modules(name):
    """An elided module plans like its full twin: planning needs no constant values (an
    elided constant is a buffer the kernel reads; its full twin's is inlined, so only
    their bytes may differ, by at most the constants' own size)."""
    elided = stitch_module(parse_file(DATA / name), Options(ptxas=False))
    full = stitch_module(parse_file(DATA / _twin(name)), Options(ptxas=False))
    assert elided.report.ok and full.report.ok
    assert sorted(sorted(p.nodes) for p in elided.plan.patterns) == \
        sorted(sorted(p.nodes) for p in full.plan.patterns)
    assert elided.report.fs.mem_kernels == full.report.fs.mem_kernels


def test_the_flax_resnet_training_step_verifies_against_xla():
    """Its H100 module holds forward cuDNN calls with a reversed window (filter gradients):
    XLA:CPU runs them, so the stitched plan is checked against XLA as well as the
    evaluator, and the drift rule decides what the 1e-5 tolerance alone cannot."""
    result = stitch_module(parse_file(DATA / "flax_resnet_train_h100.hlo.gz"),
                           Options(ptxas=False, verify=True))
    check = result.report.verify
    assert result.kernels and check.ran and check.ok and not check.vacuous, check
    assert check.against == ["evaluator", "xla"]
