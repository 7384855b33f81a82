"""The capability query the explorer asks of a pattern (XLA's CanFuse): can the code generator
build it, is the kernel modeled faster than XLA's kernels it replaces, and does ptxas keep it
out of spills? The same question in the planning process and in the query workers
(query_workers.py), so a plan does not depend on where its queries ran. Priced for the host
CPU (``costmodel.HostPricing``), what runs is the pattern's CPU schedule: the question is
asked of it, and of the first GPU schedule that builds (the one the host route emulates).
"""
from __future__ import annotations

import enum
from collections.abc import MutableMapping

import costmodel
from costmodel.latency import MAX_REGISTERS_PER_THREAD

from . import codegen
from .codegen import modeled_kernel_us
from .graph import OpGraph
from .graph.refusal import Refusal, internal
from .graph.xla_kernel_model import xla_kernel_profile


class PlanRefusal(enum.Enum):
    """Why the pipeline refuses a pattern the code generator can build."""

    SLOWER_THAN_XLA = "stitched kernel modeled no faster than XLA's kernels"
    SPILLS = "ptxas spills the pattern's fastest schedule"
    PLANNING_BUDGET = "the planner's budget of code-generator work for the module is spent"


def ask_counted(graph: OpGraph, nodes: list[str], device, target: str, ptxas: bool,
                chosen: MutableMapping, pricing=None
                ) -> tuple[codegen.KernelSpec | Refusal, int]:
    """``ask``'s answer and its work: the values the code generator computed for it, or the
    statements it placed where those are more (their pricing is then most of the time)."""
    values, statements = codegen.values_built(), codegen.statements_placed()
    answer = ask(graph, nodes, device, target, ptxas, chosen, pricing)
    return answer, max(codegen.values_built() - values, codegen.statements_placed() - statements)


def ask(graph: OpGraph, nodes: list[str], device, target: str, ptxas: bool,
        chosen: MutableMapping, pricing=None) -> codegen.KernelSpec | Refusal:
    """The fastest kernel of ``nodes`` when the pipeline would use it, else why not.
    ``chosen``: the schedules chosen so far by pattern form (``generate``'s). ``pricing``: a
    ``costmodel.HostPricing`` to ask it for the host CPU (None: for ``device``)."""
    if isinstance(pricing, costmodel.HostPricing):
        return _ask_for_host(graph, nodes, device, chosen, pricing)
    xla_us = sum(xla_kernel_us(graph, n, device) for n in nodes if graph.nodes[n].is_kernel)
    try:
        # below_us: schedules that cannot beat XLA's kernels are not built or priced
        spec = codegen.generate(graph.module, nodes, "probe", device, chosen=chosen,
                                with_host_kernel=False, below_us=xla_us,
                                kept=graph.derived.setdefault(("kept kernels", device), {}),
                                not_faster=graph.derived.setdefault(("not faster", device), {}))
    except codegen.NotFaster as exc:
        return Refusal(PlanRefusal.SLOWER_THAN_XLA,
                       f"stitched kernel modeled at {exc.least_us:.2f} us or more is not "
                       f"faster than XLA's kernels at {xla_us:.2f} us (modeled, {target})")
    except codegen.CodegenError as exc:
        return Refusal(exc.kind, exc.detail)
    except Exception as exc:  # a defect of ours: the pattern is refused, with the reason
        return internal(exc)
    slower = slower_than_xla(graph, spec, device, target)
    if slower:
        return Refusal(PlanRefusal.SLOWER_THAN_XLA, slower)
    if ptxas and spec.regs_model >= MAX_REGISTERS_PER_THREAD and codegen.find_ptxas():
        # At the register model's cap it cannot tell whether ptxas spills: ask ptxas
        # (the chosen schedule only: trying the others here made planning minutes longer).
        try:
            if spec.borrowed:  # assembled under its own names
                spec = codegen.with_own_names(graph.module, spec, spec.name, device)
            spills = codegen.compile_nvptx(spec, device.sm_arch).spills
        except Exception as exc:  # ptxas failed or timed out: the pattern is refused
            return internal(exc)
        if spills:
            return Refusal(PlanRefusal.SPILLS,
                           f"ptxas ({device.sm_arch}) spills the pattern's fastest "
                           f"schedule: {spills} B of spill stores")
    return spec


def _ask_for_host(graph: OpGraph, nodes: list[str], device, chosen: MutableMapping,
                  pricing) -> codegen.KernelSpec | Refusal:
    """``ask`` for the host CPU: the first GPU schedule that builds, and the CPU schedule
    priced against XLA:CPU's kernels by the host model."""
    try:
        spec = codegen.generate(graph.module, nodes, "probe", device, chosen=chosen,
                                fastest=False, priced=False)
    except codegen.CodegenError as exc:
        return Refusal(exc.kind, exc.detail)
    except Exception as exc:  # a defect of ours: the pattern is refused, with the reason
        return internal(exc)
    slower = slower_than_xla(graph, spec, device, "cpu", pricing)
    return Refusal(PlanRefusal.SLOWER_THAN_XLA, slower) if slower else spec


def stitched_kernel_us(spec, device, pricing=None) -> float:
    """Modeled time of a stitched kernel: its GPU schedule by the latency-evaluator of
    ``device``, or with a ``HostPricing``, its CPU schedule by the host model."""
    if isinstance(pricing, costmodel.HostPricing):
        return pricing.kernel_us(codegen.host_profile(spec))
    return modeled_kernel_us(spec, device)


def slower_than_xla(graph: OpGraph, spec, device, target: str, pricing=None) -> str | None:
    """No negative optimization: why a stitched kernel modeled slower than the XLA kernels it
    replaces is not used (None when it is faster)."""
    stitched_us = stitched_kernel_us(spec, device, pricing)
    xla_us = sum(xla_kernel_us(graph, n, device, pricing) for n in spec.nodes
                 if graph.nodes[n].is_kernel)
    if stitched_us < xla_us:
        return None
    return (f"stitched kernel modeled at {stitched_us:.2f} us is not faster than XLA's "
            f"kernels at {xla_us:.2f} us (modeled, {target})")


def xla_kernel_us(graph: OpGraph, node: str, device, pricing=None) -> float:
    """Modeled time of one of XLA's own kernels, by the same latency-evaluator (or the host
    model, given a ``HostPricing``); once per graph and model (the explorer's queries, the
    cost guard and the Report all ask)."""
    pricing = pricing or costmodel.GpuPricing(device)
    times = graph.derived.setdefault(("xla_kernel_us", device, pricing.name), {})
    us = times.get(node)
    if us is None:
        us = times[node] = pricing.kernel_us(xla_kernel_profile(graph, node, device))
    return us
