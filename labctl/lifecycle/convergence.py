"""When a lab's own routing software (FRR) has converged, and how long it took.

Converged means, for every node that routes for itself and every subnet of an end host (a GPU's,
a storage server's link), compared with the lab's shortest paths (plan/routing.py, what labctl
would install statically):
- where the cut links leave the node a path as short as before, its kernel has the route with
  exactly the shortest-path ECMP next hops (so the fabric carries the hosts' traffic as the
  static lab does, ECMP included);
- where only a longer path is left (a detour), the route may be missing, as in RFC 7938's design
  (a spine that lost its leaf does not learn the leaf's subnets back through another leaf, since
  the other spine shares its AS), but any route it has uses only shortest-path next hops.
Routers' own loopbacks and links are not required (the spines never learn each other's).
"""
from __future__ import annotations

import json
import subprocess
import time

from labctl.errors import LabError
from labctl.kinds import node_kind
from labctl.plan.model import LabPlan
from labctl.plan.routing import expected_routes

CONVERGE_TIMEOUT_S = 120
POLL_S = 0.01


def routing_nodes(plan: LabPlan) -> list:
    return [n for n in plan.nodes if not n.static_routes and n.numbered and n.forwarding]


def kernel_routes(namespace: str) -> dict[str, set[str]]:
    """{prefix: next-hop addresses} of the namespace's main table (nexthop groups resolved by ip)."""
    r = subprocess.run(["ip", "-n", namespace, "-j", "route", "show"], capture_output=True, text=True)
    if r.returncode != 0:
        raise LabError(f"cannot read the routes of {namespace}: {r.stderr.strip()}")
    out: dict[str, set[str]] = {}
    for route in json.loads(r.stdout or "[]"):
        dst = route.get("dst", "")
        if dst == "default" or "/" not in dst and not dst.count(".") == 3:
            continue
        prefix = dst if "/" in dst else f"{dst}/32"
        hops = {h["gateway"] for h in route.get("nexthops", []) if "gateway" in h}
        if "gateway" in route:
            hops.add(route["gateway"])
        out[prefix] = hops
    return out


def missing(plan: LabPlan, down: set[int] = frozenset()) -> dict[str, list[str]]:
    """What each routing node still lacks or has wrong, by prefix (empty: converged)."""
    now, base = expected_routes(plan, down), expected_routes(plan)
    hosts = {n.name for n in plan.nodes if node_kind(n.kind).end_host}
    data = {lk.subnet for lk in plan.links if lk.subnet and set(lk.nodes) & hosts}
    out = {}
    for node in routing_nodes(plan):
        have = kernel_routes(node.namespace)
        before = {r.dst: {h.via for h in r.nexthops} for r in base[node.name]}
        wrong = []
        for r in now[node.name]:
            if r.dst not in data:
                continue
            hops = {h.via for h in r.nexthops}
            detour = not hops <= before.get(r.dst, set())
            got = have.get(r.dst)
            if (got != hops) if not detour else (got is not None and not got <= hops):
                wrong.append(r.dst)
        if wrong:
            out[node.name] = wrong
    return out


def wait_converged(plan: LabPlan, down: set[int] = frozenset(), timeout: float = CONVERGE_TIMEOUT_S) -> float:
    """Seconds until the lab's routing has converged (see the module); LabError after `timeout`."""
    if not routing_nodes(plan):
        return 0.0
    t0 = time.monotonic()
    while True:
        left = missing(plan, down)
        if not left:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            node, prefixes = next(iter(left.items()))
            raise LabError(f"the lab's routing has not converged after {timeout:.0f} s: {node} has no shortest-path "
                           f"route to {', '.join(prefixes[:3])}" + (f" and {len(prefixes) - 3} more" if len(prefixes) > 3 else ""),
                           f"look at its routing software, e.g. `labctl exec {node} -- vtysh -c 'show bgp summary'`")
        time.sleep(POLL_S)
