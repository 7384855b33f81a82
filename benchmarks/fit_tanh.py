"""Fits host_math's tanh rational: tanh(x) ~ x * P(x^2) / Q(x^2) on [0, TANH_ONE], Q(0) = 1.

Reweighted linear least squares on the relative error (x P(z) - tanh(x) Q(z) = 0, weighted
by 1 / (tanh(x) Q_previous(z)), and more where the error is largest), in f64 at points dense
near both ends. Prints the coefficients highest power first (as host_math's `_poly` takes
them), the largest relative error in f64, and the smallest value of Q on the range.

    python benchmarks/fit_tanh.py [--degrees 4 4]
"""
from __future__ import annotations

import argparse

import numpy as np

TANH_ONE = 9.5


def fit(p_degree: int, q_degree: int, rounds: int = 30):
    k = 4000
    x = np.concatenate([TANH_ONE * (1 - np.cos(np.pi * (np.arange(k) + 0.5) / (2 * k))),
                        np.linspace(1e-4, TANH_ONE, k)])
    z, t = x * x, np.tanh(x)
    weight, q_before = 1 / t, np.ones_like(z)
    for _ in range(rounds):
        columns = [x * z ** i for i in range(p_degree + 1)] + \
                  [-t * z ** j for j in range(1, q_degree + 1)]
        scale = weight / q_before
        c, *_ = np.linalg.lstsq(np.stack(columns, 1) * scale[:, None], t * scale, rcond=None)
        p, q = c[:p_degree + 1], np.concatenate([[1.0], c[p_degree + 1:]])
        q_before = np.polyval(q[::-1], z)
        error = (x * np.polyval(p[::-1], z) / q_before - t) / t
        weight = weight * (1 + 10 * np.abs(error) / np.abs(error).max())
    return p, q, float(np.abs(error).max()), float(q_before.min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--degrees", type=int, nargs=2, default=(4, 4))
    opts = parser.parse_args()
    p, q, error, q_min = fit(*opts.degrees)
    print("TANH_P =", tuple(float(v) for v in p[::-1]))
    print("TANH_Q =", tuple(float(v) for v in q[::-1]))
    print(f"largest relative error (f64) {error:.3g}; smallest Q {q_min:.3g}")


if __name__ == "__main__":
    main()
