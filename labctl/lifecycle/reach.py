"""Where traffic goes in a running lab: a flow's path as each kernel hashes it, and every pair's reachability."""
from __future__ import annotations

import os
import subprocess

from labctl.kernel import flowhash, nsutil, rtnl
from labctl.errors import LabError
from labctl.kinds import fabric_kind, node_kind
from labctl.lifecycle import balance, targets
from labctl.lifecycle.labs import require_root
from labctl.plan import te
from labctl.plan.flowhash import ROCE_PORT, te_mark
from labctl.plan.model import LabPlan

ROCE_DSCP = 26      # what the agents send RoCE data with (traffic/roce.py DSCP_DATA)


def trace_path(plan: LabPlan, start: str, dest: str, sport: int | None, dport: int | None,
               proto: int = 17, qp: int | None = None, dscp: int | None = None) -> list[dict]:
    """Hop by hop, ask each node's kernel where this flow goes (the ECMP hash with its 5-tuple).
    At a router with an lb: mode the hop says why (`why`): the hash of the flow's next packet in
    that mode, `qp` being the BTH destination QP its packets carry (lifecycle/balance.py). At a
    router whose te: rules match the packet (its `dscp` and ports), the rule and its table."""
    require_root("labctl route")
    if dscp is None:
        dscp = ROCE_DSCP if dport == ROCE_PORT else 0
    dst = targets.address(plan, dest)
    owner = {i.address.split("/")[0]: (n, i) for n in plan.nodes for i in n.interfaces if i.address}
    owner.update({n.loopback.split("/")[0]: (n, None) for n in plan.nodes if n.loopback})
    node = targets.node(plan, start)
    src = None
    iif = None
    hops = []
    for _ in range(64):
        if dst in owner and owner[dst][0].name == node.name:
            hops.append({"node": node.name, "out": None, "via": None})
            return hops
        with nsutil.entered(node.namespace):
            sock = rtnl.open_socket()
        try:
            facts = None
            mark, rule = te_mark(node.flow_hash, dscp, proto, dport or 0) if node.flow_hash else (0, None)
            if node.flow_hash and node.flow_hash.mode and iif is not None:
                h, facts = balance.packet_hash(node, src, dst, proto, sport or 0, dport or 0, qp)
                got = flowhash.next_hop(sock, node.flow_hash, dst, src, iif, proto, sport, dport, h, mark)
            elif node.flow_hash and iif is not None:      # forwarded by labctl's hash, not the kernel's
                got = flowhash.next_hop(sock, node.flow_hash, dst, src, iif, proto, sport, dport, mark=mark)
            else:
                got = rtnl.route_get(sock, dst, src=src, iif=iif, proto=proto, sport=sport, dport=dport)
            # the rule decided if its table had a route for dst: the route matched with the mark
            # differs from main's (a destination the rule's paths do not reach falls through)
            steered = rule is not None and iif is not None and \
                rtnl.route_fib_match(sock, dst, src, iif, mark)[0] != rtnl.route_fib_match(sock, dst, src, iif)[0]
        except rtnl.NetlinkError as exc:
            raise LabError(f"{node.name} cannot route to {dst}: {os.strerror(exc.code)}") from None
        finally:
            sock.close()
        out = next((i for i in node.interfaces if i.index == got.get("oif")), None)
        if out is None:
            raise LabError(f"{node.name} has no route toward {dst}")
        if src is None:
            # the host's own lookup once more with its source address: the L4 hash includes it
            src = out.address.split("/")[0]
            continue
        hops.append({"node": node.name, "out": out.name, "via": got.get("gateway")})
        if facts is not None and "choices" in got:
            hops[-1]["why"] = balance.explain(plan, node, facts, got)
        if steered:
            hops[-1]["why"] = te.explain(node, rule, out.name)
            hops[-1]["te"] = True
        nxt = plan.node(out.peer_node)
        if nxt.bridged:     # across an L2 segment: the next hop is whoever holds the gateway (or dst)
            holder = owner.get(got.get("gateway") or dst)
            if holder is None or holder[1] is None:
                raise LabError(f"{node.name} sends toward {got.get('gateway') or dst} across a bridge, "
                               "and no port on the segment holds that address")
            node, iif = holder[0], holder[1].index
            continue
        iif = nxt.iface(out.peer_iface).index
        node = nxt
    raise LabError(f"no path from {start} to {dest} within 64 hops (a routing loop?)")


def ping_pairs(plan: LabPlan, fabric: str | None = None) -> list[tuple]:
    """(from node, to node, to port) for every pair of end hosts that share a fabric; a fabric with
    islands (NVLink) pairs only hosts of one island (one server, or one NVLink switch's)."""
    pairs = []
    for f, spec in plan.fabrics.items():
        if fabric and f != fabric:
            continue
        members = [(n, i) for n in plan.nodes if node_kind(n.kind).end_host for i in n.interfaces if i.fabric == f]
        island = fabric_kind(spec.kind).islands
        pairs += [(a, b, bi) for a, ai in members for b, bi in members
                  if a.name != b.name and (not island or getattr(a, island) == getattr(b, island)
                                           or ai.peer_node == bi.peer_node)]
    return pairs


def why_none(plan: LabPlan, fabric: str | None = None) -> str:
    """Why pingall found no pair to try: the end of its message."""
    pairs = ping_pairs(plan, fabric)
    where = f" on fabric {fabric}" if fabric else ""
    if not pairs:
        shared = f"are on fabric {fabric}" if fabric else "share a fabric"
        return f"no two end hosts {shared}, so nothing was checked"
    if not any(bi.address for _, _, bi in pairs):
        return (f"no end host's port{where} has an address (its exec lines set none), so nothing was checked; "
                f"add them as containerlab labs do, e.g. exec: [ip addr add 10.0.0.1/24 dev eth1]")
    return (f"its own routing connects no two end hosts{where} (`labctl route A B` shows where a path ends), "
            f"so nothing was checked")


def routed(plan: LabPlan, start: str, address: str) -> bool:
    """Does the lab's own routing carry a packet from `start` to `address`, hop by hop as each kernel
    looks it up? In a lab numbered by its exec lines (containerlab's way) the plan cannot tell
    which hosts are meant to reach which (separate networks, NVLink islands): the routing says."""
    try:
        trace_path(plan, start, address, None, None)
        return True
    except LabError:
        return False


def pingall(plan: LabPlan, fabric: str | None = None, parallel: int = 64, sample: int | None = None,
            backend=None, seed: int = 1) -> tuple[int, list[tuple[str, str]]]:
    """Ping every host from every other host over each fabric they share (Mininet's pingall), or a
    random `sample` of those pairs (seeded: the same pairs every time). In a lab numbered by its
    exec lines, only the pairs its routing connects (`routed`).

    Returns the number of pairs tried and the pairs that failed: those that answered none of
    PING_TRIES pings, one after another. Pings run `parallel` at a time.
    """
    import random
    from labctl import backends
    require_root("labctl pingall")
    backend = backend or backends.get("netns")
    pairs = ping_pairs(plan, fabric)
    if sample is not None and sample < len(pairs):
        pairs = random.Random(seed).sample(pairs, sample)
    if any(not n.numbered for n in plan.nodes):
        pairs = [p for p in pairs if routed(plan, p[0].name, p[2].address.split("/")[0])]
    left = pairs
    for _ in range(PING_TRIES):
        # a pair that did not answer is asked again, as fping does: a lab's first packets wait for
        # ARP at every hop, and on a starved machine (a TCG guest) one ping's 2 s may not be enough
        left = [(a, b, bi) for a, b, bi, ok in _ping_all(backend, left, parallel) if not ok]
        if not left:
            break
    return len(pairs), [(a.name, b.name) for a, b, _ in left]


PING_TRIES = 3      # pings a pair gets, one after another, before it counts as unreachable


def _ping_all(backend, pairs: list, parallel: int) -> list:
    """(from, to, to port, answered) for each pair: one ping each, `parallel` at a time."""
    out = []
    for start in range(0, len(pairs), parallel):
        running = [(a, b, bi, subprocess.Popen(backend.netns_argv(a, ["ping", "-n", "-q", "-c", "1", "-W", "2",
                                                                     bi.address.split("/")[0]]),
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                   for a, b, bi in pairs[start:start + parallel]]
        out += [(a, b, bi, p.wait() == 0) for a, b, bi, p in running]
    return out
