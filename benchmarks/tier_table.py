"""Replay the third-party tier's XLA:GPU H100 modules and print benchmarks/README.md's table:
memory-intensive kernels, bytes against compulsory, modeled times and plan wall time.

    python benchmarks/tier_table.py [--out DIR] [files...]   (default: every full H100 file)

Each module is one `fusionstitching replay FILE --no-ptxas --json DIR/NAME.json` process;
a module whose JSON already exists in DIR is not replayed again (resumable).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

TIER = Path(__file__).resolve().parent.parent / "tests" / "data" / "hlo" / "third_party"


def tier_files() -> list[Path]:
    manifest = json.loads((TIER / "manifest.json").read_text())
    return sorted(TIER / name for name, e in manifest.items() if e["target"] == "h100"
                  and not e["elided"] and "skipped" not in e and "identical_to" not in e)


def replay(path: Path, out: Path) -> dict:
    json_path = out / (path.name.split(".")[0] + ".json")
    if not json_path.exists():
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "fusionstitching.cli", "replay", str(path),
                        "--no-ptxas", "--json", str(json_path)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report = json.loads(json_path.read_text())
        report[0]["wall_s"] = time.perf_counter() - start
        json_path.write_text(json.dumps(report))
    return json.loads(json_path.read_text())[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("/tmp/tier_table"))
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    head = (f"{'module':<40} {'XLA mem':>7} {'FS mem':>6} {'XLA bytes':>13} {'FS bytes':>12} "
            f"{'compulsory':>12} {'FS/comp':>7} {'XLA us':>8} {'FS us':>8} {'plan s':>6}")
    print(head)
    sums = [0] * 7
    for path in args.files or tier_files():
        r = replay(path, args.out)
        xla, fs, comp = r["xla"], r["fs"], r["compulsory_bytes"]
        row = (xla["mem_kernels"], fs["mem_kernels"], xla["bytes"], fs["bytes"], comp,
               xla["modeled_us"], fs["modeled_us"])
        sums = [a + b for a, b in zip(sums, row)]
        print(f"{path.name.split('.')[0]:<40} {row[0]:>7} {row[1]:>6} {row[2]:>13,} "
              f"{row[3]:>12,} {comp:>12,} {row[3] / comp:>7.3f} {row[5]:>8.2f} {row[6]:>8.2f} "
              f"{r.get('wall_s', 0):>6.1f}", flush=True)
    print(f"{'sum':<40} {sums[0]:>7} {sums[1]:>6} {sums[2]:>13,} {sums[3]:>12,} "
          f"{sums[4]:>12,} {sums[3] / sums[4]:>7.3f} {sums[5]:>8.2f} {sums[6]:>8.2f}")
    print(f"stitched memory-intensive kernels {sums[1] / sums[0]:.1%} of XLA's; bytes "
          f"{sums[3] / sums[4]:.3f}x compulsory")


if __name__ == "__main__":
    main()
