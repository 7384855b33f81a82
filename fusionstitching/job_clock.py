"""How long the job has run, and when its stitching work starts (``STITCH_AFTER_S``).

Imported at start-up by the env var's hook (``tf_hooks``), so the clock starts with the
process; it imports nothing of the compiler, so a young job's calls never load it.
"""
from __future__ import annotations

import time

# A job's stitching work (planning, builds, trials) starts once the process has run this long:
# beside a short job it took the cores the job left and memory bandwidth (with planning from
# the first call a 10.3 s Keras script ran 11.5-12.5 s; with cached plans built and tried from
# the first call, 10.1 s scripts ran 11.6-13.0 s), for an executable that job has too few calls
# left to pay back. A longer job loses at most this long of stitched running; a shorter one
# plans at its exit, for its next run. A decision an earlier run kept is loaded at once.
STITCH_AFTER_S = 30.0
_STARTED = time.monotonic()


def job_seconds() -> float:
    """Seconds since the process started (since this module was first imported)."""
    return time.monotonic() - _STARTED


def seconds_until_stitching() -> float:
    """How long until the job has run STITCH_AFTER_S (0 once it has)."""
    return max(0.0, STITCH_AFTER_S - job_seconds())
