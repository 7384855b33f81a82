"""Random JAX programs for the differential fuzzer: seeded, printable, runnable in f32 and f64.

A ``Program`` is Python source defining ``f(*inputs)`` over ``jnp``/``lax``, with ``F`` the
float type: the same source runs in f32 (what is checked) and, with ``F = float64`` under x64,
as the near-exact yardstick. Ops are drawn from what memory-intensive fusion meets in models:
elementwise math, broadcasts, reductions over random axes, transposes, reshapes, slices,
concatenates, pads, flips, dynamic slices and updates at traced indices, dtype round trips,
integer bit ops, softmax and normalizations, cumulative scans, small dots; a share of programs
returns gradients. Every op keeps values finite on normal inputs (logs of |x| + c, clipped
exponents), so a check compares numbers, not NaN with NaN.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

DIMS = (1, 2, 3, 4, 5, 7, 8, 16, 17, 32, 64, 128)
MAX_ELEMENTS = 1 << 15  # per value, so that a program compiles and runs in about a second
LONG_ROWS = (1000, 4096, 1 << 14, 1 << 16)  # the long reductions some programs have


@dataclasses.dataclass(frozen=True)
class Input:
    name: str
    dims: tuple[int, ...]
    dtype: str  # "float" (F) or "int32"


@dataclasses.dataclass(frozen=True)
class Program:
    seed: int
    source: str  # defines f(*inputs); F is the float type
    inputs: tuple[Input, ...]
    gradient: bool  # f returns (loss, gradients of the float inputs)

    def function(self, float_type):
        """``f`` with ``F`` bound to ``float_type`` (jnp.float32 or jnp.float64)."""
        import jax
        import jax.numpy as jnp
        from jax import lax

        scope = {"jax": jax, "jnp": jnp, "lax": lax, "F": float_type}
        exec(compile(self.source, f"<fuzz program {self.seed}>", "exec"), scope)
        return scope["f"]

    def arguments(self, float_dtype=np.float32, seed: int | None = None) -> list[np.ndarray]:
        """Seeded inputs: standard normal floats, small non-negative integers (indices)."""
        rng = np.random.default_rng(self.seed if seed is None else seed)
        out = []
        for spec in self.inputs:
            if spec.dtype == "int32":
                out.append(rng.integers(0, 8, size=spec.dims).astype(np.int32))
            else:
                out.append(rng.standard_normal(spec.dims).astype(np.float32).astype(float_dtype))
        return out


@dataclasses.dataclass
class _Value:
    name: str
    dims: tuple[int, ...]
    dtype: str  # "F", "bf16", "f16", "int32", "bool"

    @property
    def size(self) -> int:
        return math.prod(self.dims)


_UNARY = (
    "jnp.tanh({x})", "jnp.sin({x})", "jnp.cos({x})", "jax.nn.sigmoid({x})", "lax.erf({x})",
    "jnp.exp(jnp.clip({x}, -8.0, 8.0))", "jnp.log(jnp.abs({x}) + 0.5)", "jnp.log1p(jnp.abs({x}))",
    "jnp.expm1(jnp.clip({x}, -5.0, 5.0))", "jnp.sqrt(jnp.abs({x}) + 0.25)",
    "lax.rsqrt(jnp.abs({x}) + 0.5)", "jnp.abs({x})", "-{x}", "{x} * {x}", "jnp.floor({x} * 4.0)",
    "jnp.round({x} * 3.0)", "jax.nn.relu({x})", "jax.nn.gelu({x})", "jax.nn.softplus({x})",
    "jnp.power(jnp.abs({x}) + 0.5, {p})", "1.0 / (1.0 + {x} * {x})", "jnp.sign({x}) * 0.5",
    "jnp.clip({x}, -1.0, 1.0)", "jnp.arctan({x})", "jax.nn.silu({x})", "{x} * {c}",
)
_BINARY = (
    "{x} + {y}", "{x} - {y}", "{x} * {y}", "{x} / (jnp.abs({y}) + 0.5)", "jnp.maximum({x}, {y})",
    "jnp.minimum({x}, {y})", "jnp.where({x} > {y}, {x}, {y} * 0.5)", "jnp.arctan2({x}, {y})",
    "jnp.where({x} > 0.0, {y}, -{y})", "{x} * jax.nn.sigmoid({y})",
)


class _Generator:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.lines: list[str] = []
        self.inputs: list[Input] = []
        self.values: list[_Value] = []
        self.index: _Value | None = None  # a traced int32 scalar, for dynamic slices
        self.count = 0

    # -- helpers ------------------------------------------------------------------------
    def choice(self, options):
        return options[int(self.rng.integers(len(options)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def new(self, expr: str, dims, dtype: str = "F") -> _Value:
        value = _Value(f"v{self.count}", tuple(int(d) for d in dims), dtype)
        self.count += 1
        self.lines.append(f"    {value.name} = {expr}")
        self.values.append(value)
        return value

    def add_input(self, dims, dtype: str = "float") -> _Value:
        name = f"x{len(self.inputs)}"
        self.inputs.append(Input(name, tuple(int(d) for d in dims), dtype))
        value = _Value(name, tuple(int(d) for d in dims), "F" if dtype == "float" else "int32")
        if dtype == "float":
            self.values.append(value)
        return value

    def random_dims(self, rank: int | None = None) -> tuple[int, ...]:
        rank = int(self.rng.integers(1, 5)) if rank is None else rank
        while True:
            dims = tuple(self.choice(DIMS) for _ in range(rank))
            if 2 <= math.prod(dims) <= MAX_ELEMENTS:
                return dims

    def float_value(self, min_rank: int = 0) -> _Value:
        """A recent F value (recent ones more often, so programs form chains)."""
        floats = [v for v in self.values if v.dtype == "F" and len(v.dims) >= min_rank]
        if not floats:
            return self.add_input(self.random_dims(max(min_rank, 2)))
        weights = np.arange(1, len(floats) + 1, dtype=float) ** 2
        return floats[int(self.rng.choice(len(floats), p=weights / weights.sum()))]

    def index_value(self) -> str:
        if self.index is None:
            self.index = self.add_input((), "int32")
        return self.index.name

    def same_dims_partner(self, x: _Value) -> _Value:
        """A second F value of ``x``'s dims: an existing one, a broadcast of a reduction of
        ``x`` (keepdims), or a new input (of a broadcastable shape)."""
        same = [v for v in self.values if v.dtype == "F" and v.dims == x.dims and v is not x]
        roll = self.rng.random()
        if same and roll < 0.45:
            return self.choice(same)
        if x.dims and roll < 0.75:
            axes = self.axes(x)
            op = self.choice(("jnp.mean", "jnp.max", "jnp.sum", "jnp.min"))
            reduced = self.new(f"{op}({x.name}, axis={axes}, keepdims=True)",
                               [1 if i in axes else d for i, d in enumerate(x.dims)])
            return self.new(f"jnp.broadcast_to({reduced.name}, {x.dims})", x.dims)
        # a new input that broadcasts: some dims 1, or fewer leading dims
        dims = list(x.dims)
        if dims and self.chance(0.5):
            dims = [1 if self.chance(0.4) else d for d in dims]
        elif len(dims) > 1 and self.chance(0.5):
            dims = dims[int(self.rng.integers(1, len(dims))):]
        y = self.add_input(dims or ())
        return self.new(f"jnp.broadcast_to({y.name}, {x.dims})", x.dims)

    def axes(self, x: _Value) -> tuple[int, ...]:
        rank = len(x.dims)
        count = int(self.rng.integers(1, rank + 1))
        return tuple(sorted(int(a) for a in self.rng.choice(rank, size=count, replace=False)))

    # -- ops ------------------------------------------------------------------------------
    def unary(self):
        x = self.float_value()
        expr = self.choice(_UNARY).format(x=x.name, p=self.choice(("2.0", "3.0", "0.5", "-1.0")),
                                          c=self.choice(("0.5", "2.0", "-1.5", "0.001")))
        self.new(expr, x.dims)

    def binary(self):
        x = self.float_value()
        y = self.same_dims_partner(x)
        a, b = (x, y) if self.chance(0.5) else (y, x)
        self.new(self.choice(_BINARY).format(x=a.name, y=b.name), x.dims)

    def reduce(self):
        x = self.float_value(min_rank=1)
        axes = self.axes(x)
        keep = self.chance(0.4)
        op = self.choice(("jnp.sum", "jnp.mean", "jnp.max", "jnp.min", "jnp.sum", "jnp.mean",
                          "jax.nn.logsumexp", "jnp.var", "jnp.prod"))
        arg = f"jnp.tanh({x.name}) * 0.5 + 1.0" if op == "jnp.prod" else x.name
        dims = [1 if i in axes else d for i, d in enumerate(x.dims) if keep or i not in axes]
        self.new(f"{op}({arg}, axis={axes}{', keepdims=True' if keep else ''})", dims)

    def arg_reduce(self):
        x = self.float_value(min_rank=1)
        axis = int(self.rng.integers(len(x.dims)))
        op = self.choice(("jnp.argmax", "jnp.argmin"))
        dims = [d for i, d in enumerate(x.dims) if i != axis]
        i = self.new(f"{op}({x.name}, axis={axis}).astype(jnp.int32)", dims, "int32")
        self.new(f"{i.name}.astype(F) * 0.25", dims)

    def normalize(self):
        x = self.float_value(min_rank=1)
        axis = self.choice((-1, int(self.rng.integers(len(x.dims)))))
        kind = self.choice(("softmax", "log_softmax", "layernorm", "rmsnorm", "standardize"))
        if kind == "softmax":
            expr = f"jax.nn.softmax({x.name}, axis={axis})"
        elif kind == "log_softmax":
            expr = f"jax.nn.log_softmax({x.name}, axis={axis})"
        elif kind == "layernorm":
            m = f"jnp.mean({x.name}, axis={axis}, keepdims=True)"
            expr = (f"({x.name} - {m}) * lax.rsqrt(jnp.mean(jnp.square({x.name} - {m}), "
                    f"axis={axis}, keepdims=True) + 1e-5)")
        elif kind == "rmsnorm":
            expr = (f"{x.name} * lax.rsqrt(jnp.mean({x.name} * {x.name}, axis={axis}, "
                    f"keepdims=True) + 1e-6)")
        else:
            expr = f"jax.nn.standardize({x.name}, axis={axis}, epsilon=1e-5)"
        self.new(expr, x.dims)

    def scan(self):
        x = self.float_value(min_rank=1)
        axis = int(self.rng.integers(len(x.dims)))
        op = self.choice(("jnp.cumsum", "lax.cummax", "lax.cummin", "jnp.cumsum"))
        reverse = ", reverse=True" if op.startswith("lax") and self.chance(0.3) else ""
        self.new(f"{op}({x.name}, axis={axis}{reverse})", x.dims)

    def transpose(self):
        x = self.float_value(min_rank=2)
        perm = tuple(int(p) for p in self.rng.permutation(len(x.dims)))
        self.new(f"jnp.transpose({x.name}, {perm})", [x.dims[p] for p in perm])

    def reshape(self):
        x = self.float_value(min_rank=1)
        dims = list(x.dims)
        if len(dims) >= 2 and self.chance(0.5):  # merge two neighbours
            i = int(self.rng.integers(len(dims) - 1))
            dims[i:i + 2] = [dims[i] * dims[i + 1]]
        else:  # split a dimension into two factors
            i = int(self.rng.integers(len(dims)))
            factors = [f for f in range(2, dims[i]) if dims[i] % f == 0]
            if factors:
                f = self.choice(factors)
                dims[i:i + 1] = [f, dims[i] // f]
            else:
                dims.insert(i, 1)
        self.new(f"{x.name}.reshape({tuple(dims)})", dims)

    def slice(self):
        x = self.float_value(min_rank=1)
        parts, dims = [], []
        for d in x.dims:
            if d > 1 and self.chance(0.6):
                start = int(self.rng.integers(0, d - 1))
                stop = int(self.rng.integers(start + 1, d + 1))
                step = self.choice((1, 1, 2)) if stop - start > 2 else 1
                parts.append(f"{start}:{stop}" + (f":{step}" if step > 1 else ""))
                dims.append(len(range(start, stop, step)))
            else:
                parts.append(":")
                dims.append(d)
        self.new(f"{x.name}[{', '.join(parts)}]", dims)

    def concatenate(self):
        x = self.float_value(min_rank=1)
        axis = int(self.rng.integers(len(x.dims)))
        other = self.new(self.choice(_UNARY).format(x=x.name, p="2.0", c="0.5"), x.dims)
        parts = [x, other] if self.chance(0.5) else [other, x, other]
        dims = list(x.dims)
        dims[axis] *= len(parts)
        if math.prod(dims) > MAX_ELEMENTS:
            return
        self.new(f"jnp.concatenate([{', '.join(p.name for p in parts)}], axis={axis})", dims)

    def pad(self):
        x = self.float_value(min_rank=1)
        config, dims = [], []
        for d in x.dims:
            lo, hi = int(self.rng.integers(-min(d - 1, 2), 3)), int(self.rng.integers(0, 3))
            interior = 1 if self.chance(0.2) else 0
            config.append((lo, hi, interior))
            dims.append(lo + hi + d + max(d - 1, 0) * interior)
        if math.prod(dims) > MAX_ELEMENTS or min(dims) < 1:
            return
        self.new(f"lax.pad({x.name}, 0.0, {tuple(config)})", dims)

    def flip(self):
        x = self.float_value(min_rank=1)
        self.new(f"jnp.flip({x.name}, axis={int(self.rng.integers(len(x.dims)))})", x.dims)

    def dynamic_slice(self):
        x = self.float_value(min_rank=1)
        axis = int(self.rng.integers(len(x.dims)))
        size = int(self.rng.integers(1, x.dims[axis] + 1))
        index = self.index_value()
        dims = list(x.dims)
        dims[axis] = size
        self.new(f"lax.dynamic_slice_in_dim({x.name}, {index} % {x.dims[axis]}, {size}, "
                 f"axis={axis})", dims)

    def dynamic_update(self):
        x = self.float_value(min_rank=1)
        axis = int(self.rng.integers(len(x.dims)))
        size = int(self.rng.integers(1, x.dims[axis] + 1))
        dims = list(x.dims)
        dims[axis] = size
        update = self.new(f"jnp.tanh(lax.slice_in_dim({x.name}, 0, {size}, axis={axis})) * 2.0",
                          dims)
        index = self.index_value() if self.chance(0.7) else str(int(self.rng.integers(0, 3)))
        self.new(f"lax.dynamic_update_slice_in_dim({x.name}, {update.name}, {index}, "
                 f"axis={axis})", x.dims)

    def convert(self):
        x = self.float_value()
        kind = self.choice(("bf16", "f16", "int", "bits", "bf16_math"))
        if kind in ("bf16", "f16"):
            t = "jnp.bfloat16" if kind == "bf16" else "jnp.float16"
            self.new(f"{x.name}.astype({t}).astype(F)", x.dims)
        elif kind == "bf16_math":  # a few ops computed in bfloat16, as mixed precision does
            low = self.new(f"{x.name}.astype(jnp.bfloat16)", x.dims, "bf16")
            op = self.choice(("jnp.tanh({x})", "{x} * {x}", "jax.nn.sigmoid({x})",
                              "jnp.exp(jnp.clip({x}, -4.0, 4.0))"))
            y = self.new(op.format(x=low.name), x.dims, "bf16")
            if x.dims and self.chance(0.5):
                axes = self.axes(x)
                dims = [d for i, d in enumerate(x.dims) if i not in axes]
                y = self.new(f"jnp.sum({y.name}, axis={axes})", dims, "bf16")
            self.new(f"{y.name}.astype(F)", y.dims)
        elif kind == "int":
            i = self.new(f"jnp.clip({x.name} * 8.0, -1000.0, 1000.0).astype(jnp.int32)", x.dims,
                         "int32")
            op = self.choice(("{i} >> 1", "{i} << 2", "{i} & 7", "{i} % 5", "{i} * 3 + 1",
                              "jnp.abs({i}) // 3"))
            j = self.new(op.format(i=i.name), x.dims, "int32")
            self.new(f"{j.name}.astype(F) * 0.125", x.dims)
        else:  # an input's bits as an integer and back, as dropout's random bits are
            x = self.choice([v for v in self.values if v.name.startswith("x")] or [x])
            i = self.new(f"lax.bitcast_convert_type({x.name}.astype(jnp.float32), jnp.uint32)",
                         x.dims, "int32")
            j = self.new(f"({i.name} >> 9) | jnp.uint32(0x3F800000)", x.dims, "int32")
            self.new(f"(lax.bitcast_convert_type({j.name}, jnp.float32) - 1.0).astype(F)", x.dims)

    def iota(self):
        x = self.float_value(min_rank=1)
        axis = int(self.rng.integers(len(x.dims)))
        iota = f"lax.broadcasted_iota(jnp.int32, {x.dims}, {axis})"
        if self.chance(0.5):
            self.new(f"jnp.where({iota} % 2 == 0, {x.name}, -{x.name})", x.dims)
        else:
            self.new(f"{x.name} + {iota}.astype(F) * 0.1", x.dims)

    def dot(self):
        x = self.float_value(min_rank=1)
        k = x.dims[-1]
        n = self.choice((1, 3, 4, 8, 16))
        if math.prod(x.dims[:-1]) * n > MAX_ELEMENTS:
            return
        w = self.add_input((k, n))
        self.values.remove(w)  # a weight: not an operand of later elementwise ops
        self.new(f"jnp.dot({x.name}, {w.name} * 0.25, precision=lax.Precision.HIGHEST)",
                 (*x.dims[:-1], n))

    def window(self):
        x = self.float_value(min_rank=1)
        axis = len(x.dims) - 1
        size = self.choice((2, 3))
        if x.dims[axis] < size:
            return
        dims = list(x.dims)
        dims[axis] = x.dims[axis] - size + 1
        window = tuple(size if i == axis else 1 for i in range(len(x.dims)))
        op, init = self.choice((("lax.add", "0.0"), ("lax.max", "-jnp.inf")))  # jit's autodiff
        # knows these two monoids only with Python scalars as init values
        self.new(f"lax.reduce_window({x.name}, {init}, {op}, {window}, "
                 f"{(1,) * len(x.dims)}, 'VALID')", dims)

    def long_reduce(self):
        """A long sum or mean: where the summation order decides the accuracy."""
        n = self.choice(LONG_ROWS)
        rows = self.choice((1, 2, 4)) if n <= 4096 else 1
        x = self.add_input((rows, n) if rows > 1 else (n,))
        y = self.new(self.choice(("{x} * {x}", "jnp.abs({x}) + 0.5", "{x} * 0.0 + 0.50025",
                                  "jnp.tanh({x}) + 1.0")).format(x=x.name), x.dims)
        op = self.choice(("jnp.sum", "jnp.mean"))
        self.new(f"{op}({y.name}, axis=-1)", x.dims[:-1])

    OPS = (("unary", 6), ("binary", 6), ("reduce", 5), ("normalize", 3), ("transpose", 2),
           ("reshape", 2), ("slice", 2), ("concatenate", 1), ("pad", 1), ("flip", 1),
           ("dynamic_slice", 1), ("dynamic_update", 1), ("convert", 2), ("scan", 1),
           ("arg_reduce", 1), ("iota", 1), ("dot", 1), ("window", 1))

    def program(self, seed: int) -> Program:
        for _ in range(int(self.rng.integers(1, 3))):
            self.add_input(self.random_dims())
        if self.chance(0.1):
            self.long_reduce()
        names = [name for name, _ in self.OPS]
        weights = np.array([w for _, w in self.OPS], dtype=float)
        for _ in range(int(self.rng.integers(4, 13))):
            getattr(self, names[int(self.rng.choice(len(names), p=weights / weights.sum()))])()
        gradient = self.chance(0.35)
        floats = [v for v in self.values if v.dtype == "F" and not v.name.startswith("x")]
        if not floats:
            self.unary()
            floats = [self.values[-1]]
        outputs = [floats[-1]] + [v for v in floats[:-1] if self.chance(0.2)][:2]
        params = ", ".join(i.name for i in self.inputs)
        body = "\n".join(self.lines)
        if gradient:
            loss = " + ".join(f"jnp.mean(jnp.tanh({o.name}))" for o in outputs)
            wrt = tuple(i for i, spec in enumerate(self.inputs) if spec.dtype == "float")
            source = (f"def loss({params}):\n{body}\n    return {loss}\n\n"
                      f"def f({params}):\n    return jax.value_and_grad(loss, argnums={wrt})"
                      f"({params})\n")
        else:
            result = ", ".join(o.name for o in outputs)
            source = f"def f({params}):\n{body}\n    return ({result},)\n"
        return Program(seed, source, tuple(self.inputs), gradient)


def generate(seed: int) -> Program:
    """The program of ``seed`` (the same program for the same seed, on every machine)."""
    return _Generator(seed).program(seed)
