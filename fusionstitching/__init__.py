"""FusionStitching: a post-XLA pass that stitches memory-intensive kernels.

``fusionstitching.jit(fn)`` is ``jax.jit`` with stitched kernels (stitched_jit.py);
``fusionstitching replay`` (cli.py) replays optimized HLO offline; ``pipeline.stitch_module``
is the pass itself. ``jit`` loads on first use, so that importing a stage
(``fusionstitching.hlo``) loads no LLVM.
"""
__all__ = ["jit"]


def __getattr__(name: str):
    if name == "jit":
        from .stitched_jit import jit  # lazily: the whole compiler and llvmlite load with it

        globals()["jit"] = jit
        return jit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
