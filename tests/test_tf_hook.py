"""FUSIONSTITCHING=1 in unchanged TF scripts (benchmarks/tf_scripts/): same losses, weights
and outputs as TF with the stitched kernels running, one warning and TF's result for a
function that cannot be handled, and the module-to-function mapping (input_output_alias).

The scripts run in child processes with the hook enabled the way the start-up .pth does
after ``pip install -e .``; here a ``sitecustomize.py`` in a temporary directory makes the
same call (``tf_hooks.enable_from_environment`` + the TF hook), so the test does not depend
on the package being installed.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from fusionstitching.runtime.decisions import Decision
from fusionstitching.capture import xla_gpu_available
from fusionstitching.cli import main as cli_main
from fusionstitching.hlo.parser import parse_module
from fusionstitching.runtime import ffi
from helpers import elementwise_kernel
from helpers_hook import tf_hook_installed
from tf_hooks import tf_hook
from tf_hooks.hlo_function import hlo_function, module_avals
from tf_hooks.stitched_call import stitched_step
from tf_hooks.tf_module import Signature, signature, split_alias

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "benchmarks", "tf_scripts")

SITECUSTOMIZE = textwrap.dedent("""
    import os
    import tf_hooks
    from tf_hooks import keras_jit
    tf_hooks.enable_from_environment()
    if os.environ.get("KERAS_JIT_ONLY"):  # a reference run: Keras steps on XLA, no hook
        keras_jit.install_when_imported()
""")


def run(script: str, tmp_path, *args: str, flags: str | None = None, out: str = "out",
        keras_jit_only: bool = False):
    """Start ``script`` (a child process); ``flags``: FUSIONSTITCHING_FLAGS with the hook on,
    None: plain TF (``keras_jit_only``: with Keras's steps on XLA, as --keras_jit puts
    them). Returns (process, report path, output path)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSIONSTITCHING")}
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    report = tmp_path / f"{out}.report.json"
    output = tmp_path / f"{out}.{'npy' if 'bert' in script else 'npz'}"
    # KERAS_BACKEND: the Keras scripts are TF scripts (jit_compile=True), whatever the
    # environment running the tests asks for
    env.update(PYTHONPATH=os.pathsep.join([str(site), REPO]), OUT=str(output),
               TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu", KERAS_BACKEND="tensorflow")
    if keras_jit_only:
        env.update(KERAS_JIT_ONLY="1")
    if flags is not None:
        # the builds in the call path, so that each swap comes at a known call
        env.update(FUSIONSTITCHING="1", FUSIONSTITCHING_FLAGS=f"--async=false {flags} "
                                                              f"--report={report} "
                                                              f"--cache_dir={tmp_path / 'cache'}")
    process = subprocess.Popen([sys.executable, os.path.join(SCRIPTS, script), *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
    return process, report, output


def finish(started) -> tuple[dict, str]:
    process = started[0]
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1]), stderr


def compare_runs(script: str, tmp_path, steps: str, flags: str, keras_jit_only=False):
    """Plain TF and the hook side by side (two child processes at once)."""
    plain = run(script, tmp_path, steps, out="tf", keras_jit_only=keras_jit_only)
    hooked = run(script, tmp_path, steps, flags=flags, out="fs")
    (expected, _), (got, stderr) = finish(plain), finish(hooked)
    return expected, got, stderr, plain[2], hooked[2], json.loads(hooked[1].read_text())


def assert_stitched_ran(report: dict, stderr: str) -> None:
    runtime = report["runtime"]
    assert runtime["kept"] == "stitched" and runtime["swapped_at_call"] == 2, \
        (runtime, report["fallbacks"], stderr[-2000:])
    assert report["verify"]["ran"] and report["verify"]["ok"], report["verify"]
    assert 0 < report["fs"]["mem_kernels"] < report["xla"]["mem_kernels"]
    assert report["fs"]["patterns"] > 0


def test_split_alias_reads_tfs_variable_updates_and_removes_them():
    header = ("HloModule a_inference_step_375__.6, input_output_alias={ {1}: (2, {}, "
              "may-alias), {2}: (3, {}, may-alias), {3}: (5, {}, may-alias) }, "
              "entry_computation_layout={(f32[4]{0})->f32[4]{0}}\nENTRY ...")
    text, alias = split_alias(header)
    assert alias == {1: 2, 2: 3, 3: 5}
    assert text == ("HloModule a_inference_step_375__.6, "
                    "entry_computation_layout={(f32[4]{0})->f32[4]{0}}\nENTRY ...")
    assert split_alias("HloModule m\nENTRY ...") == ("HloModule m\nENTRY ...", {})


def test_adam_step_parameters_and_updates_map_to_its_variables():
    tf = pytest.importorskip("tensorflow")

    w = tf.Variable(tf.ones([8, 4]), name="w")
    b = tf.Variable(tf.zeros([4]), name="b")
    optimizer = tf.keras.optimizers.Adam(1e-2)

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.softmax(x @ w + b) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
        return loss

    x = tf.ones([16, 8])
    step(x)
    concrete = step.get_concrete_function(x)
    text, alias = split_alias(step.experimental_get_compiler_ir(x)(stage="hlo"))
    sig = signature(concrete, parse_module(text), alias, ((16, 8),))
    assert sig.num_inputs == 1 and sig.num_outputs == 1
    handles = [h for h, _ in sig.variables]
    by_handle = {id(v.handle): v for v in concrete.variables}
    names = [by_handle[id(h)].name for h in handles]
    written = sorted(names[i] for i in sig.updates)
    # Adam writes w, b, both moments of each and its iteration count; it only reads its
    # learning rate.
    assert written == sorted(n for n in names if "learning_rate" not in n)
    assert any("learning_rate" in n for n in names)
    assert dict(zip(names, (d.name for _, d in sig.variables)))["adam/iteration:0"] == "int64"


@pytest.mark.slow  # 40-90 s: TF start-up, TF's compile and 6 host kernels on 2 shared cores
def test_custom_training_loop_with_adam_same_losses_and_weights(tmp_path):
    expected, got, stderr, plain_out, hooked_out, reports = compare_runs(
        "custom_loop.py", tmp_path, "3", "--keep=stitched")
    np.testing.assert_allclose(got["losses"], expected["losses"], rtol=1e-5)
    plain, hooked = np.load(plain_out), np.load(hooked_out)
    assert sorted(plain) == sorted(hooked)
    for name in plain:
        np.testing.assert_allclose(hooked[name], plain[name], rtol=1e-5, atol=1e-6)
    (report,) = reports
    assert report["schema"] == "fusionstitching.report/1"
    assert_stitched_ran(report, stderr)


def test_call_shapes_are_the_concrete_ones_or_none_where_a_dimension_is_open():
    tf = pytest.importorskip("tensorflow")
    from tf_hooks.tf_hook import call_shapes

    assert call_shapes([tf.zeros([4, 16]), tf.zeros([], tf.int32)]) == ((4, 16), ())

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
    def traced(x):
        assert call_shapes([x]) is None  # inside the trace: the batch is open
        return x

    traced(tf.zeros([4, 16]))


@pytest.mark.slow  # ~40 s: two TF processes, two builds (Keras's partial batch: the test below)
def test_a_function_with_an_open_batch_dimension_is_stitched_per_shape(tmp_path):
    """``input_signature`` with a batch of None, called with batches of 4, 8 and 4 rows: one
    build per concrete shape (as TF's XLA compiles), each stitched and checked."""
    expected, got, stderr, _, _, reports = compare_runs(
        "dynamic_shapes.py", tmp_path, "", "--keep=stitched --verify")
    np.testing.assert_allclose(got["sums"], expected["sums"], rtol=1e-5)
    assert sorted(r["module"].rsplit(".", 1)[-1] for r in reports) == ["4x16", "8x16"]
    for report in reports:
        assert not report["fallbacks"], report["fallbacks"]
        assert report["runtime"]["kept"] == "stitched", report["runtime"]
        assert report["verify"]["ran"] and report["verify"]["ok"], report["verify"]


def test_a_mirrored_strategy_s_replica_function_runs_as_tf_and_says_why(tmp_path):
    """MirroredStrategy over two logical CPUs: the jit-compiled function its replicas call
    runs as TF (taking its HLO inside the replica's trace broke the step), so the job gives
    TF's losses and the report says why."""
    expected, got, stderr, _, _, reports = compare_runs("mirrored_loop.py", tmp_path, "3",
                                                        "--keep=stitched")
    assert got == expected
    assert "tf.distribute strategy" in stderr
    assert reports and all(r["runtime"]["kept"] == "tf" for r in reports)
    assert all([f["stage"] for f in r["fallbacks"]] == ["strategy"] for r in reports)


def test_dump_of_a_hooked_tf_job_replays_offline(tmp_path):
    """``--dump_to`` writes what ``fusionstitching replay`` needs to redo the job's plan
    offline: XLA:CPU's module (and XLA:GPU's for the target, when the deviceless compiler is
    installed), replayed with the same plan and verified against XLA."""

    script = os.path.join(REPO, "tests", "data", "dumps", "tf_layernorm_cpu", "script.py")
    dump = tmp_path / "dump"
    expected, got, stderr, _, _, (report,) = compare_runs(
        script, tmp_path, "", f"--keep=stitched --dump_to={dump}")
    assert got == pytest.approx(expected, rel=1e-5)
    assert report["verify"]["ok"] and report["fs"]["mem_kernels"] == 1, report
    name = "__inference_tf_layernorm_18.0"
    targets = ["cpu", "h100"] if xla_gpu_available() else ["cpu"]
    assert sorted(p.name for p in dump.glob("*after_optimizations.txt")) == \
        [f"{name}.{t}.after_optimizations.txt" for t in targets], stderr[-2000:]

    replayed = []
    for target in targets:  # XLA:CPU's module priced as the job priced it, by this CPU's model
        out = tmp_path / f"replay_{target}.json"
        cost_model = ["--cost_model", "cpu"] if target == "cpu" else []
        assert cli_main(["replay", str(dump / f"{name}.{target}.after_optimizations.txt"),
                         "--verify", "--no-ptxas", "--json", str(out), *cost_model]) == 0
        replayed += json.loads(out.read_text())
    assert replayed[0]["xla"] == report["xla"] and report["xla"]["mem_kernels"] > 1
    assert replayed[0]["target"] == report["target"] == "cpu"
    assert all(replayed[0]["fs"][k] == report["fs"][k] for k in ("kernels", "bytes", "patterns"))
    for r in replayed:
        # XLA:GPU's default plan already has LayerNorm as one Triton kernel
        assert r["verify"]["ok"] and r["fs"]["mem_kernels"] == 1 <= r["xla"]["mem_kernels"], r


# A step with an int64 variable (64-bit values in TF's module) and a LayerNorm to stitch; with
# the hook on, it waits for the background build and trial so the stitched executable runs,
# then reports jax's default dtype, and again after the script enables x64 itself.
X64_SCRIPT = textwrap.dedent("""
    import json, os
    import tensorflow as tf

    counter = tf.Variable(tf.constant(2**40, tf.int64))
    gamma = tf.Variable(tf.ones([256]))
    x = tf.reshape(tf.range(64 * 256, dtype=tf.float32) % 7.0, [64, 256])

    @tf.function(jit_compile=True)
    def step(x):
        counter.assign_add(1)
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        gamma.assign_sub(1e-3 * tf.reduce_mean((x - mean) * tf.math.rsqrt(var + 1e-5), 0))
        return tf.reduce_mean(((x - mean) * tf.math.rsqrt(var + 1e-5) * gamma) ** 2), counter

    hooked = os.environ.get("FUSIONSTITCHING")
    results = [step(x)]
    if hooked:
        from tf_hooks import tf_hook
        compiled = tf_hook.last_compiled(step)
        compiled.lifecycle.builder.join()
    results.append(step(x))  # starts the trial on a background thread
    if hooked:
        compiled.executor.trial_thread.join()
    results += [step(x) for _ in range(2)]

    import jax
    import jax.numpy as jnp
    default = str(jnp.zeros(1).dtype)
    jax.config.update("jax_enable_x64", True)  # the user's own choice, kept by the hook
    results.append(step(x))
    print(json.dumps({"results": [[float(r), int(c)] for r, c in results][-3:],
                      "counter": int(counter.numpy()), "gamma": float(gamma.numpy().sum()),
                      "default": default, "after_user_x64": str(jnp.zeros(1).dtype)}))
""")


def test_hook_keeps_jax_32_bit_default_outside_tfs_module(tmp_path):
    """TF's module runs with 64-bit jax types (its int64 variable keeps its values, built,
    tried on a background thread and run stitched) without switching the process: a hooked
    function leaves ``jnp.zeros(1)`` float32, and a user's own x64 setting stays."""
    script = tmp_path / "x64_scope.py"
    script.write_text(X64_SCRIPT)
    expected, got, stderr, _, _, (report,) = compare_runs(
        str(script), tmp_path, "", "--async --keep=stitched")
    assert got["default"] == "float32" and got["after_user_x64"] == "float64", got
    assert got["counter"] == expected["counter"] == 2**40 + 5
    np.testing.assert_allclose([r for r, _ in got["results"]],
                               [r for r, _ in expected["results"]], rtol=1e-5)
    assert got["gamma"] == pytest.approx(expected["gamma"], rel=1e-6)
    runtime = report["runtime"]
    assert runtime["mode"] == "async" and runtime["trial_call"] == 2, runtime
    assert runtime["kept"] == "stitched" and runtime["swapped_at_call"] == 3, \
        (runtime, report["fallbacks"], stderr[-2000:])
    assert report["verify"]["ran"] and report["verify"]["ok"], report["verify"]
    assert 0 < report["fs"]["mem_kernels"] < report["xla"]["mem_kernels"]


@pytest.mark.slow  # ~60 s: 7 host kernels built on a shared 2-core machine
def test_bert_like_encoder_inference_equals_tf(tmp_path):
    _, _, stderr, plain_out, hooked_out, reports = compare_runs(
        "bert_inference.py", tmp_path, "3", "--keep=stitched")
    np.testing.assert_allclose(np.load(hooked_out), np.load(plain_out), rtol=1e-4, atol=2e-5)
    (report,) = reports
    assert_stitched_ran(report, stderr)


@pytest.mark.slow  # ~2-3 min: the encoder's train step has ~18 stitched patterns to build
@pytest.mark.parametrize("steps", ["3", "20"])
def test_keras_encoder_fit_same_losses_and_weights(tmp_path, steps):
    """Keras 3 ``fit`` on the TF backend (a Keras/TF training script): every step's loss and
    the trained weights as plain TF's, the train step stitched and verified."""
    pytest.importorskip("keras", minversion="3")
    expected, got, stderr, plain_out, hooked_out, reports = compare_runs(
        "keras_encoder.py", tmp_path, steps, "--keep=stitched --verify")
    assert len(got["losses"]) == int(steps)
    np.testing.assert_allclose(got["losses"], expected["losses"], rtol=1e-5)
    plain, hooked = np.load(plain_out), np.load(hooked_out)
    for name in plain:
        np.testing.assert_allclose(hooked[name], plain[name], rtol=1e-5, atol=1e-6)
    (report,) = reports
    assert "one_step_on_data" in report["module"]
    assert_stitched_ran(report, stderr)


# An Adam-like step on one variable: our kernel computes the update (v + x), XLA the output.
STEP_HLO = """HloModule step
ENTRY %main (x: f32[8], v: f32[8]) -> (f32[8], f32[8]) {{
  %x = f32[8] parameter(0)
  %v = f32[8] parameter(1)
  %update = f32[8] custom-call(%v, %x), custom_call_target="{target}", api_version=API_VERSION_TYPED_FFI
  %output = f32[8] multiply(%update, %x)
  ROOT %results = (f32[8], f32[8]) tuple(%output, %update)
}}
"""


def test_stitched_step_runs_our_kernel_inside_tfs_xla_and_assigns_the_update():
    """The swapped-in TF step: TF's XLA runs the module with our FFI kernel (registered with
    the XLA TensorFlow links), reads the variable and assigns the update; outputs and the
    variable equal jaxlib's XLA running the same module."""
    tf = pytest.importorskip("tensorflow")

    target = ffi.register_kernel("fusionstitching_test_tf_step",
                                 elementwise_kernel("tf_step_add", 8, [("fadd", 0, 1)]), 2, 1)
    text = STEP_HLO.format(target=target)
    in_avals, out_avals = module_avals(parse_module(text))
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    start = np.arange(8, dtype=np.float32)
    variable = tf.Variable(start)
    sig = Signature(num_inputs=1, variables=((variable.handle, tf.float32),), num_outputs=1,
                    updates=(0,))
    with jax.enable_x64(True):
        step = stitched_step(text, in_avals, out_avals, sig)
        expected = [np.asarray(r) for r in jax.jit(hlo_function(text, out_avals))(x, start)]
    (output,) = step._inference_function.call_flat(tf.constant(x), variable.handle)
    np.testing.assert_array_equal(output.numpy(), expected[0])
    np.testing.assert_array_equal(variable.numpy(), expected[1])
    np.testing.assert_array_equal(expected[1], start + x)  # the kernel ran, not a no-op


def test_handlers_are_not_registered_with_an_xla_speaking_an_older_ffi():
    """An XLA whose FFI API is older than the handlers' (0.2) is refused with the versions
    named, before anything is registered: the TF step then stays TF's."""

    api = ffi._FfiApi(ctypes.sizeof(ffi._FfiApi), None, 24, None, 0, 1)
    with pytest.raises(RuntimeError, match=r"FFI API 0\.1.*need 0\.2"):
        ffi.register_with(ctypes.addressof(api), ["fusionstitching_anything"])


@pytest.mark.slow  # ~2 min: six step modules (train, test, predict at 32 and 4 rows) to build
def test_a_keras_script_with_default_jit_and_a_partial_batch_runs_stitched(tmp_path):
    """Keras 3 on TF, ``compile()`` at its defaults, 100 rows in batches of 32: with the env
    var and one flag (--keep=stitched, which gives the steps XLA from their first call)
    train, test and predict run stitched, at both batch sizes, with the losses and
    predictions of TF's XLA."""
    pytest.importorskip("keras", minversion="3")
    expected, got, stderr, plain_out, hooked_out, reports = compare_runs(
        "keras_tabular.py", tmp_path, "", "--keep=stitched --verify",
        keras_jit_only=True)
    np.testing.assert_allclose(got["losses"], expected["losses"], rtol=1e-4)
    np.testing.assert_allclose(got["evaluate"], expected["evaluate"], rtol=1e-4)
    assert got["predict"] == pytest.approx(expected["predict"], rel=1e-4)
    # Keras names all three step functions one_step_on_data; a function traced with an open
    # batch dimension has one build per batch size, named by its input shapes
    modules = [r["module"] for r in reports]
    assert len(modules) == 6 and sum(".4x30" in m for m in modules) == 3, modules
    for report in reports:
        assert not report["fallbacks"], (report["module"], report["fallbacks"])
        assert report["runtime"]["kept"] == "stitched", (report["module"], report["runtime"])
        assert report["verify"]["ran"] and report["verify"]["ok"], report["verify"]


def test_a_short_keras_script_under_the_default_flags_runs_as_plain_tf_and_says_so(tmp_path):
    """Keras 3 on TF at its defaults, a job of a few seconds: --keras_jit=auto leaves its
    steps to plain TF (the same losses, bit for bit), and the exit notice says why."""
    pytest.importorskip("keras", minversion="3")
    expected, got, stderr, _, _, reports = compare_runs("keras_tabular.py", tmp_path, "", "")
    assert got == expected
    assert reports and all(r["runtime"]["state"] == "waiting" for r in reports), reports
    assert "ran as plain TF" in stderr and "--keras_jit=always" in stderr, stderr[-2000:]


def test_a_step_called_under_a_gradient_tape_runs_as_tf_and_says_so(tmp_path):
    """A gradient tape watching a jit-compiled function's inputs: TF runs the call (its
    gradient is TF's), once noted in the fallbacks."""
    tf = pytest.importorskip("tensorflow")
    with tf_hook_installed(tmp_path, async_compile=False, keep="stitched"):
        @tf.function(jit_compile=True)
        def f(x):
            return tf.reduce_sum(tf.exp(x) * x)

        x = tf.reshape(tf.range(16, dtype=tf.float32) / 16.0, [2, 8])
        f(x)  # built
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = f(x)
        plain = tf.function(f.python_function, jit_compile=True)  # TF's own, not hooked
        with tf.GradientTape() as plain_tape:
            plain_tape.watch(x)
            y_plain = tf_hook._hook.original(plain, x)
        np.testing.assert_array_equal(tape.gradient(y, x).numpy(),
                                      plain_tape.gradient(y_plain, x).numpy())
        fallbacks = tf_hook.last_compiled(f).report().fallbacks
        assert [fb.stage for fb in fallbacks] == ["call"], fallbacks
        assert "gradient tape" in fallbacks[0].reason


def test_a_tf_step_whose_earlier_decision_kept_tf_builds_nothing(tmp_path):
    """A decision an earlier run kept for TF's own function: the next run's TfCompiled
    settles on it as soon as it has XLA's module, with no planning and no build."""
    tf = pytest.importorskip("tensorflow")

    @tf.function(jit_compile=True)
    def step(x):
        return tf.reduce_sum(tf.exp(x) * x, axis=1)

    x = tf.reshape(tf.range(32, dtype=tf.float32) / 32.0, [4, 8])
    with tf_hook_installed(tmp_path, async_compile=False, keep="fastest"):
        step(x)
        first = tf_hook.last_compiled(step)
        assert first.executor.built is not None
        first.executor.decisions.save(Decision("reference", 10.0, 20.0, "measured in a test"))
    # the next run: a new hook
    with tf_hook_installed(tmp_path, async_compile=False, keep="fastest"):
        np.testing.assert_array_equal(step(x).numpy(),
                                      tf_hook._hook.original(step, x).numpy())
        again = tf_hook.last_compiled(step)
        assert again is not first and again.executor.built is None
        assert again.info.state == "settled" and again.info.kept == "tf", again.info
        assert again.info.why.startswith("decided by an earlier run on this machine")


def test_a_background_tf_build_loads_the_plan_of_the_jobs_planning_process(tmp_path):
    """With --async, a TF step is planned by the job's planning process (planning on the
    build thread held the GIL the training loop needs) and its build loads the plan."""
    tf = pytest.importorskip("tensorflow")
    with tf_hook_installed(tmp_path, async_compile=True, keep="stitched"):
        @tf.function(jit_compile=True)
        def step(x):
            return tf.reduce_sum(tf.exp(x * 0.5 - 1.0), axis=1)

        x = tf.reshape(tf.range(32, dtype=tf.float32) / 32.0, [4, 8])
        step(x)
        compiled = tf_hook.last_compiled(step)
        assert compiled.lifecycle.wait_built(300)
        assert compiled.lifecycle._planning_started
        assert compiled.report().cache["plan"] == "hit", compiled.report().cache
