"""Replace ``jax.jit`` by ``fusionstitching.jit`` in a process started with FUSIONSTITCHING=1.

The hook waits for the script to import jax (a one-shot import hook on ``sys.meta_path``),
then replaces the module attribute ``jax.jit``. Code that calls ``jax.jit(...)`` or uses
``@jax.jit`` / ``functools.partial(jax.jit, static_argnums=...)`` gets a stitched function;
jax's own internals keep calling ``jax._src.api.jit`` and are not affected. An option given
its default (``None`` shardings included, as Keras and Flax pass them) is no option; a call
with an UNSUPPORTED one gets the original ``jax.jit`` and one warning per option naming it.
"""
from __future__ import annotations

import functools
import importlib.util
import inspect
import sys

from fusionstitching.logs import log

from . import flags as flag_parsing

# jax.jit keywords fusionstitching.jit takes (keep_unused: it always keeps them).
SUPPORTED = ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames",
             "keep_unused", "inline")
# The others, given anything but jax.jit's default: why the function is left to jax.jit.
# A keyword in neither (a newer jax's) is left to jax.jit too, as not known here.
UNSUPPORTED = {
    "in_shardings": "the stitched executable is built for jax's default placement only",
    "out_shardings": "the stitched executable is built for jax's default placement only",
    "device": "the stitched executable is built for jax's default device only",
    "backend": "the stitched executable is built for jax's default backend only",
    "compiler_options": "they would reach XLA's compile, not the stitched module's",
}
# jax.jit reads None (or a pytree of None) as unspecified for these.
_SHARDINGS = ("in_shardings", "out_shardings")


def install(flags: flag_parsing.Flags) -> None:
    import jax

    if hasattr(jax.jit, "fusionstitching_original"):
        return
    original = jax.jit
    defaults = {name: parameter.default
                for name, parameter in inspect.signature(original).parameters.items()
                if parameter.kind is not parameter.POSITIONAL_ONLY}
    warned: set[str] = set()  # options already warned about: once each, not once per function

    @functools.wraps(original)
    def jit(fun=None, /, **kwargs):
        if fun is None:  # @jax.jit(static_argnums=...) style
            return functools.partial(jit, **kwargs)
        if any(k not in defaults for k in kwargs):  # a typo: jax.jit's own TypeError
            return original(fun, **kwargs)
        # jax.jit(f, device=None, out_shardings=None) is plain jax.jit(f): not a reason to leave it
        kwargs = {k: v for k, v in kwargs.items()
                  if k in SUPPORTED or not _is_default(k, v, defaults[k])}
        unsupported = sorted(k for k in kwargs if k not in SUPPORTED)
        if unsupported:
            _left_to_jax(fun, unsupported, warned)
            return original(fun, **kwargs)
        import fusionstitching

        kwargs.pop("keep_unused", None)
        stitched = fusionstitching.jit(fun, **kwargs, **flags.jit_options())
        flag_parsing.track(stitched)
        return stitched

    jit.fusionstitching_original = original
    jax.jit = jit


def _left_to_jax(fun, options: list[str], warned: set[str]) -> None:
    name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", repr(fun))
    new = [k for k in options if k not in warned]
    warned.update(new)
    # A job whose functions silently run unstitched reports nothing: say so, once per option.
    (log.warning if new else log.info)(
        "%s is left to jax.jit, not stitched: %s%s", name, "; ".join(
            f"jax.jit({k}=...) is not supported ({UNSUPPORTED.get(k, 'not known here')})"
            for k in options),
        " (warned once per option)" if new else "")


def _is_default(name: str, value, default) -> bool:
    if value is default:
        return True
    try:
        if name in _SHARDINGS:  # None, or a pytree of None, as Keras and Flax pass them
            import jax

            leaves = jax.tree_util.tree_leaves(value, is_leaf=lambda leaf: leaf is None)
            return bool(leaves) and all(leaf is None or type(leaf) is type(default)
                                        for leaf in leaves)
        if name == "compiler_options":
            return value == {}  # jax.jit reads None and {} alike
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
                log.warning("could not install the hook for %s: %s", fullname, exc)

        spec.loader.exec_module = exec_then_install
        return spec
