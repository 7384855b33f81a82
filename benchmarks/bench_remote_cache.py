"""A second host's first step with a warm remote cache, against cold.

    python benchmarks/bench_remote_cache.py                          # zoo BERT, Transformer
    python benchmarks/bench_remote_cache.py --part transformers --only gpt2 --json /tmp/r.json

Starts a redis-server on localhost (Debian's package, on PATH). Per training step, four fresh
processes ("hosts"), each timing its first call (sync build, ``keep="stitched"``) and the
stitched build inside it, with the Report's cache counts:

- ``xla``: ``jax.jit`` alone (what the first step costs without us);
- ``cold``: host A, empty directory, empty server: plans, builds, stores in both;
- ``warm remote``: host B, empty directory of its own: reads A's plan and kernels;
- ``warm directory``: host B again, its directory now filled (the server is not needed).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
from bench_cpu_speed import steps

from fusionstitching.stitched_jit import jit

HOSTS = ("xla", "cold", "warm remote", "warm directory")


def child(opts) -> None:
    """One host: build the step, time its first call, print one JSON line."""
    (name, fn, args), = [(n, f, a) for n, kind, f, a in steps(opts.part, opts.only)
                         if n == opts.child]
    if opts.host == "xla":
        step = jax.jit(fn)
    else:
        step = jit(fn, keep="stitched", cache_dir=opts.cache_dir, remote_cache=opts.remote)
    started = time.perf_counter()
    jax.block_until_ready(step(*args))
    row = {"step": name, "host": opts.host, "first_call_s": time.perf_counter() - started}
    if opts.host != "xla":
        (report,) = step.reports()
        report = report.to_json()
        cache = report["cache"]
        row.update(build_s=report["runtime"]["build_s"], plan=cache["plan"],
                   explore_s=report["times_s"]["explore"], hits=cache["hits"],
                   misses=cache["misses"], remote_hits=cache["remote_hits"],
                   refused=cache["refused"], remote_refused=cache["remote_refused"])
    print(json.dumps(row), flush=True)


def start_server() -> tuple[subprocess.Popen, str]:
    server = shutil.which("redis-server")
    if server is None:
        sys.exit("redis-server is not on PATH (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save",
                                "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    process.kill()
    sys.exit(f"redis-server did not listen on port {port}")


def run_host(opts, name: str, host: str, cache_dir: str, url: str) -> dict:
    command = [sys.executable, __file__, "--child", name, "--host", host, "--part", opts.part,
               "--cache_dir", cache_dir, "--remote", url, *(
                   ["--only", *opts.only] if opts.only else [])]
    env = dict(os.environ, JAX_PLATFORMS="cpu", FUSIONSTITCHING_CACHE_SECRET="bench secret")
    run = subprocess.run(command, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        return {"step": name, "host": host, "error": run.stderr.strip().splitlines()[-1:]}
    return json.loads(run.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    lines = ["| step | host | first call s | build s | explore s | plan | kernels built / "
             "loaded | from the server |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['step']} | {r['host']} | error: {r['error']} |||||| ")
        elif r["host"] == "xla":
            lines.append(f"| {r['step']} | xla | {r['first_call_s']:.1f} |  |  |  |  |  |")
        else:
            lines.append(f"| {r['step']} | {r['host']} | {r['first_call_s']:.1f} | "
                         f"{r['build_s']:.1f} | {r['explore_s']:.2f} | {r['plan']} | "
                         f"{r['misses']} / {r['hits']} | {r['remote_hits']} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", default="zoo")
    parser.add_argument("--only", nargs="+", default=None)
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--host", help=argparse.SUPPRESS)
    parser.add_argument("--cache_dir", help=argparse.SUPPRESS)
    parser.add_argument("--remote", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        child(opts)
        return
    if opts.part == "zoo" and not opts.only:
        opts.only = ["bert", "transformer"]
    names = [n for n, kind, *_ in steps(opts.part, opts.only)
             if kind == "jax" and n.endswith("train")]
    server, url = start_server()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for name in names:
                dirs = {"cold": f"{scratch}/{name}/a", "warm remote": f"{scratch}/{name}/b",
                        "warm directory": f"{scratch}/{name}/b", "xla": f"{scratch}/unused"}
                for host in HOSTS:
                    rows.append(run_host(opts, name, host, dirs[host], url))
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        server.kill()
    print(table(rows))
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
