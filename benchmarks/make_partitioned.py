"""Partitioned XLA:GPU H100 modules of the zoo's BERT and Transformer training steps (issue
29): tests/data/hlo/partitioned/, for replay (plans around the collectives) and its
simulated-device verification.

    python benchmarks/make_partitioned.py

Each step at the small size with batch 8, data parallel over 8 H100s and tensor parallel
over a 2x4 mesh (benchmarks/sharded_steps.py says how), compiled deviceless for an 8-GPU
topology: one module per step, the program every device runs. Metadata is removed, as in
the corpus (make_corpus.py).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
os.environ["JAX_PLATFORMS"] = "cpu"  # before JAX initializes: the CUDA plugin compiles deviceless
sys.path.insert(0, str(REPO))

import jax  # noqa: E402
from jax.experimental import topologies  # noqa: E402

from benchmarks.hlo_files import write_hlo  # noqa: E402
from benchmarks.make_corpus import COMPRESS_ABOVE, strip_metadata  # noqa: E402
from benchmarks.sharded_steps import LAYOUTS, MODELS, sharded_step  # noqa: E402
from fusionstitching.capture import target_config  # noqa: E402
from fusionstitching.hlo.xla_runner import optimized_hlo_text  # noqa: E402

OUT = REPO / "tests" / "data" / "hlo" / "partitioned"


def main() -> None:
    devices = topologies.get_topology_desc(platform="cuda", topology="1x1x8",
                                           target_config=target_config("h100")).devices
    OUT.mkdir(parents=True, exist_ok=True)
    for model in MODELS:
        for layout in LAYOUTS:
            fn, args = sharded_step(model, layout, devices, abstract=True)
            text = optimized_hlo_text(jax.jit(fn).trace(*args).lower().compile())
            tag = "dp8" if layout == "data parallel" else "tp2x4"
            name = write_hlo(OUT, f"{model}_train_{tag}_jax_h100.hlo", strip_metadata(text),
                             COMPRESS_ABOVE)
            print(name, flush=True)


if __name__ == "__main__":
    main()
