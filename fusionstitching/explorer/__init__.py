"""explorer/: fusion plans over the op graph (which XLA kernels become one stitched kernel).

Strategies: ``beam`` is the paper's explorer (search.py: candidate patterns by approximate
dynamic programming, remote fusion, beam search, choice by the latency-evaluator or the host CPU's model);
``greedy`` is the baseline (baseline.py: one pattern per connected region), kept for
comparison. A plan of a module of the same structure at other sizes is taken as given when
the code generator builds it at this module's (given.py).
"""
from .plan import Decision, ExplorerRefusal, FusionPlan, Pattern
from .index import KernelDag
from .baseline import connected_region_plan
from .search import Explorer, beam_plan
from .given import GivenRefusal, given_plan

STRATEGIES = {
    "beam": lambda graph, can_stitch, device, profile_of, other_space, ask_ahead, pricing:
        beam_plan(graph, can_stitch, device, profile_of=profile_of, other_space=other_space,
                  ask_ahead=ask_ahead, pricing=pricing),
    "greedy": lambda graph, can_stitch, device, profile_of, other_space, ask_ahead, pricing:
        connected_region_plan(graph, can_stitch),
}


def explore(graph, can_stitch, strategy: str = "beam", device=None,
            profile_of=None, other_space=None, ask_ahead=None, pricing=None) -> FusionPlan:
    """Plan ``graph``'s stitched kernels; ``can_stitch(nodes) -> Refusal | None`` asks the
    code generator whether a set of nodes can become one kernel (None: it can); ``device`` (costmodel.Device,
    default H100) is what the cost model prices; ``profile_of(nodes) -> KernelProfile``, when
    given, is the kernel the plan's report will price for one XLA kernel or an accepted
    pattern (``Explorer``), so plans are compared by the report's model; ``other_space(nodes)``,
    when given, names a pattern's nodes reducing outside its main reduction space;
    ``ask_ahead(patterns, next_up)``, when given, is told patterns ``can_stitch`` will be
    asked, in order: the ones asked next, or (``next_up`` False) ones asked later (query
    workers start on them). ``pricing`` (costmodel.GpuPricing or HostPricing; default the
    latency-evaluator of ``device``) prices kernels and packs for the choice; candidates are
    ranked by the delta-evaluator of ``device`` either way."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown explorer {strategy!r}; known: {', '.join(STRATEGIES)}")
    return STRATEGIES[strategy](graph, can_stitch, device, profile_of, other_space, ask_ahead,
                                pricing)
