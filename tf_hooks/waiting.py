"""A step --keras_jit=auto gave XLA, while the job is younger than STITCH_AFTER_S: it runs as
plain TF. ``plain_function`` is TF's function of the step with XLA off; in a caller's graph a
``tf.cond`` reads the ``StitchingSwitch`` a timer turns on, and a ``WaitingStep`` reports the
step until then (tf_hook.py ``Hook._switched_in_graph``).
"""
from __future__ import annotations

import dataclasses
import threading

from fusionstitching import job_clock

from . import flags as flag_parsing


class StitchingSwitch:
    """A boolean TF variable the graphs of waiting steps read: False until the job has run
    STITCH_AFTER_S, when a timer sets it (``turn_on``)."""

    def __init__(self):
        import tensorflow as tf

        self.variable = outside_any_trace(
            lambda: tf.Variable(False, trainable=False, name="fusionstitching_on"))
        self.on = False
        self.delay_s = job_clock.seconds_until_stitching()
        self.timer = threading.Timer(self.delay_s, self.turn_on)
        self.timer.daemon = True
        self.timer.start()

    def turn_on(self) -> None:
        self.variable.assign(True)
        self.on = True


class WaitingStep:
    """A step whose graph runs TF's plain function while the switch is off
    (``Hook._switched_in_graph``): its report until then (its ``TfCompiled``s report after),
    and ``back_to_plain``, a variable of its own that sends the graph to the plain function
    again once TF's plain function won (``settle``)."""

    def __init__(self, concrete, flags: flag_parsing.Flags, switch: StitchingSwitch):
        import tensorflow as tf

        self.name = concrete.name.decode() if isinstance(concrete.name, bytes) \
            else str(concrete.name)
        self.flags, self.switch = flags, switch
        self.back_to_plain = outside_any_trace(
            lambda: tf.Variable(False, trainable=False, name="fusionstitching_plain_again"))
        self.settled_plain = False

    def settle(self, compiled: list) -> None:
        """After a hooked call (``compiled``: the step's ``TfCompiled`` per input shapes): once
        the one called most settled on TF's plain function, and none runs stitched, the graph
        calls the plain function again, inlined, instead of a ``tf.py_function`` per step
        (through one, a Keras convnet's steps ran 1.65x slower)."""
        if self.settled_plain or not compiled:
            return
        main = max(compiled, key=lambda c: c.info.calls)
        if main.info.state in ("settled", "fallback") and \
                not any(c.info.kept == "stitched" for c in compiled):
            self.back_to_plain.assign(True)
            self.settled_plain = True

    def reports(self, wait_s: float = 0.0) -> list:
        from fusionstitching.report import RuntimeInfo, RuntimeReport, fallback_report

        if self.switch.on:
            return []
        base = fallback_report(self.name, self.flags.target, [])
        info = RuntimeInfo(mode="async" if self.flags.async_compile else "sync",
                           state="waiting", kept="plain-tf")
        return [RuntimeReport(**vars(base), runtime=dataclasses.asdict(info))]


def outside_any_trace(make):
    """``make()`` on a thread of its own, where no tf.function is being traced: a variable it
    creates is an ordinary one, which traces capture. Created during a trace, even under
    ``tf.init_scope``, TF allows one only on that function's first trace (Keras retraces its
    predict function for a partial last batch)."""
    made: list = []

    def run():
        try:
            made.append((True, make()))
        except BaseException as exc:  # raised again on the caller's thread
            made.append((False, exc))

    thread = threading.Thread(target=run, name="fusionstitching-variable")
    thread.start()
    thread.join()
    ok, value = made[0]
    if not ok:
        raise value
    return value


def plain_function(concrete):
    """TF's function of ``concrete`` without XLA, made once per concrete function: its
    FunctionDef under a name of its own with ``_XlaMustCompile`` off. A second trace of a
    Keras step without XLA cost a 5.7 s script about a second per shape."""
    plain = getattr(concrete, "_fusionstitching_plain", None)
    if plain is None:
        from tensorflow.core.framework import function_pb2
        from tensorflow.python.eager import context
        from tensorflow.python.eager.polymorphic_function import atomic_function, attributes

        inference = concrete._inference_function
        definition = function_pb2.FunctionDef()
        definition.CopyFrom(inference.cached_definition)
        definition.signature.name += "_fusionstitching_plain"
        definition.attr[attributes.XLA_COMPILE].b = False
        context.context().add_function_def(definition)
        # with the functions it calls (a while loop's body and condition): a graph that calls
        # it must hold them too (a Keras LSTM's step failed to trace without them)
        plain = atomic_function.AtomicFunction(
            definition.signature.name, context.context(), inference.function_type,
            children=list(inference.children), call_options=inference.call_options)
        concrete._fusionstitching_plain = plain
    return plain
