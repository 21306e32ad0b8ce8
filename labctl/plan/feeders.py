"""Which ingress ports feed which egress queue of a switch, from the plan's routes (or, on a
switch that runs its own routing, the shortest paths it converges to).

A congested lossless queue must pause only the neighbours whose traffic can reach it. Pausing
every port of the switch instead (what this controller did first) creates cyclic waits: a leaf
pausing a spine that feeds another leaf's queue, which pauses that spine in turn, until every
queue on the fabric is full and paused (a PFC deadlock, reproduced on the ai-cluster lab). With
up-down routing in a Clos, feeding only follows host-to-host paths, so the waits cannot close a
loop. Only data destinations count: the subnets of links with a host at one end; routes to
switch loopbacks and inter-switch links may go up and down again and would add false edges.
"""
from __future__ import annotations

import ipaddress

from labctl.plan.model import LabPlan, Node


def feeders(plan: LabPlan, node: Node) -> dict[str, set[str]]:
    """egress port name -> the names of the ingress ports whose traffic can be queued there."""
    out: dict[str, set[str]] = {i.name: set() for i in node.interfaces}
    if node.bridged:                             # a bridge floods and learns: any port may feed any other
        return {e: {i.name for i in node.interfaces if i.name != e} for e in out}
    hosts = {n.name for n in plan.nodes if not n.forwarding}
    data_prefixes = [lk.subnet for lk in plan.links
                     if set(lk.nodes) & hosts]
    connected = {i.link: i.name for i in node.interfaces}
    routes = {r.dst: [h.dev for h in r.nexthops] for r in _routes(plan, node)}
    for i in node.interfaces:
        peer = plan.node(i.peer_node)
        if not peer.forwarding:
            for e in out:                        # a host may send to anything beyond this switch
                if e != i.name:
                    out[e].add(i.name)
            continue
        peer_routes = {r.dst: r.nexthops for r in _routes(plan, peer)}
        my_address = i.address.split("/")[0]
        for prefix in data_prefixes:
            if not any(h.via == my_address for h in peer_routes.get(prefix, [])):
                continue
            for e in _egress(plan, prefix, connected, routes):
                if e != i.name:
                    out[e].add(i.name)
    return out


_converged: dict[int, tuple[LabPlan, dict]] = {}


def _routes(plan: LabPlan, node: Node) -> list:
    """The node's routes: labctl's own, or for a node whose software routes it (FRR) the shortest
    paths its routing converges to (lifecycle/convergence.py checks that it does)."""
    if node.static_routes:
        return node.routes
    held = _converged.get(id(plan))
    if held is None or held[0] is not plan:
        from labctl.plan.routing import expected_routes
        held = _converged[id(plan)] = (plan, expected_routes(plan))
    return held[1][node.name]


def _egress(plan: LabPlan, prefix: str, connected: dict[int, str], routes: dict[str, list[str]]) -> list[str]:
    for link_id, port in connected.items():
        if plan.links[link_id].subnet == prefix:
            return [port]
    if prefix in routes:
        return routes[prefix]
    net = ipaddress.ip_network(prefix)
    for dst, devs in routes.items():           # a coarser route (hosts route pools) covers it
        if net.subnet_of(ipaddress.ip_network(dst)):
            return devs
    return []
