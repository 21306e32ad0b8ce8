"""What changed in a lab while a run played on it: `labctl lb` and `tc set --rate` rewrite the
lab's record, and the run's plan.json is the lab as the run began."""
from __future__ import annotations

from labctl.plan.model import LabPlan
from labctl.state import LabDir


def record(lab: LabDir) -> LabPlan | None:
    """The lab's record as it is now (None if it cannot be read)."""
    try:
        return LabPlan.from_lab_dir(lab.path)
    except (OSError, ValueError, KeyError):
        return None


def during(plan: LabPlan | None, lab: LabDir) -> list[str]:
    """What `labctl lb` or `tc set --rate` changed in the lab's record since `plan` (its record as
    the run began): each router's balancing and each port's rate."""
    now = record(lab)
    if plan is None or now is None:
        return []
    from labctl.plan.lb import describe
    from labctl.units import format_rate
    out = []
    for node in plan.nodes:
        later = now.node(node.name)
        if node.flow_hash and later.flow_hash and (node.flow_hash.mode, node.flow_hash.gap_ns) != \
                (later.flow_hash.mode, later.flow_hash.gap_ns):
            out.append(f"{node.name}: {describe(node.flow_hash, plan.dilation)} -> "
                       f"{describe(later.flow_hash, plan.dilation)}")
        for i in node.interfaces:
            a, b = i.shaping, later.iface(i.name).shaping
            if a is not None and b is not None and a.rate_bps != b.rate_bps:
                out.append(f"{node.name}:{i.name}: {format_rate(a.rate_bps)} -> {format_rate(b.rate_bps)}")
    return out
