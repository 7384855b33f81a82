"""``fusionstitching demo``: a LayerNorm written in JAX, end to end.

Prints XLA:CPU's plan, the stitched plan and its verification against ``jax.jit``; then, if
the XLA:GPU deviceless compiler is installed (``pip install fusionstitching[xla-gpu]``), the
same for XLA:GPU's classic plan on the chosen target.
"""
from __future__ import annotations

import time

import numpy as np


def layernorm(x, gamma, beta):
    """LayerNorm over the last axis, as models write it."""
    import jax
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * gamma + beta


def _print_plan(title: str, result) -> None:
    graph = result.graph
    print(f"\n{title}")
    print("  XLA's kernels:")
    for node in graph.kernel_nodes():
        print(f"    {node.name:32s} {node.op_class.name.lower():22s} {node.shape}")
    print("  stitched kernels:")
    for k in result.kernels:
        print(f"    {k.spec.name}: {' + '.join(k.pattern.nodes)}")
        print(f"      schemes {', '.join(k.spec.schemes)}; grid {k.spec.grid}, block "
              f"{k.spec.block}, shared memory {k.spec.smem_bytes} B")
    from .report import format_summary
    print(format_summary(result.report))


def run(rows: int = 256, cols: int = 1024, target: str = "h100") -> int:
    import jax
    import jax.numpy as jnp

    from .capture import jax_hlo
    from .hlo.parser import parse_module
    from .pipeline import Options, stitch_module
    from .verification import compare, execute_stitched

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    gamma = rng.standard_normal(cols).astype(np.float32)
    beta = rng.standard_normal(cols).astype(np.float32)
    status = 0

    t0 = time.perf_counter()
    text = jax_hlo(layernorm, x, gamma, beta, target="cpu")
    module = parse_module(text, "layernorm (XLA:CPU)")
    result = stitch_module(module, Options(target=target, verify=True),
                           parse_seconds=time.perf_counter() - t0)
    _print_plan(f"LayerNorm [{rows}x{cols}] f32, XLA:CPU optimized HLO", result)
    expected = np.asarray(jax.jit(layernorm)(jnp.asarray(x), gamma, beta))
    stitched = execute_stitched(result.module, result.kernels, [x, gamma, beta])
    ok, max_abs, _ = compare(expected, stitched)
    print(f"  stitched host kernels vs jax.jit(layernorm): {'OK' if ok else 'MISMATCH'} "
          f"(max abs err {max_abs:.3g})")
    status |= not (ok and result.report.ok)

    try:
        gpu_text = jax_hlo(layernorm, x, gamma, beta, target=target, classic=True)
    except Exception as exc:  # the XLA:GPU compiler is an optional extra
        print(f"\nXLA:GPU plan skipped: {exc}")
        return status
    gpu = stitch_module(parse_module(gpu_text, f"layernorm (XLA:GPU {target})"),
                        Options(target=target, verify=True))
    _print_plan(f"LayerNorm [{rows}x{cols}] f32, XLA:GPU ({target}, classic fusions) "
                "optimized HLO", gpu)
    status |= not gpu.report.ok
    return status
