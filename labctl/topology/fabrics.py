"""Which fabric each switch and link belongs to, and which links form an L2 segment (pure)."""
from __future__ import annotations

from labctl.kinds import default_fabric_kinds, fabric_kind, node_kind
from labctl.names import split_endpoint
from labctl.topology.schema import TopologySpec


def switching(topo: TopologySpec, name: str) -> bool:
    """A node that forwards (routes or bridges) between its ports, and so belongs to one fabric."""
    return node_kind(topo.nodes[name].kind).switches


def bridging(topo: TopologySpec, name: str) -> bool:
    return node_kind(topo.nodes[name].kind).bridges


def node_fabric(topo: TopologySpec, name: str) -> str | None:
    """The fabric a switching node belongs to: its own `fabric:`, else the only fabric that fits its kind."""
    node = topo.nodes[name]
    if not switching(topo, name):
        return None
    if node.fabric:
        return node.fabric
    allowed = default_fabric_kinds(node_kind(node.kind))
    fits = [f for f, spec in topo.fabrics.items() if spec.kind in allowed]
    return fits[0] if len(fits) == 1 else None


def routing_domain(kind: str, name: str) -> str:
    """Fabrics that route into each other: every scale-out fabric and the scale-across WAN that joins
    them form the backend; a frontend or a scale-up domain is a network of its own."""
    return fabric_kind(kind).domain or name


def link_fabric(topo: TopologySpec, link_index: int) -> str | None:
    link = topo.links[link_index]
    if link.fabric:
        return link.fabric
    ends = [split_endpoint(e)[0] for e in link.endpoints]
    fabrics = {node_fabric(topo, n) for n in ends if switching(topo, n)}
    if len(fabrics) == 1:
        return fabrics.pop()
    known = {f: fabric_kind(topo.fabrics[f].kind) for f in fabrics if f in topo.fabrics}
    inside = {f for f, k in known.items() if k.domain and not k.joins}
    if len(fabrics) == 2 and len(inside) == 1 and fabrics - inside <= {f for f, k in known.items() if k.joins}:
        return inside.pop()   # a DCI router's link into its building belongs to the building's fabric
    if not fabrics and len(topo.fabrics) == 1:
        return next(iter(topo.fabrics))
    return None


def l2_segments(topo: TopologySpec) -> list[tuple[set[str], list[int]]]:
    """(bridges, link indexes) of every L2 segment: bridges joined by their links, with every link
    that touches one, in file order of their first link."""
    parent = {n: n for n in topo.nodes if bridging(topo, n)}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    touching: list[tuple[int, list[str]]] = []
    for i, link in enumerate(topo.links):
        ends = [split_endpoint(e)[0] for e in link.endpoints]
        bridges = [e for e in ends if e in parent]
        if len(bridges) == 2:
            parent[root(bridges[0])] = root(bridges[1])
        if bridges:
            touching.append((i, bridges))
    out: dict[str, tuple[set[str], list[int]]] = {}
    for i, bridges in touching:
        seg = out.setdefault(root(bridges[0]), (set(), []))
        seg[0].update(bridges)
        seg[1].append(i)
    return sorted(out.values(), key=lambda s: s[1][0])
