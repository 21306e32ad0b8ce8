"""Static ECMP routes from shortest paths, per fabric, as an L3 leaf-spine is built.

Routers get a route to every prefix of their fabric that is not directly connected, with one
next-hop per neighbour that lies on a shortest path (and per parallel link). Hosts never forward:
paths do not pass through them, and they reach their fabric's address pools through the routers
they are cabled to. Fabrics of one routing domain (the scale-out fabrics and the scale-across WAN
between them) route as one network; other fabrics never route into each other.
"""
from __future__ import annotations

import ipaddress
from collections import deque
from dataclasses import dataclass


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
                  routers: set[str], dist: dict[str, dict[str, int]]) -> list[tuple[str, list[Adjacency]]]:
    """(prefix, ECMP next-hops) for one router; `prefixes` holds (prefix, nodes it is attached to)."""
    def prefix_dist(node: str, owners: set[str]) -> float:
        if node in owners:
            return 0
        if node not in routers:
            return float("inf")
        d = dist[node]
        return min((d[o] for o in owners if o in d), default=float("inf"))

    out = []
    for prefix, owners in prefixes:
        here = prefix_dist(router, owners)
        if here == 0 or here == float("inf"):
            continue
        hops = [a for a in adj.get(router, []) if prefix_dist(a.peer, owners) == here - 1]
        out.append((prefix, hops))
    return out


def _net_key(prefix: str):
    net = ipaddress.ip_network(prefix)
    return (int(net.network_address), net.prefixlen)
