"""``replay DIR`` takes the HLO files users keep (``*.hlo.txt``, ``*.hlo``, ``*.txt`` holding a
module, XLA's dumps, gzipped or not) and says what it left out; a stopped run keeps the
Reports of the modules it finished."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from fusionstitching import cli
from fusionstitching.cli import main as cli_main
from fusionstitching.hlo.files import collect_hlo_files

DATA = Path(__file__).parent / "data" / "hlo"
MODULE = (DATA / "layernorm_64x256_jax_cpu.hlo").read_text()


def test_a_folder_gives_its_hlo_files_and_says_what_it_left_out(tmp_path):
    (tmp_path / "a.hlo.txt").write_text(MODULE)
    (tmp_path / "b.hlo").write_text(MODULE)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "c.txt").write_text("\n\n" + MODULE)  # a module under any name
    (tmp_path / "d.hlo.txt.gz").write_bytes(gzip.compress(MODULE.encode()))
    (tmp_path / "readme.txt").write_text("not HLO")
    (tmp_path / "module_0001.jit_f.before_optimizations.txt").write_text(MODULE)
    (tmp_path / "module_0001.jit_f.cpu_after_optimizations.txt").write_text(MODULE)
    (tmp_path / "step.xla.hlo.txt").write_text(MODULE)  # the runtime's dump (JAX)
    (tmp_path / "step.rewritten.hlo.txt").write_text(MODULE)
    (tmp_path / "tf.xla.hlo.txt").write_text(MODULE)  # ... beside its XLA dump (TF)
    (tmp_path / "tf.cpu.after_optimizations.txt").write_text(MODULE)
    files, skipped = collect_hlo_files([str(tmp_path)])
    assert sorted(f.relative_to(tmp_path).as_posix() for f in files) == [
        "a.hlo.txt", "b.hlo", "d.hlo.txt.gz", "module_0001.jit_f.cpu_after_optimizations.txt",
        "notes/c.txt", "step.xla.hlo.txt", "tf.cpu.after_optimizations.txt"]
    why = {f.name: reason for f, reason in skipped}
    assert sorted(why) == ["module_0001.jit_f.before_optimizations.txt",
                           "step.rewritten.hlo.txt", "tf.xla.hlo.txt"]
    assert "before optimization" in why["module_0001.jit_f.before_optimizations.txt"]
    assert "rewritten" in why["step.rewritten.hlo.txt"]


def test_replay_writes_json_as_each_module_completes(tmp_path, monkeypatch):
    """A run stopped after its first module keeps that module's Report in --json."""
    for name in ("a", "b"):
        (tmp_path / f"{name}.hlo.txt").write_text(MODULE)
    out = tmp_path / "reports.json"
    seen = []
    write = cli._write_reports

    def stop_after_first(reports, path):
        write(reports, path)
        seen.append(json.loads(Path(path).read_text()))
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_write_reports", stop_after_first)
    try:
        cli_main(["replay", str(tmp_path), "--no-ptxas", "--json", str(out)])
    except KeyboardInterrupt:
        pass
    assert len(seen) == 1 and len(json.loads(out.read_text())) == 1
    assert seen[0][0]["module"] == "jit_layernorm"
