"""Every port knows its neighbours' MACs from the start: permanent ARP entries from the plan.

Without them the first packets of a run wait for ARP at every hop, in a queue the kernel bounds
by bytes (`unres_qlen_bytes`, about 25 RoCE frames) and empties from the oldest end: measured
here, the first 3-16 packets of a message that starts a run on a fresh lab vanished at the NVLink
switch with no qdisc or device counter moving, only the machine-wide `unresolved_discards`. A
real fabric has resolved its neighbours long before a job starts; the plan knows every address
and MAC, so labctl writes them in before any traffic.

A point-to-point port gets its peer's entry. A port on an L2 segment (toward `bridge` nodes) gets
one for every other member of the segment, up to SEGMENT_MAX members: past that, ARP (the
entries would grow as the square of the members).
"""
from __future__ import annotations

import struct

from labctl.kernel import rtnl
from labctl.plan.model import LabPlan

RTM_NEWNEIGH, NDA_DST, NDA_LLADDR, NUD_PERMANENT = 28, 1, 2, 0x80
NLM_F_REPLACE = 0x100
SEGMENT_MAX = 256


def entry(ifindex: int, address: str, mac: str) -> tuple[int, int, bytes]:
    """A permanent ARP entry (ip neigh replace ADDRESS lladdr MAC nud permanent dev IFINDEX)."""
    body = (struct.pack("BxxxiHBB", 2, ifindex, NUD_PERMANENT, 0, 1)
            + rtnl.attr(NDA_DST, rtnl.ip4(address)) + rtnl.attr(NDA_LLADDR, rtnl.mac_bytes(mac)))
    return RTM_NEWNEIGH, rtnl.NLM_F_REQUEST | rtnl.NLM_F_ACK | rtnl.NLM_F_CREATE | NLM_F_REPLACE, body


def of_node(plan: LabPlan, node_name: str) -> list[tuple[tuple, str]]:
    """(request, description) for every neighbour of the node's addressed ports."""
    members = _segment_members(plan)
    return [r for i in plan.node(node_name).interfaces for r in _of_port(plan, node_name, i, members)]


def of_port(plan: LabPlan, node_name: str, iface_name: str) -> list[tuple[tuple, str]]:
    """The same for one port: what a port brought down and up again needs back (the kernel flushes
    a port's neighbours, permanent ones too, when it goes down)."""
    return _of_port(plan, node_name, plan.node(node_name).iface(iface_name), _segment_members(plan))


def _of_port(plan: LabPlan, node_name: str, i, members: dict) -> list[tuple[tuple, str]]:
    if not i.address:
        return []                                 # a bridge's own port: it has no IP neighbours
    if i.peer_address:
        peers = [(i.peer_address, plan.node(i.peer_node).iface(i.peer_iface).mac)]
    else:
        peers = [(a, m) for a, m in members.get(i.link, []) if a != i.address.split("/")[0]]
    return [(entry(i.index, a, m), f"{node_name}:{i.name}: neighbour {a}") for a, m in peers]


def _segment_members(plan: LabPlan) -> dict[int, list[tuple[str, str]]]:
    """{link index: [(address, MAC) of every member port of that link's segment]}."""
    bridges = {n.name for n in plan.nodes if n.bridged}
    out: dict[int, list[tuple[str, str]]] = {}
    for seg in plan.segments:
        ports = []
        for k in seg.links:
            for n, p in plan.links[k].ends:
                iface = plan.node(n).iface(p)
                if n not in bridges and iface.address:
                    ports.append((iface.address.split("/")[0], iface.mac))
        if len(ports) <= SEGMENT_MAX:
            out.update({k: ports for k in seg.links})
    return out
