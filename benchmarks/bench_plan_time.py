"""Our planning time next to XLA's own compile time of the same step.

    python benchmarks/bench_plan_time.py                      # zoo + third-party tier
    python benchmarks/bench_plan_time.py --parts zoo --only bert dien
    python benchmarks/bench_plan_time.py --parts flax --targets h100 --json /tmp/plan.json
    python benchmarks/bench_plan_time.py --parts zoo --size paper --only bert bert-large

Per step (the zoo's JAX workloads at their small size, or with ``--size paper`` at the
paper's Table 1 sizes plus ``bert-large``, BERT-large at BERT-base's paper batch and
sequence; and every model of the third-party tier, train and infer) and per target (XLA:CPU,
deviceless XLA:GPU H100), in one run:

- ``xla s``: XLA compiling the step (``jax.jit(fn).trace(*args).lower()`` done first, then
  ``.compile()`` timed; TF models: ``experimental_get_compiler_ir`` for XLA:CPU, and for the
  H100 the deviceless compile of TF's HLO, as the corpus was captured);
- ``ours s``: ``stitch_module`` on the optimized module that compile produced, as
  ``fusionstitching replay`` plans it (for the H100, ptxas on: a pattern at the register
  model's cap is assembled while it is planned, the plan's kernels after), wall time;
  ``explore`` and ``ptxas`` are its shares;
- ``runtime s``: the same module as the JIT plans it (``fusionstitching.jit``,
  ``FUSIONSTITCHING=1``: for the H100, ptxas off; for XLA:CPU, its small loops unrolled
  first), plus the machine code of the plan's
  kernels the step runs: on XLA:CPU the host kernels, for the H100 ptxas on each kernel
  (standing in for the driver's JIT of their PTX).

The sums and the largest ratio come last. Each library runs in a child process of its own
(the Keras backend is chosen once per process), as in make_third_party.py; JAX, TF and
the capture (which loads JAX) are imported inside the functions for that reason. The
planner loads neither, so it is imported here.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import make_third_party
from third_party_models import MODELS

from costmodel.devices import load_device
from fusionstitching import codegen
from fusionstitching.codegen import flatten, index_expr
from fusionstitching.codegen.cost import registers
from fusionstitching.hlo.parser import parse_module
from fusionstitching.hlo.unroll import unroll_loops
from fusionstitching.pipeline import Options, stitch_module

REPO = Path(__file__).resolve().parent.parent
ZOO = "zoo"
PARTS = [ZOO, *make_third_party.PARTS]
TARGETS = ("cpu", "h100")
SIZES = ("small", "paper")
# BERT-large, built from the zoo's BERT-base "paper" config (its batch and sequence).
BERT_LARGE = dict(hidden=1024, heads=16, ffn=4096, layers=24)


# =========================================================================== timing one step

def time_jax(fn, args, target: str) -> tuple[float, str]:
    """(seconds XLA compiles ``jax.jit(fn)`` for ``target``, its optimized HLO text)."""
    import jax

    from fusionstitching import capture

    lowered = jax.jit(fn).trace(*make_third_party.abstract_on(args, target)).lower()
    started = time.perf_counter()
    compiled = lowered.compile(capture._compiler_options(target, False, None))
    seconds = time.perf_counter() - started
    return seconds, capture.optimized_hlo_text(compiled)


def time_tf(fn, specs, target: str) -> tuple[float, str]:
    """The same for a ``tf.function(jit_compile=True)``."""
    from fusionstitching import capture

    if target == "cpu":
        fn.experimental_get_compiler_ir(*specs)(stage="hlo")  # tracing, not timed
        started = time.perf_counter()
        fn.experimental_get_compiler_ir(*specs)(stage="optimized_hlo")
        seconds = time.perf_counter() - started
        return seconds, capture.tf_hlo(fn, *specs)
    hlo = capture.tf_hlo(fn, *specs, stage="hlo")
    started = time.perf_counter()
    modules = capture._compile_hlo_modules(hlo, capture._gpu_device(target),
                                           capture._compiler_options(target, False, None))
    seconds = time.perf_counter() - started
    return seconds, "\n\n".join(capture.hlo_module_text(m) for m in modules)


def plan(text: str, target: str, cost_model: str = "auto") -> dict:
    """Our planning of an optimized module (wall seconds): as replay plans it, and as the JIT
    does with the machine code its step runs (module docstring). Each starts with the
    memoized expressions of earlier plannings forgotten, as in a process of its own.
    ``cost_model``: the JIT's (``auto``: the host CPU's model for XLA:CPU's modules)."""
    forget_memos()
    started = time.perf_counter()
    result = stitch_module(parse_module(text, "<step>"), Options(target="h100"))
    seconds = time.perf_counter() - started
    times = result.report.times_s
    forget_memos()
    started = time.perf_counter()
    module = parse_module(text, "<step>")
    if target == "cpu":  # as the runtime's host route plans: XLA:CPU's small loops unrolled
        module = unroll_loops(module)
    if cost_model == "auto":
        cost_model = "cpu" if target == "cpu" else "gpu"
    jit = stitch_module(module, Options(target="h100", ptxas=False, host=target == "cpu",
                                        cost_model=cost_model))
    if target != "cpu":
        arch = load_device("h100").sm_arch
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(lambda k: codegen.compile_nvptx(k.spec, arch), jit.kernels))
    runtime_s = time.perf_counter() - started
    return dict(ours_s=seconds, explore_s=times.explore, ptxas_s=times.ptxas,
                kernels=len(result.kernels), runtime_s=runtime_s, runtime_kernels=len(jit.kernels))


def forget_memos() -> None:
    """Clear the code generator's memoized functions (index expressions, flatten's and the
    register model's), so that one planning does not find another's answers."""
    for module in (index_expr, flatten, registers):
        for value in vars(module).values():
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


def measure(name: str, kind: str, fn, args, target: str, cost_model: str = "auto") -> dict:
    row = dict(step=name, target=target)
    try:
        xla_s, text = (time_jax if kind == "jax" else time_tf)(fn, args, target)
        row.update(xla_s=xla_s, **plan(text, target, cost_model))
    except Exception as err:  # reported in the table, never stops the run
        traceback.print_exc()
        row["error"] = f"{type(err).__name__}: {err}"[:200]
    print(json.dumps(row), flush=True)
    return row


# =========================================================================== parts (children)

def zoo_steps(only, size: str = "small"):
    sys.path.insert(0, str(REPO))
    from benchmarks.models import bert, zoo

    workloads = [(model, mode) for model, mode, _ in zoo.WORKLOADS]
    if size == "paper":
        workloads += [("bert-large", "train"), ("bert-large", "infer")]
    for model, mode in workloads:
        if only and model not in only:
            continue
        if model == "bert-large":
            large = dataclasses.replace(bert.CONFIGS["paper"], **BERT_LARGE)
            with mock.patch.dict(bert.CONFIGS, large=large):  # a size for this call only
                fn, args = zoo.jax_workload("bert", mode, "large")
        else:
            fn, args = zoo.jax_workload(model, mode, size)
        suffix = "" if size == "small" else f"_{size}"
        yield f"zoo_{model}_{mode}_jax{suffix}", "jax", fn, args


def tier_steps(part: str, only):
    for key, spec in MODELS.items():
        if spec["part"] != part or (only and spec["model"] not in only and key not in only):
            continue
        try:
            steps = spec["build"]()
        except Exception:  # a library incompatible with this JAX: as make_third_party
            traceback.print_exc()
            continue
        for mode in spec["modes"]:
            if mode in steps:
                kind, fn, args = steps[mode]
                yield f"{key}_{mode}", kind, fn, args


def run_part(part: str, only, targets, size: str = "small", cost_model: str = "auto"
             ) -> list[dict]:
    steps = zoo_steps(only, size) if part == ZOO else tier_steps(part, only)
    return [measure(name, kind, fn, args, target, cost_model)
            for name, kind, fn, args in steps for target in targets]


# =========================================================================== driver

def markdown_table(columns: list[str], rows: list[dict], cells, key_columns: int = 1
                   ) -> list[str]:
    """Markdown lines: ``cells(row)`` gives a row's cells; a row with an ``error`` gives its
    first ``key_columns`` cells (the step's name, ...) and then the error."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        if "error" in r:
            key = [str(r.get(k, "-")) for k in ("step", "target")[:key_columns]]
            lines.append("| " + " | ".join(key) + f" | error: {r['error']} |"
                         + "|" * (len(columns) - key_columns - 1))
        else:
            lines.append("| " + " | ".join(cells(r)) + " |")
    return lines


def table(rows: list[dict]) -> str:
    columns = ["step", "target", "XLA compile s", "ours s", "explore s", "ptxas s", "ours / XLA",
               "kernels", "runtime s", "runtime / XLA", "runtime kernels"]
    lines = markdown_table(columns, rows, lambda r: [
        r["step"], r["target"], f"{r['xla_s']:.2f}", f"{r['ours_s']:.2f}",
        f"{r['explore_s']:.2f}", f"{r['ptxas_s']:.2f}", f"{r['ours_s'] / r['xla_s']:.2f}",
        str(r["kernels"]), f"{r['runtime_s']:.2f}", f"{r['runtime_s'] / r['xla_s']:.2f}",
        str(r["runtime_kernels"])], key_columns=2)
    done = [r for r in rows if "error" not in r]
    if done:
        xla = sum(r["xla_s"] for r in done)
        lines.append("")
        for key, what in (("ours_s", "ours (replay)"), ("runtime_s", "ours (runtime)")):
            ours = sum(r[key] for r in done)
            worst = max(done, key=lambda r: r[key] / r["xla_s"])
            over = sum(r[key] > 3 * r["xla_s"] for r in done)
            lines.append(f"{len(done)} steps: XLA {xla:.1f} s, {what} {ours:.1f} s "
                         f"({ours / xla:.2f}x); largest ratio "
                         f"{worst[key] / worst['xla_s']:.2f}x ({worst['step']}, "
                         f"{worst['target']}); {over} steps above 3x")
    return "\n".join(lines)


def rows_from_children(script: str, parts, extra: list[str]) -> list[dict]:
    """Each part's rows from a child process of ``script`` (``--part P --result FILE`` and
    ``extra``) in its library's environment; a child that fails is one error row."""
    rows = []
    for part in parts:
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "rows.json")
            argv = [sys.executable, script, "--part", part, "--result", result, *extra]
            env = make_third_party.child_env(part) if part != ZOO else dict(
                os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
            done = subprocess.run(argv, env=env)
            if done.returncode != 0 or not os.path.exists(result):
                rows.append(dict(step=part, target="-", error=f"child exited {done.returncode}"))
                continue
            rows += json.loads(Path(result).read_text())
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS)
    parser.add_argument("--only", nargs="+", help="model names or keys: just these")
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--size", choices=SIZES, default="small",
                        help="the zoo's workloads at this size (the tier has one size)")
    parser.add_argument("--cost_model", choices=("auto", "gpu"), default="auto",
                        help="the JIT's: auto (the host CPU's model for XLA:CPU's modules, "
                             "as the runtime plans them) or gpu (the H100's everywhere)")
    parser.add_argument("--json", help="also write the rows here")
    opts = parser.parse_args(argv)
    only = set(opts.only) if opts.only else None
    run_parts(opts, __file__,
              lambda part: run_part(part, only, opts.targets, opts.size, opts.cost_model),
              ["--targets", *opts.targets, "--size", opts.size, "--cost_model",
               opts.cost_model], table)


def run_parts(opts, script: str, run_part, extra: list[str], table) -> None:
    """A child (``opts.part``: ``run_part(part)``'s rows to ``opts.result``), or the parent:
    each of ``opts.parts`` in its child (`rows_from_children`, with ``extra`` and ``--only``),
    then ``table(rows)`` printed and the rows to ``opts.json``."""
    if opts.part:
        Path(opts.result).write_text(json.dumps(run_part(opts.part)))
        return
    rows = rows_from_children(script, opts.parts, extra + (
        ["--only", *opts.only] if opts.only else []))
    print(table(rows))
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
