"""Host execution of stitched kernels vs XLA:CPU executing the same patterns, in one run.

For each pattern (a JAX function): XLA:CPU's optimized module is stitched into one kernel per
memory-intensive region; the host kernel is timed as the stitched executable runs it (a
module of one custom call, its parts on XLA's thread pool) and jax.jit of the same function
on the same inputs (both: median of repeated calls after warm-up).
Beside them, the modeled H100 times of XLA:GPU's plan and of the stitched plan (the same
function captured for H100 through XLA's deviceless compile, priced by the cost model).

    python benchmarks/bench_host_kernels.py [--repeat 200] [--no-gpu]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fusionstitching.capture import jax_hlo  # noqa: E402
from fusionstitching.codegen import compile_host, generate  # noqa: E402
from fusionstitching.hlo.parser import parse_module  # noqa: E402
from fusionstitching.hlo.xla_runner import prepared_for_xla_cpu  # noqa: E402
from fusionstitching.pipeline import Options, stitch_module  # noqa: E402
from fusionstitching.runtime import cpu_speed, ffi  # noqa: E402

TRIVIAL = {"parameter", "constant", "tuple", "get-tuple-element"}


def layernorm(x, gamma, beta):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * gamma + beta


def softmax(x):
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    return e / jnp.sum(e, axis=-1, keepdims=True)


def batchnorm_train(x, gamma, beta):
    mean = jnp.mean(x, axis=(0, 1, 2))
    var = jnp.mean(jnp.square(x - mean), axis=(0, 1, 2))
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * gamma + beta, mean, var


def adam_update(p, g, m, v, lr, t):
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    step = lr * (m / (1 - 0.9 ** t)) / (jnp.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    return p - step, m, v


def gelu_bias(x, b):
    return jax.nn.gelu(x + b, approximate=True)


def patterns(rng):
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)
    return [("layernorm 512x1024", layernorm, (f32(512, 1024), f32(1024), f32(1024))),
            ("softmax 512x1024", softmax, (f32(512, 1024),)),
            ("batchnorm 32x16x16x64", batchnorm_train, (f32(32, 16, 16, 64), f32(64), f32(64))),
            ("adam 1M", adam_update, (f32(1024, 1024), f32(1024, 1024), f32(1024, 1024),
                                      np.abs(f32(1024, 1024)), np.float32(1e-3), np.float32(3))),
            ("gelu+bias 512x1024", gelu_bias, (f32(512, 1024), f32(1024)))]


def median_us(fn, repeat: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def host_runner(spec, args, module):
    """The kernel as a stitched executable calls it: one custom call in an XLA:CPU module."""
    host = compile_host(spec, fast=True)
    target = ffi.register_host_kernel(spec.name, host, len(spec.inputs), len(spec.outputs))
    number = {p.name: p.parameter_number for p in module.entry.parameters}
    executable, buffers = prepared_for_xla_cpu(cpu_speed.call_module(spec, target),
                                               [args[number[n]] for n, _ in spec.inputs])
    return lambda: [out.block_until_ready() for out in executable.execute(buffers)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--no-gpu", action="store_true", help="skip the modeled H100 columns")
    opts = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'pattern':24s} {'kernels':>8s} {'compile s':>9s} {'host us':>9s} {'XLA:CPU us':>10s}"
          f" {'H100 XLA us (modeled)':>22s} {'H100 stitched us (modeled)':>27s}")
    for name, fn, args in patterns(rng):
        module = parse_module(jax_hlo(fn, *args, target="cpu"))
        nodes = [i.name for i in module.entry.instructions if i.opcode not in TRIVIAL]
        t0 = time.perf_counter()
        spec = generate(module, nodes, "fusionstitching_" + name.split()[0].replace("+", "_"))
        run = host_runner(spec, args, module)
        compile_s = time.perf_counter() - t0
        host_us = median_us(run, opts.repeat)
        jitted = jax.jit(fn)
        xla_us = median_us(lambda: jax.block_until_ready(jitted(*args)), opts.repeat)
        gpu = ("", "")
        if not opts.no_gpu:
            gpu_module = parse_module(jax_hlo(fn, *args, target="h100", classic=True))
            report = stitch_module(gpu_module, Options(target="h100", ptxas=False)).report
            gpu = (f"{report.xla.modeled_us:.2f}", f"{report.fs.modeled_us:.2f}")
        print(f"{name:24s} {len(nodes):>3d} -> 1 {compile_s:9.2f} {host_us:9.1f} {xla_us:10.1f}"
              f" {gpu[0]:>22s} {gpu[1]:>27s}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
