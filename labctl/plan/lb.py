"""Each router's load-balancing mode, from the lab file's `lb:` (docs/load-balancing.md).

    routing: {lb: spray}                         # every router
    routing: {lb: {leaf: spray, spine: ecmp}}    # per tier
    nodes: {leaf3: {kind: switch, lb: adaptive}} # one node, over its tier's

A tier is what a router is cabled to: a leaf has an end host on some port, a spine has none. A
lab that names `lb:` anywhere runs labctl's own hash program on every router (kernel/lb.py),
whatever the kernel, so that its modes can change while it runs (`labctl lb`); a lab without it
keeps the kernel's ECMP hash (or labctl's plain one before Linux 6.11: kernel/flowhash.py).
"""
from __future__ import annotations

import bisect
import ipaddress

from labctl.errors import InputError
from labctl.plan.flowhash import FlowHash
from labctl.units import parse_duration_ns

TIERS = ("leaf", "spine")
DEFAULT = "ecmp"


def parse(text: str) -> tuple[str, int]:
    """(mode, flowlet gap in fabric ns) of a mode as written: ecmp, ecmp-qp, flowlet:GAP, spray, adaptive."""
    if text.startswith("flowlet:"):
        return "flowlet", parse_duration_ns(text.split(":", 1)[1])
    return text, 0


def tier(node, by_name: dict) -> str:
    """leaf (an end host cabled to it) or spine (only routers and switches around it)."""
    return "leaf" if any(not by_name[i.peer_node].switching for i in node.interfaces) else "spine"


def wanted(routing_lb, node_specs: dict) -> bool:
    """Whether the lab names lb: at all (then every router runs labctl's program)."""
    return routing_lb is not None or any(getattr(n, "lb", None) for n in node_specs.values())


def group(node) -> tuple[list[str], list[int]]:
    """The ports and weights of a router's multipath next hops, in the routes' order: the uplinks
    its mode spreads over. ([], []) if it has no multipath route or routes differ in theirs."""
    groups = {tuple((h.dev, h.weight) for h in r.nexthops) for r in node.routes if len(r.nexthops) > 1}
    if len(groups) != 1:
        return [], []
    (members,) = groups
    return [dev for dev, _ in members], [w for _, w in members]


def mode_for(node, topo, by_name: dict) -> tuple[str, tuple]:
    """The mode as written for this router, and the lab-file key that says so."""
    spec = topo.nodes[node.name]
    if getattr(spec, "lb", None):
        return spec.lb, ("nodes", node.name, "lb")
    lb = topo.routing.lb
    if isinstance(lb, str):
        return lb, ("routing", "lb")
    t = tier(node, by_name)
    if lb and t in lb:
        return lb[t], ("routing", "lb", t)
    return DEFAULT, ("routing", "lb")


def assign(nodes: dict, topo, dilation: float, smap) -> list[str]:
    """Give every router its FlowHash with a mode (a lab that names lb:), and the kernel's policy 1,
    under which it places a forwarded packet by the hash the program set. Returns located notes for
    a mode written for a tier or a node that has no choice to make."""
    if not wanted(topo.routing.lb, topo.nodes):
        return []
    idle: dict[tuple, tuple] = {}     # key -> (mode as written, its routers if none has a choice, else None)
    hosts = None
    for name, spec in topo.nodes.items():
        node = nodes[name]
        if getattr(spec, "lb", None) and not (node.forwarding and not node.bridged):
            raise InputError(smap.where(("nodes", name, "lb")), f"{name} is a {node.kind}: it forwards nothing "
                             "to balance", "give lb: to routers and L3 switches (or per tier under routing:)")
    l4 = topo.routing.hash_policy == 1
    for node in nodes.values():
        if not node.forwarding or node.bridged:
            continue
        text, key = mode_for(node, topo, nodes)
        mode, gap = parse(text)
        if mode == "ecmp-qp" and not l4:
            raise InputError(smap.where(key), "ecmp-qp hashes the 5-tuple and the QP, but routing.hash_policy "
                             "is 0 (addresses only)", "set routing.hash_policy: 1, or use ecmp")
        members, weights = group(node)
        if mode != DEFAULT and key != ("routing", "lb") and node.static_routes:
            names = idle.setdefault(key, (text, []))[1]
            if names is not None:
                fans = fans_out_to_hosts(node, hosts if hosts is not None else (hosts := host_addresses(nodes)))
                idle[key] = (text, None if fans else names + [node.name])
        if mode == "adaptive" and not node.static_routes:
            raise InputError(smap.where(key), f"{node.name} routes for itself (routes: none): labctl does not "
                             "know its next hops to compare their queues", "use ecmp, ecmp-qp, flowlet or spray there")
        if mode == "adaptive" and not members and any(len(r.nexthops) > 1 for r in node.routes):
            raise InputError(smap.where(key), f"{node.name}'s multipath routes go through different sets of "
                             "next hops: adaptive compares the queues of one set of uplinks",
                             "use adaptive where every multipath route shares its uplinks (a leaf of a leaf-spine)")
        node.flow_hash = FlowHash(l4=l4, seed=topo.routing.hash_seed, mode=mode, gap_ns=int(gap * dilation),
                                  group=members, weights=weights)
        node.sysctls = {k: v for k, v in node.sysctls.items()
                        if k not in ("net.ipv4.fib_multipath_hash_fields", "net.ipv4.fib_multipath_hash_seed")}
        node.sysctls["net.ipv4.fib_multipath_hash_policy"] = "1"
    return [f"{smap.where(key)}: lb: {text} on {', '.join(names)}: {'it has' if len(names) == 1 else 'they have'} "
            "one next hop towards every end host, so there is nothing to choose; load balancing acts where "
            "routes fan out (a leaf-spine's leaves, over their uplinks)"
            for key, (text, names) in idle.items() if names]


def host_addresses(nodes: dict) -> list[int]:
    """The end hosts' addresses (GPUs, servers), sorted: the traffic a router balances goes to them."""
    return sorted(int(ipaddress.ip_interface(i.address).ip) for n in nodes.values() if not n.switching
                  for i in n.interfaces if i.address)


def fans_out_to_hosts(node, hosts: list[int]) -> bool:
    """Whether some route of `node` towards an end host has more than one next hop."""
    for r in node.routes:
        if len(r.nexthops) > 1:
            net = ipaddress.ip_network(r.dst, strict=False)
            at = bisect.bisect_left(hosts, int(net.network_address))
            if at < len(hosts) and hosts[at] <= int(net.broadcast_address):
                return True
    return False


def describe(fh: FlowHash | None, dilation: float) -> str:
    """A router's mode as the lab file writes it (flowlet with its gap in fabric time)."""
    if fh is None or fh.mode is None:
        return DEFAULT
    if fh.mode == "flowlet":
        return f"flowlet:{fh.gap_ns / dilation / 1e3:g}us"
    return fh.mode
