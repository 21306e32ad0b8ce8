"""Bytes a fabric's links carried, from the kernel's port counters (rtnetlink link stats)."""
from __future__ import annotations

from labctl.kernel import nsutil, rtnl
from labctl.kinds import fabric_kind
from labctl.plan.model import LabPlan


def sent_bytes(plan: LabPlan, kind: str = "scale-across") -> int:
    """tx_bytes summed over both ends of every link of fabrics of `kind`: each byte that crossed such
    a link once, in either direction."""
    return sum(a + b for a, b in link_sent_bytes(plan, kind).values())


def link_sent_bytes(plan: LabPlan, kind: str = "scale-across") -> dict[int, tuple[int, int]]:
    """link id -> (tx_bytes of its a end, of its b end) for every link of fabrics of `kind`: what
    each path carried, each way."""
    out, cache = {}, {}
    for link in plan.links:
        if fabric_kind(plan.fabrics[link.fabric].kind).name != kind:
            continue
        sides = []
        for end in (link.a, link.b):
            node, iface = end.split(":")
            ns = plan.node(node).namespace
            if ns not in cache:
                with nsutil.netlink_socket(ns) as sock:
                    cache[ns] = rtnl.link_dump(sock)
            sides.append(cache[ns].get(iface, {}).get("tx_bytes", 0))
        out[link.id] = (sides[0], sides[1])
    return out


def uplink_bytes(plan: LabPlan) -> dict[str, dict[str, list[int]]]:
    """leaf -> its port toward a switch of a leaf-spine fabric -> [tx, rx] bytes now, from the
    ports' own counters. A leaf is a router with an end host cabled to it; what it sends up those
    ports is its load balancer's choice, what it receives the other leaves'."""
    out: dict[str, dict[str, list[int]]] = {}
    by_name = {n.name: n for n in plan.nodes}
    for node in plan.nodes:
        if not node.forwarding or all(by_name[i.peer_node].forwarding for i in node.interfaces):
            continue
        ups = [i.name for i in node.interfaces if by_name[i.peer_node].forwarding
               and fabric_kind(plan.fabrics[i.fabric].kind).leaf_spine]
        if not ups or not nsutil.exists(node.namespace):
            continue
        with nsutil.netlink_socket(node.namespace) as sock:
            links = rtnl.link_dump(sock)
        out[node.name] = {p: [links.get(p, {}).get("tx_bytes", 0), links.get(p, {}).get("rx_bytes", 0)] for p in ups}
    return out


def uplink_deltas(before: dict, after: dict) -> dict[str, dict[str, dict[str, int]]]:
    """What each leaf's uplinks carried between two `uplink_bytes`: {leaf: {port: {up, down}}}."""
    return {leaf: {p: {"up": after[leaf][p][0] - v[0], "down": after[leaf][p][1] - v[1]}
                   for p, v in ports.items() if p in after.get(leaf, {})}
            for leaf, ports in before.items()}


def busiest_uplink(plan: LabPlan, uplinks: dict, share: float = 1.0) -> dict | None:
    """The leaf-spine port whose bytes in `uplinks` (an uplink_deltas; times `share`, the part of
    the run its measured operations sent) take the longest at the port's rate, as the lab's record
    has it (`tc set --rate` included): {port, bytes, rate_bps, seconds}. A run cannot end sooner."""
    best = None
    for leaf, ports in uplinks.items():
        for port, ways in ports.items():
            up = plan.node(leaf).iface(port)
            down = plan.node(up.peer_node).iface(up.peer_iface)
            for name, nbytes, iface in ((f"{leaf}:{port}", ways["up"], up),
                                        (f"{up.peer_node}:{up.peer_iface}", ways["down"], down)):
                if iface.shaping is None or not iface.shaping.rate_bps:
                    continue
                seconds = nbytes * share * 8 / iface.shaping.rate_bps
                if best is None or seconds > best["seconds"]:
                    best = {"port": name, "bytes": int(nbytes * share), "rate_bps": iface.shaping.rate_bps,
                            "seconds": seconds}
    return best


def link_imbalance(uplinks: dict, floor: int = 1_000_000) -> dict:
    """max / mean bytes over each leaf's uplinks, per direction (up: what the leaf spread; down:
    what the others sent it through the spines), and the worst of them; a leaf-direction that
    carried under `floor` bytes in all is left out. 1.0 is a perfect spread."""
    per, worst = {}, 1.0
    for leaf, ports in uplinks.items():
        for way in ("up", "down"):
            values = [v[way] for v in ports.values()]
            if len(values) > 1 and sum(values) > 0 and sum(values) >= floor:
                ratio = max(values) / (sum(values) / len(values))
                per[f"{leaf} {way}"] = round(ratio, 4)
                worst = max(worst, ratio)
    return {"worst": worst, "per_leaf": per}
