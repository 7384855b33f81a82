"""The ``fusionstitching`` logger, whose lines name it once whether or not logging is set up.

Messages carry no prefix: where the script configured logging, its format names the logger
("WARNING:fusionstitching:..."); where nothing is configured, Python's last-resort handler
would print the bare message, so the logger's own handler prints "..." then.
"""
from __future__ import annotations

import logging
import sys

NAME = "fusionstitching"


class _WhereUnconfigured(logging.Handler):
    """Prints ``fusionstitching: message`` to stderr, at WARNING and above as Python's last
    resort does, for a record no other handler on its way to the root would print."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter(NAME + ": %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if _handled_elsewhere(logging.getLogger(record.name)):
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # a closed stderr at exit: as logging's own handlers, say nothing
            self.handleError(record)


def _handled_elsewhere(logger: logging.Logger) -> bool:
    current = logger
    while current is not None:
        if any(not isinstance(h, _WhereUnconfigured) for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


log = logging.getLogger(NAME)
if not any(isinstance(h, _WhereUnconfigured) for h in log.handlers):
    log.addHandler(_WhereUnconfigured())
