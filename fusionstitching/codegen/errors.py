"""Why the code generator refuses a pattern or a schedule: a kind (``Refusal``) and a detail.

Callers branch on the kind (the explorer groups decisions by it, the schedule choice decides
whether to try the phased schedule); the detail is the sentence a person reads.
"""
from __future__ import annotations

import enum


class Refusal(enum.Enum):
    """Kinds of code-generator refusals; each value is the kind in words (after "code
    generator: " where it is shown)."""

    NOT_IN_ENTRY = "not in the entry computation"
    UNSUPPORTED_OP = "unsupported op (or form of an op)"
    UNSUPPORTED_TYPE = "unsupported element type"
    UNSUPPORTED_COMBINER = "unsupported combiner"
    TUPLE = "a tuple read or written other than by element"
    DYNAMIC_SHAPE = "bounded-dynamic shape (size known only at run time)"
    ELIDED_CONSTANT = "elided constant"
    NO_OUTPUTS = "no outputs"
    CHAIN_TOO_LONG = "dependency chain too long"
    EXPRESSION_TOO_LARGE = "too many values at distinct indices"
    NON_CONSTANT_INIT = "reduction init value not a constant"
    TOO_MANY_WINDOWS = "too many windows per output element"
    DIFFERENT_SPACES = "reductions over different spaces"
    CROSS_BLOCK = "needs cross-block communication"
    READ_BEFORE_COMPUTED = "reduction read before it is computed"
    VARIADIC_ACROSS_THREADS = "variadic reduction across threads"
    VARIADIC_ORDER = "variadic reduction whose order depends on the layout"
    TOO_LARGE_FOR_BLOCK = "too many points for one block"
    SAME_KERNEL = "the same kernel as another candidate"
    UNCOALESCED = "uncoalesced reads"
    SHARED_MEMORY = "too much shared memory"
    CANNOT_LAUNCH = "cannot launch on the device"
    EXCLUDED = "excluded by the caller"
    NO_LOWERING = "no LLVM lowering"
    COLUMNS_FORM = "outside the host column schedule's form"


class CodegenError(Exception):
    """The code generator cannot build this pattern (or schedule): ``kind`` says which rule
    refused it, ``detail`` (also ``str(err)``) says how, in a sentence."""

    def __init__(self, kind: Refusal, detail: str):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


class NotFaster(Exception):
    """No schedule of a pattern is modeled faster than the caller asked (``below_us``, XLA's
    kernels' time): ``least_us`` is a time no schedule is modeled below (modeled)."""

    def __init__(self, least_us: float, below_us: float):
        super().__init__(f"modeled at {least_us:.2f} us or more, not below {below_us:.2f} us")
        self.least_us = least_us
        self.below_us = below_us
