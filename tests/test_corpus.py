"""The HLO corpus (tests/data/hlo/, made by benchmarks/make_corpus.py) is complete and sound:
the manifest and the files agree, every file parses the way XLA's own parser reads it, and
every workload and micro model has an XLA:CPU and an XLA:GPU H100 module or a stated reason
why not."""
import collections
import json
from pathlib import Path

import pytest

from fusionstitching.hlo.parser import parse_file, read_hlo_text

DATA = Path(__file__).parent / "data" / "hlo"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
FILES = sorted(name for name, entry in MANIFEST.items() if "skipped" not in entry)
REQUIRED = {"model", "framework", "target", "classic", "how", "regenerate"}


def test_manifest_lists_every_file_and_every_file_exists():
    on_disk = {p.name for p in DATA.glob("*.hlo*")}  # *.hlo and gzipped *.hlo.gz
    assert on_disk == set(FILES)
    for name, entry in MANIFEST.items():
        assert REQUIRED <= set(entry), name
        if "skipped" in entry:
            assert entry["skipped"].strip(), f"{name}: a skip must say why"
            assert not (DATA / name).exists()
        else:
            assert entry["parameters"], name


def test_corpus_stays_a_few_megabytes():
    """The corpus is checked in, so it stays small; large modules are gzipped
    (make_corpus.COMPRESS_ABOVE)."""
    total = sum(p.stat().st_size for p in DATA.iterdir() if p.is_file())
    assert total < 4_000_000, f"{total} bytes"
    for name in FILES:
        assert name.endswith(".gz") or (DATA / name).stat().st_size <= 64 * 1024, name


def test_corpus_holds_the_papers_workloads():
    workloads = {(e["model"], e.get("mode"), e["framework"]) for e in MANIFEST.values()
                 if e.get("kind") == "workload"}
    for model, mode in [("bert", "train"), ("bert", "infer"), ("dien", "train"),
                        ("dien", "infer"), ("transformer", "train")]:
        assert {(model, mode, "jax"), (model, mode, "tf")} <= workloads
    assert {("asr", "infer", "jax"), ("crnn", "infer", "jax")} <= workloads


def test_every_model_has_cpu_and_h100_variants_or_a_reason():
    by_model = collections.defaultdict(dict)
    for name, entry in MANIFEST.items():
        key = (entry["model"], entry.get("mode"), entry["framework"])
        by_model[key].setdefault(entry["target"], []).append(entry)
    for key, targets in by_model.items():
        for target in ("cpu", "h100"):
            assert target in targets, f"{key} has no {target} module nor a recorded skip"


def _xla_instruction_count(text: str) -> int:
    from jax._src.lib import xla_client

    module = xla_client.hlo.hlo_module_from_text(text)
    return sum(len(comp.instructions()) for comp in module.computations())


@pytest.mark.parametrize("name", FILES)
def test_file_parses_and_agrees_with_xla_instruction_count(name):
    path = DATA / name
    module = parse_file(path)
    ours = sum(len(c.instructions) for c in module.computations)
    assert ours == _xla_instruction_count(read_hlo_text(path))
    params = [{"dtype": p.shape.dtype, "shape": list(p.shape.dims)}
              for p in sorted(module.entry.parameters, key=lambda p: p.parameter_number)]
    assert params == MANIFEST[name]["parameters"]
