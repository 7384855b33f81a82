"""``fusionstitching.jit(fn, **opts)``: ``jax.jit`` with stitched kernels in XLA's executable.

Per input signature, on the first call (or ``.lower(*a).compile()``), ``jax.jit`` compiles
``fn`` and its optimized HLO is stitched (runtime/lifecycle.py, runtime/build.py: at once, or
on a background thread with ``async_compile=True``); ``runtime.executor.Executor`` runs XLA's
executable until the stitched one is built and tried, then the one it keeps. Any failure falls
back to XLA's executable for that signature, with one warning and a ``fallbacks`` entry.
"""
from __future__ import annotations

import functools
import operator
import threading
import time
import types
from dataclasses import dataclass

import jax
from jax._src import source_info_util, tree_util
from jax._src.api_util import fun_signature, infer_argnums_and_argnames
from jax._src.array import ArrayImpl
from jax._src.interpreters import pxla
from jax._src.lib import _jax as jaxlib_cpp  # jaxlib's C++ dispatch (jax_dispatch)
from jax.api_util import shaped_abstractify

from .hlo.xla_text import optimized_hlo_text
from .options import Options
from .report import Report
from .runtime.built import reason
from .runtime.cache import default_dir
from .runtime.executor import Executor
from .runtime import coordination
from .runtime.lifecycle import Lifecycle, measures, share_cache

_DEFAULT = object()


@dataclass
class RuntimeOptions:
    async_compile: bool = False  # build the stitched executable on a background thread
    verify: bool = True  # the stitched outputs must match XLA's on the trial call
    keep: str = "fastest"  # "fastest": time both on a real call; "stitched": always stitched
    cache_dir: str | None = None  # kernel cache directory (None: no cache)
    dump_to: str | None = None  # write optimized HLO, rewritten HLO, kernels and Report here
    remote_cache: str | None = None  # redis:// URL: the cache tier shared by a job's hosts


def jit(fn=None, *, static_argnums=None, static_argnames=None, donate_argnums=None,
        donate_argnames=None, inline: bool = False, async_compile: bool = False,
        verify: bool = True, keep: str = "fastest", cache_dir=_DEFAULT,
        dump_to: str | None = None, cache_group=None, remote_cache: str | None = None,
        **opts):
    """Like ``jax.jit(fn, static_argnums=..., static_argnames=...)``, with stitching.

    ``opts`` are ``Options`` fields (options.py) (target, explorer, ptxas). PTX is not assembled
    unless ``ptxas=True``: on the CPU it is not executed, only reported. ``cache_dir``
    defaults to ``$XDG_CACHE_HOME/fusionstitching`` (``None``: no kernel cache); it is private
    to this user unless ``cache_group`` (a group name or gid) is given, whose members then share
    it (runtime/cache.py, "write access is trust"). ``remote_cache``, a
    ``redis://[:password@]host:port/db`` URL, adds a tier shared by the job's hosts: entries
    there are signed with ``$FUSIONSTITCHING_CACHE_SECRET`` (runtime/cache_redis.py).

    ``donate_argnums`` / ``donate_argnames`` donate as with ``jax.jit``: XLA's executable and
    the stitched one (whose module keeps XLA's input/output aliasing) reuse the donated
    buffers, which are deleted after the call. ``inline=True``, as with ``jax.jit``, inlines
    ``fn`` into an enclosing trace (which is then stitched as a whole); a call outside any
    trace runs ``fn``'s own stitched executable. Used as a decorator without ``fn``, returns one.
    """
    if fn is None:
        return functools.partial(jit, static_argnums=static_argnums,
                                 static_argnames=static_argnames, donate_argnums=donate_argnums,
                                 donate_argnames=donate_argnames, inline=inline,
                                 async_compile=async_compile,
                                 verify=verify, keep=keep, cache_dir=cache_dir, dump_to=dump_to,
                                 cache_group=cache_group, remote_cache=remote_cache, **opts)
    opts.setdefault("ptxas", False)
    runtime = RuntimeOptions(async_compile, verify, keep,
                             default_dir() if cache_dir is _DEFAULT else cache_dir, dump_to,
                             remote_cache)
    if cache_group is not None and runtime.cache_dir is not None:
        share_cache(runtime.cache_dir, cache_group)
    return StitchedFunction(fn, Options(**opts), runtime, static_argnums,
                            static_argnames, donate_argnums, donate_argnames, inline)


def original_jax_jit():
    """``jax.jit`` itself, also while the FUSIONSTITCHING hook has replaced it."""
    return getattr(jax.jit, "fusionstitching_original", jax.jit)


class StitchedFunction:
    def __init__(self, fn, options: Options, runtime: RuntimeOptions,
                 static_argnums=None, static_argnames=None, donate_argnums=None,
                 donate_argnames=None, inline: bool = False):
        _exclude_self_from_metadata()
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.options = options
        self.runtime = runtime
        signature = fun_signature(fn)
        if signature is None:  # builtins, some callables: numbers only, as jax does
            nums = () if static_argnums is None else (
                (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums))
            names = () if static_argnames is None else (
                (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames))
        else:
            nums, names = infer_argnums_and_argnames(signature, static_argnums, static_argnames)
        self.static_argnums, self.static_argnames = nums, names
        # keep_unused: the rewritten module's parameters must be exactly the flattened inputs.
        self._jax_jit = original_jax_jit()(fn, static_argnums=nums, static_argnames=names,
                                           donate_argnums=donate_argnums,
                                           donate_argnames=donate_argnames, keep_unused=True,
                                           inline=inline)
        self._compiled: dict = {}  # input signature -> Compiled
        self._lock = threading.Lock()
        self._dispatch = jax_dispatch(fn, self._cache_miss, nums, names) or self._python_dispatch

    def reports(self, wait_s: float = 0.0) -> list[Report]:
        """One Report per input signature compiled so far; ``wait_s`` bounds how long to wait
        for background builds still running (the report at exit waits, calls never do)."""
        with self._lock:
            compiled = list(self._compiled.values())
        deadline = time.monotonic() + wait_s
        for c in compiled:
            c.wait_built(max(0.0, deadline - time.monotonic()))
        return [c.report() for c in compiled]

    def __call__(self, *args, **kwargs):
        try:
            return self._dispatch(*args, **kwargs)
        except jax.errors.JaxRuntimeError as exc:
            return self._after_runtime_error(exc, args, kwargs)

    def _cache_miss(self, *args, **kwargs):
        """A call jax's dispatch has no entry for: (outputs, the entry for later calls of this
        signature or None, whether to drop the signature's entry). There is an entry only once
        the signature's executable is decided; until then every call comes here, to the
        executor (an entry without an executable would stay, and take every call here)."""
        try:
            key = self._signature(args, kwargs)
            hash(key)
        except TypeError:  # an unhashable static argument: jax.jit's own error message
            return self._jax_jit(*args, **kwargs), None, True
        if key is None:  # inside a trace: jax.jit's own inlines fn there
            return self._jax_jit(*args, **kwargs), None, True
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                compiled = self._compiled[key] = self.lower(*args, **kwargs).compile()
        return compiled.dispatch(*self._dynamic(args), **self._dynamic_kwargs(kwargs))

    def _python_dispatch(self, *args, **kwargs):
        """Every call through ``_cache_miss``: where jaxlib offers no dispatch of its own."""
        if jax.config.jax_disable_jit:  # jax.jit's own: it runs fn eagerly
            return self._jax_jit(*args, **kwargs)
        return self._cache_miss(*args, **kwargs)[0]

    def _after_runtime_error(self, exc, args, kwargs):
        """A call failed in XLA's runtime. When the stitched executable ran it, XLA's answers
        the call and every later one (a fallback with the error); XLA's own errors are the
        user's."""
        try:
            key = self._signature(args, kwargs)
            compiled = self._compiled.get(key) if key is not None else None
        except TypeError:  # an unhashable static argument: no executable of ours ran
            compiled = None
        if compiled is None or compiled.executor.decided() in (None, compiled.xla_compiled):
            raise exc
        compiled.executor.fail("execute", [], reason(exc))
        self._clear_dispatch()
        return compiled.xla_compiled(*self._dynamic(args), **self._dynamic_kwargs(kwargs))

    def lower(self, *args, **kwargs) -> "Lowered":
        lowered = self._jax_jit.lower(*args, **kwargs)
        return Lowered(lowered, self.options, self.runtime, getattr(self.fn, "__name__", "fn"))

    def __get__(self, instance, owner=None):
        """A method when stored on a class, as jax.jit's function is (``self`` is passed as
        the first argument, typically static)."""
        return self if instance is None else types.MethodType(self, instance)

    def clear_cache(self) -> None:
        with self._lock:
            self._compiled.clear()
        self._clear_dispatch()
        self._jax_jit.clear_cache()

    def _clear_dispatch(self) -> None:
        if self._dispatch is not self._python_dispatch:
            self._dispatch._clear_cache()

    def __getattr__(self, name):  # trace, eval_shape, ...: jax.jit's own
        if name.startswith("__") or name in ("_jax_jit", "fn"):
            raise AttributeError(name)
        return getattr(self._jax_jit, name)

    def _dynamic(self, args) -> tuple:
        count = len(args)
        static = {i % count for i in self.static_argnums if -count <= i < count}
        return tuple(a for i, a in enumerate(args) if i not in static)

    def _dynamic_kwargs(self, kwargs) -> dict:
        return {k: v for k, v in kwargs.items() if k not in self.static_argnames}

    def _signature(self, args, kwargs):
        """The call's key among compiled signatures; None when an argument is a tracer."""
        count = len(args)
        static = {i % count for i in self.static_argnums if -count <= i < count}
        static_values = tuple(args[i] for i in sorted(static)) + tuple(
            sorted((k, v) for k, v in kwargs.items() if k in self.static_argnames))
        dynamic = (self._dynamic(args), self._dynamic_kwargs(kwargs))
        leaves, tree = jax.tree_util.tree_flatten(dynamic)
        # Every call flattens once: a training step has hundreds of leaves. A jax array's aval
        # is what shaped_abstractify returns for it, kept on the array (0.07 us per leaf
        # instead of 0.8); when every leaf is one, the avals are read without a Python loop.
        # Shardings over several devices too: an executable is compiled for its inputs'
        # layout over them (a sharded step's outputs can come back sharded otherwise).
        kinds = set(map(type, leaves))
        if kinds == {ArrayImpl}:
            return (static_values, tree, tuple(map(_AVAL, leaves)),
                    tuple(map(_placement, leaves)))
        if any(issubclass(kind, jax.core.Tracer) for kind in kinds):
            return None  # an argument is a tracer
        return static_values, tree, tuple(leaf.aval if type(leaf) is ArrayImpl
                                          else shaped_abstractify(leaf) for leaf in leaves), \
            tuple(_placement(leaf) if type(leaf) is ArrayImpl else None for leaf in leaves)


_AVAL = operator.attrgetter("aval")


def _placement(array):
    """An array's sharding when it spans several devices; None on one (as a numpy input)."""
    sharding = array.sharding
    return sharding if sharding.num_devices > 1 else None


def jax_dispatch(fn, cache_miss, static_argnums, static_argnames):
    """jaxlib's C++ dispatch, the one behind ``jax.jit``, with ``cache_miss`` in place of
    jax's tracing: a call whose signature (static values, pytree, avals, weak types,
    shardings) has an entry runs that executable without Python, 0.2 ms sooner per call than
    our own signature with a training step's arguments (benchmarks/README). Its cache is
    private: never shared with a ``jax.jit`` of the same ``fn``. None when this jaxlib has
    no such dispatch (every call then takes ``cache_miss``)."""
    try:
        return jaxlib_cpp.pjit(getattr(fn, "__name__", "fn"), fn, cache_miss,
                               list(static_argnums), list(static_argnames),
                               pxla.JitGlobalCppCacheKeys(), tree_util.dispatch_registry,
                               pxla.cc_shard_arg, jaxlib_cpp.PjitFunctionCache())
    except (AttributeError, TypeError):  # another jaxlib's pjit or signature: Python's path
        return None


@functools.cache
def _exclude_self_from_metadata() -> None:
    """Keep this file out of the stack traces in the HLO's metadata, as JAX does with its own
    files: the metadata should point at the user's code only."""
    source_info_util.register_exclusion(__file__)


@dataclass
class Lowered:
    jax_lowered: object  # jax.stages.Lowered
    options: Options
    runtime: RuntimeOptions
    name: str

    def as_text(self) -> str:
        return self.jax_lowered.as_text()

    def __getattr__(self, name):  # compiler_ir, in_tree, out_info, args_info, ...: jax's own
        if name.startswith("__") or name == "jax_lowered":
            raise AttributeError(name)
        return getattr(self.jax_lowered, name)

    def compile(self) -> "Compiled":
        compiled = Compiled(self.jax_lowered.compile(), self.name, self.options, self.runtime)
        lifecycle = compiled.lifecycle
        lifecycle.optimized_text = lambda: optimized_hlo_text(compiled.xla_compiled)
        lifecycle.measure = measures(compiled.executor)
        lifecycle.reference = compiled.xla_compiled
        lifecycle.start(compiled._build, self.jax_lowered, earlier_decision=lambda: (
            lifecycle.earlier_decision(compiled.xla_compiled, measures(compiled.executor))))
        return compiled


class Compiled:
    """Like ``jax.stages.Compiled``; calls run XLA's own executable or the stitched one
    (runtime/executor.py decides which; runtime/lifecycle.py builds, dumps and reports)."""

    def __init__(self, xla_compiled, name: str, options: Options,
                 runtime: RuntimeOptions):
        self.xla_compiled = xla_compiled  # jax.stages.Compiled: XLA's own plan, the fallback
        coordinator = coordination.for_job(name)  # None unless the job has several processes
        background = runtime.async_compile and coordinator is None  # peers build in step
        self.lifecycle = Lifecycle(name, options, runtime.cache_dir, background,
                                   runtime.dump_to, remote_cache=runtime.remote_cache,
                                   stitch_at_once=runtime.keep == "stitched")
        self.executor = self.lifecycle.executor = Executor(
            xla_compiled, name, verify=runtime.verify, keep=runtime.keep,
            background=background, info=self.lifecycle.info, coordinator=coordinator)

    @property
    def stitched(self):
        """The jax Compiled running the rewritten module (None until built or if none)."""
        built = self.executor.built
        return built.stitched if built else None

    def wait_built(self, timeout_s: float | None = None) -> bool:
        """Wait for a background build and a background trial that has started (never needed
        for calls); True when neither is running."""
        return self.lifecycle.wait_built(timeout_s)

    def running(self):
        """The jax Compiled that runs the next call (or, on trial, would after it): the stitched
        one, or XLA's own while building, after a fallback, or when XLA's was kept as the
        faster one."""
        stitched = self.executor.runs_stitched() and self.stitched
        return stitched or self.xla_compiled

    def as_text(self) -> str:
        """The HLO XLA executes (our kernels are ``fusionstitching...`` custom calls)."""
        return self.running().as_text()

    def __getattr__(self, name):  # cost_analysis, memory_analysis, args_info, in_tree, ...
        if name.startswith("__") or name in ("executor", "xla_compiled", "lifecycle"):
            raise AttributeError(name)
        return getattr(self.running(), name)

    def report(self) -> Report:
        """The plan of the executable that runs (``fs`` equals ``xla`` when XLA's own runs),
        with the optional ``runtime`` and ``cache`` fields."""
        return self.lifecycle.report()

    def __call__(self, *args, **kwargs):
        return self.executor(*args, **kwargs)

    def dispatch(self, *args, **kwargs):
        """One call from ``StitchedFunction._cache_miss``: (outputs, the dispatch entry of the
        decided executable, False), or (outputs, None, True) while the executor decides."""
        decided = self.executor.decided()
        cache_miss = getattr(getattr(decided, "_call", None), "_cache_miss", None)
        if cache_miss is None:  # deciding, or the executable has no C++ call of its own yet
            return self.executor(*args, **kwargs), None, True
        self.executor.info.calls += 1
        return cache_miss(*args, **kwargs)

    def _build(self, jax_lowered) -> None:
        started = time.perf_counter()
        with self.lifecycle.dumps() as dump_prefix:
            self.lifecycle.build(self.executor, jax_lowered, self.xla_compiled, started,
                                 dump_prefix)
