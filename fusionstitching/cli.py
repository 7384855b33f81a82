"""The ``fusionstitching`` command: ``replay`` HLO files or dump folders, ``prewarm`` a job's
kernel cache from them, ``demo``, ``explain`` a fusion plan."""
from __future__ import annotations

import argparse
import os
import sys
import time
import json
from pathlib import Path

import costmodel
from costmodel import TARGETS

from .demo import run as run_demo
from .explain import explain_text, plan_dot, write_svg
from .explorer import STRATEGIES
from .graph import build_graph
from .fuzz.differential import fuzz_summary
from .fuzz.pool import fuzz_in_process, fuzz_in_workers
from .hlo.files import collect_hlo_files, collect_runtime_modules
from .hlo.ir import HloParseError
from .hlo.parser import parse_file, read_hlo_text
from .pipeline import Options, plan_module, planning_workers
from .replay_pool import MODULE_TIMEOUT_S, ModuleOutcome, OutcomeKind, outcome_json, \
    outcome_table, replay_all
from .replay_ray import replay_on_ray
from .report import write_json
from .runtime.build import BuildError, prewarm
from .runtime.cache import default_dir


def replay(args: argparse.Namespace) -> int:
    files, skipped = collect_hlo_files(args.paths)
    for path, why in skipped:
        print(f"skipped {path}: {why}", file=sys.stderr)
    if not files:
        print("fusionstitching replay: no HLO files found", file=sys.stderr)
        return 1
    options = Options(target=args.target, explorer=args.explorer, verify=args.verify,
                      emit_dir=args.emit, ptxas=not args.no_ptxas, host=args.cpu_schedule,
                      cost_model=args.cost_model)
    paths = [str(f) for f in files]
    progress = Progress(len(paths))
    # --json-dir names each file by its path below the files' common folder
    root = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in paths])

    reports = []

    def on_outcome(outcome: ModuleOutcome) -> None:
        progress.clear()
        if outcome.kind is OutcomeKind.PLANNED:
            print(f"{outcome.path}:\n{outcome.text}", flush=True)
        else:
            print(f"error: {outcome.text}", file=sys.stderr)
        if args.json_dir:
            _write_module_json(outcome, args.json_dir, root)
        if args.json and outcome.report is not None:
            # each module as it completes: a run stopped halfway keeps what it finished
            reports.append(outcome.report)
            _write_reports(reports, args.json)
        progress.step(outcome)

    started = time.perf_counter()
    if args.ray:
        try:
            outcomes = replay_on_ray(paths, options, args.ray, args.timeout, on_outcome)
        except RuntimeError as exc:
            progress.clear()
            print(f"error: {exc}", file=sys.stderr)
            return 1
    else:
        outcomes = replay_all(paths, options, args.workers, args.timeout, on_outcome)
    progress.clear()
    print(outcome_table(outcomes, time.perf_counter() - started))
    if args.json:
        reports = [o.report for o in outcomes if o.report is not None]
        try:
            write_json(reports, args.json)
        except OSError as exc:  # checked up front; the folder may have gone since
            print(f"error: --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"wrote {len(reports)} reports to {args.json}")
    if skipped:
        print(f"skipped {len(skipped)} files of the folders (listed above)")
    return 1 if any(o.failed for o in outcomes) else 0


class Progress:
    """A progress bar on a terminal's stderr (redrawn in place); nothing elsewhere, where
    each module's summary or error already says it is done."""

    def __init__(self, total: int, stream=None):
        self.total, self.done, self.failed = total, 0, 0
        self.stream = sys.stderr if stream is None else stream
        self.live = self.stream.isatty()
        self.started = time.perf_counter()

    def step(self, outcome: ModuleOutcome) -> None:
        self.done += 1
        self.failed += outcome.failed
        if self.live:
            filled = 30 * self.done // self.total
            self.stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/"
                              f"{self.total}, {self.failed} failed, "
                              f"{time.perf_counter() - self.started:.0f} s")
            self.stream.flush()

    def clear(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _write_reports(reports: list, path: str) -> None:
    """The Reports so far, replacing the file in one step (a reader never sees half)."""
    partial = f"{path}.partial"
    try:
        write_json(reports, partial)
        os.replace(partial, path)
    except OSError:  # said once, at the end, where the whole list is written again
        pass


def _write_module_json(outcome: ModuleOutcome, folder: str, root: str) -> None:
    """``folder``/<the file's path below ``root``, / as __>.json."""
    name = os.path.relpath(os.path.abspath(outcome.path), root).replace(os.sep, "__")
    with open(os.path.join(folder, name + ".json"), "w") as f:
        json.dump(outcome_json(outcome), f, indent=1)
        f.write("\n")


def _output_file_problem(path: str) -> str | None:
    """Why ``--json PATH`` cannot be written (None when it can), said before any planning."""
    p = Path(path)
    if p.is_dir():
        return "is a folder; name the JSON file to write"
    if not p.parent.is_dir():
        return f"no such folder: {p.parent}"
    if not os.access(p.parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        return "not writable"
    return None


def _output_folder_problem(path: str) -> str | None:
    """Why ``--emit DIR`` cannot hold the kernels (None when it can); creates the folder."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        return "exists and is not a folder"
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot be created ({exc.strerror or exc})"
    if not os.access(p, os.W_OK):
        return "not writable"
    return None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def prewarm_cache(args: argparse.Namespace) -> int:
    """Plan each XLA:CPU module as the runtime would and keep plan and kernels in the cache:
    the job's first step then loads them instead of planning."""
    options = Options(target=args.target, explorer=args.explorer, ptxas=False,
                      workers=args.workers, cost_model=args.cost_model)
    failed = 0
    files = collect_runtime_modules(args.paths)
    while files:
        for path in files:
            failed += not _prewarm_one(path, options, args)
            if args.drain:
                path.unlink(missing_ok=True)
        # --drain: a job's planning process; the job adds modules while it plans
        files = collect_runtime_modules(args.paths) if args.drain else []
    return 1 if failed else 0


def _prewarm_one(path, options: Options, args: argparse.Namespace) -> bool:
    started = time.perf_counter()
    try:
        outcome, stats = prewarm(read_hlo_text(path), options, args.cache_dir,
                                 args.remote_cache, measure=args.keep == "fastest",
                                 source=str(path))
    except (BuildError, HloParseError, OSError) as exc:
        print(f"{path}: error: {exc}", file=sys.stderr)
        return False
    print(f"{path}: {outcome} ({stats.misses} kernels built, {stats.hits} loaded, "
          f"{time.perf_counter() - started:.1f} s)", flush=True)
    return outcome != "not stored"


def fuzz(args: argparse.Namespace) -> int:
    """Each failing program's verdicts and source as it comes, then the count of each verdict."""
    seeds = list(range(args.seed, args.seed + args.count))
    routes = tuple(r.strip() for r in args.routes.split(",") if r.strip())
    progress = Progress(len(seeds))

    def on_outcome(outcome) -> None:
        progress.clear()
        if outcome.failed:
            print(outcome.describe(), flush=True)
        progress.step(_Failed(outcome.failed))

    started = time.perf_counter()
    if args.workers > 1:
        outcomes = fuzz_in_workers(seeds, routes, args.workers, on_outcome)
    else:
        outcomes = fuzz_in_process(seeds, routes, on_outcome)
    progress.clear()
    print(fuzz_summary(outcomes, time.perf_counter() - started))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([o.to_json() for o in outcomes], f, indent=1)
            f.write("\n")
    return 1 if any(o.failed for o in outcomes) else 0


class _Failed:
    """What Progress.step reads of an outcome."""

    def __init__(self, failed: bool):
        self.failed = failed


def demo(args: argparse.Namespace) -> int:
    return run_demo(rows=args.rows, cols=args.cols, target=args.target)


def explain(args: argparse.Namespace) -> int:
    """Print the plan and why a node was or was not stitched; write the plan as DOT/SVG."""
    try:
        module = parse_file(args.file)
    except (HloParseError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    graph = build_graph(module)
    options, chosen = Options(target=args.target, explorer=args.explorer), {}
    with planning_workers(graph, options, chosen) as workers:
        plan = plan_module(graph, options, costmodel.load_device(args.target),
                           schedules=chosen, workers=workers)
    try:
        print(explain_text(graph, plan, args.node))
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 1
    if args.dot or args.svg:
        dot_path = args.dot or str(Path(args.svg).with_suffix(".dot"))
        dot_text = plan_dot(graph, plan)
        Path(dot_path).write_text(dot_text)
        print(f"wrote {dot_path}")
        if args.svg:
            ok, message = write_svg(dot_text, args.svg)
            print(message if ok else f"no SVG: {message}; the DOT file is {dot_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    # The command works on this machine's CPU; without this, a jax with the CUDA plugin
    # installed prints a CUDA-not-found traceback before falling back to the CPU.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    parser = argparse.ArgumentParser(prog="fusionstitching", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    rp = sub.add_parser("replay", help="stitch optimized HLO files or XLA dump folders offline")
    rp.add_argument("paths", nargs="+", help="HLO text files or folders")
    targets, explorers = sorted(TARGETS), list(STRATEGIES)
    rp.add_argument("--target", default="h100", choices=targets,
                    help="GPU to model and assemble for")
    rp.add_argument("--explorer", default="beam", choices=explorers, help="fusion strategy")
    rp.add_argument("--cost_model", default="gpu", choices=("gpu", "cpu"),
                    help="what prices the plan: the target GPU's latency-evaluator, or this "
                         "host CPU's model (for XLA:CPU dumps, as the runtime plans them)")
    rp.add_argument("--verify", action="store_true",
                    help="run XLA's plan and the stitched plan on random inputs and compare")
    rp.add_argument("--cpu-schedule", action="store_true",
                    help="also build each kernel's CPU schedule, as the runtime runs it on a "
                         "CPU (an XLA:CPU dump), and with --verify check it too")
    rp.add_argument("--json", metavar="OUT", help="write the list of Reports as JSON")
    rp.add_argument("--emit", metavar="DIR", help="write kernel IR, LLVM IR, PTX and cubins")
    rp.add_argument("--no-ptxas", action="store_true", help="skip assembling with ptxas")
    rp.add_argument("--workers", type=_positive_int, default=1,
                    help="plan this many modules side by side, each in a worker process "
                         "(default 1: one at a time in this process)")
    rp.add_argument("--timeout", type=float, default=MODULE_TIMEOUT_S, metavar="SECONDS",
                    help="with --workers 2 or more or --ray: a module still planning after "
                         "this long is stopped and reported (default %(default)g)")
    rp.add_argument("--ray", metavar="ADDRESS",
                    help="plan each module as a task on the Ray cluster at ADDRESS (\"local\": "
                         "one started on this machine for the run); needs Ray")
    rp.add_argument("--json-dir", metavar="DIR",
                    help="write one JSON file per module: its Report, or why it failed")
    rp.set_defaults(run=replay)

    pp = sub.add_parser("prewarm", help="plan XLA:CPU modules (a job's --dump_to files) ahead "
                                        "of the job, into its kernel cache")
    pp.add_argument("paths", nargs="+", help="optimized HLO files (*.xla.hlo.txt) or folders")
    pp.add_argument("--cache_dir", default=default_dir(), help="the job's cache directory")
    pp.add_argument("--remote_cache", metavar="URL", help="the job's redis:// remote cache")
    pp.add_argument("--target", default="h100", choices=targets, help="the job's --target")
    pp.add_argument("--explorer", default="beam", choices=explorers, help="the job's --explorer")
    pp.add_argument("--cost_model", default="auto", choices=("auto", "gpu", "cpu"),
                    help="the job's --cost_model (auto: this CPU's model)")
    pp.add_argument("--keep", default="fastest", choices=("fastest", "stitched"),
                    help="the job's --keep (fastest: kernels timed against XLA:CPU here)")
    pp.add_argument("--workers", type=_positive_int, default=None,
                    help="processes answering the explorer's questions (default: one per core "
                         "for a large module; 1: none, as a job's planning process asks)")
    pp.add_argument("--drain", action="store_true",
                    help="remove each module once planned and plan the ones added meanwhile, "
                         "until none is left (a job's planning process)")
    pp.set_defaults(run=prewarm_cache)

    dp = sub.add_parser("demo", help="LayerNorm from JAX: XLA's plan, the stitched plan, "
                                     "verification")
    dp.add_argument("--target", default="h100", choices=targets)
    dp.add_argument("--rows", type=int, default=256)
    dp.add_argument("--cols", type=int, default=1024)
    dp.set_defaults(run=demo)

    ep = sub.add_parser("explain", help="the fusion plan of an HLO file, why each node was or "
                                        "was not stitched, and a DOT/SVG picture of it")
    ep.add_argument("file", help="optimized HLO text file")
    ep.add_argument("--node", help="show every decision involving this node and its neighbours")
    ep.add_argument("--dot", metavar="OUT", help="write the plan as Graphviz DOT")
    ep.add_argument("--svg", metavar="OUT", help="write the plan as SVG (needs Graphviz's dot; "
                                                 "the .dot file is written either way)")
    ep.add_argument("--target", default="h100", choices=targets, help="GPU the cost model prices")
    ep.add_argument("--explorer", default="beam", choices=explorers, help="fusion strategy")
    ep.set_defaults(run=explain)

    fp = sub.add_parser("fuzz", help="random JAX programs through XLA and the stitched routes "
                                     "(XLA:CPU, H100 replay), judged by their f64 results")
    fp.add_argument("--count", type=_positive_int, default=100, help="programs to run")
    fp.add_argument("--seed", type=int, default=0, help="the first program's seed")
    fp.add_argument("--routes", default="cpu,h100", help="comma-separated: cpu, h100")
    fp.add_argument("--workers", type=_positive_int, default=1,
                    help="programs side by side, each in a worker process (default 1: in "
                         "this process)")
    fp.add_argument("--json", metavar="OUT", help="write every program's verdicts as JSON")
    fp.set_defaults(run=fuzz)

    args = parser.parse_args(argv)
    if args.command == "replay":
        if args.ray and args.workers > 1:
            rp.error("--workers and --ray: the Ray cluster's CPUs are the workers")
        # Output paths are checked before minutes of planning, as argparse checks choices.
        for option, value, problem in (("--json", args.json, _output_file_problem),
                                       ("--emit", args.emit, _output_folder_problem),
                                       ("--json-dir", args.json_dir, _output_folder_problem)):
            why = value and problem(value)
            if why:
                rp.error(f"{option} {value}: {why}")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
