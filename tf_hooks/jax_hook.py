"""Replace ``jax.jit`` by ``fusionstitching.jit`` in a process started with FUSIONSTITCHING=1.

The hook waits for the script to import jax (a one-shot import hook on ``sys.meta_path``),
then replaces the module attribute ``jax.jit``. Code that calls ``jax.jit(...)`` or uses
``@jax.jit`` / ``functools.partial(jax.jit, static_argnums=...)`` gets a stitched function;
jax's own internals keep calling ``jax._src.api.jit`` and are not affected. Calls with
options fusionstitching does not support (shardings, device, backend, inline, compiler
options...) set to anything but jax.jit's defaults get the original ``jax.jit``.
"""
from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import sys

from . import flags as flag_parsing

log = logging.getLogger("fusionstitching")

# jax.jit keywords fusionstitching.jit takes (keep_unused: it always keeps them).
SUPPORTED = ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames",
             "keep_unused")


def install(flags: flag_parsing.Flags) -> None:
    import jax

    if hasattr(jax.jit, "fusionstitching_original"):
        return
    original = jax.jit
    defaults = {name: parameter.default
                for name, parameter in inspect.signature(original).parameters.items()}

    @functools.wraps(original)
    def jit(fun=None, /, **kwargs):
        if fun is None:  # @jax.jit(static_argnums=...) style
            return functools.partial(jit, **kwargs)
        # jax.jit(f, device=None, inline=False) is plain jax.jit(f): not a reason to leave it
        kwargs = {k: v for k, v in kwargs.items()
                  if k in SUPPORTED or not _is_default(v, defaults.get(k, inspect.Parameter.empty))}
        unsupported = sorted(k for k in kwargs if k not in SUPPORTED)
        if unsupported:
            log.info("fusionstitching: %s uses jax.jit(%s): left to jax.jit",
                     getattr(fun, "__name__", fun), ", ".join(unsupported))
            return original(fun, **kwargs)
        import fusionstitching

        kwargs.pop("keep_unused", None)
        stitched = fusionstitching.jit(fun, **kwargs, **flags.jit_options())
        flag_parsing.track(stitched)
        return stitched

    jit.fusionstitching_original = original
    jax.jit = jit


def _is_default(value, default) -> bool:
    if value is default:
        return True
    try:
        return default in (None, False) and value == default and type(value) is type(default)
    except Exception:  # e.g. an array compared with None: not a default
        return False


def install_when_imported(flags: flag_parsing.Flags) -> None:
    if "jax" in sys.modules:
        install(flags)
    else:
        sys.meta_path.insert(0, _AfterImport("jax", lambda: install(flags)))


class _AfterImport:
    """Finds nothing itself: when ``name`` is first imported, it lets the normal finders find
    it and wraps that loader's ``exec_module`` so ``callback`` runs once the module is done."""

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps find_spec below from finding us
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_install(module):
            exec_module(module)
            try:
                callback()
            except Exception as exc:  # the user's import must not fail because of us
                log.warning("fusionstitching: could not install the jax hook: %s", exc)

        spec.loader.exec_module = exec_then_install
        return spec
