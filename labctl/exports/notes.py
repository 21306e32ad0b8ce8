"""What every export says of a lab it cannot carry whole."""
from __future__ import annotations

from labctl.plan.model import LabPlan


def own_routing(plan: LabPlan) -> list[str]:
    """Nodes whose software routes them (FRR): an export gives them the static routes it converges to."""
    own = [n.name for n in plan.nodes if not n.static_routes and n.numbered]
    if not own:
        return []
    return [f"the routing software of {', '.join(own[:4])}{' ...' if len(own) > 4 else ''} (FRR, its files "
            "and exec lines): replaced by the static ECMP routes it converges to"]
