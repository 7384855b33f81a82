"""The tree passes ruff's checks (ruff.toml): unused imports, undefined names, syntax and
escape errors, in the package, its tests and its benchmarks."""
from __future__ import annotations

import subprocess
import sys

from helpers import REPO


def test_the_tree_passes_ruff():
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise",
                          "."], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-1000:]
