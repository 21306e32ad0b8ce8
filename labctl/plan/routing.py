"""Static ECMP routes from shortest paths, per routing domain, as an L3 leaf-spine is built.

Routers get a route to every prefix of their domain that is not directly connected, with one
next-hop per neighbour that lies on a shortest path (and per parallel link). Hosts never forward:
paths do not pass through them, and they reach their fabrics' address pools through the routers
they are cabled to. Fabrics of one routing domain (the scale-out fabrics and the scale-across WAN
between them) route as one network; other fabrics never route into each other.

An L2 segment (bridges and the ports cabled to them) is one subnet: every node with a port on it
is a neighbour of every other, and the segment's subnet is reached through its routers.
"""
from __future__ import annotations

import copy
import ipaddress
from collections import deque
from dataclasses import dataclass

from labctl.kinds import fabric_kind
from labctl.plan import model


@dataclass(frozen=True)
class Adjacency:
    local_if: str
    peer: str
    peer_address: str
    weight: int = 1


def shortest_hops(start: str, adj: dict[str, list[Adjacency]], routers: set[str]) -> dict[str, int]:
    """Hop counts from `start`; only routers are expanded (a host is an end, never a transit)."""
    dist = {start: 0}
    queue = deque([start])
    while queue:
        u = queue.popleft()
        if u != start and u not in routers:
            continue
        for a in adj.get(u, []):
            if a.peer not in dist:
                dist[a.peer] = dist[u] + 1
                queue.append(a.peer)
    return dist


def ordered(prefixes: dict[str, set[str]]) -> list[tuple[str, set[str]]]:
    """Prefixes in address order (routes are emitted in this order), sorted once per fabric."""
    return sorted(prefixes.items(), key=lambda kv: _net_key(kv[0]))


def router_routes(router: str, prefixes: list[tuple[str, set[str]]], adj: dict[str, list[Adjacency]],
                  routers: set[str], dist: dict[str, dict[str, int]],
                  memo: dict | None = None) -> list[tuple[str, list[Adjacency]]]:
    """(prefix, ECMP next-hops) for one router; `prefixes` holds (prefix, nodes it is attached to).

    `memo`, shared by the routers of one domain, keeps each node's distance to each prefix: every
    router asks it of all its neighbours, and at 1,024 GPUs that was 3.4 million questions."""
    memo = {} if memo is None else memo
    inf = float("inf")

    def distances(node: str) -> list[float]:
        got = memo.get(node)
        if got is None:
            if node not in routers:
                got = [0 if node in owners else inf for _, owners in prefixes]
            else:
                d = dist[node]
                got = [0 if node in owners else min((d[o] for o in owners if o in d), default=inf)
                       for _, owners in prefixes]
            memo[node] = got
        return got

    here_all = distances(router)
    neighbours = [(a, distances(a.peer)) for a in adj.get(router, [])]
    out = []
    for k, (prefix, _) in enumerate(prefixes):
        here = here_all[k]
        if here == 0 or here == inf:
            continue
        out.append((prefix, [a for a, d in neighbours if d[k] == here - 1]))
    return out


def _net_key(prefix: str):
    net = ipaddress.ip_network(prefix)
    return (int(net.network_address), net.prefixlen)


def routing_domains(fabrics: dict[str, model.FabricPlan]) -> dict[str, list[str]]:
    """Fabrics that route as one network: the scale-out fabrics with the scale-across WAN joining
    them (when there is one); every other fabric alone."""
    joined = any(fabric_kind(f.kind).joins for f in fabrics.values())
    out: dict[str, list[str]] = {}
    for name, f in fabrics.items():
        key = (fabric_kind(f.kind).domain or name) if joined else name
        out.setdefault(key, []).append(name)
    return out


def add_routes(nodes: dict[str, model.Node], links: list[model.Link], fabrics: dict[str, model.FabricPlan],
               segments: list[model.Segment] = (), down: set[int] = frozenset()) -> None:
    weights = {lk.id: lk.weight for lk in links}
    for members in routing_domains(fabrics).values():
        _add_domain_routes(nodes, links, fabrics, segments, set(members), weights, down)


def routes_without(plan: model.LabPlan, down: set[int]) -> dict[str, list[model.Route]]:
    """Every node's static routes as if the links in `down` were cut (none on a node that routes
    for itself: its software converges on its own)."""
    out = expected_routes(plan, down)
    return {n.name: (out[n.name] if n.static_routes else []) for n in plan.nodes}


def expected_routes(plan: model.LabPlan, down: set[int] = frozenset()) -> dict[str, list[model.Route]]:
    """Every node's shortest-path ECMP routes with the links in `down` cut: what labctl installs,
    and what a routing protocol on the same fabric must converge to."""
    nodes = {n.name: copy.copy(n) for n in plan.nodes}
    for n in nodes.values():
        n.routes = []
    add_routes(nodes, plan.links, plan.fabrics, plan.segments, down)
    return {name: n.routes for name, n in nodes.items()}


def _add_domain_routes(nodes, links, fabrics, segments, members: set[str], weights: dict[int, int], down) -> None:
    adj: dict[str, list[Adjacency]] = {}
    prefixes: dict[str, set[str]] = {}
    in_segment = {i for s in segments for i in s.links}
    for lk in links:
        if lk.fabric not in members or lk.id in in_segment or not lk.subnet:
            continue
        ends = set(lk.nodes)
        # a link's subnet is reached through the routers at its ends: hosts never forward
        prefixes[lk.subnet] = {e for e in ends if nodes[e].forwarding} or ends
    for seg in segments:
        if seg.fabric in members:
            _segment_adjacency(seg, nodes, adj, prefixes, down)
    for n in nodes.values():
        for i in n.interfaces:
            if i.fabric in members and i.link not in down and i.link not in in_segment and i.peer_address:
                adj.setdefault(n.name, []).append(Adjacency(i.name, i.peer_node, i.peer_address, weights[i.link]))
        if n.loopback and n.fabric in members:
            prefixes[n.loopback] = {n.name}
    routers = {n for n in adj if nodes[n].forwarding}
    dist = {r: shortest_hops(r, adj, routers) for r in routers}
    in_order = ordered(prefixes)
    memo: dict = {}
    for name in sorted(adj, key=lambda x: nodes[x].index):
        node = nodes[name]
        if node.forwarding:
            for prefix, hops in router_routes(name, in_order, adj, routers, dist, memo):
                node.routes.append(model.Route(prefix, [model.NextHop(h.peer_address, h.local_if, h.weight)
                                                        for h in hops]))
        else:
            gateways = [a for a in adj.get(name, []) if a.peer in routers]
            if gateways:
                for fabric in sorted(members, key=list(fabrics).index):
                    for pool in (fabrics[fabric].prefix, fabrics[fabric].loopbacks):
                        node.routes.append(model.Route(pool, [model.NextHop(g.peer_address, g.local_if, g.weight)
                                                              for g in gateways]))


def _segment_adjacency(seg: model.Segment, nodes, adj, prefixes, down) -> None:
    """Every member of a segment neighbours every other; the subnet belongs to its routers."""
    ports = [(n, i) for n in nodes.values() if not n.bridged for i in n.interfaces
             if i.link in seg.links and i.link not in down and i.address]
    for n, i in ports:
        for m, j in ports:
            if m.name != n.name:
                adj.setdefault(n.name, []).append(Adjacency(i.name, m.name, j.address.split("/")[0]))
    owners = {n.name for n, _ in ports}
    if seg.subnet:
        prefixes[seg.subnet] = {o for o in owners if nodes[o].forwarding} or owners


def converged_routes(plan: model.LabPlan) -> dict[str, list[model.Route]]:
    """What each node routes by: labctl's static routes, or, for a node whose software routes it
    (FRR), the shortest paths that software converges to (what an export writes for it)."""
    expected = None
    out = {}
    for n in plan.nodes:
        if n.static_routes or not n.numbered:
            out[n.name] = n.routes
        else:
            expected = expected or expected_routes(plan)
            out[n.name] = expected[n.name]
    return out
