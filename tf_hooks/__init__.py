"""FUSIONSTITCHING=1: stitching in an unchanged script, enabled from the environment.

The package installs ``fusionstitching_hook.pth`` into site-packages (setup.py); Python runs
its one line at every start-up (``at_start_up``). It quiets the JAX CUDA plugin where it can
only fail (quiet_start.py); when ``FUSIONSTITCHING`` is unset it does nothing else; when it
is set, ``enable_from_environment`` parses ``FUSIONSTITCHING_FLAGS`` (flags.py) and arranges
for each framework's hook to be installed when the script imports that framework
(jax_hook.py, tf_hook.py; keras_jit.py for Keras 3 on TF), so nothing heavy is imported at
start-up and a script that sets ``JAX_PLATFORMS`` etc. before importing jax still works.
"""
from __future__ import annotations

import atexit
import os

from . import quiet_start

_enabled = False


def at_start_up() -> None:
    """What the .pth line runs in every Python process: nothing heavy is imported."""
    quiet_start.at_start_up()
    if "FUSIONSTITCHING" in os.environ:
        enable_from_environment()


def enable_from_environment() -> bool:
    """Install the hooks if ``FUSIONSTITCHING`` asks for it; True when it did. Idempotent:
    the .pth line may run more than once (an installed copy and a site dir added by hand),
    and flags must be read, warned about and registered for the report at exit only once."""
    global _enabled
    from . import flags

    if not flags.enabled():
        return False
    if _enabled:
        return True
    _enabled = True
    parsed = flags.from_environment()
    atexit.register(flags.say_if_nothing_was_stitched)
    from . import jax_hook, keras_jit, tf_hook

    jax_hook.install_when_imported(parsed)
    tf_hook.install_when_imported(parsed)
    if parsed.keras_jit != "false":
        keras_jit.install_when_imported()
    return True
