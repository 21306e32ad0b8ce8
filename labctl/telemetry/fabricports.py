"""Bytes a fabric's links carried, from the kernel's port counters (rtnetlink link stats)."""
from __future__ import annotations

from labctl.kernel import nsutil, rtnl
from labctl.kinds import fabric_kind
from labctl.plan.model import LabPlan


def sent_bytes(plan: LabPlan, kind: str = "scale-across") -> int:
    """tx_bytes summed over both ends of every link of fabrics of `kind`: each byte that crossed such
    a link once, in either direction."""
    total, cache = 0, {}
    for link in plan.links:
        if fabric_kind(plan.fabrics[link.fabric].kind).name != kind:
            continue
        for end in (link.a, link.b):
            node, iface = end.split(":")
            ns = plan.node(node).namespace
            if ns not in cache:
                with nsutil.netlink_socket(ns) as sock:
                    cache[ns] = rtnl.link_dump(sock)
            total += cache[ns].get(iface, {}).get("tx_bytes", 0)
    return total
