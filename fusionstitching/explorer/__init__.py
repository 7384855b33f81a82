"""explorer/: fusion plans over the op graph (which XLA kernels become one stitched kernel)."""
from .plan import Decision, FusionPlan, Pattern, creates_cycle
from .baseline import connected_region_plan

STRATEGIES = {"greedy": connected_region_plan}


def explore(graph, can_stitch, strategy: str = "greedy") -> FusionPlan:
    """Plan ``graph``'s stitched kernels; ``can_stitch(nodes) -> (ok, reason)`` asks the code
    generator whether a set of nodes can become one kernel."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown explorer {strategy!r}; known: {', '.join(STRATEGIES)}")
    return STRATEGIES[strategy](graph, can_stitch)
