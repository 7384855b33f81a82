"""f32 exp, log, tanh, erf, sine and cosine as plain arithmetic, for fast host kernels.

LLVM lowers ``llvm.exp.f32`` and friends on x86 to calls of the C library's scalar functions,
so a loop holding one is not vectorized and pays a call per element (a 512x1024 softmax took
5 ms, XLA:CPU 0.5 ms). These are range reductions and polynomials, selects for the special
values, and bit operations: the loop vectorizer widens them like any arithmetic, as XLA:CPU's
own polynomial approximations are. Every polynomial was fitted here (numpy, least squares at
Chebyshev nodes, in f64, to the function's smooth remainder named beside it; tanh's rational
by reweighted least squares on its relative error); each function is within a few ulp of the
correctly rounded result (tests/test_host_math.py measures it). Sine and cosine reduce any
finite f32 exactly enough in f64 (a table of 2/pi), then Taylor polynomials in f64.
"""
from __future__ import annotations

import math
from fractions import Fraction

from llvmlite import ir

F32 = ir.FloatType()
F64 = ir.DoubleType()
I32 = ir.IntType(32)

LOG2_E = 1 / math.log(2)
# ln 2 in two parts (Cody-Waite): LN2_HI has 9 significant bits, so n * LN2_HI is exact in f32
# for the n an f32 exp can reach.
LN2_HI = 0.693359375
LN2_LO = math.log(2) - LN2_HI
EXP_MAX = 88.72283935546875  # above: exp overflows f32
EXP_MIN = -103.972084  # below: the result rounds to 0 (under half the smallest subnormal)
# (e^r - 1 - r) / r^2 for |r| <= ln(2) / 2
EXP_POLY = (1.9899611927488557e-04, 1.3933902568861567e-03, 8.3332980759619774e-03,
            4.1666462635770084e-02, 1.6666666719921117e-01, 5.0000000136971512e-01)
SQRT_HALF = 0.707106781186547524
# (log(1 + m) - m + m^2 / 2) / m^3 for sqrt(1/2) - 1 <= m <= sqrt(2) - 1
LOG_POLY = (7.1596021162031565e-02, -1.1586937399353534e-01, 1.1665084134378124e-01,
            -1.2409169752087180e-01, 1.4249413396952681e-01, -1.6668543254720755e-01,
            2.0000723699992631e-01, -2.4999988510171117e-01, 3.3333331111166109e-01)
TANH_ONE = 9.5  # |x| beyond: tanh(x) rounds to 1 in f32; the rational is fitted up to here
# tanh(x) ~ x * P(x^2) / Q(x^2) for |x| <= TANH_ONE (relative error 3.4e-8 in f64;
# benchmarks/fit_tanh.py fits it)
TANH_P = (1.248838144007891e-08, 1.997194854718408e-05, 0.0034564397836334007,
          0.13347942726779355, 0.9999999662647763)
TANH_Q = (7.418311632825803e-07, 0.00032218985924716676, 0.025727662564890973,
          0.4668124777190262, 1.0)
ERF_SMALL = 1.0  # below: x * polynomial in x^2; above: 1 - erfc
# erf(x) / x in z = x^2, |x| < ERF_SMALL
ERF_POLY = (7.8824970715248976e-05, -8.0188549802262738e-04, 5.1893119411107963e-03,
            -2.6854328795116369e-02, 1.1283597463460129e-01, -3.7612626903576957e-01,
            1.1283791658815017e+00)
ERFC_LARGE = 2.0  # erfc's polynomial changes here
# erfc(x) * exp(x^2) in u = x - 1.5, 1 <= x < ERFC_LARGE (1.6e-7 relative error in f32)
ERFC_NEAR_CENTER = 1.5
ERFC_POLY_NEAR = (2.381482691575796e-4, -7.043418409181461e-4, 1.8828484623972842e-3,
                  -5.137907669895416e-3, 1.3377636207592698e-2, -3.293146773858581e-2,
                  7.615103059436998e-2, -1.6362290714814232e-1, 3.2158541650073835e-1)
# erfc(x) * exp(x^2) * x in w = 1/x^2, ERFC_LARGE <= x < ERF_ONE
ERFC_POLY_FAR = (-9.1733266633766135e+00, 1.1739268376225025e+01, -7.0229267899824936e+00,
                 2.8282965676376155e+00, -1.0053659618824069e+00, 4.2128707892770895e-01,
                 -2.8206187421437134e-01, 5.6418937122178658e-01)
ERF_ONE = 9.19  # above: erf(x) is 1.0 in f32
# sin(r) = r + r^3 SIN_POLY(r^2), cos(r) = 1 + r^2 COS_POLY(r^2): Taylor's coefficients, for
# |r| <= pi/4 in f64 (truncation below 1e-11 relative, far under an f32 ulp)
SIN_POLY = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(6, 0, -1))
COS_POLY = tuple((-1) ** k / math.factorial(2 * k) for k in range(6, 0, -1))
# A finite f32 is m * 2^e, m < 2^24 an integer, -149 <= e <= 104. SINCOS_TABLE[e + 149] is
# (2^e * 2/pi) mod 4 as two f64 (hi + lo, 106 bits): m times it, mod 4, is x * 2/pi mod 4 to
# about 2^-78, however large x is (Payne and Hanek's reduction, with one entry per exponent).
SINCOS_MIN_E, SINCOS_MAX_E = -149, 104


def _two_over_pi() -> Fraction:
    """2/pi to about 2^-450, from Machin's formula in integers."""
    scale = 1 << 460

    def atan_inverse(n: int) -> int:  # atan(1/n) * scale
        total, power, k = 0, scale // n, 0
        while power:
            total += (-1) ** k * (power // (2 * k + 1))
            power //= n * n
            k += 1
        return total

    pi = 16 * atan_inverse(5) - 4 * atan_inverse(239)
    return Fraction(2 * scale, 1) / pi


def _sincos_table() -> list[tuple[float, float]]:
    two_over_pi, table = _two_over_pi(), []
    for e in range(SINCOS_MIN_E, SINCOS_MAX_E + 1):
        value = two_over_pi * Fraction(2) ** e
        value -= 4 * (value.numerator // (4 * value.denominator))  # mod 4
        hi = float(value)
        table.append((hi, float(value - Fraction(hi))))
    return table


SINCOS_TABLE = _sincos_table()


def _const(value: float) -> ir.Constant:
    return ir.Constant(F32, value)


def _poly(b: ir.IRBuilder, x: ir.Value, coefficients) -> ir.Value:
    """Horner's rule in x's type (f32 or f64), highest power first; each step an
    ``llvm.fmuladd`` (one FMA where the CPU has it, else a multiply and an add: never a call)."""
    name = "llvm.fmuladd.f64" if x.type == F64 else "llvm.fmuladd.f32"
    acc = ir.Constant(x.type, coefficients[0])
    for c in coefficients[1:]:
        acc = _intrinsic(b, name, acc, x, ir.Constant(x.type, c))
    return acc


def _intrinsic(b: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    """A call of an intrinsic whose result has its first argument's type."""
    module = b.module
    fn = module.globals.get(name) or ir.Function(
        module, ir.FunctionType(args[0].type, [a.type for a in args]), name)
    return b.call(fn, list(args))


def _is_nan(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.fcmp_unordered("uno", x, x)


def _power_of_two(b: ir.IRBuilder, n: ir.Value) -> ir.Value:
    """2^n for a normal exponent n (an i32)."""
    return b.bitcast(b.shl(b.add(n, ir.Constant(I32, 127)), ir.Constant(I32, 23)), F32)


def _clamp(b: ir.IRBuilder, x: ir.Value, low: float, high: float) -> ir.Value:
    """x within [low, high], as compares and selects (x86: one maxps and one minps; a NaN
    comes out as ``low``: callers select their own result for it)."""
    above = b.select(b.fcmp_ordered(">", x, _const(low)), x, _const(low))
    return b.select(b.fcmp_ordered("<", above, _const(high)), above, _const(high))


def exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    clamped = _clamp(b, x, EXP_MIN, EXP_MAX)
    n = _intrinsic(b, "llvm.rint.f32", b.fmul(clamped, _const(LOG2_E)))
    r = b.fsub(b.fsub(clamped, b.fmul(n, _const(LN2_HI))), b.fmul(n, _const(LN2_LO)))
    p = b.fadd(b.fadd(b.fmul(b.fmul(_poly(b, r, EXP_POLY), r), r), r), _const(1.0))
    # 2^n as 2^h * 2^(n-h), h = n/2: n spans -150..128, past the normal exponents, and the
    # halves are normal, so results near the extremes overflow and go subnormal as they should.
    whole = b.fptosi(n, I32)
    half = b.ashr(whole, ir.Constant(I32, 1))
    result = b.fmul(b.fmul(p, _power_of_two(b, half)), _power_of_two(b, b.sub(whole, half)))
    result = b.select(b.fcmp_ordered(">", x, _const(EXP_MAX)), _const(float("inf")), result)
    result = b.select(b.fcmp_ordered("<", x, _const(EXP_MIN)), _const(0.0), result)
    return b.select(_is_nan(b, x), x, result)


def log(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    # Subnormal inputs are scaled into the normal range first (2^23 larger, 23 off the exponent).
    subnormal = b.fcmp_ordered("<", x, _const(1.17549435e-38))
    scaled = b.select(subnormal, b.fmul(x, _const(8388608.0)), x)
    bits = b.bitcast(scaled, I32)
    exponent = b.sub(b.lshr(bits, ir.Constant(I32, 23)), ir.Constant(I32, 126))
    exponent = b.sitofp(b.sub(exponent, b.select(subnormal, ir.Constant(I32, 23),
                                                 ir.Constant(I32, 0))), F32)
    # the mantissa in [0.5, 1)
    m = b.bitcast(b.or_(b.and_(bits, ir.Constant(I32, 0x007FFFFF)), ir.Constant(I32, 0x3F000000)),
                  F32)
    small = b.fcmp_ordered("<", m, _const(SQRT_HALF))
    exponent = b.select(small, b.fsub(exponent, _const(1.0)), exponent)
    m = b.fsub(b.select(small, b.fadd(m, m), m), _const(1.0))
    z = b.fmul(m, m)
    y = b.fmul(b.fmul(_poly(b, m, LOG_POLY), m), z)
    y = b.fadd(y, b.fmul(exponent, _const(LN2_LO)))
    y = b.fsub(y, b.fmul(z, _const(0.5)))
    result = b.fadd(b.fadd(m, y), b.fmul(exponent, _const(LN2_HI)))
    result = b.select(b.fcmp_ordered("==", x, _const(float("inf"))), x, result)
    result = b.select(b.fcmp_ordered("==", x, _const(0.0)), _const(float("-inf")), result)
    # x < 0 and NaN: NaN
    return b.select(b.fcmp_unordered("<", x, _const(0.0)), _const(float("nan")), result)


def tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    ax = _intrinsic(b, "llvm.fabs.f32", x)
    # min(|x|, TANH_ONE) and min(ratio, 1) as unordered selects: a NaN passes through both
    ax = b.select(b.fcmp_unordered("<", ax, _const(TANH_ONE)), ax, _const(TANH_ONE))
    z = b.fmul(ax, ax)
    ratio = b.fdiv(b.fmul(ax, _poly(b, z, TANH_P)), _poly(b, z, TANH_Q))
    ratio = b.select(b.fcmp_unordered("<", ratio, _const(1.0)), ratio, _const(1.0))
    return _intrinsic(b, "llvm.copysign.f32", ratio, x)


def erf(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    ax = _intrinsic(b, "llvm.fabs.f32", x)
    small = b.fmul(x, _poly(b, b.fmul(x, x), ERF_POLY))
    # erfc(|x|) = exp(-x^2) P(|x| - 1.5) below ERFC_LARGE, exp(-x^2) / |x| R(1/x^2) above
    safe = _intrinsic(b, "llvm.maxnum.f32", ax, _const(ERF_SMALL))
    near = _poly(b, b.fsub(safe, _const(ERFC_NEAR_CENTER)), ERFC_POLY_NEAR)
    q = b.fdiv(_const(1.0), safe)
    far = b.fmul(q, _poly(b, b.fmul(q, q), ERFC_POLY_FAR))
    p = b.select(b.fcmp_ordered("<", safe, _const(ERFC_LARGE)), near, far)
    erfc = b.fmul(exp(b, b.fneg(b.fmul(safe, safe))), p)
    large = _intrinsic(b, "llvm.copysign.f32", b.fsub(_const(1.0), erfc), x)
    large = b.select(b.fcmp_ordered(">=", ax, _const(ERF_ONE)),
                     _intrinsic(b, "llvm.copysign.f32", _const(1.0), x), large)
    result = b.select(b.fcmp_ordered("<", ax, _const(ERF_SMALL)), small, large)
    return b.select(_is_nan(b, x), x, result)


def _table_entry(b: ir.IRBuilder, part: int, index: ir.Value) -> ir.Value:
    """SINCOS_TABLE[index][part] (0: hi, 1: lo), from a constant global of the module."""
    name = ("fs_sincos_hi", "fs_sincos_lo")[part]
    table = b.module.globals.get(name)
    if table is None:
        typ = ir.ArrayType(F64, len(SINCOS_TABLE))
        table = ir.GlobalVariable(b.module, typ, name)
        table.initializer = ir.Constant(typ, [entry[part] for entry in SINCOS_TABLE])
        table.global_constant, table.linkage = True, "internal"
    return b.load(b.gep(table, [ir.Constant(I32, 0), index], source_etype=table.value_type),
                  typ=F64)


def _quadrant_and_rest(b: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(n, r): |x| = (n + r * 2/pi) * pi/2 modulo 2*pi, n an i32 quadrant (0-3) and r an f64
    within [-pi/4, pi/4]; any finite f32 x."""
    bits = b.bitcast(x, I32)
    i32 = lambda v: ir.Constant(I32, v)  # noqa: E731
    biased = b.and_(b.lshr(bits, i32(23)), i32(0xFF))
    fraction = b.and_(bits, i32(0x7FFFFF))
    subnormal = b.icmp_signed("==", biased, i32(0))
    m = b.select(subnormal, fraction, b.or_(fraction, i32(0x800000)))
    e = b.sub(b.select(subnormal, i32(1), biased), i32(150))  # |x| = m * 2^e
    index = b.sub(e, i32(SINCOS_MIN_E))
    index = b.select(b.icmp_signed(">", index, i32(len(SINCOS_TABLE) - 1)),
                     i32(len(SINCOS_TABLE) - 1), index)  # inf and NaN: any entry
    md = b.sitofp(m, F64)
    hi, lo = _table_entry(b, 0, index), _table_entry(b, 1, index)
    product = b.fmul(md, hi)
    error = _intrinsic(b, "llvm.fma.f64", md, hi, b.fneg(product))  # md * hi - product, exact
    four = ir.Constant(F64, 4.0)
    whole = b.fsub(product, b.fmul(four, _intrinsic(
        b, "llvm.floor.f64", b.fmul(product, ir.Constant(F64, 0.25)))))  # mod 4, exact
    low = _intrinsic(b, "llvm.fma.f64", md, lo, error)
    q = _intrinsic(b, "llvm.rint.f64", b.fadd(whole, low))
    rest = b.fadd(b.fsub(whole, q), low)  # whole - q is exact: low's bits are kept
    r = b.fmul(rest, ir.Constant(F64, math.pi / 2))
    return b.and_(b.fptosi(q, I32), i32(3)), r


def _sine_or_cosine(b: ir.IRBuilder, x: ir.Value, cosine: bool) -> ir.Value:
    n, r = _quadrant_and_rest(b, x)
    r2 = b.fmul(r, r)
    sin_r = _intrinsic(b, "llvm.fmuladd.f64", b.fmul(r, r2), _poly(b, r2, SIN_POLY), r)
    cos_r = _intrinsic(b, "llvm.fmuladd.f64", r2, _poly(b, r2, COS_POLY),
                       ir.Constant(F64, 1.0))
    one, two = ir.Constant(I32, 1), ir.Constant(I32, 2)
    odd = b.icmp_signed("!=", b.and_(n, one), ir.Constant(I32, 0))
    # sin: quadrants 2 and 3 negative, and odd sin(-x); cos: quadrants 1 and 2
    if cosine:
        value = b.select(odd, sin_r, cos_r)
        negative = b.icmp_signed("!=", b.and_(b.add(n, one), two), ir.Constant(I32, 0))
    else:
        value = b.select(odd, cos_r, sin_r)
        negative = b.xor(b.icmp_signed("!=", b.and_(n, two), ir.Constant(I32, 0)),
                         b.icmp_signed("<", b.bitcast(x, I32), ir.Constant(I32, 0)))
    value = b.fptrunc(value, F32)
    result = b.select(negative, b.fneg(value), value)
    infinite_or_nan = b.fcmp_unordered("uno", b.fsub(x, x), b.fsub(x, x))
    return b.select(infinite_or_nan, _const(float("nan")), result)


def sine(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _sine_or_cosine(b, x, cosine=False)


def cosine(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _sine_or_cosine(b, x, cosine=True)


FUNCTIONS = {"exponential": exp, "log": log, "tanh": tanh, "erf": erf, "sine": sine,
             "cosine": cosine}
