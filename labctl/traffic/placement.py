"""Where a ring's hops cross the fabric: the spine each fabric hop's QP hashes to.

ECMP is a draw: with the bundled lab's default hash seed the ring's two fabric hops land on the
same spine, so a ring all-reduce runs at about half the bound, which is a lesson about entropy,
not about the fabric. A benchmark that means to measure the fabric picks a seed without that
collision, and says which.
"""
from __future__ import annotations

from labctl.plan.model import LabPlan
from labctl.traffic import roce
from labctl.traffic.pool import gpu_ranks, path_ports
from labctl.traffic.sender import qpn


def paths_fixed(plan: LabPlan) -> bool:
    """Whether a flow keeps one path (ECMP, with or without the QP): not under spray, flowlet or
    adaptive, where the next packet's path is all a trace can tell."""
    return all(n.flow_hash is None or n.flow_hash.mode in (None, "ecmp", "ecmp-qp") for n in plan.nodes)


def ring_hops(plan: LabPlan, trace, order: list[int] | None = None, sport_policy: str = "per-qp") -> list[dict]:
    """Each ring hop that crosses a spine: from, to, the UDP source port of its QP 0 (as Linux
    derives it from the QPNs, or 0xC000 when fixed) and the spine, on the NICs the agents pick.
    Hops inside a server ride NVLink and cross none. `trace` is lab.trace_path (it asks each
    node's kernel, and hashes the BTH destination QP where a router's mode is ecmp-qp)."""
    ranks = gpu_ranks(plan)
    order = order or list(ranks)
    spines = spine_names(plan)
    out = []
    for i, r in enumerate(order):
        peer = order[(i + 1) % len(order)]
        _, dst = path_ports(plan, ranks[r], ranks[peer])
        sport = roce.udp_sport(qpn(r, peer, 0), qpn(peer, r, 0)) if sport_policy == "per-qp" else 0xC000
        path = trace(plan, ranks[r].name, dst.address.split("/")[0], sport, roce.ROCE_PORT, qp=qpn(peer, r, 0))
        links = [f"{h['node']}:{h['out']}" for h in path if h["out"] and plan.node(h["node"]).forwarding]
        for h in path:
            if h["node"] in spines:
                out.append({"from": ranks[r].name, "to": ranks[peer].name, "sport": sport, "spine": h["node"],
                            "links": links})
    return out


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
    """Each switch port (NODE:PORT) that two or more ring hops leave by, with those hops."""
    by_link: dict[str, list[dict]] = {}
    for h in hops:
        for link in h.get("links") or [h["spine"]]:
            same = [x for x in by_link.get(link, []) if (x["from"], x["to"], x.get("sport")) ==
                    (h["from"], h["to"], h.get("sport"))]
            if not same:      # a hop listed once per spine it crosses is one hop on its links
                by_link.setdefault(link, []).append(h)
    return {link: hs for link, hs in by_link.items() if len(hs) > 1}


def collision_note(hops: list[dict]) -> str | None:
    """One line saying which ring hops ECMP put on one link, how to see it and how to draw again."""
    shared = shared_links(hops)
    if not shared:
        return None
    worst = max(len(hs) for hs in shared.values())
    pairs = "; ".join(f"{' and '.join(h['from'] + ' -> ' + h['to'] for h in hs)} on {link}"
                      for link, hs in sorted(shared.items()))
    first = next(iter(shared.values()))[0]
    return (f"ECMP put ring hops on one link: {pairs}. A ring runs at the pace of its busiest link, so it "
            f"takes about {worst}x its bound. `labctl route {first['from']} {first['to']} --sport "
            f"{first['sport']}` shows it; `labctl up ... --set hash_seed=N` draws again (modes that need "
            f"no lucky draw: docs/load-balancing.md)")


def spine_names(plan: LabPlan) -> set[str]:
    """Switches with no host attached: the spines of a leaf-spine."""
    hosts = {n.name for n in plan.nodes if not n.forwarding}
    return {n.name for n in plan.nodes if n.forwarding
            and not any(i.peer_node in hosts for i in n.interfaces)}


def collides(spines: list[str]) -> bool:
    return len(set(spines)) < len(spines)
