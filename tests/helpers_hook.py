"""Training scripts of JAX libraries run twice in child processes at once, plainly and under
the hook (FUSIONSTITCHING=1): shared by test_hook_jax_libraries.py and test_hook_keras3.py."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

from benchmarks.bench_training_loop import REPO
from benchmarks.bench_training_loop import WITH_REPOSITORY_HOOK as WITH_PTH
from tf_hooks import flags as flag_parsing, tf_hook


def start(tmp_path, script: str, env: dict) -> subprocess.Popen:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FUSIONSTITCHING")}
    full_env.update(env, PYTHONPATH=REPO, KERAS_HOME=str(tmp_path / "keras"),
                    TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen([sys.executable, *WITH_PTH, script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env)


def numbers(stdout: str, keys=("losses", "loss", "params")) -> dict:
    return {line.split(":")[0]: [float(v) for v in line.split(":")[1].split()]
            for line in stdout.splitlines() if line.split(":")[0] in keys}


def plain_and_stitched(tmp_path, source: str, keys=("losses", "loss", "params")
                       ) -> tuple[dict, dict, list, str]:
    """Run ``source`` plainly and with the hook, both at once; (plain numbers, hooked
    numbers, the hooked run's Reports, its stderr); the numbers are the printed lines
    ``key: values`` of ``keys``."""
    script = tmp_path / "train.py"
    script.write_text(source)
    report_path = tmp_path / "reports.json"
    plain = start(tmp_path, str(script), {})
    hooked = start(tmp_path, str(script), {
        "FUSIONSTITCHING": "1",
        "FUSIONSTITCHING_FLAGS": f"--async=false --keep=stitched --verify --report={report_path} "
                                 f"--cache_dir={tmp_path / 'cache'}"})
    plain_out, plain_err = plain.communicate(timeout=900)
    out, err = hooked.communicate(timeout=900)
    assert plain.returncode == 0, plain_err[-3000:]
    assert hooked.returncode == 0, err[-3000:]
    assert "jax.jit replaced: True" in out and "jax.jit replaced: False" in plain_out
    assert "left to jax.jit" not in err  # no step function escaped the hook
    reports = json.loads(report_path.read_text())
    return numbers(plain_out, keys), numbers(out, keys), reports, err


@contextlib.contextmanager
def tf_hook_installed(tmp_path, **flags):
    """TF's hook installed in this process with ``flags`` (its cache under ``tmp_path``), as
    FUSIONSTITCHING_FLAGS would install it; uninstalled on leaving."""
    tf_hook.install(flag_parsing.Flags(cache_dir=str(tmp_path / "cache"), **flags))
    try:
        yield
    finally:
        tf_hook.uninstall()
