"""`fusionstitching replay --verify` over the third-party tier, one subprocess per file.

    python benchmarks/verify_tier.py [FILE ...] [--out /tmp/verify_tier] [--timeout 1800]

Default: every file of tests/data/hlo/third_party (full captures, then elided), smallest
first. Per file: replay's Report JSON and log under --out (files with a JSON are skipped, so
a run resumes), then evaluator vs XLA:CPU on the inputs verify used (within XLA's own f32/f64
distance), and for an elided file whether its plan is its full twin's. Prints one line per
module and a summary; --report only prints the table of what is under --out.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from fusionstitching.hlo.elided import elided_constants, fill_elided
from fusionstitching.hlo.evaluator import evaluate
from fusionstitching.hlo.parser import parse_file
from fusionstitching.hlo.drift import drift_problems, widened_to_f64
from fusionstitching.hlo.xla_runner import run_hlo_with_xla
from fusionstitching.verification import _leaves, compare, random_inputs

ROOT = Path(__file__).resolve().parent.parent
TIER = ROOT / "tests" / "data" / "hlo" / "third_party"


def tier_files() -> list[Path]:
    """Full captures smallest first (uncompressed size), then the elided ones."""
    def size(p: Path) -> int:
        return len(gzip.decompress(p.read_bytes())) if p.suffix == ".gz" else p.stat().st_size

    files = [p for p in TIER.iterdir() if p.name.endswith((".hlo", ".hlo.gz"))]
    return sorted(files, key=lambda p: ("_elided" in p.name, size(p)))


def stem(path: Path | str) -> str:
    return Path(path).name.split(".hlo")[0]


def run_file(path: Path, out: Path, timeout: float) -> dict:
    """replay --verify in a subprocess; its JSON, log and a meta record under ``out``."""
    name = stem(path)
    meta_path = out / f"{name}.meta.json"
    if meta_path.exists():
        return json.loads(meta_path.read_text())
    cmd = [sys.executable, "-m", "fusionstitching.cli", "replay", str(path), "--verify",
           "--no-ptxas", "--json", str(out / f"{name}.json")]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    t0 = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=ROOT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    meta = {"file": path.name, "rc": rc, "wall_s": round(time.perf_counter() - t0, 1)}
    meta_path.write_text(json.dumps(meta))
    return meta


def eval_check(path: Path, kind: str) -> dict:
    """Evaluator vs XLA:CPU on verify's inputs: within 1e-5, else as close to XLA's f64
    result as XLA's own f32 is (xla_runner.drift_problems)."""
    module = parse_file(path)
    if elided_constants(module):
        module = fill_elided(module, 0)
    args = random_inputs(module, 0, kind)
    t0 = time.perf_counter()
    ours = _leaves(evaluate(module, args))
    t_eval = time.perf_counter() - t0
    text = str(module)
    xla = run_hlo_with_xla(text, args)
    ok, max_abs, max_rel = compare(xla, ours)
    record = {"kind": kind, "within_1e-5": ok, "max_abs": max_abs, "max_rel": max_rel,
              "eval_s": round(t_eval, 1), "problems": []}
    if not ok:
        exact = run_hlo_with_xla(widened_to_f64(text), [
            a.astype(np.float64) if a.dtype == np.float32 else a for a in args])
        record["problems"] = drift_problems(ours, xla, exact)
    record["agree"] = not record["problems"]
    return record


def run_eval(path: Path, kind: str, out: Path, timeout: float) -> dict:
    name = stem(path)
    target = out / f"{name}.eval.json"
    if not target.exists():
        cmd = [sys.executable, __file__, "--eval-check", str(path), "--kind", kind,
               "--out", str(out)]
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        with open(out / f"{name}.eval.log", "w") as log:
            try:
                subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                               timeout=timeout)
            except subprocess.TimeoutExpired:
                target.write_text(json.dumps({"error": "timeout"}))
        if not target.exists():
            target.write_text(json.dumps({"error": f"crashed, see {name}.eval.log"}))
    return json.loads(target.read_text())


def plan_of(report: dict) -> list:
    return sorted(sorted(k["nodes"]) for k in report["kernels"])


def row(path: Path, out: Path) -> dict:
    """One module's line from what is under ``out``."""
    name = stem(path)
    meta_path, json_path = out / f"{name}.meta.json", out / f"{name}.json"
    r = {"file": path.name, "status": "pending", "inputs": "", "finite": None,
         "max_abs": None, "max_rel": None, "eval": "", "same_plan": "", "wall_s": None}
    if not meta_path.exists():
        return r
    meta = json.loads(meta_path.read_text())
    r["wall_s"] = meta["wall_s"]
    reports = json.loads(json_path.read_text()) if json_path.exists() else []
    if meta["rc"] == "timeout":
        r["status"] = "timeout"
        return r
    if not reports:
        r["status"] = "error"
        return r
    v = reports[0]["verify"]
    if v["ran"] and v["error"]:
        r["status"] = "error(run)"
    elif v["vacuous"]:
        r["status"] = "vacuous"
    elif v["ran"]:
        r["status"] = "OK" if v["ok"] else "MISMATCH"
    else:
        r["status"] = "not run"
    r.update(inputs=v["inputs"], finite=v["finite"], max_abs=v["max_abs_err"],
             max_rel=v["max_rel_err"])
    eval_path = out / f"{name}.eval.json"
    if eval_path.exists():
        e = json.loads(eval_path.read_text())
        r["eval"] = ("error" if "error" in e else
                     "1e-5" if e["within_1e-5"] else "drift-ok" if e["agree"] else "DISAGREE")
    if "_elided" in name:
        twin = out / f"{name.replace('_elided', '')}.json"
        if twin.exists() and json.loads(twin.read_text()):
            r["same_plan"] = ("yes" if plan_of(json.loads(twin.read_text())[0]) ==
                              plan_of(reports[0]) else "NO")
    return r


def print_table(files: list[Path], out: Path) -> None:
    rows = [row(p, out) for p in files]
    print(f"{'file':44s} {'verify':10s} {'inputs':14s} {'finite':>7s} {'max abs':>9s} "
          f"{'max rel':>9s} {'eval/XLA':9s} {'plan=twin':9s} {'wall s':>7s}")
    for r in rows:
        fmt = (lambda x: "" if x is None else f"{x:.2g}")
        print(f"{r['file']:44s} {r['status']:10s} {r['inputs']:14s} "
              f"{'' if r['finite'] is None else format(r['finite'], '.1%'):>7s} "
              f"{fmt(r['max_abs']):>9s} {fmt(r['max_rel']):>9s} {r['eval']:9s} "
              f"{r['same_plan']:9s} {'' if r['wall_s'] is None else r['wall_s']:>7}")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    disagree = [r["file"] for r in rows if r["eval"] in ("DISAGREE", "error")]
    other_plan = [r["file"] for r in rows if r["same_plan"] == "NO"]
    print("summary:", ", ".join(f"{n} {s}" for s, n in sorted(counts.items())),
          f"| evaluator disagrees/errors: {disagree or 'none'}"
          f" | elided plan differs: {other_plan or 'none'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--out", type=Path, default=Path("/tmp/verify_tier"))
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--report", action="store_true", help="print the table only")
    ap.add_argument("--eval-check", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--kind", default="normal", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path.insert(0, str(ROOT))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.eval_check:
        record = eval_check(args.eval_check, args.kind)
        print(json.dumps(record))
        (args.out / f"{stem(args.eval_check)}.eval.json").write_text(json.dumps(record))
        return 0
    files = args.files or tier_files()
    if not args.report:
        for path in files:
            meta = run_file(path, args.out, args.timeout)
            r = row(path, args.out)
            if r["inputs"] and r["status"] in ("OK", "MISMATCH", "error(run)", "vacuous"):
                run_eval(path, r["inputs"], args.out, args.timeout)
                r = row(path, args.out)
            print(f"{r['file']}: {r['status']} inputs={r['inputs']} finite={r['finite']} "
                  f"max_abs={r['max_abs']} max_rel={r['max_rel']} eval={r['eval']} "
                  f"same_plan={r['same_plan']} wall={meta['wall_s']}s", flush=True)
    print_table(files, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
