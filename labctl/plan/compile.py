"""Topology → LabPlan, in named passes. Deterministic: the same file always gives the same plan.

Each pass reads what the earlier ones made and adds its part (a new feature adds a pass, not a
branch in a long function):

    pools → nodes → placement → ranks → loopbacks → segments → links → shaping → buffers → wires → tunnels → routes
    → balancing → steering → files
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from labctl import names
from labctl.errors import InputError
from labctl.kinds import fabric_kind, node_kind
from labctl.plan import buffers as port_buffers, lb, model, placement, qos, routing, software, te
from labctl.plan.sysctls import node_sysctls
from labctl.topology.fabrics import l2_segments, link_fabric, node_fabric
from labctl.topology.load import Loaded

FIBRE_NS_PER_KM = 4900       # light in fibre: ~4.9 us per km (docs/design.md §6)
ESP_ROOM = 64                # ESP adds 54-57 bytes (qos.ESP_MAX_OVERHEAD), rounded up


def link_ifindex(link: int, end: int) -> int:
    """The ifindex of one end of a link: unique in the lab and never equal to its peer's.

    The kernel handles a veth's carrier change at once only if ifindex != iflink (the peer's
    ifindex); otherwise linkwatch batches it up to a second later, and until then the port's
    qdisc is noop and drops. Numbering ends 2+2k and 3+2k keeps every `up` fast.
    """
    return 2 + 2 * link + end


def default_pools(index: int) -> tuple[str, str]:
    """Address pools of the index-th fabric (1-based) when the lab does not give them."""
    return f"10.{index}.0.0/16", f"10.{100 + index}.0.0/24"


def link_latency_ns(lk, default_ns: int) -> int:
    """A link's one-way delay: its latency:, else its fibre length at 4.9 us/km, else the default."""
    if lk.latency is not None:
        return lk.latency
    if lk.distance is not None:
        return int(round(lk.distance * FIBRE_NS_PER_KM))
    return default_ns


class Pool:
    """Consecutive, aligned blocks of a fabric's prefix: /31 links in file order, a segment's subnet
    where its first link comes."""

    def __init__(self, net: ipaddress.IPv4Network, fabric: str, smap):
        self.net, self.fabric, self.smap = net, fabric, smap
        self.cursor = int(net.network_address)

    def take(self, prefixlen: int) -> ipaddress.IPv4Network:
        size = 1 << (32 - prefixlen)
        start = -(-self.cursor // size) * size
        if start + size > int(self.net.broadcast_address) + 1:
            raise InputError(self.smap.where(("fabrics", self.fabric, "prefix")),
                             f"fabric {self.fabric!r} ran out of addresses in its prefix pool",
                             "give it a larger prefix: (e.g. a /16)")
        self.cursor = start + size
        return ipaddress.ip_network((start, prefixlen))


@dataclass
class Build:
    """What the passes share: the validated lab, and the plan as far as it is made."""
    loaded: Loaded
    fabrics: dict[str, model.FabricPlan] = field(default_factory=dict)
    pools: dict[str, Pool] = field(default_factory=dict)
    loopback_pools: dict[str, ipaddress.IPv4Network] = field(default_factory=dict)
    nodes: dict[str, model.Node] = field(default_factory=dict)
    segments: list[model.Segment] = field(default_factory=list)
    segment_of: dict[int, model.Segment] = field(default_factory=dict)     # link id -> its segment
    ends: list[tuple] = field(default_factory=list)                         # (a, ia, b, ib) per link
    links: list[model.Link] = field(default_factory=list)
    queue_reads: str = "poll"
    notes: list[str] = field(default_factory=list)                          # located, for the user

    @property
    def topo(self):
        return self.loaded.topology

    @property
    def smap(self):
        return self.loaded.source


def pools(b: Build) -> None:
    """Each fabric's address pools (given, or 10.N.0.0/16 and 10.(100+N).0.0/24), which must not overlap."""
    seen: dict[str, tuple] = {}
    for i, (name, f) in enumerate(b.topo.fabrics.items(), start=1):
        p2p, lo = default_pools(i)
        prefix = f.prefix or ipaddress.ip_network(p2p)
        loopbacks = f.loopbacks or ipaddress.ip_network(lo)
        for other, (op, ol) in seen.items():
            if any(mine.overlaps(op) or mine.overlaps(ol) for mine in (prefix, loopbacks)):
                raise InputError(b.smap.where(("fabrics", name)),
                                 f"the address pools of fabrics {other!r} and {name!r} overlap",
                                 "give each fabric its own prefix: and loopbacks:")
        seen[name] = (prefix, loopbacks)
        b.pools[name] = Pool(prefix, name, b.smap)
        b.loopback_pools[name] = loopbacks
        lossless = f.lossless if f.lossless is not None else fabric_kind(f.kind).lossless
        b.fabrics[name] = model.FabricPlan(f.kind, lossless, str(prefix), str(loopbacks))


def nodes(b: Build) -> None:
    t = b.topo
    for index, (name, n) in enumerate(t.nodes.items()):
        kind = node_kind(n.kind)
        b.nodes[name] = model.Node(
            name=name, kind=n.kind, namespace=names.namespace(t.name, name), index=index,
            forwarding=kind.forwards, fabric=node_fabric(t, name), server=n.server, rank=n.rank,
            loopback=None, sysctls=node_sysctls(t.routing.hash_policy, t.routing.hash_seed, kind.forwards,
                                                kind.bridges),
            zone=n.zone, bridged=kind.bridges,
            container=software.container(t.name, name, n, b.loaded.file, b.smap),
            exec=software.exec_lines(name, n, b.smap),
            static_routes=n.routes == "static" and n.addresses == "auto", numbered=n.addresses == "auto")


def ranks(b: Build) -> None:
    """GPUs without an explicit rank get the lowest free ranks, in file order."""
    taken = {n.rank for n in b.nodes.values() if n.rank is not None}
    free = (r for r in range(len(b.nodes) + len(taken)) if r not in taken)
    for n in b.nodes.values():
        if node_kind(n.kind).holds_rank and n.rank is None:
            n.rank = next(free)


def loopbacks(b: Build) -> None:
    hosts = {f: iter(net.hosts()) for f, net in b.loopback_pools.items()}
    for node in b.nodes.values():
        if node.forwarding and node.numbered:      # `addresses: none`: its exec lines number it, loopback too
            try:
                node.loopback = f"{next(hosts[node.fabric])}/32"
            except StopIteration:
                raise InputError(b.smap.where(("fabrics", node.fabric, "loopbacks")),
                                 f"fabric {node.fabric!r} ran out of addresses in its loopbacks pool",
                                 "give it a larger loopbacks: (e.g. a /24)") from None


def segments(b: Build) -> None:
    """L2 segments: bridges joined by their links (topology/check.py found and checked them)."""
    b.ends = [(*names.split_endpoint(lk.endpoints[0]), *names.split_endpoint(lk.endpoints[1]))
              for lk in b.topo.links]
    for k, (bridges, link_ids) in enumerate(l2_segments(b.topo)):
        seg = model.Segment(k, link_fabric(b.topo, link_ids[0]), "", sorted(bridges), sorted(link_ids))
        b.segments.append(seg)
        b.segment_of.update({i: seg for i in link_ids})


def _segment_subnet(b: Build, seg: model.Segment) -> ipaddress.IPv4Network | None:
    """Room for the segment's numbered members (None if its exec lines number all of them)."""
    members = sum(1 for i in seg.links for end in (b.ends[i][0], b.ends[i][2])
                  if end not in seg.bridges and b.nodes[end].numbered)
    if not members:
        return None
    host_bits = max(2, (members + 1).bit_length())   # room for the members, the network and broadcast
    return b.pools[seg.fabric].take(32 - host_bits)


def links(b: Build) -> None:
    t = b.topo
    ifnames = names.assign_ifnames(b.ends)
    addresses: dict[int, iter] = {}
    for i, (lk, (a, _, z, _), (ia, iz)) in enumerate(zip(t.links, b.ends, ifnames)):
        fabric = link_fabric(t, i)
        seg = b.segment_of.get(i)
        if seg is None and not (b.nodes[a].numbered and b.nodes[z].numbered):
            subnet, addr = "", {a: "", z: ""}        # its nodes' exec lines number it
        elif seg is None:
            subnet = b.pools[fabric].take(31)
            addr = {a: f"{subnet[0]}/31", z: f"{subnet[1]}/31"}
        else:
            if seg.id not in addresses:
                net = _segment_subnet(b, seg)
                seg.subnet, addresses[seg.id] = (str(net), iter(net.hosts())) if net else ("", iter(()))
            subnet = seg.subnet
            addr = {end: ("" if end in seg.bridges or not b.nodes[end].numbered
                          else f"{next(addresses[seg.id])}/{subnet.split('/')[1]}") for end in (a, z)}
        rate = lk.rate or t.defaults.rate
        latency = link_latency_ns(lk, t.defaults.latency)
        b.links.append(model.Link(i, f"{a}:{ia}", f"{z}:{iz}", fabric, str(subnet), rate,
                                  int(round(rate / t.dilation)), latency, int(round(latency * t.dilation)),
                                  lk.mtu or t.defaults.mtu, loss=lk.loss,
                                  lab_jitter_ns=int(round((lk.jitter or 0) * t.dilation)), encrypt=lk.encrypt,
                                  weight=lk.weight))
        link = b.links[-1]
        for end, (node, ifname, peer, peer_if) in enumerate(((a, ia, z, iz), (z, iz, a, ia))):
            n = b.nodes[node]
            n.interfaces.append(model.Interface(
                name=ifname, index=link_ifindex(i, end), mac=names.mac(n.index, len(n.interfaces)), mtu=link.mtu,
                address=addr[node], peer_node=peer, peer_iface=peer_if,
                peer_address=addr[peer].split("/")[0], link=i, fabric=fabric, shaping=None,
                delay_ns=link.lab_delay_ns))


def shaping(b: Build) -> None:
    """Every port's HTB tree: the link's lab rate, the classes, and each lossless class's XOFF."""
    t = b.topo
    degree = {name: len(n.interfaces) for name, n in b.nodes.items()}
    response = qos.pfc_response_s(controlled_queues(b), _measured_response(t), b.queue_reads == "arrivals")
    for node in b.nodes.values():
        for iface in node.interfaces:
            link, lk = b.links[iface.link], t.links[iface.link]
            fabric = b.fabrics[link.fabric]
            credit = fabric_kind(fabric.kind).credit_based
            buffer = port_buffers.link_buffer(t, lk, link)
            iface.shaping = qos.shaping_for(
                link.lab_rate_bps, link.mtu, buffer or t.defaults.buffer, t.qos.classes,
                fabric.lossless and (t.qos.pfc or credit), feeders=degree[node.name] - 1, credit_based=credit,
                lab_delay_ns=link.lab_delay_ns, pfc_quanta=t.qos.pfc_quanta, class_buffer=buffer,
                response_s=response)
            e = t.qos.ecn
            kmin, kmax = qos.ecn_thresholds(e.kmin, e.kmax, link.rate_bps, e.rate)
            for c in iface.shaping.classes:
                if c.ecn:
                    c.kmin_bytes, c.kmax_bytes = kmin, kmax
            if link.encrypt:
                # the port's rate is the fibre's: the encryptor in front of it adds ESP to every packet,
                # so the router's queue (the WAN buffer) holds what the fibre cannot take yet
                iface.shaping.overhead_bytes = qos.ESP_MAX_OVERHEAD


def buffers(b: Build) -> None:
    """Every queue holds a frame, and the ECN profile's thresholds fit the buffers (plan/buffers.py)."""
    b.notes += port_buffers.check(b)


def controlled_queues(b: Build) -> list[int]:
    """For each switch the controller reads, its queues with ECN or PFC (it paces idle reads by
    their cost). From the topology's classes: this runs before the ports have their shaping."""
    t = b.topo
    per_port = sum(1 for c in t.qos.classes if c.ecn or c.lossless)
    return [len(n.interfaces) * per_port for n in b.nodes.values() if n.switching]


def wires(b: Build) -> None:
    """Links with a delay, loss, jitter or encryption go through the WAN line (kernel/wires.py)."""
    t = b.topo
    for link in b.links:
        if link.lab_delay_ns or link.loss or link.lab_jitter_ns or link.encrypt:
            i = link.id
            link.wire = model.Wire(near=names.namespace(t.name, f"wire{i}.a"), far=names.namespace(t.name, f"wire{i}.b"),
                                   near_index=link_ifindex(i, 1), far_index=link_ifindex(i, 0),
                                   fibre_mtu=link.mtu + ESP_ROOM)


def routes(b: Build) -> None:
    routing.add_routes(b.nodes, b.links, b.fabrics, b.segments)
    for node in b.nodes.values():
        if not node.static_routes:
            node.routes = []          # its own software (FRR) or its exec lines route it


def balancing(b: Build) -> None:
    """Each router's load-balancing mode (plan/lb.py), once its routes say what its uplinks are."""
    b.notes += lb.assign(b.nodes, b.topo, b.topo.dilation, b.smap)


def steering(b: Build) -> None:
    """Each router's te: rules (plan/te.py), once its routes and its load balancing are known."""
    te.assign(b.nodes, b.topo, b.smap)


TUNNEL_INDEX = 1 << 30


def tunnels(b: Build) -> None:
    """A link between two machines (placement.py) is a point-to-point VXLAN between them. Its
    ports get ifindexes far above any a host hands out: a kernel before 6.14 checks a requested
    index against the *sender's* namespace, which for a VXLAN is the machine's own (where its UDP
    socket lives), whose devices have low indexes."""
    for link in b.links:
        a, z = (b.nodes[n].machine for n in link.nodes)
        if a == z:
            continue
        if link.wire is not None:
            raise InputError(b.smap.where(("links", link.id)), f"link {link.a} -- {link.b} runs between machines "
                             f"{a} and {z}, and its delay, loss, jitter or encryption (its own, or the lab's "
                             "defaults:) is made by a line process that needs both ends on one machine",
                             "place both ends on one machine (placement:), or give this link `latency: 0`")
        link.machines = [a, z]
        for end, (node, ifname) in enumerate(link.ends):
            b.nodes[node].iface(ifname).index = TUNNEL_INDEX + 2 * link.id + end


PASSES = (("pools", pools), ("nodes", nodes), ("placement", placement.place), ("ranks", ranks), ("loopbacks", loopbacks),
          ("segments", segments), ("links", links), ("shaping", shaping), ("buffers", buffers), ("wires", wires),
          ("tunnels", tunnels), ("routes", routes), ("balancing", balancing), ("steering", steering),
          ("binds", software.binds_apart), ("bind sources", software.binds_exist), ("files", software.files))


def compile_plan(loaded: Loaded, queue_reads: str = "poll") -> model.LabPlan:
    """`queue_reads`: how this machine's controller will find busy queues (dataplane/arrivals.py
    chooses): polled, idle switches are read less often in a large lab, and the headroom grows."""
    b = Build(loaded, queue_reads=queue_reads)
    for _, run_pass in PASSES:
        run_pass(b)
    t = b.topo
    e = t.qos.ecn
    return model.LabPlan(t.name, t.description.strip(), t.dilation, loaded.template, b.fabrics,
                         list(b.nodes.values()), b.links, model.EcnPlan(e.kmin, e.kmax, e.pmax, e.rate),
                         model.SharedBuffer(t.qos.shared_buffer, t.qos.shared_alpha) if t.qos.shared_buffer else None,
                         qos.pfc_response_s(controlled_queues(b), _measured_response(t), queue_reads == "arrivals"),
                         b.segments, queue_reads, b.notes)


def _measured_response(t) -> float | None:
    return t.qos.pfc_response / 1e9 if t.qos.pfc_response is not None else None


def routes_without(plan: model.LabPlan, down: set[int]) -> dict[str, list[model.Route]]:
    return routing.routes_without(plan, down)
