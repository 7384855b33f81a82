"""benchmarks/decision_check.py: the decision rules replayed on recorded samples."""
import json

from benchmarks import decision_check


def test_rules_on_samples_where_the_best_of_five_was_lucky():
    # stitched's one fast call comes first; XLA's best comes after the fifth
    xla = [1.0] * 5 + [0.70] + [1.0] * 9
    stitched = [0.80] + [1.1] * 14
    kept = decision_check.rules({"xla": xla, "stitched": stitched})
    assert kept == {"best of 5, 2% margin": True, "best of 15, 2% margin": False,
                    "median of 15 pair ratios over 1.02": False,
                    "stop once apart (>= 3 each), else best of 6": False,
                    "90% interval of the pair ratios above 1": False}


def test_replay_counts_each_rule_against_the_measured_ratio(tmp_path, capsys):
    lucky = {"xla": [1.0] * 5 + [0.70] + [1.0] * 9, "stitched": [0.80] + [1.1] * 14}
    rows = [{"samples": lucky, "true": {"xla": 1.0, "stitched": 1.1}},  # stitched is slower
            {"samples": {"xla": [], "stitched": []}, "true": {"xla": 1.0, "stitched": 0.5}}]
    (tmp_path / "d.json").write_text(json.dumps(rows))
    decision_check.replay([str(tmp_path / "d.json")])
    *lines, used = capsys.readouterr().out.splitlines()
    assert len(lines) == 5  # one per rule; the trial-decided row is not counted
    assert lines[0].startswith("best of 5") and "'kept slower': 1" in lines[0]
    assert all("'right': 1" in line for line in lines[1:])
    assert used == "samples of each executable the early stop used: [6]"
