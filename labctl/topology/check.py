"""Checks across keys that a schema cannot express: references, fabrics, names and rates."""
from __future__ import annotations

from labctl.errors import InputError
from labctl.plan.naming import NamingError, assign_ifnames, split_endpoint
from labctl.topology.schema import ROUTER_KINDS, Topology
from labctl.topology.templates import did_you_mean
from labctl.topology.yamlpos import SourceMap
from labctl.units import format_rate

# What this machine can shape and forward (docs/design.md §8): above ~40 Gbit/s HTB and veth stop meaning
# anything; below 64 kbit/s a 9000-byte frame takes over a second and ping times out.
LAB_RATE_MAX = 40e9
LAB_RATE_MIN = 64e3
# The WAN line holds a link's frames for its delay: past a minute of lab time a run is not a lab.
LAB_DELAY_MAX_NS = 60e9


def _round_up(x: float) -> int:
    """The next 1, 2, 5 × 10^k at or above x: a dilation a person would pick."""
    k = 1
    while True:
        for m in (1, 2, 5):
            if k * m >= x:
                return k * m
        k *= 10


def node_fabric(topo: Topology, name: str) -> str | None:
    """The fabric a router belongs to: its own `fabric:`, else the only fabric that fits its kind."""
    node = topo.nodes[name]
    if node.kind not in ROUTER_KINDS:
        return None
    if node.fabric:
        return node.fabric
    want_scale_up = node.kind == "nvswitch"
    fits = [f for f, spec in topo.fabrics.items() if (spec.kind == "scale-up") == want_scale_up]
    return fits[0] if len(fits) == 1 else None


def routing_domain(kind: str, name: str) -> str:
    """Fabrics that route into each other: every scale-out fabric and the scale-across WAN that joins
    them form the backend; a frontend or a scale-up domain is a network of its own."""
    return "backend" if kind in ("scale-out", "scale-across") else name


def link_fabric(topo: Topology, link_index: int) -> str | None:
    link = topo.links[link_index]
    if link.fabric:
        return link.fabric
    ends = [split_endpoint(e)[0] for e in link.endpoints]
    fabrics = {node_fabric(topo, n) for n in ends if topo.nodes[n].kind in ROUTER_KINDS}
    if len(fabrics) == 1:
        return fabrics.pop()
    inside = {f for f in fabrics if f in topo.fabrics and topo.fabrics[f].kind == "scale-out"}
    if len(fabrics) == 2 and len(inside) == 1 and fabrics - inside <= {
            f for f in topo.fabrics if topo.fabrics[f].kind == "scale-across"}:
        return inside.pop()   # a DCI router's link into its building belongs to the building's fabric
    if not fabrics and len(topo.fabrics) == 1:
        return next(iter(topo.fabrics))
    return None


def check_topology(topo: Topology, smap: SourceMap) -> None:
    fabric_names = list(topo.fabrics)
    for name, node in topo.nodes.items():
        if node.fabric is not None and node.fabric not in topo.fabrics:
            raise InputError(smap.where(("nodes", name, "fabric")),
                             f"node {name!r} is on fabric {node.fabric!r}, which is not defined"
                             + did_you_mean(node.fabric, fabric_names),
                             f"define it under fabrics:, or use one of: {', '.join(fabric_names)}")
        if node.kind in ROUTER_KINDS and node_fabric(topo, name) is None:
            raise InputError(smap.where(("nodes", name)),
                             f"{node.kind} {name!r} does not say which fabric it belongs to",
                             f"add `fabric: <one of {', '.join(fabric_names)}>` to it")
    ranks: dict[int, str] = {}
    for name, node in topo.nodes.items():
        if node.rank is not None:
            if node.rank in ranks:
                raise InputError(smap.where(("nodes", name, "rank")),
                                 f"rank {node.rank} is given to both {ranks[node.rank]!r} and {name!r}",
                                 "give every GPU its own rank, or leave rank out to number them in order")
            ranks[node.rank] = name

    ends = []
    linked: set[str] = set()
    nic_fabric: dict[tuple[str, str], tuple[int, str]] = {}
    for i, link in enumerate(topo.links):
        parsed = []
        for e, text in enumerate(link.endpoints):
            node, iface = split_endpoint(text)
            if node not in topo.nodes:
                raise InputError(smap.where(("links", i, "endpoints", e)),
                                 f"link endpoint {text!r} names node {node!r}, which is not defined"
                                 + did_you_mean(node, list(topo.nodes)),
                                 "define the node under nodes:, or fix the name")
            parsed.append((node, iface))
            linked.add(node)
        if parsed[0][0] == parsed[1][0]:
            raise InputError(smap.where(("links", i, "endpoints")),
                             f"link {i} connects {parsed[0][0]!r} to itself", "connect two different nodes")
        ends.append((parsed[0][0], parsed[0][1], parsed[1][0], parsed[1][1]))
        if link.fabric is not None and link.fabric not in topo.fabrics:
            raise InputError(smap.where(("links", i, "fabric")), f"fabric {link.fabric!r} is not defined"
                             + did_you_mean(link.fabric, fabric_names),
                             f"use one of: {', '.join(fabric_names)}")
        routers = {node_fabric(topo, n) for n, _ in parsed if topo.nodes[n].kind in ROUTER_KINDS}
        domains = {routing_domain(topo.fabrics[f].kind, f) for f in routers if f in topo.fabrics}
        if len(routers) > 1 and len(domains) > 1:
            raise InputError(smap.where(("links", i)),
                             f"link {parsed[0][0]}—{parsed[1][0]} joins switches of different fabrics "
                             f"({', '.join(sorted(routers))})",
                             "fabrics are separate networks; connect each host to each fabric instead")
        if link.fabric and routers and link.fabric not in routers and len(routers) == 1:
            raise InputError(smap.where(("links", i, "fabric")),
                             f"link says fabric {link.fabric!r} but its switch is on {routers.pop()!r}",
                             "remove the link's fabric: key or fix it")
        if link_fabric(topo, i) is None:
            raise InputError(smap.where(("links", i)),
                             f"cannot tell which fabric link {parsed[0][0]}—{parsed[1][0]} belongs to",
                             f"add `fabric: <one of {', '.join(fabric_names)}>` to the link")
        _check_nic_sharing(topo, smap, i, parsed, nic_fabric)
        if link.distance is not None and link.rate is None:
            raise InputError(smap.where(("links", i, "distance")),
                             f"WAN link {parsed[0][0]}—{parsed[1][0]} has a distance but no rate",
                             "give it its own rate, e.g. `rate: 400G`: a WAN link rarely runs at the fabric default")
        _check_delay(topo, smap, i, link)
        rate = link.rate or topo.defaults.rate
        lab_rate = rate / topo.dilation
        key = ("links", i, "rate") if link.rate else ("defaults", "rate")
        if lab_rate > LAB_RATE_MAX:
            raise InputError(smap.where(key),
                             f"{format_rate(rate)} at dilation {topo.dilation:g} is {format_rate(lab_rate)} "
                             f"in the lab, more than this machine can shape ({format_rate(LAB_RATE_MAX)})",
                             f"raise dilation (e.g. dilation: {_round_up(rate / LAB_RATE_MAX * 10)}) so rates scale down")
        if lab_rate < LAB_RATE_MIN:
            raise InputError(smap.where(key),
                             f"{format_rate(rate)} at dilation {topo.dilation:g} is {format_rate(lab_rate)} "
                             f"in the lab, too slow to carry a jumbo frame in a second",
                             f"lower dilation to at most {rate / LAB_RATE_MIN:g}, or raise the rate")

    _check_qos(topo, smap)
    _check_zones(topo, smap)
    for name in topo.nodes:
        if name not in linked:
            raise InputError(smap.where(("nodes", name)), f"node {name!r} has no links",
                             "connect it (links: - endpoints: [" + name + ", <peer>]) or remove it")
    try:
        assign_ifnames(ends)
    except NamingError as exc:
        raise InputError(smap.where(("links", exc.link, "endpoints", exc.end)), exc.message, exc.fix) from None


def _check_delay(topo: Topology, smap: SourceMap, i: int, link) -> None:
    one_way = link.latency if link.latency is not None else (
        link.distance * 4900 if link.distance is not None else topo.defaults.latency)
    lab = (one_way + (link.jitter or 0)) * topo.dilation
    if lab > LAB_DELAY_MAX_NS:
        key = ("links", i, "latency" if link.latency is not None else "distance" if link.distance is not None
               else "jitter" if link.jitter else "latency")
        raise InputError(smap.where(key if link.latency is not None or link.distance is not None or link.jitter
                                    else ("defaults", "latency")),
                         f"a one-way delay of {one_way / 1e6:g} ms at dilation {topo.dilation:g} is "
                         f"{lab / 1e9:g} s in the lab; the WAN line holds at most {LAB_DELAY_MAX_NS / 1e9:g} s",
                         "shorten the link or lower dilation")


def _check_nic_sharing(topo: Topology, smap: SourceMap, i: int, parsed, nic_fabric: dict) -> None:
    """A host NIC named by two links of different fabrics would bridge networks meant to be apart."""
    fabric = link_fabric(topo, i)
    for e, (node, iface) in enumerate(parsed):
        if iface is None or topo.nodes[node].kind in ROUTER_KINDS:
            continue
        seen = nic_fabric.get((node, iface))
        if seen and fabric and seen[1] != fabric:
            raise InputError(smap.where(("links", i, "endpoints", e)),
                             f"{node}:{iface} is on fabric {seen[1]!r} (link {seen[0]}) and on {fabric!r} here: "
                             "one NIC cannot serve two networks",
                             f"give this link its own NIC, e.g. `{node}:{fabric[:3]}0`, or leave the port name out")
        nic_fabric[(node, iface)] = (i, fabric)


def _check_zones(topo: Topology, smap: SourceMap) -> None:
    """With a scale-across fabric, every zone needs a DCI router: a router of that fabric in the zone."""
    wan = {f for f, spec in topo.fabrics.items() if spec.kind == "scale-across"}
    if not wan:
        return
    dci_zones = {n.zone for name, n in topo.nodes.items()
                 if n.kind in ROUTER_KINDS and node_fabric(topo, name) in wan}
    for name, node in topo.nodes.items():
        if node.zone is not None and node.zone not in dci_zones:
            raise InputError(smap.where(("nodes", name, "zone")),
                             f"zone {node.zone!r} (of {name!r}) has no DCI router, so nothing joins it to the WAN",
                             f"add a router with `fabric: {sorted(wan)[0]}, zone: {node.zone}` linked to the "
                             "zone's spines and to the WAN")


def _check_qos(topo: Topology, smap: SourceMap) -> None:
    seen_tc: dict[int, str] = {}
    seen_dscp: dict[int, str] = {}
    defaults = []
    for i, c in enumerate(topo.qos.classes):
        where = ("qos", "classes", i)
        if c.tc in seen_tc:
            raise InputError(smap.where(where + ("tc",)), f"classes {seen_tc[c.tc]!r} and {c.name!r} both use "
                             f"traffic class {c.tc}", "give each class its own tc (0..7)")
        seen_tc[c.tc] = c.name
        for d in c.dscp:
            if not 0 <= d <= 63:
                raise InputError(smap.where(where + ("dscp",)), f"DSCP {d} is not in 0..63", "use a 6-bit DSCP")
            if d in seen_dscp:
                raise InputError(smap.where(where + ("dscp",)), f"DSCP {d} is mapped to both {seen_dscp[d]!r} "
                                 f"and {c.name!r}", "map each DSCP to one class")
            seen_dscp[d] = c.name
        if not c.dscp:
            defaults.append(c.name)
    if len(defaults) != 1:
        raise InputError(smap.where(("qos", "classes")),
                         f"exactly one class must take the unmapped DSCPs (a class with no dscp:), found "
                         f"{len(defaults)}", "leave dscp: out of exactly one class, e.g. the default class")
    e = topo.qos.ecn
    if e.kmin >= e.kmax:
        raise InputError(smap.where(("qos", "ecn")), f"ecn kmin ({e.kmin} B) must be below kmax ({e.kmax} B)",
                         "e.g. kmin: 400KB, kmax: 1600KB")
