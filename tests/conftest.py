"""Make the repository importable when pytest runs from a checkout without `pip install -e .`;
keep the per-kernel timing out of decisions the tests assert."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@pytest.fixture(autouse=True)
def kernels_measured_faster(request, monkeypatch):
    """With keep='fastest' each host kernel is timed against XLA:CPU (runtime/cpu_speed.py);
    a small test kernel wins or loses by microseconds of noise, and a loss leaves it to XLA,
    so whether a test's kernel ran would be decided by the machine's load. Here every kernel
    is measured a little faster, unless the test is marked ``real_timing``: a planned kernel
    runs, an XLA kernel the plan left alone stays XLA's (not ``cpu_speed.faster_alone``)."""
    if request.node.get_closest_marker("real_timing") is None:
        monkeypatch.setattr("fusionstitching.runtime.cpu_speed.compare",
                            lambda module, spec, target: (1.0, 1.2))


@pytest.fixture(autouse=True)
def stitching_starts_at_once(monkeypatch):
    """A job's background stitching waits until the process has run STITCH_AFTER_S
    (fusionstitching/job_clock.py); a test's builds start at once unless it sets its own."""
    monkeypatch.setattr("fusionstitching.job_clock.STITCH_AFTER_S", 0.0)
