"""The ``fusionstitching`` command: ``replay`` HLO files or dump folders, ``demo``,
``explain`` a fusion plan."""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import costmodel
from costmodel import TARGETS

from .demo import run as run_demo
from .explain import explain_text, plan_dot, write_svg
from .explorer import STRATEGIES
from .graph import build_graph
from .hlo.ir import HloParseError
from .hlo.parser import parse_file
from .pipeline import Options, plan_module, planning_workers, stitch_module
from .report import format_summary, write_json


def collect_hlo_files(paths: list[str]) -> list[Path]:
    """Files named on the command line, and inside folders: ``*.hlo`` files (also gzipped,
    ``*.hlo.gz``) and XLA dump files (``*after_optimizations.txt``)."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file() and (
                f.name.endswith((".hlo", ".hlo.gz", "after_optimizations.txt"))))
        else:
            files.append(p)
    return files


def replay(args: argparse.Namespace) -> int:
    files = collect_hlo_files(args.paths)
    if not files:
        print("fusionstitching replay: no HLO files found", file=sys.stderr)
        return 1
    options = Options(target=args.target, explorer=args.explorer, verify=args.verify,
                      emit_dir=args.emit, ptxas=not args.no_ptxas)
    reports, failed = [], False
    for path in files:
        t0 = time.perf_counter()
        try:
            module = parse_file(path)
            result = stitch_module(module, options, parse_seconds=time.perf_counter() - t0)
            summary = format_summary(result.report)
        except (HloParseError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed = True
            continue
        except Exception as exc:  # a defect of ours: this file fails, the others still replay
            print(f"error: {path}: internal error ({type(exc).__name__}: {exc}); please "
                  f"report it with the file\n{_innermost_frame(exc)}", file=sys.stderr)
            failed = True
            continue
        print(f"{path}:")
        print(summary)
        reports.append(result.report)
        failed |= not result.report.ok
    if args.json:
        try:
            write_json(reports, args.json)
        except OSError as exc:  # checked up front; the folder may have gone since
            print(f"error: --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"wrote {len(reports)} reports to {args.json}")
    return 1 if failed else 0


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


def _innermost_frame(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return f"  raised at {frame.filename}:{frame.lineno} in {frame.name}"


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
    rp.add_argument("--verify", action="store_true",
                    help="run XLA's plan and the stitched plan on random inputs and compare")
    rp.add_argument("--json", metavar="OUT", help="write the list of Reports as JSON")
    rp.add_argument("--emit", metavar="DIR", help="write kernel IR, LLVM IR, PTX and cubins")
    rp.add_argument("--no-ptxas", action="store_true", help="skip assembling with ptxas")
    rp.set_defaults(run=replay)

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

    args = parser.parse_args(argv)
    if args.command == "replay":
        # Output paths are checked before minutes of planning, as argparse checks choices.
        for option, value, problem in (("--json", args.json, _output_file_problem),
                                       ("--emit", args.emit, _output_folder_problem)):
            why = value and problem(value)
            if why:
                rp.error(f"{option} {value}: {why}")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
