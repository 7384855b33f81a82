"""The fusionstitching logger names itself once, whether or not the script set up logging."""
from __future__ import annotations

import subprocess
import sys


def stderr_of(setup: str) -> list[str]:
    code = (f"import logging\n{setup}\nfrom fusionstitching.logs import log\n"
            "log.warning('kernel %s left to XLA', 'fusion.3')\nlog.info('not shown')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stderr.splitlines()


def test_without_logging_set_up_a_warning_names_the_logger():
    assert stderr_of("") == ["fusionstitching: kernel fusion.3 left to XLA"]


def test_with_the_scripts_logging_its_format_names_the_logger_once():
    assert stderr_of("logging.basicConfig()") == \
        ["WARNING:fusionstitching:kernel fusion.3 left to XLA"]


def test_a_child_logger_without_handlers_is_printed_once_too():
    code = ("from fusionstitching.logs import log\nimport logging\n"
            "logging.getLogger('fusionstitching.defects').warning('x')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stderr.splitlines() == ["fusionstitching: x"]
