"""Run TF's XLA-compiled functions with stitched kernels (processes with FUSIONSTITCHING=1).

``install`` wraps ``Function.__call__`` of TF's tf.function class once, so every call of a
``tf.function(jit_compile=True)`` (Keras's ``train_function`` included) comes here. Per
concrete function a ``TfCompiled`` takes TF's pre-optimization HLO (inputs, then captured
variables; outputs, then variable updates), makes it a jax function whose compile is the
reference, and builds as for JAX (``runtime.lifecycle``); calls run TF until a ``TfExecutor``
settles, with 64-bit values inside ``jax.enable_x64``. What it cannot handle runs as TF
would, with one warning and a ``fallbacks`` entry.
"""
from __future__ import annotations

import functools
import sys
import threading
import time

from fusionstitching import job_clock
from fusionstitching.logs import log

from . import flags as flag_parsing
from . import keras_jit
from .against_plain import (SAMPLES_WAIT_S, PlainTimes, beyond_reach, remember_plain,
                            tf_module_decisions, xla_best_s)
from .hlo_function import hlo_function, module_avals
from .stitched_call import NotCallable, stitched_step
from .tf_executor import tf_executor
from .tf_module import Signature, Unsupported, signature, split_alias
from .waiting import StitchingSwitch, WaitingStep, plain_function

_hook: "Hook | None" = None  # the installed hook

# -- installation ---------------------------------------------------------------------------


def install(flags: flag_parsing.Flags) -> None:
    """Wrap ``Function.__call__`` of TF's tf.function class (once)."""
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    cls = polymorphic_function.Function
    if hasattr(cls.__call__, "fusionstitching_original"):
        return
    original = cls.__call__
    global _hook
    hook = _hook = Hook(flags, original)

    @functools.wraps(original)
    def __call__(function, *args, **kwargs):
        if not function._jit_compile or function._run_functions_eagerly:
            return original(function, *args, **kwargs)
        return hook.call(function, args, kwargs)

    __call__.fusionstitching_original = original
    cls.__call__ = __call__


def uninstall() -> None:
    """Put TF's own ``Function.__call__`` back (tests; a process normally keeps the hook)."""
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    cls = polymorphic_function.Function
    original = getattr(cls.__call__, "fusionstitching_original", None)
    if original is not None:
        cls.__call__ = original


def last_compiled(function) -> "TfCompiled | None":
    """The most recent ``TfCompiled`` of a tf.function under the installed hook."""
    found = [c for _, c in _hook._compiled.values() if c.function is function] if _hook else []
    return found[-1] if found else None


def install_when_imported(flags: flag_parsing.Flags) -> None:
    from .jax_hook import _AfterImport

    if "tensorflow" in sys.modules:
        install(flags)
    else:
        sys.meta_path.insert(0, _AfterImport("tensorflow", lambda: install(flags)))


# -- per call -------------------------------------------------------------------------------


class Hook:
    """Routes each call of a jit-compiled tf.function to its concrete function's
    ``TfCompiled`` (one per concrete function, created on its first call)."""

    def __init__(self, flags: flag_parsing.Flags, original):
        self.flags = flags
        self.original = original
        self._compiled: dict = {}  # id(concrete function) -> (concrete function, TfCompiled)
        self._lock = threading.Lock()
        self._reported_functions: set = set()
        self._switch: StitchingSwitch | None = None
        self._waiting: dict = {}  # id(concrete function) -> WaitingStep

    def call(self, function, args, kwargs):
        from tensorflow.python.eager import context
        from tensorflow.python.ops import control_flow_util
        from tensorflow.python.framework import ops

        if control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()):
            return self.original(function, *args, **kwargs)  # XLA compiles it with its caller
        try:
            concrete = function.get_concrete_function(*args, **kwargs)
        except Exception:  # first call creating variables, etc.: TF's own path says why
            return self.original(function, *args, **kwargs)
        flat = concrete.function_type.unpack_inputs(concrete.function_type.bind(*args, **kwargs))
        if not context.executing_eagerly() and self._waits(function) and not _taped(flat, concrete):
            # A step --keras_jit=auto gave XLA, traced into a caller's graph while the job is
            # young: the graph itself picks TF's plain function until the switch turns on
            try:
                return concrete.function_type.pack_output(self._switched_in_graph(
                    function, concrete, flat))
            except Exception as exc:  # never fail the user's job: a Python call per step
                log.warning("%s: its waiting step goes through Python (%s: %s)",
                            concrete.name, type(exc).__name__, _first_line(exc))
                return concrete.function_type.pack_output(self._per_shape_in_graph(
                    function, concrete, flat))
        shapes = call_shapes(flat)
        if shapes is None:
            # A dimension left open (Keras's batch of None inside its train function): TF's
            # XLA compiles per concrete shape at run time, and so is each shape built here.
            return concrete.function_type.pack_output(self._per_shape_in_graph(
                function, concrete, flat))
        compiled = self._compiled_for(function, concrete, shapes, flat)
        if compiled.unsupported:
            return self.original(function, *args, **kwargs)
        if _taped(flat, concrete):
            compiled.note_tf_call("differentiated from outside (a gradient tape watches "
                                  "its inputs or variables)")
            return self.original(function, *args, **kwargs)
        if context.executing_eagerly():
            return concrete.function_type.pack_output(compiled(flat))
        return concrete.function_type.pack_output(compiled.in_graph(flat))

    def _compiled_for(self, function, concrete, shapes: tuple, flat) -> "TfCompiled":
        """The ``TfCompiled`` of ``concrete`` called with inputs of ``shapes``, created and
        started on the first such call (``flat``: its inputs, eager or symbolic)."""
        key = (id(concrete), shapes)
        with self._lock:
            entry = self._compiled.get(key)
            if entry is not None and entry[0] is concrete:
                return entry[1]
            compiled = TfCompiled(function, concrete, self.flags, shapes)
            self._compiled[key] = (concrete, compiled)
            flag_parsing.track(compiled)
        compiled.start(flat)
        return compiled

    def _compiled_of(self, concrete) -> list:
        """The ``TfCompiled`` of each input shapes ``concrete`` was called with."""
        with self._lock:
            return [c for (key, _), (_, c) in self._compiled.items() if key == id(concrete)]

    def _waits(self, function) -> bool:
        """Whether calls of ``function`` run as plain TF for now: a step --keras_jit=auto gave
        XLA, in a job younger than STITCH_AFTER_S."""
        return (self.flags.keras_jit == "auto" and keras_jit.turned_on_here(function)
                and job_clock.seconds_until_stitching() > 0)

    def stitching_switch(self) -> "StitchingSwitch":
        """The process's switch (made by the first step that waits in a graph)."""
        with self._lock:
            if self._switch is None:
                self._switch = StitchingSwitch()
            return self._switch

    def _switched_in_graph(self, function, concrete, flat) -> list:
        """The call inside another function's graph, for a step that waits: a ``tf.cond`` on
        the stitching switch between TF's plain function, called in the graph (no Python per
        call: a ``tf.py_function`` per call cost a Keras convnet's 56 steps 1.06 s of TF
        execution against 0.64 s plain), and the hooked call once the switch is on."""
        import tensorflow as tf

        switch = self.stitching_switch()
        with self._lock:
            step = self._waiting.get(id(concrete))
            if step is None:
                self._waiting[id(concrete)] = step = WaitingStep(concrete, self.flags, switch)
                flag_parsing.track(step)
        outputs = concrete.outputs
        plain = plain_function(concrete)

        def hooked():
            return self._per_shape_in_graph(function, concrete, flat, waiting=step)

        def as_tf():
            results = plain.call_flat(*flat, *concrete.captured_inputs)
            return list(results) if isinstance(results, (list, tuple)) else [results]

        hook_it = tf.logical_and(switch.variable, tf.logical_not(step.back_to_plain))
        results = tf.cond(hook_it, hooked, as_tf, name="fusionstitching_waiting")
        results = list(results) if isinstance(results, (list, tuple)) else [results]
        for result, output in zip(results, outputs):
            result.set_shape(output.shape)
        return results

    def _per_shape_in_graph(self, function, concrete, flat, waiting=None) -> list:
        """The call inside a graph whose inputs have an open dimension: a
        ``tf.py_function`` that runs the ``TfCompiled`` of each call's concrete shapes
        (``waiting``: the step's ``WaitingStep``, told after each call)."""
        import tensorflow as tf

        def run(*values):
            values = list(values)
            compiled = self._compiled_for(function, concrete, call_shapes(values), values)
            results = compiled(values) if not compiled.unsupported else compiled._tf(values)
            if waiting is not None:
                waiting.settle(self._compiled_of(concrete))
            return results

        outputs = concrete.outputs
        results = tf.py_function(run, list(flat), [t.dtype for t in outputs],
                                 name="fusionstitching_call")
        for result, output in zip(results, outputs):
            result.set_shape(output.shape)
        return list(results)


def _taped(flat, concrete) -> bool:
    """Whether a gradient tape watches the call's inputs or variables (TF then runs it)."""
    from tensorflow.python.eager import record
    from tensorflow.python.ops import gradients_util

    return record.could_possibly_record() and gradients_util.PossibleTapeGradientTypes(
        list(flat) + list(concrete.captured_inputs)) != gradients_util.POSSIBLE_GRADIENT_TYPES_NONE


def call_shapes(flat) -> tuple | None:
    """The shapes of a call's flat inputs; None where a tensor's shape is not fully known
    (the call is inside a graph traced with an open dimension)."""
    shapes = []
    for value in flat:
        shape = getattr(value, "shape", None)
        if shape is None:
            shapes.append(None)
        elif not shape.is_fully_defined():
            return None
        else:
            shapes.append(tuple(shape.as_list()))
    return tuple(shapes)


# -- one concrete function ------------------------------------------------------------------


class TfCompiled:
    """One concrete function of a jit-compiled tf.function: which executable runs its calls
    (its build, dumps and report: ``runtime.lifecycle.Lifecycle``, as for JAX)."""

    def __init__(self, function, concrete, flags: flag_parsing.Flags, shapes: tuple):
        from fusionstitching.options import Options
        from fusionstitching.runtime.cache import default_dir
        from fusionstitching.runtime.lifecycle import Lifecycle, share_cache

        self.function, self.concrete, self.flags = function, concrete, flags
        self.shapes = shapes  # of the flat inputs of the calls it runs
        self.name = concrete.name.decode() if isinstance(concrete.name, bytes) \
            else str(concrete.name)
        open_dims = [s for t, s in zip(concrete.inputs, shapes) if not t.shape.is_fully_defined()]
        if open_dims:  # one TfCompiled per shape: the name says which
            self.name += "." + "_".join("x".join(map(str, s)) for s in open_dims)
        cache_dir = flags.cache_dir if flags.cache_dir is not None else default_dir()
        if flags.cache_group is not None:
            share_cache(cache_dir, flags.cache_group)
        options = Options(target=flags.target, explorer=flags.explorer,
                          cost_model=flags.cost_model, ptxas=False)
        self.lifecycle = Lifecycle(self.name, options, cache_dir, flags.async_compile,
                                   flags.dump_to, module_name=self.name,
                                   remote_cache=flags.remote_cache,
                                   stitch_at_once=flags.keep == "stitched")
        self.info = self.lifecycle.info
        self.unsupported: str | None = None
        self.signature: Signature | None = None
        self._noted: set = set()
        self._step = None  # the stitched step, TF's call of (inputs, variable handles)
        # --keras_jit=auto turned XLA on for this step: plain TF runs it until the job has run
        # STITCH_AFTER_S, and only then is TF's HLO taken and built (``start``)
        self.waiting = flags.keras_jit == "auto" and keras_jit.turned_on_here(function)
        # ... and TF's own function for it stays the plain one (``_tf``): the stitched step
        # must beat what the script runs without the flag, not TF's XLA (a Keras convnet's
        # step on XLA:CPU took 59 ms, stitched 23 ms, plain TF about 10 ms)
        self.plain_reference = self.waiting
        self.plain_times = PlainTimes()  # of its calls while building (against_plain.py)

    @property
    def executor(self):
        """The ``tf_executor()`` of this function, set once built: until then TF runs calls."""
        return self.lifecycle.executor

    # -- build ------------------------------------------------------------------------
    def start(self, flat: list) -> None:
        """Take TF's HLO for this call's input shapes now (``flat``: its flat inputs, eager
        or symbolic), build at once or on a background thread; a waiting step, once the job
        has run STITCH_AFTER_S (its first call after that starts it)."""
        from tensorflow.python.distribute import distribute_lib
        from tensorflow.python.framework import ops

        if self.waiting:
            if job_clock.seconds_until_stitching() > 0:
                self.info.state, self.info.kept = "waiting", "plain-tf"
                return
            self.waiting = False
            self.info.kept = "tf"

        if distribute_lib.has_strategy() and ops.inside_function():
            # MirroredStrategy's replica functions: taking TF's HLO from there broke the
            # step's graph (a placeholder of another trace was left unfed)
            self._unsupported("strategy", "called inside a tf.distribute strategy's "
                                          "function; its replicas run as TF")
            return
        try:
            hlo_text = self._tf_hlo(flat)
        except Unsupported as exc:
            self._unsupported("signature", str(exc))
            return
        except Exception as exc:
            self._unsupported("tf-hlo", f"{type(exc).__name__}: {_first_line(exc)}")
            return
        if self.plain_reference and self.flags.keep == "fastest" and \
                self._kept_plain_before(hlo_text):
            return  # nothing compiled, planned or built
        self.lifecycle.start(self._build, hlo_text)

    def _kept_plain_before(self, hlo_text: str) -> bool:
        """Whether an earlier run kept plain TF for TF's module ``hlo_text``
        (``against_plain.py``): the step then settles on it with no executable of ours."""
        store = tf_module_decisions(self.lifecycle, hlo_text)
        stored = store.load() if store is not None else None
        if stored is None or stored.kept != "reference":
            return False
        executor = tf_executor()(None, self.name, verify=True, keep=self.flags.keep,
                                 background=self.flags.async_compile, reference="tf",
                                 info=self.info, compiled=self)
        executor.keep_reference_as_decided(stored)  # its calls run TF's plain function
        self.lifecycle.executor = executor
        return True

    def _tf_hlo(self, flat: list) -> str:
        """TF's module before optimization for inputs of this call's shapes, as
        ``experimental_get_compiler_ir`` takes it, from the flat inputs: zeros stand for
        symbolic ones (TF's HLO depends on shapes only)."""
        import tensorflow as tf
        from tensorflow.python.eager import context
        from tensorflow.python.eager.polymorphic_function import compiler_ir

        with tf.init_scope():
            if not tf.executing_eagerly():
                raise Unsupported("TF 1 graph mode")
            values = [v if hasattr(v, "numpy") else tf.zeros(v.shape, v.dtype) for v in flat]
            text = context.context().get_compiler_ir(
                device_name=compiler_ir.maybe_get_device_name(None), platform_name=None,
                function_name=self.concrete.name, flat_args=values,
                captured_inputs=self.concrete.captured_inputs, stage="hlo")
        return text.decode() if isinstance(text, bytes) else text

    def _build(self, hlo_text: str) -> None:
        import jax

        from fusionstitching.hlo.parser import parse_module
        from fusionstitching.hlo.xla_runner import optimized_hlo_text
        from fusionstitching.runtime.lifecycle import measures
        from fusionstitching.stitched_jit import original_jax_jit

        started = time.perf_counter()
        with jax.enable_x64(True), self.lifecycle.dumps() as dump_prefix:
            try:
                text, alias = split_alias(hlo_text)
                module = parse_module(text, source=f"<tf {self.name}>")
                self.signature = signature(self.concrete, module, alias, self.shapes)
                in_avals, out_avals = module_avals(module)
                run = hlo_function(text, out_avals)
                # jax's own jit also when the jax hook has replaced jax.jit (FUSIONSTITCHING=1).
                # The variables TF updates are donated as TF's cluster donates them: the
                # stitched kernels then write the updates over them (no copy after each).
                lowered = original_jax_jit()(run, keep_unused=True, donate_argnums=sorted(
                    set(alias.values()))).lower(*in_avals)
                reference = lowered.compile()  # TF's module compiled by XLA:CPU (jaxlib)
                if dump_prefix:
                    self._dump(dump_prefix, hlo_text, optimized_hlo_text(reference))
            except Unsupported as exc:
                self._unsupported("signature", str(exc))
                return
            except Exception as exc:  # never fail the user's job: TF's own function runs
                self._unsupported("runtime", f"{type(exc).__name__}: {_first_line(exc)}")
                return
            executor = tf_executor()(reference, self.name, verify=True, keep=self.flags.keep,
                                    background=self.flags.async_compile, reference="tf",
                                    info=self.info, compiled=self)
            lifecycle = self.lifecycle
            lifecycle.optimized_text = lambda: optimized_hlo_text(reference)
            lifecycle.reference, lifecycle.measure = reference, measures(executor)
            stored = lifecycle.earlier_decision(reference, lifecycle.measure)
            if stored is not None and stored.kept == "reference":
                executor.keep_reference_as_decided(stored)  # nothing to plan or build
                lifecycle.executor = executor
                return
            if self.plain_reference and lifecycle.measure:
                # (a synchronous build runs in the call: no plain call to wait for)
                plain_s, samples = self.plain_times.best(
                    SAMPLES_WAIT_S if self.flags.async_compile else 0.0)
                why = beyond_reach(xla_best_s(reference, in_avals), plain_s, samples)
                if why is not None:  # nothing to plan or build
                    executor.decisions = lifecycle.decision_store(reference, lifecycle.measure)
                    executor.keep_reference_unplanned(plain_s, why)
                    remember_plain(lifecycle, hlo_text, executor.info.xla_us, why)
                    lifecycle.executor = executor
                    return
            if self.flags.async_compile and not lifecycle.plan_in_background():
                return  # the job is ending: the planning process goes on, for the next run
            lifecycle.build(executor, lowered, reference, started, dump_prefix)
            if executor.candidate is not None:
                self._make_step(executor, in_avals, out_avals)
            self.lifecycle.executor = executor  # last: the next call may start the trial

    def _make_step(self, executor, in_avals: list, out_avals: tuple) -> None:
        """The stitched step as TF's own XLA call, compiled now by one call on variables of
        its own (TF's compile cache then serves the real variables): a failure leaves the
        function to TF, saying why."""
        import tensorflow as tf

        try:
            step = stitched_step(executor.built.rewritten_hlo, in_avals, out_avals,
                                 self.signature)
            n = self.signature.num_inputs
            scratch = [tf.Variable(tf.zeros(a.shape, a.dtype)) for a in in_avals[n:]]
            step._inference_function.call_flat(
                *[tf.zeros(a.shape, a.dtype) for a in in_avals[:n]],
                *[v.handle for v in scratch])
        except NotCallable as exc:
            executor.fail("tf-call", [], str(exc))
            return
        except Exception as exc:  # never fail the user's job: TF's own function runs
            executor.fail("tf-call", [], f"{type(exc).__name__}: {_first_line(exc)}")
            return
        handles = [handle for handle, _ in self.signature.variables]
        inference = step._inference_function
        self._step = lambda flat: list(inference.call_flat(*flat, *handles))

    def _dump(self, dump_prefix: str, tf_hlo: str, optimized: str) -> None:
        """The modules ``fusionstitching replay`` reads back: TF's module before
        optimization, XLA:CPU's optimized module, and XLA:GPU's for the target when the
        deviceless compiler is there (replay picks ``*after_optimizations.txt``)."""
        from fusionstitching.capture import CaptureError, hlo_for_gpu

        self.lifecycle.write_dump(dump_prefix + ".tf.before_optimizations.txt", tf_hlo)
        self.lifecycle.write_dump(dump_prefix + ".cpu.after_optimizations.txt", optimized)
        try:
            gpu = hlo_for_gpu(tf_hlo, target=self.flags.target)
        except (CaptureError, ValueError, RuntimeError) as exc:
            log.info("%s: no XLA:GPU plan dumped: %s", self.name,
                     _first_line(exc))
        else:
            self.lifecycle.write_dump(
                f"{dump_prefix}.{self.flags.target}.after_optimizations.txt", gpu)

    # -- outcomes ---------------------------------------------------------------------
    def _unsupported(self, stage: str, why: str) -> None:
        from fusionstitching.report import Fallback

        log.warning("%s runs as TF (%s): %s", self.name, stage, why)
        self.unsupported = why
        self.lifecycle.fallbacks.append(Fallback(stage, [], why))
        self.info.state, self.info.kept, self.info.why = "fallback", "tf", f"{stage}: {why}"

    def note_tf_call(self, why: str) -> None:
        """One call ran as TF (the function is otherwise handled): say so once per reason."""
        from fusionstitching.report import Fallback

        if why not in self._noted:
            self._noted.add(why)
            log.warning("%s: a call runs as TF: %s", self.name, why)
            self.lifecycle.fallbacks.append(Fallback("call", [], why))

    # -- calls ------------------------------------------------------------------------
    def __call__(self, flat: list) -> list:
        """Flat outputs of one eager call (``flat``: the function's flat tensor inputs)."""
        import jax

        if self.waiting:
            self.start(flat)
            if self.waiting:
                self.info.calls += 1
                return self._plain_tf(flat)
        executor = self.executor
        if executor is None:  # still building
            self.info.calls += 1
            if not self.plain_reference:
                return self._tf(flat)
            started = time.perf_counter()
            outputs = self._tf(flat)  # TF's eager call returns once it has run
            self.plain_times.add(time.perf_counter() - started)
            return outputs
        with jax.enable_x64(True):
            return executor(flat)

    def in_graph(self, flat: list) -> list:
        """The call inside another function's graph: a ``tf.py_function`` that runs
        ``self`` on the eager values each time that graph runs."""
        import tensorflow as tf

        outputs = self.concrete.outputs
        results = tf.py_function(lambda *values: self(list(values)), list(flat),
                                 [t.dtype for t in outputs], name="fusionstitching_call")
        for result, output in zip(results, outputs):
            result.set_shape(output.shape)
        return list(results)

    def _tf(self, flat: list) -> list:
        """The call as TF runs it without us: its XLA function, or plain for a step that only
        --keras_jit=auto gave XLA."""
        if self.plain_reference:
            return self._plain_tf(flat)
        return list(self.concrete._inference_function.call_flat(
            *flat, *self.concrete.captured_inputs))

    def _plain_tf(self, flat: list) -> list:
        """The call as the script would run it without the flag: TF's function without XLA."""
        return list(plain_function(self.concrete).call_flat(
            *flat, *self.concrete.captured_inputs))

    # -- report -----------------------------------------------------------------------
    def report(self):
        return self.lifecycle.report()

    def reports(self, wait_s: float = 0.0) -> list:
        self.lifecycle.wait_built(wait_s)
        return [self.report()]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
