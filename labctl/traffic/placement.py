"""Where a ring's hops cross the fabric: the spine each fabric hop's QP hashes to.

ECMP is a draw: with the bundled lab's default hash seed the ring's two fabric hops land on the
same spine, so a ring all-reduce runs at about half the bound, which is a lesson about entropy,
not about the fabric. A benchmark that means to measure the fabric picks a seed without that
collision, and says which.
"""
from __future__ import annotations

import ipaddress

from labctl.errors import LabError
from labctl.plan.model import LabPlan, Node
from labctl.traffic import roce
from labctl.traffic.pool import gpu_ranks, path_ports
from labctl.traffic.sender import qpn


RINGS = ("all_reduce", "reduce_scatter", "all_gather")
MAX_TRACED_FLOWS = 1024     # a trace asks every hop's kernel: about 3 ms a flow


def traced(plan: LabPlan, trace, w, schedules: list, ranks: list[int]) -> dict:
    """What a run's results say about its paths: where ECMP put a ring's hops (`ring_placement`)
    and the fabric paths of the pairs of `schedules` (`fabric_paths`, the run's first operation),
    where the workload's options let a trace tell (one channel, ports that are not random)."""
    out = {}
    try:
        if w.collective in RINGS and w.options.qps == 1 and w.options.channels == 1 \
                and w.options.sport != "random" and paths_fixed(plan):
            hops = ring_hops(plan, trace, ranks, w.options.sport)
            out["ring_placement"] = {"hops": hops, "note": collision_note(hops)}
        if w.collective in RINGS + ("hier_all_reduce",) and w.options.channels == 1 \
                and w.options.sport != "random" and w.options.qps * len(ranks) <= MAX_TRACED_FLOWS:
            pairs = {(t.src, t.dst) for s in schedules for t in s.transfers}
            out["fabric_paths"] = fabric_paths(plan, trace, pairs, w.options.qps, w.options.sport)
    except LabError as exc:
        # the paths are traced on the lab as it is after the run: a link taken down during it (an
        # experiment's step, `labctl link down`) can leave a destination unroutable; the run stands
        out.pop("ring_placement", None)
        out["trace_error"] = (f"the ring's paths were not traced after the run ({exc}): a link down? "
                              f"`labctl route SRC DST` traces one path once the lab routes again")
    return out


def paths_fixed(plan: LabPlan) -> bool:
    """Whether a flow keeps one path (ECMP, with or without the QP): not under spray, flowlet or
    adaptive, where the next packet's path is all a trace can tell."""
    return all(n.flow_hash is None or n.flow_hash.mode in (None, "ecmp", "ecmp-qp") for n in plan.nodes)


def ring_hops(plan: LabPlan, trace, order: list[int] | None = None, sport_policy: str = "per-qp") -> list[dict]:
    """Each ring hop that crosses a spine: from, to, the UDP source port of its QP 0 (as Linux
    derives it from the QPNs, or 0xC000 when fixed) and the spine, on the NICs the agents pick.
    Hops inside a server ride NVLink and cross none. `trace` is lab.trace_path (it asks each
    node's kernel, and hashes the BTH destination QP where a router's mode is ecmp-qp).
    With the switch ports it leaves by (`links`), those where the switch chose among next hops
    (`ecmp_links`: the only ones a draw put it on), each port's rate and the hop's own (its NIC's)."""
    ranks = gpu_ranks(plan)
    order = order or list(ranks)
    spines = spine_names(plan)
    out = []
    for i, r in enumerate(order):
        peer = order[(i + 1) % len(order)]
        src, dst = path_ports(plan, ranks[r], ranks[peer])
        address = dst.address.split("/")[0]
        sport = roce.udp_sport(qpn(r, peer, 0), qpn(peer, r, 0)) if sport_policy == "per-qp" else 0xC000
        path = trace(plan, ranks[r].name, address, sport, roce.ROCE_PORT, qp=qpn(peer, r, 0))
        left = [(plan.node(h["node"]), h["out"]) for h in path if h["out"] and plan.node(h["node"]).forwarding]
        links = [f"{n.name}:{port}" for n, port in left]
        ecmp = [f"{n.name}:{port}" for n, port in left if _multipath(n, address)]
        link_bps = {f"{n.name}:{port}": _port_rate(n, port) for n, port in left}
        for h in path:
            if h["node"] in spines:
                out.append({"from": ranks[r].name, "to": ranks[peer].name, "sport": sport, "spine": h["node"],
                            "links": links, "ecmp_links": ecmp, "link_bps": link_bps,
                            "hop_bps": src.shaping.rate_bps})
    return out


def _multipath(node: Node, address: str) -> bool:
    """Whether `node` may have chosen among next hops toward `address`: its planned route (the
    longest match) has more than one, or the plan does not know its routes (FRR's BGP learns
    them, a te: rule's table holds its own), where the trace's choice is taken as a draw."""
    dst = ipaddress.ip_address(address)
    best = None
    for route in node.routes:
        net = ipaddress.ip_network(route.dst, strict=False)
        if dst in net and (best is None or net.prefixlen > best[0].prefixlen):
            best = (net, route)
    return best is None or bool(node.te) or len(best[1].nexthops) > 1


def _port_rate(node: Node, port: str) -> int:
    return next((i.shaping.rate_bps for i in node.interfaces if i.name == port), 0)


def fabric_paths(plan: LabPlan, trace, pairs: set[tuple[int, int]], qps: int, sport_policy: str) -> list[dict]:
    """For each (src rank, dst rank) pair of a schedule and each QP, the spine the kernel sends it
    through, if any: what `labctl estimate` uses to predict this very run rather than a draw."""
    ranks = gpu_ranks(plan)
    spines = spine_names(plan)
    out = []
    for a, b in sorted(pairs):
        _, dst = path_ports(plan, ranks[a], ranks[b])
        qp_hashed = any(n.flow_hash is not None and n.flow_hash.mode == "ecmp-qp" for n in plan.nodes)
        for k in range(qps if sport_policy == "per-qp" or qp_hashed else 1):
            sport = roce.udp_sport(qpn(a, b, k), qpn(b, a, k)) if sport_policy == "per-qp" else 0xC000
            for h in trace(plan, ranks[a].name, dst.address.split("/")[0], sport, roce.ROCE_PORT, qp=qpn(b, a, k)):
                if h["node"] in spines:
                    out.append({"src": a, "dst": b, "qp": k, "sport": sport, "spine": h["node"]})
    return out


def ring_spines(plan: LabPlan, trace) -> list[str]:
    return [h["spine"] for h in ring_hops(plan, trace)]


def shared_links(hops: list[dict]) -> dict[str, list[dict]]:
    """Each switch port (NODE:PORT) where ECMP put more ring hops than it carries at their rate,
    with those hops. A port counts only where the switch had a choice (a hop's `ecmp_links`): two
    hops on a port that is the only way on were put there by the topology, not by a draw; and only
    if the hops together ask more than its rate (two 400G hops fit an 800G uplink). Hops recorded
    before the ports' rates and choices were (older results) count on every port they share."""
    by_link: dict[str, list[dict]] = {}
    for h in hops:
        for link in h["ecmp_links"] if "ecmp_links" in h else (h.get("links") or [h["spine"]]):
            same = [x for x in by_link.get(link, []) if (x["from"], x["to"], x.get("sport")) ==
                    (h["from"], h["to"], h.get("sport"))]
            if not same:      # a hop listed once per spine it crosses is one hop on its links
                by_link.setdefault(link, []).append(h)
    return {link: hs for link, hs in by_link.items() if len(hs) > _fits(link, hs)}


def _fits(link: str, hops: list[dict]) -> int:
    """How many of these hops `link` carries at their rate (1 where the rates are not recorded)."""
    rate = max((h.get("link_bps", {}).get(link, 0) for h in hops), default=0)
    each = max((h.get("hop_bps", 0) for h in hops), default=0)
    return max(1, rate // each) if rate and each else 1


def busiest(hops: list[dict]) -> float:
    """How many times its rate ECMP asks of the ring's busiest port (1.0: no collision)."""
    return max((len(hs) / _fits(link, hs) for link, hs in shared_links(hops).items()), default=1.0)


def collision_note(hops: list[dict]) -> str | None:
    """One line saying which ring hops ECMP put on one link, how to see it and how to draw again."""
    shared = shared_links(hops)
    if not shared:
        return None
    worst = busiest(hops)
    pairs = "; ".join(f"{' and '.join(h['from'] + ' -> ' + h['to'] for h in hs)} on {link}"
                      for link, hs in sorted(shared.items()))
    first = next(iter(shared.values()))[0]
    return (f"ECMP put ring hops on one link: {pairs}. A ring runs at the pace of its busiest link, so it "
            f"takes about {worst:g}x its bound. `labctl route {first['from']} {first['to']} --sport "
            f"{first['sport']}` shows it; another hash seed draws again (the lab file's routing.hash_seed, "
            f"or `--set hash_seed=N` where its template has the variable; modes that need no lucky draw: "
            f"docs/load-balancing.md)")


def spine_names(plan: LabPlan) -> set[str]:
    """Switches with no host attached: the spines of a leaf-spine."""
    hosts = {n.name for n in plan.nodes if not n.forwarding}
    return {n.name for n in plan.nodes if n.forwarding
            and not any(i.peer_node in hosts for i in n.interfaces)}


def collides(spines: list[str]) -> bool:
    return len(set(spines)) < len(spines)
