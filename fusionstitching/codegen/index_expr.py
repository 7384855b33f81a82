"""Index expressions: quasi-affine integer sums of variables, floor divisions and remainders.

They simplify as they are built: index propagation through reshapes and bitcasts produces
``(row*256 + col) // 256``-style expressions that must fold back to ``row``, for readable
kernel IR and cheap code.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

from ..hlo.ir import Shape


# Entries of each memoized function below: expressions are immutable, and the same ones recur
# in every schedule of a pattern and in the explorer's overlapping patterns.
MEMO_SIZE = 1 << 16


class _Expr:
    """Expressions nest, so hashing or printing one did so for every expression inside it
    again (a third of the code generator's time went to hash and repr): each is done once.
    The hash is the dataclass's own (the same value, so set orders do not change)."""

    def _cached_hash(self) -> int:
        cached = self.__dict__.get("_hash")
        if cached is None:
            names = _FIELD_NAMES.get(type(self))
            if names is None:
                names = _FIELD_NAMES[type(self)] = tuple(f.name for f in fields(self))
            cached = self.__dict__["_hash"] = hash(tuple(getattr(self, n) for n in names))
        return cached

    @property
    def sort_key(self) -> str:
        """``repr``, the order of terms in a sum."""
        if "_repr" not in self.__dict__:
            self.__dict__["_repr"] = repr(self)
        return self.__dict__["_repr"]

    def __getstate__(self) -> dict:  # a hash of str is per process: never carry one over
        return {k: v for k, v in self.__dict__.items() if k not in ("_hash", "_repr", "_vars")}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # a dataclass's field names, in order


@dataclass(frozen=True)
class Var(_Expr):
    """An integer index variable taking the values 0 .. extent-1 (its range drives folding)."""

    name: str
    extent: int

    __hash__ = _Expr._cached_hash

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class FloorDiv(_Expr):
    arg: "Ix"
    k: int

    __hash__ = _Expr._cached_hash

    def __str__(self) -> str:
        return f"({self.arg} // {self.k})"


@dataclass(frozen=True)
class Mod(_Expr):
    arg: "Ix"
    k: int

    __hash__ = _Expr._cached_hash

    def __str__(self) -> str:
        return f"({self.arg} % {self.k})"


Atom = Var | FloorDiv | Mod


@dataclass(frozen=True)
class Ix(_Expr):
    """sum(coefficient * atom) + const, terms in a canonical order so that equal means equal."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    __hash__ = _Expr._cached_hash

    def __str__(self) -> str:
        parts = [str(a) if c == 1 else f"{c}*{a}" for a, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)

    def vars(self) -> set[Var]:
        """The variables the expression reads (kept: expressions nest; never mutate it)."""
        out = self.__dict__.get("_vars")
        if out is None:
            out = set()
            for atom, _ in self.terms:
                out |= {atom} if isinstance(atom, Var) else atom.arg.vars()
            self.__dict__["_vars"] = out
        return out

    def evaluate(self, env: dict[str, np.ndarray]) -> np.ndarray:
        total = np.int64(self.const)
        for atom, c in self.terms:
            if isinstance(atom, Var):
                v = env[atom.name]
            elif isinstance(atom, FloorDiv):
                v = atom.arg.evaluate(env) // atom.k
            else:
                v = atom.arg.evaluate(env) % atom.k
            total = total + c * v
        return total


def ix(x: int | Var | Ix) -> Ix:
    if isinstance(x, Ix):
        return x
    if isinstance(x, Var):
        return Ix(((x, 1),))
    return Ix((), int(x))


def _make(coeffs: dict[Atom, int], const: int) -> Ix:
    terms = tuple(sorted(((a, c) for a, c in coeffs.items() if c), key=lambda t: t[0].sort_key))
    return Ix(terms, const)


@lru_cache(maxsize=MEMO_SIZE)
def add(*xs: int | Var | Ix) -> Ix:
    coeffs: dict[Atom, int] = {}
    const = 0
    for x in map(ix, xs):
        const += x.const
        for a, c in x.terms:
            coeffs[a] = coeffs.get(a, 0) + c
    # Undo a delinearize-then-linearize round trip, one digit at a time:
    # (a // k) * k + a % k == a, and ((a // k) % m) * k + a % k == a % (k*m) (the middle
    # digits of a row of [4,8,8,32] reduced over its first three dimensions).
    for atom in list(coeffs):
        if not coeffs.get(atom):
            continue
        if isinstance(atom, FloorDiv):  # (a // k) * k
            a, k, m = atom.arg, atom.k, None
        elif isinstance(atom, Mod) and (digit := _bare_floordiv(atom.arg)) is not None:
            a, k, m = digit.arg, digit.k, atom.k  # ((a // k) % m) * k
        else:
            continue
        low = Mod(a, k)
        c_low = coeffs.get(low, 0)
        if c_low and coeffs[atom] == c_low * k:
            del coeffs[atom], coeffs[low]
            joined = a if m is None else mod(a, k * m)
            return add(_make(coeffs, const), scale(joined, c_low))
    return _make(coeffs, const)


def _bare_floordiv(x: Ix) -> FloorDiv | None:
    """The floor division ``x`` is, if it is one as is."""
    if x.const == 0 and len(x.terms) == 1 and x.terms[0][1] == 1 \
            and isinstance(x.terms[0][0], FloorDiv):
        return x.terms[0][0]
    return None


@lru_cache(maxsize=MEMO_SIZE)
def scale(x: int | Var | Ix, k: int) -> Ix:
    x = ix(x)
    return _make({a: c * k for a, c in x.terms}, x.const * k)


@lru_cache(maxsize=MEMO_SIZE)
def value_range(x: Ix) -> tuple[int, int]:
    """Inclusive bounds of x over all values of its variables."""
    lo = hi = x.const
    for atom, c in x.terms:
        if isinstance(atom, Var):
            alo, ahi = 0, atom.extent - 1
        elif isinstance(atom, FloorDiv):
            alo, ahi = (b // atom.k for b in value_range(atom.arg))
        else:
            alo, ahi = value_range(atom.arg)
            if alo < 0 or ahi >= atom.k:
                alo, ahi = 0, atom.k - 1
        lo, hi = lo + min(c * alo, c * ahi), hi + max(c * alo, c * ahi)
    return lo, hi


def _split(x: Ix, k: int) -> tuple[Ix, Ix]:
    """x = k*q + r where q collects the terms divisible by k."""
    q = {a: c // k for a, c in x.terms if c % k == 0}
    r = {a: c for a, c in x.terms if c % k != 0}
    return _make(q, x.const // k), _make(r, x.const % k)


def _aligned(r: Ix, k: int) -> tuple[int, Ix, Ix] | None:
    """r = a*y + s with a dividing k and 0 <= s < a for every value of the variables, for the
    largest such coefficient a: then floor(r / k) = floor(y / (k/a)) and
    r % k = a * (y % (k/a)) + s. Turns ``(128*bid + tid) // 256`` (tid < 128) into
    ``bid // 2`` and ``(4*c + 3) % 256`` into ``4*(c % 64) + 3``, so that index arithmetic
    is done once on the part that varies, and a vector lane stays visible as the constant
    (128-bit accesses, see `vector_group`)."""
    for a in sorted({c for _, c in r.terms if 1 < c < k and k % c == 0}, reverse=True):
        high = {t: c // a for t, c in r.terms if c % a == 0}
        low = _make({t: c for t, c in r.terms if c % a}, r.const % a)
        lo, hi = value_range(low)
        if 0 <= lo and hi < a:
            return a, _make(high, r.const // a), low
    return None


@lru_cache(maxsize=MEMO_SIZE)
def div(x: int | Var | Ix, k: int) -> Ix:
    x = ix(x)
    if k == 1:
        return x
    q, r = _split(x, k)  # floor((k*q + r) / k) == q + floor(r / k) for any integers
    lo, hi = value_range(r)
    if 0 <= lo and hi < k:
        return q
    if (aligned := _aligned(r, k)) is not None:
        a, y, _ = aligned
        return add(q, div(y, k // a))
    if len(r.terms) == 1 and r.const == 0 and r.terms[0][1] == 1 and isinstance(r.terms[0][0], FloorDiv):
        inner = r.terms[0][0]
        return add(q, Ix(((FloorDiv(inner.arg, inner.k * k), 1),)))
    return add(q, Ix(((FloorDiv(r, k), 1),)))


@lru_cache(maxsize=MEMO_SIZE)
def mod(x: int | Var | Ix, k: int) -> Ix:
    x = ix(x)
    _, r = _split(x, k)
    lo, hi = value_range(r)
    if 0 <= lo and hi < k:
        return r
    if (aligned := _aligned(r, k)) is not None:
        a, y, low = aligned
        return add(scale(mod(y, k // a), a), low)
    if len(r.terms) == 1 and r.const == 0 and r.terms[0][1] == 1 and isinstance(r.terms[0][0], Mod) \
            and r.terms[0][0].k % k == 0:
        return Ix(((Mod(r.terms[0][0].arg, k), 1),))
    return Ix(((Mod(r, k), 1),))


def strides(shape: Shape) -> list[int]:
    """Element strides of each logical dimension in the physical (minor_to_major) layout."""
    out = [0] * shape.rank
    step = 1
    for d in shape.minor_to_major:
        out[d] = step
        step *= shape.dims[d]
    return out


@lru_cache(maxsize=MEMO_SIZE)
def linearize(index: tuple[Ix, ...], shape: Shape) -> Ix:
    """Physical element offset of a logical index."""
    return add(*(scale(i, s) for i, s in zip(index, strides(shape))))


@lru_cache(maxsize=MEMO_SIZE)
def delinearize(offset: Ix, shape: Shape) -> tuple[Ix, ...]:
    """Logical index of a physical element offset (inverse of linearize)."""
    return tuple(mod(div(offset, s), d) for s, d in zip(strides(shape), shape.dims))


def row_major(shape: Shape) -> Shape:
    return Shape(shape.dtype, shape.dims, tuple(range(shape.rank - 1, -1, -1)))
