"""``fusionstitching replay --workers N``: modules planned side by side in worker processes
give the reports one process gives, in the files' order; a module that fails, hangs past its
time limit or loses its worker is reported and the others still replay. The same on a Ray
cluster the tests start (`--ray ADDRESS`)."""
from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fusionstitching import child_processes
from fusionstitching.cli import Progress, main as cli_main
from fusionstitching.pipeline import Options
from fusionstitching.replay_pool import OutcomeKind, replay_all
from fusionstitching.replay_ray import replay_on_ray
from helpers import free_port

DATA = Path(__file__).parent / "data" / "hlo"
FILES = [str(DATA / name) for name in ("layernorm_64x256_jax_cpu.hlo",
                                       "softmax_64x256_jax_h100.hlo",
                                       "adam_64x256_tf_cpu.hlo")]
OPTIONS = Options(ptxas=False)


def plan_of(report) -> dict:
    """A report's JSON without its times (which differ from run to run)."""
    data = report.to_json()
    del data["times_s"]
    return data


def test_two_workers_give_one_processs_reports_in_the_files_order():
    alone = replay_all(FILES, OPTIONS, workers=1)
    heard = []
    side_by_side = replay_all(FILES, OPTIONS, workers=2, on_outcome=heard.append)
    assert [o.path for o in side_by_side] == FILES
    assert sorted(o.path for o in heard) == sorted(FILES)
    assert all(o.kind is OutcomeKind.PLANNED for o in side_by_side)
    assert [plan_of(o.report) for o in side_by_side] == [plan_of(o.report) for o in alone]


def test_a_bad_file_is_reported_with_its_location_and_the_others_replay(tmp_path):
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\n\nENTRY %e () -> f32[] {\n  ROOT %c = f32[ constant(0)\n}\n")
    outcomes = replay_all([str(bad), *FILES[:2]], OPTIONS, workers=2)
    assert [o.kind for o in outcomes] == [OutcomeKind.BAD_INPUT, OutcomeKind.PLANNED,
                                          OutcomeKind.PLANNED]
    assert outcomes[0].text.startswith(f"{bad}:4:") and outcomes[0].failed


def never_written_fifo(tmp_path) -> str:
    """A file whose reading waits for a writer that never comes: a module that never ends."""
    path = tmp_path / "hangs.hlo"
    os.mkfifo(path)
    return str(path)


def test_a_module_past_its_time_limit_is_stopped_and_the_others_replay(tmp_path):
    hangs = never_written_fifo(tmp_path)
    started = time.perf_counter()
    outcomes = replay_all([hangs, *FILES], OPTIONS, workers=2, timeout_s=3.0)
    assert time.perf_counter() - started < 60
    assert [o.kind for o in outcomes] == [OutcomeKind.TIMED_OUT] + [OutcomeKind.PLANNED] * 3
    assert outcomes[0].seconds >= 3.0 and "still planning after 3 s" in outcomes[0].text


def test_a_worker_that_dies_is_reported_and_replaced(tmp_path, monkeypatch):
    hangs = never_written_fifo(tmp_path)
    pids = []
    real_start = child_processes.start

    def remembered(cmd, **kwargs):
        proc = real_start(cmd, **kwargs)
        pids.append(proc.pid)
        return proc

    monkeypatch.setattr(child_processes, "start", remembered)

    def opened_the_fifo(pid: int) -> bool:
        """Blocked opening the FIFO: Linux's pipe code waits for a writer there."""
        try:
            with open(f"/proc/{pid}/wchan") as f:
                return f.read().strip() == "wait_for_partner"
        except OSError:  # ended meanwhile
            return False

    def kill_the_worker_planning_the_fifo():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a worker imports, then opens the FIFO and waits
            waiting = [pid for pid in list(pids) if opened_the_fifo(pid)]
            if waiting:
                os.kill(waiting[0], 9)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_worker_planning_the_fifo)
    killer.start()
    # the FIFO first: the first worker ready gets it
    outcomes = replay_all([hangs, *FILES], OPTIONS, workers=2, timeout_s=120.0)
    killer.join()
    assert [o.kind for o in outcomes] == [OutcomeKind.WORKER_DIED] + [OutcomeKind.PLANNED] * 3
    assert "exit status -9" in outcomes[0].text
    assert len(pids) == 3  # two, and the one that replaced the killed one


def test_cli_writes_one_json_per_module_and_a_summary_table(tmp_path, capsys):
    bad = tmp_path / "bad.hlo"
    bad.write_text("not HLO\n")
    folder = tmp_path / "per_module"
    status = cli_main(["replay", *FILES[:2], str(bad), "--no-ptxas", "--workers", "2",
                       "--json-dir", str(folder), "--json", str(tmp_path / "all.json")])
    assert status == 1  # one file failed
    written = {p.name: json.loads(p.read_text()) for p in folder.iterdir()}
    assert len(written) == 3
    planned = [d for d in written.values() if d["outcome"] == "planned"]
    assert sorted(d["file"] for d in planned) == sorted(FILES[:2])
    assert all(d["schema"] == "fusionstitching.report/1" for d in planned)
    (failed,) = [d for d in written.values() if d["outcome"] != "planned"]
    assert failed["outcome"] == "bad input" and failed["error"].startswith(f"{bad}:1:")
    assert [r["module"] for r in json.loads((tmp_path / "all.json").read_text())] == [
        d["module"] for d in sorted(planned, key=lambda d: FILES.index(d["file"]))]
    out = capsys.readouterr().out
    assert "3 modules in" in out and "2 planned, 1 bad input" in out
    table = out[out.index("module  "):]
    assert [line.split()[0] for line in table.splitlines()[1:4]] == [*FILES[:2], str(bad)]


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_cli_refuses_a_worker_count_that_is_not_positive(value, capsys):
    with pytest.raises(SystemExit):
        cli_main(["replay", FILES[0], "--workers", value])
    assert "--workers" in capsys.readouterr().err


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray cluster of two CPUs on this machine, as `ray start --head` starts one; its
    address."""
    ray = Path(sys.executable).parent / "ray"
    port = free_port()
    # Ray's token authentication, which `ray start` turns on: the cluster and the drivers
    # share a token, given here (a fresh machine has no ~/.ray/auth_token)
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    started = subprocess.run([str(ray), "start", "--head", "--node-ip-address=127.0.0.1",
                              f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                              "--disable-usage-stats"], capture_output=True, text=True,
                             timeout=120)
    assert started.returncode == 0, f"ray start failed:\n{started.stdout}\n{started.stderr}"
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(ray), "stop", "--force"], capture_output=True, timeout=120)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_a_ray_cluster_gives_one_processs_reports_in_the_files_order(ray_cluster, tmp_path,
                                                                    capsys):
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\n\nENTRY %e () -> f32[] {\n  ROOT %c = f32[ constant(0)\n}\n")
    out = tmp_path / "all.json"
    status = cli_main(["replay", *FILES, str(bad), "--no-ptxas", "--ray", ray_cluster,
                       "--json", str(out)])
    assert status == 1
    captured = capsys.readouterr()
    assert f"{bad}:4:" in captured.err
    assert "4 modules in" in captured.out and "3 planned, 1 bad input" in captured.out
    got = json.loads(out.read_text())
    for report in got:
        del report["times_s"]
    assert got == [plan_of(o.report) for o in replay_all(FILES, OPTIONS)]


def test_a_ray_task_past_its_time_limit_is_cancelled_and_reported(ray_cluster):
    outcomes = replay_on_ray(FILES, OPTIONS, ray_cluster, timeout_s=1e-3)
    assert [o.kind for o in outcomes] == [OutcomeKind.TIMED_OUT] * 3
    assert "its Ray task was cancelled" in outcomes[0].text


def test_an_unreachable_ray_cluster_is_an_error_not_a_traceback(capsys):
    port = free_port()  # nothing listens there
    assert cli_main(["replay", FILES[0], "--ray", f"127.0.0.1:{port}"]) == 1
    assert "cannot reach the Ray cluster" in capsys.readouterr().err


def test_the_progress_bar_is_drawn_on_a_terminal_only():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    outcomes = replay_all(FILES[:2], OPTIONS)
    for stream, drawn in ((Terminal(), True), (io.StringIO(), False)):
        progress = Progress(2, stream)
        for outcome in outcomes:
            progress.step(outcome)
        progress.clear()
        text = stream.getvalue()
        assert ("[" + "#" * 30 + "] 2/2, 0 failed" in text) is drawn
        assert text.endswith("\r\033[K") is drawn
