"""The host cost model's constants fitted on measured kernels, and scored on models it was not
fitted on.

Input: rows of cpu_kernel_times.py (each kernel of ours timed against XLA:CPU running the same
instructions, with the features ``costmodel.host`` prices). Each side of a row was timed as a
module call, so a measured time is the call's fixed cost (``dispatch_us``, fitted, not part of
the model) plus its kernels, each priced by ``host_kernel_us``: ours one kernel, XLA's one per
XLA kernel it replaces. Our kernel's call and XLA's are one constant: one side of every row
holds exactly one of ours, which a constant of its own could not be told apart from the
harness's cost. The constants (the call, a cost per instruction of each class group)
minimize the soft-L1 loss of the log errors of both sides over the rows; the bandwidths and
cores are the machine's measured ones.

Held out: the tier's models are split in two halves (alternately, by name); the constants are
fitted on one half and scored on the other, then the reverse. Scores: the median and 90th
percentile error of the modeled times, and how often the model says which side is faster as
measured (stitched kernels whose sides differ by over 10%), next to the H100 model's verdict,
which chose those kernels.

    python benchmarks/fit_host_model.py rows.json [--write costmodel/data/host_cpu.json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.manifest import run_manifest  # noqa: E402
from costmodel import KernelProfile  # noqa: E402
from costmodel.host import HostConstants, host_kernel_us, measure_machine  # noqa: E402

# Op classes of the instruction counts, grouped: a CPU has no shuffles or shared memory, and
# LLVM folds most of a GPU thread's index arithmetic, so few costs are told apart.
GROUPS = {"fp32": "float", "fp32_overlapped": "float", "fp64": "float",
          "fp64_overlapped": "float", "sfu": "math", "sfu_overlapped": "math",
          "int": "int", "int_overlapped": "int", "ld_global": "memory",
          "ld_global_overlapped": "memory", "st_global": "memory"}
GROUP_NAMES = ("float", "math", "int", "memory", "other")
PARAMS = ("dispatch_us", "call_us") + tuple(f"ns_{g}" for g in GROUP_NAMES)
# Kernels moving at least this many bytes are modeled on every core (XLA:CPU's thread pool
# splits a loop of some 64 KiB and more; our kernels' parts the same).
PARALLEL_BYTES = 1 << 16
CLEAR = 1.10  # sides closer than this are not scored for which is faster


def as_profile(instructions: dict[str, float], bytes_read: int, bytes_written: int
               ) -> KernelProfile:
    """A kernel's totals as a profile of one thread (the model uses only the products)."""
    return KernelProfile(grid_blocks=1, threads_per_block=1, regs_per_thread=0, smem_bytes=0,
                         instructions=instructions, bytes_read=bytes_read,
                         bytes_written=bytes_written)


def constants_of(params) -> HostConstants:
    by_group = dict(zip(GROUP_NAMES, map(float, params[2:])))
    return HostConstants(call_us=float(params[1]), parallel_bytes=PARALLEL_BYTES,
                         ns_per_instruction={cls: by_group[GROUPS.get(cls, "other")]
                                             for cls in [*GROUPS, "other"]},
                         fitted_on="")


def prepared(rows: list[dict]) -> list[tuple]:
    """(our kernel's profile, XLA's kernels' profiles, our us, XLA's us) per row; classes
    outside GROUPS are counted as "other"."""
    def profile(instructions, read, written):
        merged: dict[str, float] = {}
        for cls, n in instructions.items():
            key = cls if cls in GROUPS else "other"
            merged[key] = merged.get(key, 0.0) + n
        return as_profile(merged, read, written)

    return [(profile(r["host_instructions"], r["bytes_read"], r["bytes_written"]),
             [profile(x["instructions"], x["bytes_read"], x["bytes_written"]) for x in r["xla"]],
             r["host_us"], r["xla_us"]) for r in rows]


def sides_us(params, row, machine) -> tuple[float, float]:
    fitted = constants_of(params)
    ours, xla, _, _ = row
    return (params[0] + host_kernel_us(ours, machine, fitted),
            params[0] + sum(host_kernel_us(p, machine, fitted) for p in xla))


def fit(rows: list[tuple], machine) -> np.ndarray:
    def residuals(params):
        out = []
        for row in rows:
            host, xla = sides_us(params, row, machine)
            out += [math.log(host / row[2]), math.log(xla / row[3])]
        return out

    start = np.array([20.0, 2.0] + [0.3] * len(GROUP_NAMES))
    return least_squares(residuals, start, bounds=(1e-6, np.inf), loss="soft_l1").x


def score(params, rows: list[tuple], raw: list[dict], machine) -> dict:
    errors, right, asked, h100_right = [], 0, 0, 0
    for row, r in zip(rows, raw):
        host, xla = sides_us(params, row, machine)
        errors += [abs(math.log(host / row[2])), abs(math.log(xla / row[3]))]
        if r["lone"] or max(row[2], row[3]) < CLEAR * min(row[2], row[3]):
            continue
        asked += 1
        right += (host < xla) == (row[2] < row[3])
        h100 = r["h100_us"] < sum(x["h100_us"] for x in r["xla"])
        h100_right += h100 == (row[2] < row[3])
    return {"median_error": math.exp(float(np.median(errors))) - 1,
            "p90_error": math.exp(float(np.percentile(errors, 90))) - 1,
            "rows": len(rows), "stitched_rows_scored": asked,
            "faster_side_right": right / asked if asked else None,
            "h100_model_right": h100_right / asked if asked else None}


def table(path: str) -> str:
    """The held-out scores of a result file (``--json``) as a markdown table."""
    body = json.loads(Path(path).read_text())
    lines = ["| fitted on | scored on | median error | 90th percentile error | faster side "
             "right: host model | faster side right: H100 model |", "|---|---|---|---|---|---|"]
    for s in body["held_out"] + [dict(body["in_sample"], fitted_on_rows="all (in sample)")]:
        fitted = (f"{s['fitted_on_rows']} kernels of {s['fitted_on_models']} models"
                  if "fitted_on_models" in s else s["fitted_on_rows"])
        lines.append(f"| {fitted} | {s['rows']} kernels ({s['stitched_rows_scored']} "
                     f"stitched, sides >{CLEAR:.2f}x apart) | {s['median_error']:.0%} | "
                     f"{s['p90_error']:.0%} | {s['faster_side_right']:.1%} | "
                     f"{s['h100_model_right']:.1%} |")
    return "\n".join(lines)


def fitted_on(data: dict, raw: list, models: list) -> str:
    manifest = data["manifest"]
    return (f"{len(raw)} kernels of {len(models)} tier models measured by "
            f"benchmarks/cpu_kernel_times.py on {manifest['host']['processor']}, "
            f"{manifest['host']['cores']} cores ({manifest['date']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows")
    parser.add_argument("--write", help="the fitted constants, as costmodel/data/host_cpu.json")
    parser.add_argument("--json", help="the scores and constants, a result file")
    args = parser.parse_args()
    data = json.loads(Path(args.rows).read_text())
    raw = [r for r in data["rows"] if r["host_us"] > 0 and r["xla_us"] > 0]
    machine = measure_machine()
    models = sorted({r["model"] for r in raw})
    halves = [set(models[0::2]), set(models[1::2])]
    held_out = []
    for fit_half, test_half in (halves, halves[::-1]):
        train = [r for r in raw if r["model"] in fit_half]
        test = [r for r in raw if r["model"] in test_half]
        params = fit(prepared(train), machine)
        held_out.append(dict(fitted_on_rows=len(train), fitted_on_models=len(fit_half),
                             **score(params, prepared(test), test, machine)))
        print("held out:", held_out[-1])
    params = fit(prepared(raw), machine)
    constants = dict(zip(PARAMS, map(float, params)))
    in_sample = score(params, prepared(raw), raw, machine)
    print("all rows:", constants, in_sample)
    if args.write:
        fitted = constants_of(params)
        Path(args.write).write_text(json.dumps({
            "call_us": fitted.call_us, "ns_per_instruction": fitted.ns_per_instruction,
            "parallel_bytes": PARALLEL_BYTES, "fitted_on": fitted_on(data, raw, models)},
            indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "manifest": run_manifest({"rows": args.rows, "write": args.write}),
            "measured": data["manifest"], "source": args.rows, "held_out": held_out,
            "in_sample": in_sample, "constants": constants, "machine": machine.__dict__},
            indent=1))


if __name__ == "__main__":
    main()
