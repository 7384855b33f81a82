"""FUSIONSTITCHING=1: flag parsing, the start-up .pth (inert without the variable), jax.jit
replaced in an unchanged script, the report written at exit."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tf_hooks import flags

from benchmarks.bench_training_loop import REPO
from benchmarks.bench_training_loop import WITH_REPOSITORY_HOOK as WITH_PTH

SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["JAX_PLATFORMS"] = "cpu"
    print("jax imported at start-up:", "jax" in sys.modules)
    import jax
    from jax._src import api
    print("jax.jit replaced:", jax.jit is not api.jit)

    @jax.jit
    def layernorm(x):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5)

    x = jax.numpy.arange(16 * 64, dtype="float32").reshape(16, 64) / 100
    for _ in range(2):
        y = layernorm(x)
    print("max |y - jax|:", float(abs(y - api.jit(layernorm.__wrapped__)(x)).max()))
""")


def run_script(tmp_path, env: dict) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FUSIONSTITCHING")}
    full_env.update(env, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, *WITH_PTH, str(script)], capture_output=True,
                          text=True, timeout=300, env=full_env)


def run_hooked(tmp_path, source: str, flags: str = "") -> subprocess.CompletedProcess:
    """``source`` as a script under FUSIONSTITCHING=1 with ``flags`` and a cache of its own."""
    script = tmp_path / "job.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSIONSTITCHING")}
    return subprocess.run([sys.executable, *WITH_PTH, str(script)], capture_output=True,
                          text=True, timeout=300, env=dict(
                              env, PYTHONPATH=REPO, JAX_PLATFORMS="cpu", FUSIONSTITCHING="1",
                              FUSIONSTITCHING_FLAGS=f"{flags} --cache_dir={tmp_path / 'cache'}"))


def test_parse_flags():
    parsed, problems = flags.parse("--async --verify=false --target=a100 --explorer=greedy "
                                   "--cache_dir=/c --dump_to='/d d' --report=/r.json "
                                   "--keep=stitched --remote_cache=redis://h:6379/2 "
                                   "--keras_jit=false --cost_model=gpu")
    assert parsed == flags.Flags(async_compile=True, verify=False, target="a100",
                                 explorer="greedy", cache_dir="/c", dump_to="/d d",
                                 report="/r.json", keep="stitched",
                                 remote_cache="redis://h:6379/2", keras_jit="false",
                                 cost_model="gpu")
    assert not problems
    # --keras_jit was a boolean: its words still mean what they did
    assert [flags.parse(text)[0].keras_jit for text in
            ("", "--keras_jit", "--keras_jit=true", "--keras_jit=auto", "--keras_jit=0")] == \
        ["auto", "always", "always", "auto", "false"]
    assert "expected one of auto, always, false" in flags.parse("--keras_jit=maybe")[1][0]
    assert "expected one of auto, gpu, cpu" in flags.parse("--cost_model=tpu")[1][0]
    assert parsed.jit_options() == {"async_compile": True, "verify": False, "target": "a100",
                                    "explorer": "greedy", "cost_model": "gpu",
                                    "dump_to": "/d d",
                                    "keep": "stitched", "cache_dir": "/c",
                                    "remote_cache": "redis://h:6379/2"}


def test_builds_run_off_the_call_path_unless_asked_otherwise():
    assert flags.parse("")[0].async_compile is True
    assert flags.parse("--async=false")[0].async_compile is False


def test_keep_stitched_alone_stitches_every_step_from_its_first_call():
    """--keep=stitched is the one flag of a user who wants the stitched kernels: builds in
    the call and Keras's steps on XLA from the first call, unless those flags say otherwise."""
    parsed, problems = flags.parse("--keep=stitched")
    assert not problems
    assert (parsed.async_compile, parsed.keras_jit) == (False, "always")
    parsed, _ = flags.parse("--keep=stitched --async --keras_jit=auto")
    assert (parsed.async_compile, parsed.keras_jit) == (True, "auto")


def test_bad_flags_are_named_and_ignored():
    parsed, problems = flags.parse("--verify --asynch --target=tpu --report -x --keep=slow "
                                   "--explorer=dp")
    assert parsed == flags.Flags(verify=True)
    assert len(problems) == 6 and any("'--explorer=dp': expected one of beam, greedy" in p
                                      for p in problems)
    assert any("--asynch" in p for p in problems) and any("tpu" in p for p in problems)
    assert any("needs a value" in p for p in problems)


def test_one_warning_for_bad_flags(caplog):
    with caplog.at_level("WARNING", logger="fusionstitching"):
        parsed = flags.from_environment({"FUSIONSTITCHING_FLAGS": "--async --nope --bad=1"})
    assert parsed.async_compile
    (record,) = caplog.records
    assert "--nope" in record.getMessage() and "--bad=1" in record.getMessage()


@pytest.mark.parametrize("value, on", [("1", True), ("yes", True), ("0", False), ("", False),
                                       ("off", False)])
def test_enabled(value, on):
    assert flags.enabled({"FUSIONSTITCHING": value}) is on
    assert flags.enabled({}) is False


def test_without_the_variable_nothing_changes(tmp_path):
    probe = tmp_path / "probe.py"
    # tf_hooks itself is read at start-up (its quiet start, ~2 ms); no framework and not the
    # fusionstitching package.
    probe.write_text("import sys\nprint('fusionstitching' in sys.modules, 'jax' in sys.modules)\n"
                     "import jax\nfrom jax._src import api\nprint(jax.jit is api.jit)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSIONSTITCHING")}
    run = subprocess.run([sys.executable, *WITH_PTH, str(probe)], capture_output=True,
                         text=True, timeout=120, env=dict(env, PYTHONPATH=REPO,
                                                          JAX_PLATFORMS="cpu"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False", "True"]


def test_a_young_jobs_calls_load_no_compiler(tmp_path):
    """Before STITCH_AFTER_S nothing is planned or built, so the hooked calls load neither the
    code generator nor the parser (0.4 s of imports a process, on scripts of 5-10 s)."""
    run = run_hooked(tmp_path, "import sys, jax\nf = jax.jit(lambda x: x + 1)\n"
                     "f(jax.numpy.ones(4)); f(jax.numpy.ones(4))\n"
                     "print(sorted(m for m in sys.modules if m.startswith((\n"
                     "    'fusionstitching.codegen', 'fusionstitching.pipeline',\n"
                     "    'fusionstitching.explorer', 'fusionstitching.hlo.parser'))))\n")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "[]", run.stdout


def test_unchanged_script_is_stitched_and_reported(tmp_path):
    report_path = tmp_path / "reports.json"
    run = run_script(tmp_path, {
        "FUSIONSTITCHING": "1",
        "FUSIONSTITCHING_FLAGS": f"--async=false --verify --keep=stitched "
                                 f"--cache_dir={tmp_path / 'cache'} "
                                 f"--dump_to={tmp_path / 'dump'} --report={report_path} "
                                 "--explorer=greedy --frobnicate"})
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0] == "jax imported at start-up: False"  # the hook waits for the import
    assert lines[1] == "jax.jit replaced: True"
    assert float(lines[2].split(":")[1]) < 1e-5
    warnings = [line for line in run.stderr.splitlines() if "FUSIONSTITCHING_FLAGS" in line]
    assert len(warnings) == 1 and "--frobnicate" in warnings[0]
    assert "--explorer=greedy" not in warnings[0]  # a known flag, passed to the pipeline
    assert "nothing was stitched" not in run.stderr

    (report,) = json.loads(report_path.read_text())
    assert report["schema"] == "fusionstitching.report/1"
    assert report["module"].startswith("jit_layernorm")
    assert report["verify"]["ran"] and report["verify"]["ok"]
    assert report["runtime"]["kept"] == "stitched" and report["runtime"]["calls"] == 2
    assert report["fs"]["mem_kernels"] < report["xla"]["mem_kernels"]
    dumped = sorted(p.name for p in (tmp_path / "dump").iterdir())
    assert any(n.endswith(".xla.hlo.txt") for n in dumped)
    assert any(n.endswith(".rewritten.hlo.txt") for n in dumped)
    dumped_report = [n for n in dumped if n.endswith(".report.json")]
    assert dumped_report
    assert json.loads((tmp_path / "dump" / dumped_report[0]).read_text())["fs"] == report["fs"]


@pytest.mark.parametrize("body, flag, why", [
    ("x = jax.numpy.ones(4) + 1", "", "no function of this process was compiled with XLA"),
    ("f = jax.jit(lambda x: x + 1)\nf(jax.numpy.ones(4)); f(jax.numpy.ones(4))",
     "--async=false", "1 compiled functions ran their own kernels (1x settled: "),
    ("f = jax.jit(lambda x: x + 1)\nf(jax.numpy.ones(4))",  # shorter than STITCH_AFTER_S
     "", "(1x the job ended before stitching starts (30 s into a job")])
def test_a_job_that_stitched_nothing_says_so_once_at_exit(tmp_path, body, flag, why):
    run = run_hooked(tmp_path, f"import jax\n{body}\n", flag)
    assert run.returncode == 0, run.stderr[-3000:]
    (notice,) = [line for line in run.stderr.splitlines() if "nothing was stitched" in line]
    assert notice.startswith("fusionstitching: ") and why in notice, notice


@pytest.mark.slow
def test_pip_install_editable_puts_the_hook_in_site_packages(tmp_path):
    """The real install route: a fresh venv (system packages for jax etc.), pip install -e."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-deps",
                          "--no-build-isolation", "-e", REPO], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-3000:]
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.exists(os.path.join(site, "fusionstitching_hook.pth"))
    script = tmp_path / "s.py"
    script.write_text("import jax\nprint(hasattr(jax.jit, 'fusionstitching_original'))\n")
    for value, expected in (("1", "True"), ("0", "False")):
        run = subprocess.run([str(venv / "bin" / "python"), str(script)], capture_output=True,
                             text=True, cwd=tmp_path,
                             env=dict(os.environ, FUSIONSTITCHING=value, JAX_PLATFORMS="cpu"))
        assert run.stdout.strip() == expected, run.stderr[-2000:]
    shutil.rmtree(venv)


# -- the replaced jax.jit behaves like jax.jit (in this process, restored after each test) ----

@pytest.fixture
def hooked(monkeypatch, tmp_path_factory):
    """``jax.jit`` replaced by the hook as FUSIONSTITCHING=1 does (stitched executable kept,
    outputs verified); returns jax's own jit for comparison."""
    import jax

    from tf_hooks import jax_hook

    original = jax.jit
    monkeypatch.setattr(jax, "jit", original)  # undone after the test
    cache_dir = str(tmp_path_factory.getbasetemp() / "hook-api-cache")  # shared by the tests
    jax_hook.install(flags.Flags(async_compile=False, keep="stitched", verify=True,
                                 cache_dir=cache_dir))
    assert jax.jit is not original
    return original


def layernorm(x, scale=1.0):
    import jax

    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale


def rows():
    import numpy as np

    return np.random.default_rng(5).standard_normal((8, 128)).astype(np.float32)


def assert_same(got, want):
    import jax
    import numpy as np

    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def stitched_reports(fn) -> list:
    reports = fn.reports()
    assert reports and all(r.runtime["kept"] == "stitched" and r.verify.ok for r in reports)
    return reports


def test_hooked_jit_static_arguments_by_position_or_name(hooked):
    import jax

    x = rows()
    by_name = jax.jit(layernorm, static_argnames="scale")
    by_number = jax.jit(layernorm, static_argnums=1)
    for call in (lambda f: f(x, 3.0), lambda f: f(x, scale=3.0), lambda f: f(x)):
        assert_same(call(by_name), call(hooked(layernorm, static_argnames="scale")))
        assert_same(call(by_number), call(hooked(layernorm, static_argnums=1)))
    stitched_reports(by_name), stitched_reports(by_number)
    with pytest.raises(ValueError, match="Non-hashable static arguments"):  # jax's own error
        by_number(x, [1.0])


def test_hooked_jit_pytrees_and_keyword_arguments(hooked):
    import collections
    import dataclasses

    import jax

    Pair = collections.namedtuple("Pair", "a b")

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Layer:
        scale: jax.Array
        repeat: int = dataclasses.field(metadata={"static": True})

    def fn(pair, layer, *, bias, unused=None):
        y = layernorm(pair.a) * layer.scale + bias
        return {"y": y * layer.repeat, "stats": (y.sum(), None, pair.b)}

    x = rows()
    inputs = (Pair(x, x[0]), Layer(x[0], 2))
    kwargs = {"bias": 0.5, "unused": None}
    stitched = jax.jit(fn)
    assert_same(stitched(*inputs, **kwargs), hooked(fn)(*inputs, **kwargs))
    stitched_reports(stitched)


def test_hooked_jit_lower_compile_and_their_attributes(hooked):
    import jax

    x = rows()
    stitched, plain = jax.jit(layernorm), hooked(layernorm)
    lowered, want = stitched.lower(x), plain.lower(x)
    assert lowered.as_text() == want.as_text()
    assert str(lowered.compiler_ir()) == str(want.compiler_ir())
    assert (lowered.in_tree, lowered.out_tree) == (want.in_tree, want.out_tree)
    compiled, want_compiled = lowered.compile(), want.compile()
    assert 'custom_call_target="fusionstitching' in compiled.as_text()
    assert compiled.report().fs.patterns >= 1
    assert (compiled.in_tree, compiled.out_tree) == (want_compiled.in_tree, want_compiled.out_tree)
    assert str(compiled.args_info) == str(want_compiled.args_info)
    assert isinstance(compiled.cost_analysis(), dict)
    assert compiled.memory_analysis() is not None
    assert_same(compiled(x), want_compiled(x))
    shapes = jax.ShapeDtypeStruct(x.shape, x.dtype)
    assert str(stitched.eval_shape(x)) == str(plain.eval_shape(x)) == str(shapes)
    assert_same(stitched.lower(shapes).compile()(x), want_compiled(x))


def test_hooked_jit_as_method_and_under_disable_jit(hooked):
    import functools

    import jax

    class Model:
        def __init__(self, scale):
            self.scale = scale

        def __hash__(self):
            return hash(self.scale)

        def __eq__(self, other):
            return self.scale == other.scale

        @functools.partial(jax.jit, static_argnums=0)
        def apply(self, x):
            return layernorm(x, self.scale)

    x = rows()
    assert_same(Model(2.0).apply(x), hooked(layernorm)(x, 2.0))
    stitched_reports(Model.apply)
    with jax.disable_jit():
        assert_same(Model(2.0).apply(x), layernorm(x, 2.0))
    assert len(Model.apply.reports()) == 1  # the eager call compiled nothing


def test_hooked_jit_with_default_options_and_donation(hooked):
    import jax
    import jax.numpy as jnp

    x = rows()
    stitched = jax.jit(layernorm, device=None, backend=None, inline=False, keep_unused=False,
                       donate_argnums=0)
    donated = jnp.asarray(x)
    assert_same(stitched(donated), hooked(layernorm)(x))
    assert donated.is_deleted()
    stitched_reports(stitched)


def test_hooked_jit_none_shardings_as_keras_passes_them(hooked, caplog):
    """Keras 3's train/test/predict steps: ``jax.jit(step, donate_argnums=0,
    out_shardings=None)``; Flax's nnx.jit: a pytree of None. jax.jit reads None as
    unspecified, so these are stitched, with no warning."""
    import jax
    import jax.numpy as jnp

    def step(state, x):
        return layernorm(x) * state, (state + 1.0, None)

    x = rows()
    with caplog.at_level("INFO", logger="fusionstitching"):
        keras_style = jax.jit(layernorm, donate_argnums=0, out_shardings=None)
        nnx_style = jax.jit(step, in_shardings=None, out_shardings=(None, (None, None)),
                            keep_unused=True, compiler_options={})
    assert not [r for r in caplog.records if "left to jax.jit" in r.getMessage()]
    donated = jnp.asarray(x)
    assert_same(keras_style(donated), hooked(layernorm)(x))
    assert donated.is_deleted()
    assert_same(nnx_style(2.0, x), hooked(step)(2.0, x))
    stitched_reports(keras_style), stitched_reports(nnx_style)


def test_hooked_jit_inline_is_stitched_and_inlined_in_a_trace(hooked):
    import jax

    x = rows()
    inlined = jax.jit(layernorm, inline=True)
    assert_same(inlined(x), hooked(layernorm)(x))
    stitched_reports(inlined)
    jaxpr = str(jax.make_jaxpr(lambda v: inlined(v) + 1.0)(x))
    assert "jit[" not in jaxpr and "rsqrt" in jaxpr  # inlined into the caller, as jax.jit does
    assert "jit[" in str(jax.make_jaxpr(lambda v: jax.jit(layernorm)(v) + 1.0)(x))


def test_hooked_jit_unsupported_option_left_to_jax_with_one_warning(hooked, caplog):
    import jax

    x = rows()
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with caplog.at_level("INFO", logger="fusionstitching"):
        left = jax.jit(layernorm, out_shardings=sharding, donate_argnums=0)
        again = jax.jit(lambda v: layernorm(v, 2.0), out_shardings=sharding)  # said already
        other = jax.jit(layernorm, compiler_options={"xla_embed_ir_in_executable": True})
    for fn in (left, again, other):  # jax.jit's own functions
        assert not hasattr(fn, "reports") and not hasattr(fn, "fusionstitching_original")
    assert_same(left(x), hooked(layernorm)(x))
    assert left(x).sharding == sharding
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2, warnings  # one per option, not one per function
    assert "layernorm" in warnings[0] and "jax.jit(out_shardings=...) is not supported" in (
        warnings[0]) and "donate_argnums" not in warnings[0]
    assert "jax.jit(compiler_options=...) is not supported" in warnings[1]
    infos = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert len(infos) == 1 and "<lambda>" in infos[0] and "out_shardings" in infos[0]
    with pytest.raises(TypeError, match="static_argnum"):  # a typo: jax.jit's own error
        jax.jit(layernorm, static_argnum=1)
