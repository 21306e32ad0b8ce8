"""Checks across keys that a schema cannot express: references, fabrics, segments, names and rates.

`CHECKS` runs in order; each raises a located InputError for the first problem it finds. A new
rule is a new check in the list.
"""
from __future__ import annotations

from labctl.errors import InputError
from labctl.kinds import fabric_kind, node_kind
from labctl.topology import placement
from labctl.names import NamingError, assign_ifnames, split_endpoint
from labctl.topology.fabrics import l2_segments, link_fabric, node_fabric, routing_domain, switching
from labctl.topology.schema import TopologySpec
from labctl.topology.templates import did_you_mean
from labctl.topology.yamlpos import SourceMap
from labctl.units import format_rate

# What this machine can shape and forward (docs/design.md §6): above ~40 Gbit/s HTB and veth stop
# meaning anything; below 64 kbit/s a 9000-byte frame takes over a second and ping times out.
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


def node_fabrics(topo: TopologySpec, smap: SourceMap) -> None:
    names = list(topo.fabrics)
    for name, node in topo.nodes.items():
        if node.fabric is not None and node.fabric not in topo.fabrics:
            raise InputError(smap.where(("nodes", name, "fabric")),
                             f"node {name!r} is on fabric {node.fabric!r}, which is not defined"
                             + did_you_mean(node.fabric, names),
                             f"define it under fabrics:, or use one of: {', '.join(names)}")
        if switching(topo, name) and node_fabric(topo, name) is None:
            raise InputError(smap.where(("nodes", name)),
                             f"{node.kind} {name!r} does not say which fabric it belongs to",
                             f"add `fabric: <one of {', '.join(names)}>` to it")


def unique_ranks(topo: TopologySpec, smap: SourceMap) -> None:
    ranks: dict[int, str] = {}
    for name, node in topo.nodes.items():
        if node.rank is not None:
            if node.rank in ranks:
                raise InputError(smap.where(("nodes", name, "rank")),
                                 f"rank {node.rank} is given to both {ranks[node.rank]!r} and {name!r}",
                                 "give every GPU its own rank, or leave rank out to number them in order")
            ranks[node.rank] = name


def link_ends(topo: TopologySpec, smap: SourceMap) -> None:
    for i, link in enumerate(topo.links):
        parsed = []
        for e, text in enumerate(link.endpoints):
            node, iface = split_endpoint(text)
            if node not in topo.nodes:
                raise InputError(smap.where(("links", i, "endpoints", e)),
                                 f"link endpoint {text!r} names node {node!r}, which is not defined"
                                 + did_you_mean(node, list(topo.nodes)),
                                 "define the node under nodes:, or fix the name")
            parsed.append(node)
        # a loop cable (containerlab allows one, e.g. between a chassis's line cards) only on a node
        # labctl does not number: both ends in one subnet on one node would be no link at all
        if parsed[0] == parsed[1] and node_kind(topo.nodes[parsed[0]].kind).holds_rank:
            raise InputError(smap.where(("links", i, "endpoints")),
                             f"link {i} connects GPU {parsed[0]!r} to itself",
                             "cable a GPU's NIC to a switch or another GPU: a loop cable carries no rank's traffic")
        if parsed[0] == parsed[1] and topo.nodes[parsed[0]].addresses != "none":
            raise InputError(smap.where(("links", i, "endpoints")),
                             f"link {i} connects {parsed[0]!r} to itself",
                             "connect two different nodes (a loop cable is only for a node with `addresses: none`, "
                             "whose own configuration numbers its ports)")


def link_fabrics(topo: TopologySpec, smap: SourceMap) -> None:
    names = list(topo.fabrics)
    nic_fabric: dict[tuple[str, str], tuple[int, str]] = {}
    for i, link in enumerate(topo.links):
        parsed = [split_endpoint(e) for e in link.endpoints]
        if link.fabric is not None and link.fabric not in topo.fabrics:
            raise InputError(smap.where(("links", i, "fabric")), f"fabric {link.fabric!r} is not defined"
                             + did_you_mean(link.fabric, names), f"use one of: {', '.join(names)}")
        routers = {node_fabric(topo, n) for n, _ in parsed if switching(topo, n)}
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
                             f"add `fabric: <one of {', '.join(names)}>` to the link")
        _nic_sharing(topo, smap, i, parsed, nic_fabric)


def _nic_sharing(topo: TopologySpec, smap: SourceMap, i: int, parsed, nic_fabric: dict) -> None:
    """A host NIC named by two links of different fabrics would bridge networks meant to be apart."""
    fabric = link_fabric(topo, i)
    for e, (node, iface) in enumerate(parsed):
        if iface is None or switching(topo, node):
            continue
        seen = nic_fabric.get((node, iface))
        if seen and fabric and seen[1] != fabric:
            raise InputError(smap.where(("links", i, "endpoints", e)),
                             f"{node}:{iface} is on fabric {seen[1]!r} (link {seen[0]}) and on {fabric!r} here: "
                             "one NIC cannot serve two networks",
                             f"give this link its own NIC, e.g. `{node}:{fabric[:3]}0`, or leave the port name out")
        nic_fabric[(node, iface)] = (i, fabric)


def link_rates_and_delays(topo: TopologySpec, smap: SourceMap) -> None:
    for i, link in enumerate(topo.links):
        a, b = (split_endpoint(e)[0] for e in link.endpoints)
        if link.distance is not None and link.rate is None:
            raise InputError(smap.where(("links", i, "distance")),
                             f"WAN link {a}—{b} has a distance but no rate",
                             "give it its own rate, e.g. `rate: 400G`: a WAN link rarely runs at the fabric default")
        _delay(topo, smap, i, link)
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
                             _slow_fix(rate, topo.dilation))


def _slow_fix(rate: float, dilation: float) -> str:
    """How to make a rate the lab can carry: a bare number is bit/s (rate: 100 meant 100M, as
    Mininet's bw does), and a dilation below 1 is no way out."""
    most = rate / LAB_RATE_MIN
    if rate < 1e6:
        return f"a bare number is bit/s: write the unit, e.g. {rate:g}M for {rate:g} Mbit/s"
    return f"lower dilation to at most {most:g}, or raise the rate" if most >= 1 else \
        f"raise the rate: even at dilation 1 the lab needs at least {format_rate(LAB_RATE_MIN)}"


def _delay(topo: TopologySpec, smap: SourceMap, i: int, link) -> None:
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


def segments(topo: TopologySpec, smap: SourceMap) -> None:
    """An L2 segment is a tree of bridges (no spanning tree runs), with at most one port per other
    node, and no encryption (ESP carries IP between two routers; the line itself carries any frame,
    so delay, loss and jitter are fine)."""
    for bridges, links in l2_segments(topo):
        between = [i for i in links if all(split_endpoint(e)[0] in bridges for e in topo.links[i].endpoints)]
        if len(between) >= len(bridges):
            i = between[-1]
            raise InputError(smap.where(("links", i)),
                             f"bridges {', '.join(sorted(bridges))} form a loop with link {i}: labctl runs no "
                             "spanning tree, so the loop would flood forever",
                             "remove a link between bridges, or make one of them a switch (routed)")
        members: dict[str, int] = {}
        for i in links:
            link = topo.links[i]
            if link.encrypt:
                raise InputError(smap.where(("links", i, "encrypt")), f"link {i} touches a bridge and is "
                                 "encrypted: ESP carries IP between two routed ends, not a bridge's frames",
                                 "encrypt a link between routers or switches")
            for e in link.endpoints:
                node = split_endpoint(e)[0]
                if node in bridges:
                    continue
                if node in members:
                    raise InputError(smap.where(("links", i)),
                                     f"{node} has two ports on one L2 segment (links {members[node]} and {i}): "
                                     "both would hold addresses of one subnet", "cable it to the segment once")
                members[node] = i


def qos_classes(topo: TopologySpec, smap: SourceMap) -> None:
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


def zones(topo: TopologySpec, smap: SourceMap) -> None:
    """With a scale-across fabric, every zone needs a DCI router: a router of that fabric in the zone."""
    wan = {f for f, spec in topo.fabrics.items() if fabric_kind(spec.kind).joins}
    if not wan:
        return
    dci_zones = {n.zone for name, n in topo.nodes.items()
                 if switching(topo, name) and node_fabric(topo, name) in wan}
    for name, node in topo.nodes.items():
        if node.zone is not None and node.zone not in dci_zones:
            raise InputError(smap.where(("nodes", name, "zone")),
                             f"zone {node.zone!r} (of {name!r}) has no DCI router, so nothing joins it to the WAN",
                             f"add a router with `fabric: {sorted(wan)[0]}, zone: {node.zone}` linked to the "
                             "zone's spines and to the WAN")


def every_node_linked(topo: TopologySpec, smap: SourceMap) -> None:
    linked = {split_endpoint(e)[0] for link in topo.links for e in link.endpoints}
    for name, node in topo.nodes.items():
        # a node the user numbers by hand (`addresses: none`, as every containerlab node) may stand
        # alone, as containerlab's one-node labs do; a planned node without links is a mistake
        if name not in linked and not _unnumbered(node):
            raise InputError(smap.where(("nodes", name)), f"node {name!r} has no links",
                             "connect it (links: - endpoints: [" + name + ", <peer>]) or remove it")


def _unnumbered(node) -> bool:
    return getattr(node, "addresses", None) == "none"


def interface_names(topo: TopologySpec, smap: SourceMap) -> None:
    ends = [(*split_endpoint(lk.endpoints[0]), *split_endpoint(lk.endpoints[1])) for lk in topo.links]
    try:
        assign_ifnames(ends)
    except NamingError as exc:
        raise InputError(smap.where(("links", exc.link, "endpoints", exc.end)), exc.message, exc.fix) from None


CHECKS = (node_fabrics, unique_ranks, link_ends, link_fabrics, link_rates_and_delays, qos_classes, zones,
          every_node_linked, segments, interface_names, placement.check)


def check_topology(topo: TopologySpec, smap: SourceMap) -> None:
    for check in CHECKS:
        check(topo, smap)
