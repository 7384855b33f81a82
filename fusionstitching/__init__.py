"""FusionStitching: a post-XLA pass that stitches memory-intensive kernels.

``fusionstitching.jit(fn)`` is ``jax.jit`` with stitched kernels; ``fusionstitching replay``
(cli.py) replays optimized HLO offline; ``pipeline.stitch_module`` is the pass itself.
"""
from .jit import jit

__all__ = ["jit"]
