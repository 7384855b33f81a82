"""Bytes of every global load and store a kernel executes, over all its threads, in memory
and time that do not grow with the grid.

Index expressions are quasi-affine in blockIdx, so after a period P of blocks every one shifts
by a constant: the threads of blocks 0..P-1 are evaluated once (a base and a shift per
expression), each standing for blocks r, r+P, ...; a guard on the shifted values holds for an
interval of repeats, and a grid-stride loop's trip count is summed over it with a floor-sum.
Blocks that do not repeat within the grid are counted one by one; at most ``MAX_POINTS``
threads are held at once. docs/ARCHITECTURE.md has the reasoning.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .index_expr import FloorDiv, Ix, Var
from .kernel_ir import DTYPE_BYTES, GlobalLoad, GlobalStore, If, IndexLet, Kernel, Loop

# Threads (or loop instances) evaluated at once: 2^20 points hold a few int64 arrays of
# 8 MiB each, and cover every kernel of the corpus in one piece.
MAX_POINTS = 1 << 20


class _Aperiodic(Exception):
    """The period must be multiplied by ``factor`` for a division or remainder to shift by a
    whole number of steps."""

    def __init__(self, factor: int):
        super().__init__(factor)
        self.factor = factor


@dataclass
class _Points:
    """Thread instances: the value of each variable as ``base + q*shift`` for the period index
    q, the interval ``lo <= q < hi`` where the instance runs, and how many times it runs each
    time (the product of enclosing non-expanded loops' trip counts). ``trips``, where not
    None, is (A, D, step) of an enclosing loop counted by trips whose start moves with the
    block: in period q it runs max(0, ceil((A - q*D) / step)) times, a further factor."""

    env: dict[str, tuple[np.ndarray, int]]
    lo: np.ndarray
    hi: np.ndarray
    weight: np.ndarray
    trips: tuple[np.ndarray, int, int] | None = None

    def take(self, keep) -> "_Points":
        trips = None if self.trips is None else (self.trips[0][keep], *self.trips[1:])
        return _Points({k: (b[keep], s) for k, (b, s) in self.env.items()},
                       self.lo[keep], self.hi[keep], self.weight[keep], trips)

    def runs(self) -> int:
        """Executions of one statement at these points, over all periods."""
        if self.trips is None:
            return int(np.sum(self.weight * np.maximum(0, self.hi - self.lo)))
        return int(np.sum(self.weight * _trip_sum(self.lo, self.hi, *self.trips)))


def _trip_sum(lo: np.ndarray, hi: np.ndarray, a: np.ndarray, d: int, step: int) -> np.ndarray:
    """sum over lo <= q < hi of max(0, ceil((a - q*d) / step)), per point (d != 0)."""
    if d > 0:  # positive while q < a/d; the terms, from q = hi-1 down, are floor((b + j*d)/step)
        hi = np.minimum(hi, -(-a // d))
        n = np.maximum(0, hi - lo)
        b = a + step - 1 - (hi - 1) * d
    else:  # positive while q > -a/|d|; from q = lo up, floor((b + j*|d|) / step)
        lo = np.maximum(lo, (-a) // -d + 1)
        n = np.maximum(0, hi - lo)
        b = a + step - 1 + lo * -d
    b = np.where(n > 0, b, 0)
    return _floor_sum(n, np.full(n.shape, step, dtype=np.int64),
                      np.full(n.shape, abs(d), dtype=np.int64), b)


def _floor_sum(n: np.ndarray, m: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum over 0 <= j < n of floor((a*j + b) / m), elementwise, for n, a, b >= 0 and m > 0:
    the classic Euclid-like floor-sum reduction, O(log m) steps. n never grows and
    m shrinks, so a*n + b < (n+1)*m, n^2 and the sum bound every intermediate: in int64 where
    they fit, in Python integers otherwise."""
    if len(n) == 0:
        return np.zeros(0, dtype=np.int64)
    most_n, most_m, least_m = int(np.max(n)) + 1, int(np.max(m)), int(np.min(m))
    most_sum = most_n * (int(np.max(a)) * most_n + int(np.max(b))) // least_m + most_n
    if max(most_n * most_n, most_n * most_m, most_sum) >= 1 << 61:
        n, m, a, b = (x.astype(object) for x in (n, m, a, b))
    total = np.zeros(n.shape, dtype=n.dtype)
    while True:
        total = total + (n - 1) * n // 2 * (a // m) + n * (b // m)
        a, b = a % m, b % m
        y = a * n + b
        more = y >= m
        if not np.any(more):
            return total
        # Finished elements become inert: n = 0 contributes nothing and stops at once.
        n = np.where(more, y // m, 0)
        b = np.where(more, y % m, 0)
        m, a = np.where(more, a, 1), np.where(more, m, 0)


def _evaluate(x: Ix, env: dict[str, tuple[np.ndarray, int]]) -> tuple[np.ndarray, int]:
    """(base, shift) of an index expression; raises _Aperiodic where the period is too short
    for a division or remainder to move by whole steps."""
    total, shift = np.int64(x.const), 0
    for atom, c in x.terms:
        if isinstance(atom, Var):
            v, s = env[atom.name]
        else:
            a, sa = _evaluate(atom.arg, env)
            if sa % atom.k:
                raise _Aperiodic(atom.k // math.gcd(sa, atom.k))
            # floor((a + q*sa) / k) == floor(a / k) + q*sa/k, and the remainder is a's.
            v, s = (a // atom.k, sa // atom.k) if isinstance(atom, FloorDiv) else (a % atom.k, 0)
        total, shift = total + c * v, shift + c * s
    return total, shift


def _holds(points: _Points, s: If) -> _Points:
    """The instances (with their intervals of q narrowed) where the If's condition holds."""
    (bl, sl), (br, sr) = _evaluate(s.lhs, points.env), _evaluate(s.rhs, points.env)
    return _narrowed(points, br - bl, sl - sr, s.cmp)


def _narrowed(points: _Points, c, d: int, cmp: str) -> _Points:
    """The instances where q*d == c (cmp "eq") or q*d < c (cmp "lt"), intervals narrowed."""
    n = len(points.weight)
    c = np.broadcast_to(c, (n,))
    lo, hi = points.lo, points.hi
    if d == 0:
        taken = (c == 0) if cmp == "eq" else (c > 0)
    elif cmp == "eq":
        taken = c % d == 0
        lo, hi = np.maximum(lo, c // d), np.minimum(hi, c // d + 1)
    elif d > 0:  # q < c/d
        hi = np.minimum(hi, -(-c // d))
        taken = np.ones(n, dtype=bool)
    else:  # q > c/d, that is q >= floor(-c / -d) + 1
        lo = np.maximum(lo, (-c) // (-d) + 1)
        taken = np.ones(n, dtype=bool)
    narrowed = _Points(points.env, np.broadcast_to(lo, (n,)), np.broadcast_to(hi, (n,)),
                       points.weight, points.trips)
    return narrowed.take(taken & (narrowed.lo < narrowed.hi))


def _expanded(points: _Points, s: Loop, start: np.ndarray, shift: int, trips: np.ndarray
              ) -> Iterator[_Points]:
    """One instance per iteration of the loop, with the loop variable set, in slices of at
    most MAX_POINTS instances (a run of points whose trips fit, or part of one point's).
    With a start that moves by ``shift`` per period, trips are each point's most over its
    interval, and iteration i keeps the periods where start + i*step < stop."""
    for inner in _iterations(points, s, start, shift, trips):
        yield _narrowed(inner, s.stop - inner.env[s.var.name][0], shift, "lt") if shift else inner


def _iterations(points: _Points, s: Loop, start: np.ndarray, shift: int, trips: np.ndarray
                ) -> Iterator[_Points]:
    i, n = 0, len(trips)
    while i < n:
        if trips[i] > MAX_POINTS:  # one point's iterations, a slice at a time
            for first in range(0, int(trips[i]), MAX_POINTS):
                count = min(MAX_POINTS, int(trips[i]) - first)
                one = points.take(np.full(count, i))
                one.env = {**one.env,
                           s.var.name: (start[i] + s.step * (first + np.arange(count)), shift)}
                yield one
            i += 1
            continue
        j = i + max(1, int(np.searchsorted(np.cumsum(trips[i:]), MAX_POINTS, side="right")))
        part_trips = trips[i:j]
        inner = points.take(np.repeat(np.arange(i, j), part_trips))
        first = np.repeat(np.cumsum(part_trips) - part_trips, part_trips)
        iteration = np.arange(int(part_trips.sum())) - first
        inner.env = {**inner.env,
                     s.var.name: (np.repeat(start[i:j], part_trips) + s.step * iteration, shift)}
        yield inner
        i = j


def _walk(body: list, points: _Points, totals: list[int]) -> None:
    for s in body:
        if len(points.weight) == 0:
            return
        match s:
            case IndexLet():
                base, shift = _evaluate(s.index, points.env)
                base = np.broadcast_to(base, points.weight.shape)
                points = _Points({**points.env, s.var.name: (base, shift)},
                                 points.lo, points.hi, points.weight, points.trips)
            case GlobalLoad():
                totals[0] += points.runs() * DTYPE_BYTES[s.dst.dtype]
            case GlobalStore():
                totals[1] += points.runs() * DTYPE_BYTES[s.value.dtype]
            case If():
                _walk(s.body, _holds(points, s), totals)
            case Loop():
                assert points.trips is None, "a loop inside a loop counted by trips"
                base, shift = _evaluate(s.start, points.env)
                start = np.broadcast_to(base, points.weight.shape)
                if not _branches_on(s.body, s.var):
                    if shift:  # in period q: max(0, ceil((stop - start - q*shift) / step))
                        inner = _Points(points.env, points.lo, points.hi, points.weight,
                                        (s.stop - start, shift, s.step))
                    else:
                        trips = np.maximum(0, -(-(s.stop - start) // s.step))
                        inner = _Points(points.env, points.lo, points.hi, points.weight * trips)
                    _walk(s.body, inner, totals)
                    continue
                # The most trips over the interval: at its first period (or last, for a
                # start that moves down).
                first = start + shift * np.where(shift > 0, points.lo, points.hi - 1)
                trips = np.maximum(0, -(-(s.stop - first) // s.step))
                for inner in _expanded(points, s, start, shift, trips):
                    _walk(s.body, inner, totals)


def _branches_on(body: list, var: Var) -> bool:
    """Whether control flow inside body depends on var (or nests a loop)."""
    for s in body:
        if isinstance(s, Loop):
            return True
        if isinstance(s, If) and (var in s.lhs.vars() | s.rhs.vars() or _branches_on(s.body, var)):
            return True
        if isinstance(s, If) and any(isinstance(x, IndexLet) for x in s.body):
            return True
    return False


def _blocks(kernel: Kernel, first: np.ndarray, period: int, repeats: np.ndarray) -> _Points:
    """The threads of the blocks ``first``, each standing for blocks first + q*period,
    0 <= q < repeats."""
    threads = kernel.block[0]
    n = len(first) * threads
    return _Points({kernel.tid.name: (np.tile(np.arange(threads, dtype=np.int64), len(first)), 0),
                    kernel.bid.name: (np.repeat(first, threads), period)},
                   np.zeros(n, dtype=np.int64), np.repeat(repeats, threads),
                   np.ones(n, dtype=np.int64))


def global_traffic(kernel: Kernel) -> tuple[int, int]:
    """(bytes loaded, bytes stored) by every global load and store the kernel executes.

    Conditions and loop bounds are index expressions of tid, bid and loop variables, never of
    data, so the count is exact; see the module's docstring for how it stays bounded."""
    period = 1
    while period < kernel.grid[0]:
        try:
            return _count(kernel, period)
        except _Aperiodic as e:
            period *= e.factor
    return _count(kernel, 0)


def _count(kernel: Kernel, period: int) -> tuple[int, int]:
    """The traffic of the blocks 0 .. period-1, each standing for every period-th block after
    it; period 0: every block on its own. A slice of at most MAX_POINTS threads at a time."""
    threads, blocks = kernel.block[0], kernel.grid[0]
    totals = [0, 0]
    step = max(1, MAX_POINTS // threads)
    for b in range(0, period or blocks, step):
        first = np.arange(b, min(period or blocks, b + step), dtype=np.int64)
        repeats = -(-(blocks - first) // period) if period else np.ones(len(first), np.int64)
        _walk(kernel.body, _blocks(kernel, first, period, repeats), totals)
    return totals[0], totals[1]
