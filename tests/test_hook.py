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


def test_parse_flags():
    parsed, problems = flags.parse("--async --verify=false --target=a100 --cache_dir=/c "
                                   "--dump_to='/d d' --report=/r.json --keep=stitched")
    assert parsed == flags.Flags(async_compile=True, verify=False, target="a100",
                                 cache_dir="/c", dump_to="/d d", report="/r.json",
                                 keep="stitched")
    assert not problems
    assert parsed.jit_options() == {"async_compile": True, "verify": False, "target": "a100",
                                    "dump_to": "/d d", "keep": "stitched", "cache_dir": "/c"}


def test_bad_flags_are_named_and_ignored():
    parsed, problems = flags.parse("--verify --asynch --target=tpu --report -x --keep=slow")
    assert parsed == flags.Flags(verify=True)
    assert len(problems) == 5
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
    probe.write_text("import sys\nprint('tf_hooks' in sys.modules, 'jax' in sys.modules)\n"
                     "import jax\nfrom jax._src import api\nprint(jax.jit is api.jit)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSIONSTITCHING")}
    run = subprocess.run([sys.executable, *WITH_PTH, str(probe)], capture_output=True,
                         text=True, timeout=120, env=dict(env, PYTHONPATH=REPO,
                                                          JAX_PLATFORMS="cpu"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False", "True"]


def test_unchanged_script_is_stitched_and_reported(tmp_path):
    report_path = tmp_path / "reports.json"
    run = run_script(tmp_path, {
        "FUSIONSTITCHING": "1",
        "FUSIONSTITCHING_FLAGS": f"--verify --keep=stitched --cache_dir={tmp_path / 'cache'} "
                                 f"--dump_to={tmp_path / 'dump'} --report={report_path} "
                                 "--frobnicate"})
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0] == "jax imported at start-up: False"  # the hook waits for the import
    assert lines[1] == "jax.jit replaced: True"
    assert float(lines[2].split(":")[1]) < 1e-5
    warnings = [line for line in run.stderr.splitlines() if "FUSIONSTITCHING_FLAGS" in line]
    assert len(warnings) == 1 and "--frobnicate" in warnings[0]

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
