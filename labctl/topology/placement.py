"""Which machine each node runs on (labctl cluster): the lab file's `placement:`, or a spread rule
over `--hosts`.

A placement names a node, a server (its GPUs and NVLink switch), a zone, or '*' (every node not
named otherwise); the most specific name wins: node, then server, then zone, then '*'. A placed
lab places every node (plan/placement.py makes each a container on its machine).
"""
from __future__ import annotations

from labctl.errors import InputError

SPREADS = ("server", "zone", "node")
EVERY = "*"


def spread(topo, hosts: list[str], rule: str = "server") -> dict[str, str]:
    """A placement over `hosts` by `rule`: `server` puts the fabric (every node outside a server) on
    the first host and deals the servers over the others in turn (all on the one host if there is
    one); `zone` deals the zones over the hosts; `node` deals every node in file order."""
    if rule not in SPREADS:
        raise ValueError(f"{rule!r} is not a spread rule: one of {', '.join(SPREADS)}")
    if not hosts:
        raise ValueError("--hosts names no machine")
    if rule == "node":
        return {name: hosts[i % len(hosts)] for i, name in enumerate(topo.nodes)}
    attr = "server" if rule == "server" else "zone"
    groups = list(dict.fromkeys(getattr(n, attr) for n in topo.nodes.values() if getattr(n, attr)))
    rest = hosts[1:] or hosts if rule == "server" else hosts
    out = {EVERY: hosts[0]}
    out.update({g: rest[i % len(rest)] for i, g in enumerate(groups)})
    return out


def machine_of(topo, name: str) -> str | None:
    """The machine `placement:` gives node `name` (None: the lab is not placed)."""
    where = topo.placement
    node = topo.nodes[name]
    for key in (name, node.server, node.zone, EVERY):
        if key is not None and key in where:
            return where[key]
    return None


def check(topo, smap) -> None:
    """Every key names something, every node gets a machine, and what cannot cross machines does not."""
    if not topo.placement:
        return
    servers = {n.server for n in topo.nodes.values() if n.server}
    zones = {n.zone for n in topo.nodes.values() if n.zone}
    for key in topo.placement:
        if key != EVERY and key not in topo.nodes and key not in servers and key not in zones:
            raise InputError(smap.where(("placement", key)), f"placement names {key!r}, which is no node, server or "
                             "zone of this lab", "name a node, a server (e.g. srv1), a zone, or '*' for every other node")
    unplaced = [name for name in topo.nodes if machine_of(topo, name) is None]
    if unplaced:
        raise InputError(smap.where(("placement",)), f"placement gives no machine to {', '.join(unplaced[:5])}"
                         + (f" and {len(unplaced) - 5} more" if len(unplaced) > 5 else ""),
                         "a placed lab runs every node on a machine: add them, or `'*': MACHINE` for the rest")
    for name, node in topo.nodes.items():
        if node.privileged:
            raise InputError(smap.where(("nodes", name, "privileged")), f"node {name!r} is privileged, and a "
                             "placed node runs as a Swarm service, which Docker never runs privileged",
                             "give it the capabilities it needs with cap_add: [...] instead")
    from labctl.names import split_endpoint
    for i, lk in enumerate(topo.links):
        (a, _), (b, _) = (split_endpoint(e) for e in lk.endpoints)
        if machine_of(topo, a) == machine_of(topo, b):
            continue
        if lk.latency or lk.distance or lk.loss or lk.jitter or lk.encrypt:
            raise InputError(smap.where(("links", i)), f"link {a} -- {b} runs between machines "
                             f"{machine_of(topo, a)} and {machine_of(topo, b)}, and its delay, loss, jitter or "
                             "encryption is made by a line process that needs both ends on one machine",
                             "place both ends on one machine (placement:), or drop the WAN properties")


def apply_hosts(loaded, hosts: list[str], rule: str = "server") -> None:
    """`--hosts M1,M2 --spread RULE`: the lab's placement becomes the spread (over any it has)."""
    import re
    from labctl.errors import InputError, Where
    for h in hosts:
        if not re.match(r"^[a-z][a-z0-9-]{0,15}$", h):
            raise InputError(Where("--hosts"), f"{h!r} is not a machine name",
                             "name machines as `labctl cluster status` lists them, e.g. --hosts m1,m2,m3")
    try:
        loaded.topology.placement = spread(loaded.topology, hosts, rule)
    except ValueError as exc:
        raise InputError(Where("--spread" if "spread" in str(exc) else "--hosts"), str(exc),
                         f"--spread is one of {', '.join(SPREADS)}; --hosts names one machine or more") from None
    check(loaded.topology, loaded.source)
