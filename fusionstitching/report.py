"""The Report (schema ``fusionstitching.report/1``) and its human-readable summary.

Definitions (DESIGN.md section 4): ``kernels`` counts launches of the entry computation
(no-ops excluded); ``mem_kernels`` those without dot/convolution/library calls; ``bytes`` sums,
over memory-intensive kernels, the distinct global bytes each reads plus the bytes it writes;
``compulsory_bytes`` is the same for the ideal plan with one kernel per connected
memory-intensive region. Every ``modeled_us`` is a cost-model estimate, not a measurement.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

SCHEMA = "fusionstitching.report/1"


@dataclass
class PlanSummary:
    kernels: int
    mem_kernels: int
    bytes: int
    modeled_us: float
    patterns: int | None = None  # stitched plan only


@dataclass
class Verify:
    ran: bool = False
    ok: bool = False
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    against: list[str] = field(default_factory=list)  # which references were compared
    not_run: str = ""  # why verification could not run (ran is False)
    inputs: str = ""  # the random inputs it ran on (verification.INPUT_KINDS)
    finite: float = 1.0  # fraction of the reference's float outputs that are finite
    compared: float = 1.0  # ... that are not NaN (NaN equals NaN: it compares nothing)
    vacuous: bool = False  # most outputs not finite, or rounding decides them (the evaluator
    # outside XLA's f32 distance too), on every kind of input: no verdict
    error: str = ""  # the stitched plan failed to run (ok is False)
    rounding_decides: str = ""  # outputs beyond XLA's own f32 distance, each element within
    # what f32 executions with other roundings reach (ok: a sign of rounding noise, say)
    schedules: list[str] = field(default_factory=list)  # which builds of the kernels ran


@dataclass
class Times:
    parse: float = 0.0
    explore: float = 0.0
    codegen: float = 0.0
    ptxas: float = 0.0
    total: float = 0.0


@dataclass
class KernelReport:
    name: str
    nodes: list[str]
    schemes: list[str]
    grid: list[int]
    block: list[int]
    smem_bytes: int
    regs: int | None
    regs_model: int | None  # None: the GPU schedule was not priced (a host-priced plan)
    spills: int | None
    bytes: int
    modeled_us: float


@dataclass
class Fallback:
    stage: str  # "explore", "codegen", "ptxas", "host", "verify", ...
    nodes: list[str]
    reason: str


@dataclass
class LeftToXla:
    """Memory-intensive XLA kernels outside every stitched kernel, for one reason: one kind of
    refusal or verdict (``explain.unstitched_kinds``), in words."""
    reason: str
    nodes: list[str]


@dataclass
class Report:
    module: str
    target: str
    xla: PlanSummary
    fs: PlanSummary
    compulsory_bytes: int
    verify: Verify = field(default_factory=Verify)
    times_s: Times = field(default_factory=Times)
    kernels: list[KernelReport] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    left_to_xla: list[LeftToXla] = field(default_factory=list)
    # how the plan was made: the explorer's strategy, or whose patterns it took (given)
    planned_by: str = ""
    schema: str = SCHEMA

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["fs"]["patterns"] = self.fs.patterns or 0
        del out["xla"]["patterns"]
        return {"schema": out.pop("schema"), **out}

    @property
    def ok(self) -> bool:
        """False when a check that ran failed (verification mismatch)."""
        return not self.verify.ran or self.verify.ok


@dataclass
class RuntimeInfo:
    """Optional ``runtime`` field of the Report: what runs and why."""

    mode: str = "sync"  # "sync" or "async" compilation
    # building -> pending -> trial -> timing -> settled | fallback; "waiting" before building
    # (job_clock.py STITCH_AFTER_S; TF's steps that --keras_jit=auto gave XLA run as
    # plain TF meanwhile)
    state: str = "building"
    kept: str = "xla"  # the executable calls run now: "xla" or "stitched"
    why: str = ""
    xla_us: float | None = None  # best time of the measurement that decided
    stitched_us: float | None = None
    calls: int = 0  # calls answered here; once decided, jax's dispatch runs them uncounted
    trial_call: int | None = None  # the call whose inputs the trial used
    swapped_at_call: int | None = None  # 1-based call number from which stitched ran
    build_s: float | None = None  # wall time of the stitched build
    stitched_plan: dict | None = None  # kernels of the built stitched executable
    timing_rounds: int | None = None  # rounds a confirmation takes (runtime/executor.py)


@dataclass
class RuntimeReport(Report):
    """A Report with what happened at run time (optional fields of the schema): ``runtime``
    (RuntimeInfo: which executable runs, measured times, swap call) and ``cache`` (kernel
    cache hits, misses, corrupt entries, LLVM seconds)."""

    runtime: dict | None = None
    cache: dict | None = None


def fallback_report(name: str, target: str, fallbacks: list) -> Report:
    """The pass did not run to the end: no plan to count, only why."""
    empty = PlanSummary(kernels=0, mem_kernels=0, bytes=0, modeled_us=0.0)
    return Report(module=name, target=target, xla=empty,
                  fs=dataclasses.replace(empty, patterns=0), compulsory_bytes=0,
                  fallbacks=fallbacks)


def write_json(reports: list[Report], path: str) -> None:
    with open(path, "w") as f:
        json.dump([r.to_json() for r in reports], f, indent=1)
        f.write("\n")


def format_summary(report: Report) -> str:
    """A few readable lines: XLA's plan vs the stitched plan, kernels, checks, fallbacks."""
    x, s = report.xla, report.fs
    lines = [
        f"module {report.module}  (target {report.target}, times modeled)",
        f"  XLA plan:      {x.kernels:4d} kernels, {x.mem_kernels:4d} memory-intensive, "
        f"{x.bytes:>12,d} bytes, {x.modeled_us:9.2f} us modeled",
        f"  stitched plan: {s.kernels:4d} kernels, {s.mem_kernels:4d} memory-intensive, "
        f"{s.bytes:>12,d} bytes, {s.modeled_us:9.2f} us modeled  ({s.patterns} patterns)",
        f"  compulsory bytes {report.compulsory_bytes:,d}",
    ]
    if report.planned_by.startswith("given"):  # the explorer's plan is the usual case
        lines.append(f"  planned: {report.planned_by}")
    for k in report.kernels:
        modeled = "not modeled" if k.regs_model is None else f"{k.regs_model} modeled"
        regs = (f"regs not assembled ({modeled})" if k.regs is None
                else f"{k.regs} regs ({modeled})")
        lines.append(f"  kernel {k.name}: {len(k.nodes)} XLA kernels {k.nodes} -> "
                     f"{'+'.join(k.schemes)}, grid {k.grid} block {k.block}, "
                     f"smem {k.smem_bytes} B, {regs}, spills {k.spills}, {k.bytes:,d} bytes")
    v = report.verify
    if v.ran and v.error:
        lines.append(f"  verify: FAILED: the stitched plan did not run: {v.error}")
    elif v.vacuous and v.compared >= 0.5:
        lines.append(f"  verify: vacuous: rounding decides the outputs on every kind of random "
                     f"input tried (last: {v.inputs}; the evaluator is outside XLA's f32 "
                     f"distance too); no verdict")
    elif v.vacuous:
        lines.append(f"  verify: vacuous: {1 - v.compared:.0%} of the outputs are NaN on "
                     f"every kind of random input tried (last: {v.inputs}); no verdict")
    elif v.ran and v.ok and v.rounding_decides:
        lines.append(f"  verify: OK against {', '.join(v.against)} ({v.inputs} inputs), where "
                     f"f32 rounding decides: {v.rounding_decides}; f32 executions with other "
                     f"roundings (the evaluator with rounding noise) land as far")
    elif v.ran:
        lines.append(f"  verify: {'OK' if v.ok else 'MISMATCH'} against {', '.join(v.against)} "
                     f"(max abs err {v.max_abs_err:.3g}, max rel err {v.max_rel_err:.3g}; "
                     f"{v.inputs} inputs, {v.finite:.1%} of outputs finite)")
    elif v.not_run:
        lines.append(f"  verify: not run: {v.not_run}")
    for fb in report.fallbacks:
        if fb.stage == "verify" and not fb.nodes:  # about the check, not a kernel
            lines.append(f"  verify note: {fb.reason}")
        else:
            lines.append(f"  left to XLA [{fb.stage}] {fb.nodes}: {fb.reason}")
    if report.left_to_xla:
        count = sum(len(group.nodes) for group in report.left_to_xla)
        lines.append(f"  memory-intensive XLA kernels not stitched: {count}, by reason")
        lines += [f"    {len(group.nodes):4d}  {group.reason}" for group in report.left_to_xla]
    t = report.times_s
    lines.append(f"  times: parse {t.parse:.3f}s explore {t.explore:.3f}s codegen "
                 f"{t.codegen:.3f}s ptxas {t.ptxas:.3f}s total {t.total:.3f}s")
    return "\n".join(lines)
