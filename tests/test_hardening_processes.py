"""Our subprocesses and kernels cannot take the user's job down: a hung tool is stopped after its
time limit and killed at exit."""
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fusionstitching import child_processes
from fusionstitching.cli import main as cli_main
from tf_hooks import quiet_start

DATA = Path(__file__).parent / "data" / "hlo"
ROOT = Path(__file__).resolve().parent.parent


def hanging_tool(tmp_path, name: str) -> Path:
    """A directory holding an executable ``name`` that sleeps for ten minutes."""
    folder = tmp_path / "bin"
    folder.mkdir()
    tool = folder / name
    tool.write_text("#!/bin/sh\nsleep 600\n")
    tool.chmod(0o755)
    return folder


def test_a_hanging_ptxas_is_stopped_and_replay_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{hanging_tool(tmp_path, 'ptxas')}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(child_processes, "PTXAS_TIMEOUT_S", 1.0)
    files = [str(DATA / "layernorm_32x2048_jax_cpu.hlo"), str(DATA / "softmax_32x2048_jax_cpu.hlo")]
    out = tmp_path / "reports.json"
    started = time.perf_counter()
    cli_main(["replay", *files, "--json", str(out)])
    assert time.perf_counter() - started < 60
    reports = json.loads(out.read_text())
    assert len(reports) == 2  # the second file was replayed too
    for report in reports:
        stages = [f["stage"] for f in report["fallbacks"]]
        assert "ptxas" in stages, report["fallbacks"]
        assert any("did not finish in 1 s" in f["reason"] for f in report["fallbacks"])


def test_a_child_still_running_when_the_script_exits_is_killed(tmp_path):
    """A background thread waiting on a child (as an async build waits on ptxas) dies with the
    interpreter; the child must not outlive it."""
    script = tmp_path / "job.py"
    script.write_text(
        "import threading, time\n"
        "from fusionstitching import child_processes\n"
        "threading.Thread(target=child_processes.run, args=(['sleep', '300'], 600),\n"
        "                 daemon=True).start()\n"
        "while not child_processes._live:\n"
        "    time.sleep(0.01)\n"
        "print(next(iter(child_processes._live)).pid, flush=True)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout)
    deadline = time.time() + 10
    while time.time() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Running or sleeping (a zombie waiting for init to reap it is dead)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    state = next(line for line in status.splitlines() if line.startswith("State:"))
    return "Z" not in state.split()[1]


def test_a_jax_program_starts_without_cuda_plugin_tracebacks():
    """The [xla-gpu] extra's CUDA plugin cannot initialize without an NVIDIA driver; a plain
    JAX program beside it must not print its tracebacks (it runs on the CPU either way)."""
    if any(map(os.path.exists, quiet_start.NVIDIA_DRIVER_FILES)):
        pytest.skip("this machine has an NVIDIA driver: the plugin initializes")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run([sys.executable, "-c", "import jax; print(jax.devices()[0].platform)"],
                          capture_output=True, text=True, timeout=120, cwd="/", env=env)
    assert done.returncode == 0 and done.stdout.strip() == "cpu", done.stderr
    assert "Traceback" not in done.stderr and "Unable to load CUDA" not in done.stderr
    assert "cudart_stub" not in done.stderr, done.stderr


@pytest.mark.parametrize("jax_platforms", [None, "cpu"])
def test_a_jax_program_beside_the_cuda_plugin_prints_only_its_own_lines(jax_platforms):
    """Nothing but what the program itself writes, in its order, whether or not the user set
    JAX_PLATFORMS; the deviceless compiler still works in that process."""
    if any(map(os.path.exists, quiet_start.NVIDIA_DRIVER_FILES)):
        pytest.skip("this machine has an NVIDIA driver: the plugin initializes")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    if jax_platforms:
        env["JAX_PLATFORMS"] = jax_platforms
    program = textwrap.dedent("""
        import os, sys
        print('before', file=sys.stderr, flush=True)
        import jax
        os.write(2, b'own line\\n')
        jax.devices()
        from fusionstitching import capture
        text = capture.hlo_for_gpu('HloModule m\\nENTRY e { p = f32[8] parameter(0)\\n'
                                   '  ROOT r = f32[8] exponential(p) }')
        print('after', 'is_scheduled=true' in text, file=sys.stderr)
        """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=180, cwd="/", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "before\nown line\nafter True\n"


def test_quiet_stderr_passes_on_everything_but_the_no_driver_lines():
    """In a child, so that fd 2 is a pipe the test reads: other lines come back in order, the
    plugin's no-driver line and absl's preamble to it do not; a lone preamble stays."""
    program = textwrap.dedent("""
        import os
        from tf_hooks.quiet_start import QuietStderr, _ABSL_PREAMBLE
        os.write(2, b'first\\n')
        with QuietStderr():
            os.write(2, _ABSL_PREAMBLE + b'\\n')
            os.write(2, b'I0000 00:00:1795676900.195313   23425 cudart_stub.cc:31] Could not '
                        b'find cuda drivers on your machine, GPU will not be used.\\n')
            os.write(2, b'second\\n')
            os.write(2, _ABSL_PREAMBLE + b'\\n')
            os.write(2, b'third\\n')
        os.write(2, b'fourth\\n')
        """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr
    assert done.stderr == b"first\nsecond\n" + quiet_start._ABSL_PREAMBLE + b"\nthird\nfourth\n"


def test_the_quiet_start_keeps_the_users_choice_and_a_real_driver(tmp_path, monkeypatch):
    assert not quiet_start.default_jax_platforms({"JAX_PLATFORMS": "cuda"})
    driver = tmp_path / "version"
    driver.write_text("NVRM version: 580")
    monkeypatch.setattr(quiet_start, "NVIDIA_DRIVER_FILES", (str(driver),))
    environ = {}
    assert not quiet_start.default_jax_platforms(environ) and environ == {}


CRASHING_JOB = """
import numpy as np, jax
from fusionstitching.stitched_jit import jit
from fusionstitching.runtime import kernel_objects
real_ir = kernel_objects.host_ir
def crashing_ir(spec):  # a store through a null pointer at the kernel's entry
    text = real_ir(spec)
    return text.replace("entry:\\n", "entry:\\n  store volatile i32 7, ptr null\\n", 1)
kernel_objects.host_ir = crashing_ir

def layernorm(x, g, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * g + b

rng = np.random.default_rng(3)
a = [rng.standard_normal(s).astype(np.float32) for s in ((16, 128), (128,), (128,))]
fn = jit(layernorm, cache_dir=None, keep="stitched", verify=True)
got = [np.asarray(fn(*a)) for _ in range(2)]
(report,) = fn.reports()
print(all(np.array_equal(g, np.asarray(jax.jit(layernorm)(*a))) for g in got),
      [f.stage for f in report.fallbacks], report.runtime["kept"])
print(report.fallbacks[0].reason)
"""


def test_a_kernel_that_crashes_is_left_to_xla_and_the_job_goes_on(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(CRASHING_JOB)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    summary, why = done.stdout.splitlines()[-2:]
    assert summary == "True ['trial'] xla", done.stdout
    assert why.startswith("crashed (SIGSEGV)"), why
