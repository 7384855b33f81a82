"""benchmarks/RESULTS.md is what benchmarks/results_page.py makes of the result files: a
result added without regenerating the page fails here."""
from __future__ import annotations

from benchmarks import results_page


def test_the_results_page_is_generated_from_the_result_files():
    assert results_page.PAGE.read_text() == results_page.page(), (
        "benchmarks/RESULTS.md is out of date: run python benchmarks/results_page.py")
