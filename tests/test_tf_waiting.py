"""A step --keras_jit=auto gave XLA while the job is young (tf_hooks/waiting.py): plain TF
runs it, inside its caller's graph behind the stitching switch, until the job has run
STITCH_AFTER_S; once plain TF wins the graph calls it inlined again."""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # Keras's own default, made explicit

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fusionstitching import job_clock  # noqa: E402
from helpers_hook import tf_hook_installed  # noqa: E402
from tf_hooks import against_plain, flags as flag_parsing, keras_jit, tf_hook  # noqa: E402


@pytest.fixture
def young_job(tmp_path, monkeypatch):
    """The hook installed (builds in the call, kept stitched) in a job whose clock reads
    ``clock[0]`` (0: younger than STITCH_AFTER_S, 30 s here), every step one --keras_jit=auto
    turned on; yields the clock."""
    pytest.importorskip("tensorflow")
    clock = [0.0]
    monkeypatch.setattr(job_clock, "job_seconds", lambda: clock[0])
    monkeypatch.setattr(job_clock, "STITCH_AFTER_S", 30.0)
    monkeypatch.setattr(keras_jit, "turned_on_here", lambda function: True)
    monkeypatch.setattr(flag_parsing, "_functions", [])
    with tf_hook_installed(tmp_path, async_compile=False, keep="stitched"):
        yield clock


def halving_step(tf):
    """(scale, step): a jit-compiled step that halves the variable ``scale`` at each call."""
    scale = tf.Variable(tf.ones([8]))

    @tf.function(jit_compile=True)
    def step(x):
        scale.assign(scale * 0.5)
        return tf.reduce_sum(tf.exp(x * scale - 1.0), axis=1)

    return scale, step


def test_a_step_keras_jit_turned_on_runs_as_plain_tf_until_the_job_has_run_a_while(young_job):
    """--keras_jit=auto: a step given XLA by the flag runs as plain TF (no XLA compile, TF's
    own numbers) while the job is younger than STITCH_AFTER_S; its first call after that takes
    TF's HLO and builds."""
    import tensorflow as tf

    clock = young_job
    scale, step = halving_step(tf)
    x = tf.reshape(tf.range(32, dtype=tf.float32) / 32.0, [4, 8])
    plain = tf.function(step.python_function)
    first = step(x).numpy()
    compiled = tf_hook.last_compiled(step)
    assert compiled.info.state == "waiting" and compiled.executor is None
    plain_copy = compiled.concrete._fusionstitching_plain  # ran TF's function, XLA off
    assert not plain_copy.cached_definition.attr["_XlaMustCompile"].b
    scale.assign(tf.ones([8]))
    np.testing.assert_array_equal(first, plain(x).numpy())  # TF's own bits

    clock[0] = 1e9  # the job has run long enough
    scale.assign(tf.ones([8]))
    np.testing.assert_allclose(step(x).numpy(), first, rtol=1e-6)
    assert not compiled.waiting and compiled.executor is not None
    assert compiled.info.state != "waiting", compiled.info


def test_a_waiting_step_inside_a_graph_runs_tf_plain_function_until_the_switch_turns_on(
        young_job):
    """A step --keras_jit=auto gave XLA, called inside another function's graph (Keras's
    train function) while the job is young: the graph picks TF's plain function with a
    tf.cond on the stitching switch (no Python per call), the exit report says it waits, and
    once the timer turns the switch on, the same graph runs the step stitched."""
    import tensorflow as tf

    clock = young_job
    scale, step = halving_step(tf)

    @tf.function
    def train(x):
        return step(x) + 1.0

    x = tf.reshape(tf.range(32, dtype=tf.float32) / 32.0, [4, 8])
    plain = tf.function(lambda x: tf.function(step.python_function)(x) + 1.0)
    first = train(x).numpy()
    switch = tf_hook._hook.stitching_switch()
    assert switch.delay_s == pytest.approx(30.0) and not switch.on
    graph = train.get_concrete_function(x).graph.as_graph_def()
    ops = {node.op for node in graph.node}
    assert "EagerPyFunc" not in ops and ({"If", "StatelessIf"} & ops), ops
    assert tf_hook.last_compiled(step) is None  # nothing taken from TF yet
    [report] = [r for f in flag_parsing._functions for r in f.reports()]
    assert report.runtime["state"] == "waiting" and report.runtime["kept"] == "plain-tf"
    scale.assign(tf.ones([8]))
    np.testing.assert_array_equal(first, plain(x).numpy())  # TF's own bits

    clock[0] = 1e9
    switch.turn_on()
    scale.assign(tf.ones([8]))
    np.testing.assert_allclose(train(x).numpy(), first, rtol=1e-6)
    compiled = tf_hook.last_compiled(step)
    assert compiled is not None and compiled.executor is not None
    assert compiled.info.kept == "stitched", compiled.info
    reports = [r for f in flag_parsing._functions for r in f.reports()]
    assert [r.runtime["kept"] for r in reports] == ["stitched"], reports


def test_keras_jit_marks_only_the_steps_its_auto_resolution_turned_on():
    """--keras_jit=auto waits only with the steps it gave XLA: a model compiled with the
    default jit_compile="auto" is marked, one compiled with an explicit jit_compile=True is
    the user's XLA (its step builds from the first call), even when Keras resolved "auto"
    for it before compile."""
    keras = pytest.importorskip("keras", minversion="3")
    if keras.backend.backend() != "tensorflow":
        pytest.skip(f"KERAS_BACKEND={keras.backend.backend()} was chosen for this process: "
                    "--keras_jit acts on Keras's TF backend only")
    keras_jit.install()

    def model():
        inputs = keras.Input((4,))
        return keras.Model(inputs, keras.layers.Dense(2)(inputs))

    auto, explicit = model(), model()
    auto.compile(optimizer="sgd", loss="mse")
    assert explicit.jit_compile  # Keras resolves "auto" here (and again in compile)
    explicit.compile(optimizer="sgd", loss="mse", jit_compile=True)
    assert auto.jit_compile and explicit.jit_compile
    assert auto._fusionstitching_auto_jit is True
    assert explicit._fusionstitching_auto_jit is False


def test_a_waiting_step_whose_plain_function_won_runs_it_inlined_again(young_job, monkeypatch):
    """Once a switched step's TfCompiled settles on TF's plain function (here: its build
    fails), the graph calls the plain function again instead of a tf.py_function per step."""
    import tensorflow as tf

    monkeypatch.setattr(tf_hook.TfCompiled, "_build",
                        lambda self, text: self._unsupported("runtime", "not built here"))

    @tf.function(jit_compile=True)
    def step(x):
        return tf.reduce_sum(tf.exp(x), axis=1)

    @tf.function
    def train(x):
        return step(x) * 2.0

    x = tf.reshape(tf.range(32, dtype=tf.float32) / 32.0, [4, 8])
    first = train(x).numpy()
    young_job[0] = 1e9
    tf_hook._hook.stitching_switch().turn_on()
    np.testing.assert_array_equal(train(x).numpy(), first)  # hooked: the build fails
    compiled = tf_hook.last_compiled(step)
    assert compiled.info.state == "fallback" and compiled.info.kept == "tf"
    [waiting] = tf_hook._hook._waiting.values()
    assert waiting.settled_plain and bool(waiting.back_to_plain.numpy())
    calls = compiled.info.calls
    for _ in range(3):
        np.testing.assert_array_equal(train(x).numpy(), first)
    assert compiled.info.calls == calls  # no call reached Python


def test_a_waiting_step_with_a_while_loop_traces_into_its_callers_graph(young_job):
    """TF's plain function of a step with a while loop (a Keras LSTM's) calls the loop's body
    and condition: in a caller's graph it brings them along (it failed to trace without)."""
    import tensorflow as tf

    @tf.function(jit_compile=True)
    def step(x):
        _, total = tf.while_loop(lambda i, acc: i < 3,
                                 lambda i, acc: (i + 1, acc * 0.5 + tf.tanh(x)),
                                 (tf.constant(0), tf.zeros_like(x)))
        return tf.reduce_sum(total, axis=1)

    @tf.function
    def train(x):
        return step(x) + 1.0

    x = tf.reshape(tf.range(32, dtype=tf.float32) / 32.0, [4, 8])
    plain = tf.function(lambda x: tf.function(step.python_function)(x) + 1.0)
    np.testing.assert_array_equal(train(x).numpy(), plain(x).numpy())
    ops = {n.op for n in train.get_concrete_function(x).graph.as_graph_def().node}
    assert "EagerPyFunc" not in ops and ({"If", "StatelessIf"} & ops), ops


def test_a_step_whose_xla_is_far_slower_than_plain_tf_stays_plain_and_is_never_planned(
        tmp_path, monkeypatch):
    """A step --keras_jit=auto gave XLA, in a job old enough to stitch, whose XLA:CPU
    executable runs more than XLA_BEYOND_REACH times its plain TF calls (the threshold is set
    to 0 here: any step is): no planning process and no build; it settles on plain TF, both
    times in its why, and the next run of the job starts with that decision, compiling
    nothing."""
    tf = pytest.importorskip("tensorflow")
    monkeypatch.setattr(job_clock, "job_seconds", lambda: 1e9)
    monkeypatch.setattr(keras_jit, "turned_on_here", lambda function: True)
    monkeypatch.setattr(flag_parsing, "_functions", [])
    monkeypatch.setattr(against_plain, "XLA_BEYOND_REACH", 0.0)
    x = tf.reshape(tf.range(32, dtype=tf.float32) / 32.0, [4, 8])
    whys = []
    for run in range(2):  # the job, then its next run
        with tf_hook_installed(tmp_path, async_compile=True, keep="fastest"):
            scale, step = halving_step(tf)
            plain = tf.function(step.python_function)
            got = [step(x).numpy() for _ in range(against_plain.PLAIN_SAMPLES + 1)]
            compiled = tf_hook.last_compiled(step)
            assert compiled.lifecycle.wait_built(60)
            scale.assign(tf.ones([8]))
            for result in got:  # every call ran plain TF: its own bits
                np.testing.assert_array_equal(result, plain(x).numpy())
            info = compiled.info
            assert info.state == "settled" and info.kept == "tf", info
            assert compiled.executor.built is None and not compiled.lifecycle._planning_started
            assert info.xla_us > 0 and info.stitched_us is None
            # the next run finds the decision under TF's module: no XLA:CPU compile at all
            assert (compiled.executor.xla is None) == (run == 1), compiled.executor.xla
            whys.append(info.why)
    assert "XLA:CPU ran it in" in whys[0] and "plain TF in" in whys[0], whys
    assert whys[1].startswith("decided by an earlier run") and whys[0] in whys[1], whys
