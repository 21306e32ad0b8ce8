"""Topology → LabPlan. Deterministic: the same file always gives the same plan (golden-tested)."""
from __future__ import annotations

import ipaddress

from labctl.errors import InputError
from labctl.dataplane import qos
from labctl.plan import model, naming, routing
from labctl.topology.check import link_fabric, node_fabric, routing_domain
from labctl.topology.load import Loaded
from labctl.topology.schema import ROUTER_KINDS, Topology

ETH_HEADER = 14


FIBRE_NS_PER_KM = 4900       # light in fibre: ~4.9 us per km (docs/design.md §6)
ESP_ROOM = 64                # outer IPv4 20 + ESP 8 + IV 8 + pad ≤ 3 + 2 + ICV 16, rounded up


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


# The 5-tuple a switch hashes: source and destination address, protocol, source and destination port.
HASH_FIELDS_5_TUPLE = 0x01 | 0x02 | 0x04 | 0x10 | 0x20


def multipath_hash_sysctls(policy: int, seed: int) -> dict[str, str]:
    """ECMP as a switch does it. L4 is the kernel's custom policy (3) over the 5-tuple, not policy 1:
    policy 1 reuses a locally sent TCP packet's socket hash, which is random per connection and
    survives the veth into the leaf, so the same TCP 5-tuple took a different spine on every
    connection. On kernels older than 5.12 (no policy 3) the backend falls back to policy 1."""
    out = {"net.ipv4.fib_multipath_hash_policy": "3" if policy == 1 else "0"}
    if policy == 1:
        out["net.ipv4.fib_multipath_hash_fields"] = str(HASH_FIELDS_5_TUPLE)
    out["net.ipv4.fib_multipath_hash_seed"] = str(seed)
    return out


# Lab time from a queue passing XOFF to its feeders stopped: the controller's worst-case reaction,
# measured here (dataplane/reaction.py), with a margin of 2. Behind two CPU-burning processes the
# worst of 40 bundled incasts was 11 ms (p99 under 8 ms), once the control loop stopped writing
# files itself and the processes that hold rtnl beside it ran real-time (procs.py).
PFC_RESPONSE_S = 0.02


def headroom(lab_rate_bps: int, feeders: int, lab_delay_ns: int, frame: int) -> int:
    """Buffer above XOFF for what still arrives once the queue passes it, from every feeding port at
    once (the switch watches its egress queue, not per-ingress counters): a round trip of the link
    (the pause travelling out, the last data travelling in) plus the controller's reaction, plus two
    frames (one may leave a paused port, one may be on the wire)."""
    seconds = 2 * lab_delay_ns / 1e9 + PFC_RESPONSE_S
    return int(max(1, feeders) * lab_rate_bps / 8 * seconds) + 2 * frame


def link_latency_ns(lk, default_ns: int) -> int:
    """A link's one-way delay: its latency:, else its fibre length at 4.9 us/km, else the default."""
    if lk.latency is not None:
        return lk.latency
    if lk.distance is not None:
        return int(round(lk.distance * FIBRE_NS_PER_KM))
    return default_ns


def bdp_bytes(rate_bps: int, one_way_ns: int) -> int:
    """Bandwidth x round trip: the buffer a single window-limited flow needs to keep the link full
    (the same in the lab: rates / D and times x D)."""
    return int(rate_bps / 8 * 2 * one_way_ns / 1e9)


def shaping_for(lab_rate_bps: int, mtu: int, buffer_bytes: int, classes=(), lossless_fabric: bool = False,
                feeders: int = 1, lab_delay_ns: int = 0, pfc_quanta: int = 0xFFFF,
                class_buffer: int | None = None, credit_based: bool = False) -> model.Shaping:
    """`class_buffer` gives every class that buffer (a WAN link's deep buffer) instead of its own.
    `credit_based` (NVLink): a lossless class's buffer grows to hold its whole headroom above XOFF,
    as a credit loop is sized to the link, where Ethernet PFC caps the headroom at half the buffer."""
    frame = mtu + ETH_HEADER
    burst = max(lab_rate_bps // 8 // 1000, 2 * frame)
    specs = [c.model_dump() for c in classes]
    if class_buffer:
        for c in specs:
            c["buffer"] = class_buffer
    plans: list[model.ClassPlan] = []
    for c, rate in zip(specs, qos.class_rates(specs, lab_rate_bps)):
        lossless = c["lossless"] and lossless_fabric
        room = c["headroom"] or headroom(lab_rate_bps, feeders, lab_delay_ns, frame)
        if lossless and credit_based:
            c["buffer"] = max(c["buffer"], c["buffer"] // 2 + room)
        xoff = max(2 * frame, c["buffer"] - min(room, c["buffer"] // 2)) if lossless else 0
        plans.append(model.ClassPlan(name=c["name"], tc=c["tc"], dscp=list(c["dscp"]), rate_bps=rate,
                                     prio=0 if c["strict"] else 1, buffer_bytes=c["buffer"], lossless=lossless,
                                     ecn=c["ecn"], xoff_bytes=xoff, xon_bytes=max(0, xoff - 2 * frame)
                                     if lossless else 0, pfc_quanta=pfc_quanta))
    return model.Shaping(rate_bps=lab_rate_bps, burst_bytes=burst, quantum=frame, buffer_bytes=buffer_bytes,
                         classes=plans)


def node_sysctls(topo: Topology, forwarding: bool) -> dict[str, str]:
    return {
        # IPv6 off: no router solicitations, DAD or MLD reports in the captures of an IPv4 fabric
        "net.ipv6.conf.all.disable_ipv6": "1",
        "net.ipv6.conf.default.disable_ipv6": "1",
        "net.ipv4.ip_forward": "1" if forwarding else "0",
        # ECMP paths are asymmetric on purpose: reverse-path filtering would drop replies
        "net.ipv4.conf.all.rp_filter": "0",
        "net.ipv4.conf.default.rp_filter": "0",
        **multipath_hash_sysctls(topo.routing.hash_policy, topo.routing.hash_seed),
        "net.ipv4.conf.all.send_redirects": "0",
        "net.ipv4.conf.all.accept_redirects": "0",
        # a port that is down takes its ECMP next-hops with it (as a switch's routing would)
        "net.ipv4.conf.all.ignore_routes_with_linkdown": "1",
        "net.ipv4.conf.default.ignore_routes_with_linkdown": "1",
        # traceroute and ping across many hops must not be rate limited
        "net.ipv4.icmp_ratelimit": "0",
    }


def compile_plan(loaded: Loaded) -> model.LabPlan:
    topo, smap = loaded.topology, loaded.source
    fabrics: dict[str, model.FabricPlan] = {}
    pools: dict[str, tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]] = {}
    for i, (name, f) in enumerate(topo.fabrics.items(), start=1):
        p2p, lo = default_pools(i)
        prefix = f.prefix or ipaddress.ip_network(p2p)
        loopbacks = f.loopbacks or ipaddress.ip_network(lo)
        for other, (op, ol) in pools.items():
            for mine in (prefix, loopbacks):
                if mine.overlaps(op) or mine.overlaps(ol):
                    raise InputError(smap.where(("fabrics", name)),
                                     f"the address pools of fabrics {other!r} and {name!r} overlap",
                                     "give each fabric its own prefix: and loopbacks:")
        pools[name] = (prefix, loopbacks)
        # NVLink (scale-up) never drops: it has credit-based link-level flow control, modelled as a
        # hop-by-hop pause of every RoCE class on it, independent of the Ethernet fabric's PFC
        lossless = f.lossless if f.lossless is not None else f.kind in ("scale-out", "scale-up")
        fabrics[name] = model.FabricPlan(f.kind, lossless, str(prefix), str(loopbacks))

    nodes: dict[str, model.Node] = {}
    for index, (name, n) in enumerate(topo.nodes.items()):
        forwarding = n.kind in ROUTER_KINDS
        nodes[name] = model.Node(
            name=name, kind=n.kind, namespace=naming.namespace(topo.name, name), index=index,
            forwarding=forwarding, fabric=node_fabric(topo, name), server=n.server, rank=n.rank,
            loopback=None, sysctls=node_sysctls(topo, forwarding), zone=n.zone)
    _number_ranks(nodes)

    lo_alloc = {f: iter(pools[f][1].hosts()) for f in pools}
    for node in nodes.values():
        if node.forwarding:
            node.loopback = f"{_next(lo_alloc[node.fabric], smap, node.fabric, 'loopbacks')}/32"

    ends = [(*naming.split_endpoint(lk.endpoints[0]), *naming.split_endpoint(lk.endpoints[1]))
            for lk in topo.links]
    ifnames = naming.assign_ifnames(ends)
    subnets = {f: pools[f][0].subnets(new_prefix=31) for f in pools}
    links = []
    for i, (lk, (a, _, b, _), (ia, ib)) in enumerate(zip(topo.links, ends, ifnames)):
        fabric = link_fabric(topo, i)
        subnet = _next(subnets[fabric], smap, fabric, "prefix")
        addr_a, addr_b = subnet[0], subnet[1]
        rate = lk.rate or topo.defaults.rate
        lab_rate = int(round(rate / topo.dilation))
        latency = link_latency_ns(lk, topo.defaults.latency)
        lab_delay = int(round(latency * topo.dilation))
        mtu = lk.mtu or topo.defaults.mtu
        buffer = lk.buffer or (max(topo.defaults.buffer, bdp_bytes(rate, latency)) if latency else None)
        lab_jitter = int(round((lk.jitter or 0) * topo.dilation))
        wire = None
        if lab_delay or lk.loss or lab_jitter or lk.encrypt:
            wire = model.Wire(near=naming.namespace(topo.name, f"wire{i}.a"), far=naming.namespace(topo.name, f"wire{i}.b"),
                              near_index=link_ifindex(i, 1), far_index=link_ifindex(i, 0), fibre_mtu=mtu + ESP_ROOM)
        links.append(model.Link(i, f"{a}:{ia}", f"{b}:{ib}", fabric, str(subnet), rate, lab_rate,
                                latency, lab_delay, mtu, loss=lk.loss, lab_jitter_ns=lab_jitter,
                                encrypt=lk.encrypt, weight=lk.weight, wire=wire))
        for end, (node, ifname, mine, peer, peer_if, theirs) in enumerate(((a, ia, addr_a, b, ib, addr_b),
                                                                            (b, ib, addr_b, a, ia, addr_a))):
            n = nodes[node]
            n.interfaces.append(model.Interface(
                name=ifname, index=link_ifindex(i, end), mac=naming.mac(n.index, len(n.interfaces)),
                mtu=mtu, address=f"{mine}/31", peer_node=peer, peer_iface=peer_if,
                peer_address=str(theirs), link=i, fabric=fabric,
                shaping=shaping_for(lab_rate, mtu, buffer or topo.defaults.buffer, topo.qos.classes,
                                    fabrics[fabric].lossless and (topo.qos.pfc or fabrics[fabric].kind == "scale-up"),
                                    feeders=sum(1 for x in ends if node in (x[0], x[2])) - 1,
                                    credit_based=fabrics[fabric].kind == "scale-up",
                                    lab_delay_ns=lab_delay, pfc_quanta=topo.qos.pfc_quanta, class_buffer=buffer),
                delay_ns=lab_delay))

    _add_routes(nodes, links, fabrics)
    e = topo.qos.ecn
    return model.LabPlan(topo.name, topo.description.strip(), topo.dilation, loaded.template, fabrics,
                         list(nodes.values()), links, model.EcnPlan(e.kmin, e.kmax, e.pmax),
                         model.SharedBuffer(topo.qos.shared_buffer, topo.qos.shared_alpha)
                         if topo.qos.shared_buffer else None, PFC_RESPONSE_S)


def _number_ranks(nodes: dict[str, model.Node]) -> None:
    """GPUs without an explicit rank get the lowest free ranks, in file order."""
    taken = {n.rank for n in nodes.values() if n.rank is not None}
    free = (r for r in range(len(nodes) + len(taken)) if r not in taken)
    for n in nodes.values():
        if n.kind == "gpu" and n.rank is None:
            n.rank = next(free)


def _next(it, smap, fabric, key):
    try:
        return next(it)
    except StopIteration:
        raise InputError(smap.where(("fabrics", fabric, key)) if smap else None,
                         f"fabric {fabric!r} ran out of addresses in its {key} pool",
                         f"give it a larger {key}: (e.g. a /16)") from None


def routes_without(plan: model.LabPlan, down: set[int]) -> dict[str, list[model.Route]]:
    """Every node's routes as if the links in `down` were cut (what a routing protocol converges to)."""
    import copy
    nodes = {n.name: copy.copy(n) for n in plan.nodes}
    for n in nodes.values():
        n.routes = []
    _add_routes(nodes, plan.links, plan.fabrics, down)
    return {name: n.routes for name, n in nodes.items()}


def routing_domains(fabrics: dict[str, model.FabricPlan]) -> dict[str, list[str]]:
    """Fabrics that route as one network: the scale-out fabrics with the scale-across WAN joining
    them (when there is one); every other fabric alone."""
    has_wan = any(f.kind == "scale-across" for f in fabrics.values())
    out: dict[str, list[str]] = {}
    for name, f in fabrics.items():
        key = routing_domain(f.kind, name) if has_wan else name
        out.setdefault(key, []).append(name)
    return out


def _add_routes(nodes: dict[str, model.Node], links: list[model.Link], fabrics, down: set[int] = frozenset()
                ) -> None:
    weights = {lk.id: lk.weight for lk in links}
    for members in routing_domains(fabrics).values():
        _add_domain_routes(nodes, links, fabrics, set(members), weights, down)


def _add_domain_routes(nodes, links, fabrics, members: set[str], weights: dict[int, int], down) -> None:
    adj: dict[str, list[routing.Adjacency]] = {}
    prefixes: dict[str, set[str]] = {}
    for lk in links:
        if lk.fabric not in members:
            continue
        ends = {lk.a.split(":")[0], lk.b.split(":")[0]}
        # a link's subnet is reached through the routers at its ends: hosts never forward
        prefixes[lk.subnet] = {e for e in ends if nodes[e].forwarding} or ends
    for n in nodes.values():
        for i in n.interfaces:
            if i.fabric in members and i.link not in down:
                adj.setdefault(n.name, []).append(routing.Adjacency(i.name, i.peer_node, i.peer_address,
                                                                    weights[i.link]))
        if n.loopback and n.fabric in members:
            prefixes[n.loopback] = {n.name}
    routers = {n for n in adj if nodes[n].forwarding}
    dist = {r: routing.shortest_hops(r, adj, routers) for r in routers}
    in_order = routing.ordered(prefixes)
    for name in sorted(adj, key=lambda x: nodes[x].index):
        if name not in adj:
            continue
        node = nodes[name]
        if node.forwarding:
            for prefix, hops in routing.router_routes(name, in_order, adj, routers, dist):
                node.routes.append(model.Route(prefix, [model.NextHop(h.peer_address, h.local_if, h.weight)
                                                        for h in hops]))
        else:
            gateways = [a for a in adj.get(name, []) if a.peer in routers]
            if gateways:
                for fabric in sorted(members, key=list(fabrics).index):
                    for pool in (fabrics[fabric].prefix, fabrics[fabric].loopbacks):
                        node.routes.append(model.Route(pool, [model.NextHop(g.peer_address, g.local_if, g.weight)
                                                              for g in gateways]))
