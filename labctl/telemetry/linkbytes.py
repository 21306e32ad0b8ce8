"""Bytes each fabric's links carried during a run, from the ports' own counters (RTM_GETLINK stats64).

Each link is read once, on its `a` side: tx + rx bytes there are the frames it carried in both
directions (a veth's counters see L2 frames without preamble or FCS; a WAN link's DCI port sees
every frame the delay line took or gave). What a fabric means and how the expected figure is
computed: traffic/fabricmap.py.
"""
from __future__ import annotations

from labctl.kernel import nsutil, rtnl
from labctl.plan.model import LabPlan


def snapshot(plan: LabPlan) -> dict[int, int]:
    """link id -> tx + rx bytes on its a side, now (links whose namespace is gone are left out)."""
    wanted: dict[str, list[tuple[int, str]]] = {}
    for lk in plan.links:
        node, iface = lk.a.split(":", 1)
        wanted.setdefault(node, []).append((lk.id, iface))
    out = {}
    for node in plan.nodes:
        if node.name not in wanted or not nsutil.exists(node.namespace):
            continue
        with nsutil.netlink_socket(node.namespace) as sock:
            links = rtnl.link_dump(sock)
        for lid, iface in wanted[node.name]:
            st = links.get(iface)
            if st is not None:
                out[lid] = st.get("tx_bytes", 0) + st.get("rx_bytes", 0)
    return out
