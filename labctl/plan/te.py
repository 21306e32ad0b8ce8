"""WAN traffic engineering: a router's `te:` rules steer a traffic class or a port to chosen paths.

    nodes:
      z1-dci1:
        kind: router
        te:
          - {class: roce, path: z2-dci1}                      # RoCE data: the short path only
          - {dport: 5201, weights: {z2-dci1: 4, z2-dci1-2: 1}}  # iperf: 4 flows of 5 on the first

A path is one of the router's ports among the next hops its multipath routes spread over (ports
are named after their peer; a second parallel link gets `-2`). The first rule that matches a
packet decides; a packet no rule matches is hashed over every next hop as before (and a link's
own `weight:` makes that unequal-cost).

How: the router runs labctl's tc program (kernel/flowhash.py) on every port, whatever the
kernel; the program gives a matching packet the rule's mark, and a fib rule sends marked packets
to the rule's own routing table, which holds the router's multipath routes with only the rule's
paths in them (at the rule's weights). A destination those paths do not lead to has no route
there, so its lookup falls through to the main table: a rule pins WAN traffic and leaves the rest
alone. Why marks and tables, not a steered hash: a hash picks a next hop only within one route's
list, and a router's routes toward different places spread over different ports.
"""
from __future__ import annotations

import difflib

from labctl.errors import InputError
from labctl.plan import model
from labctl.plan.flowhash import FlowHash, TeMatch

MARK_BASE = 0x7E000000      # rule k marks 0x7E000000 + k + 1 (nothing else in a lab marks packets)
TABLE_BASE = 200            # rule k's routing table: 200 + k (under 256: the header carries it)
PREF_BASE = 100             # rule k's fib rule: priority 100 + k, before main's 32766
UNBALANCED = ("spray", "adaptive")   # they steer by the main routes' next hops, which a rule changes


def _close(word: str, known: list[str]) -> str:
    near = difflib.get_close_matches(word, known, n=1)
    return f"did you mean {near[0]!r}? " if near else ""


def describe(rule) -> str:
    """A rule as the lab file writes it."""
    match = " ".join(x for x in (f"class {rule.class_}" if rule.class_ else "",
                                 f"dport {rule.dport}" if rule.dport else "") if x)
    to = (f"path {', '.join(_paths(rule.path))}" if rule.path else
          "weights " + ", ".join(f"{p} {w}" for p, w in rule.weights.items()))
    return f"{match} -> {to}"


def _paths(path) -> list[str]:
    return [path] if isinstance(path, str) else list(path)


def dscp_match(name: str, classes, where, smap) -> tuple[list[int], bool]:
    """(DSCP values, negate) of a class: its own DSCPs, or for the class with none, every DSCP no
    other class claims (what the queueing does with it)."""
    by_name = {c.name: c for c in classes}
    if name not in by_name:
        known = [c.name for c in classes]
        raise InputError(smap.where(where), f"te: no traffic class {name!r} (qos.classes has "
                         f"{', '.join(known)})", f"{_close(name, known)}name a class of qos.classes")
    c = by_name[name]
    if c.dscp:
        return sorted(c.dscp), False
    return sorted({d for o in classes for d in o.dscp}), True


def multipath_ports(node: model.Node) -> list[str]:
    """The ports a router's multipath routes spread over, in port order."""
    spread = {h.dev for r in node.routes if len(r.nexthops) > 1 for h in r.nexthops}
    return [i.name for i in node.interfaces if i.name in spread]


def rule_routes(node: model.Node, shares: dict[str, int]) -> list[model.Route]:
    """The router's multipath routes over the rule's paths only, at the rule's weights."""
    out = []
    for r in node.routes:
        hops = [model.NextHop(h.via, h.dev, shares[h.dev]) for h in r.nexthops if h.dev in shares]
        if len(r.nexthops) > 1 and hops:
            out.append(model.Route(r.dst, hops))
    return out


def compile_rules(node: model.Node, spec, classes, smap, name: str) -> tuple[list[model.TeRoute], list[TeMatch]]:
    """A router's te: rules, checked against its ports and the lab's classes."""
    ports = multipath_ports(node)
    routes, matches = [], []
    for k, rule in enumerate(spec.te):
        where = ("nodes", name, "te", k)
        if rule.class_ is None and rule.dport is None:
            raise InputError(smap.where(where), "a te: rule matches nothing: it needs class: or dport:",
                             "add class: NAME (a traffic class) or dport: PORT, e.g. {class: roce, path: ...}")
        if (rule.path is None) == (rule.weights is None):
            raise InputError(smap.where(where), "a te: rule needs one of path: (one port) or weights: "
                             "(ports and shares), not " + ("both" if rule.path else "neither"),
                             f"e.g. path: {ports[0] if ports else 'PORT'}")
        shares = {p: 1 for p in _paths(rule.path)} if rule.path is not None else dict(rule.weights)
        if not shares:
            raise InputError(smap.where(where + ("path" if rule.path is not None else "weights",)),
                             "a te: rule with no path", f"name a port, e.g. {ports[0] if ports else 'PORT'}")
        for port in shares:
            if port not in ports:
                key = where + (("path",) if rule.path is not None else ("weights", port))
                mine = [i.name for i in node.interfaces]
                what = ("is not a port of " + name) if port not in mine else \
                    f"is a port of {name}, but none of its routes spreads over it"
                raise InputError(smap.where(key), f"te: path {port!r} {what}",
                                 f"{_close(port, ports)}name one of its multipath next hops' ports: "
                                 f"{', '.join(ports) or 'none (it has no multipath route)'}")
        dscp, negate = dscp_match(rule.class_, classes, where + ("class",), smap) if rule.class_ else ([], True)
        mark = MARK_BASE + k + 1
        matches.append(TeMatch(dscp=dscp, negate=negate, dport=rule.dport or 0, mark=mark))
        routes.append(model.TeRoute(describe(rule), mark, TABLE_BASE + k, PREF_BASE + k, list(shares),
                                    list(shares.values()), rule_routes(node, shares)))
    return routes, matches


def assign(nodes: dict[str, model.Node], topo, smap) -> None:
    """Every router's te: rules, and labctl's program on it to mark their packets (policy 1: the
    kernel places a packet by the hash the program set, so `labctl route` can say where)."""
    for name, spec in topo.nodes.items():
        if not spec.te:
            continue
        node = nodes[name]
        key = ("nodes", name, "te")
        if not node.forwarding or node.bridged:
            raise InputError(smap.where(key), f"{name} is a {node.kind}: it routes nothing to steer",
                             "give te: to a router (the DCI router in front of the WAN paths)")
        if not node.static_routes:
            raise InputError(smap.where(key), f"{name} routes for itself (routes: none): labctl does not "
                             "know its routes to steer", "give te: to a router with labctl's static routes")
        if node.flow_hash is not None and node.flow_hash.mode in UNBALANCED:
            raise InputError(smap.where(key), f"{name} balances by {node.flow_hash.mode}, which steers each "
                             "packet among its main routes' next hops, not a rule's",
                             "use ecmp, ecmp-qp or flowlet on a router with te: rules")
        node.te, matches = compile_rules(node, spec, topo.qos.classes, smap, name)
        if node.flow_hash is None:
            node.flow_hash = FlowHash(l4=topo.routing.hash_policy == 1, seed=topo.routing.hash_seed)
            node.sysctls = {k: v for k, v in node.sysctls.items()
                            if k not in ("net.ipv4.fib_multipath_hash_fields", "net.ipv4.fib_multipath_hash_seed")}
            node.sysctls["net.ipv4.fib_multipath_hash_policy"] = "1"
        node.flow_hash.te = matches


def explain(node: model.Node, index: int, chosen: str) -> str:
    """`labctl route`'s line for a packet a rule steered."""
    rule = node.te[index]
    among = f" (hash over {', '.join(f'{p} x{w}' for p, w in zip(rule.paths, rule.weights))})" \
        if len(rule.paths) > 1 else ""
    return (f"{node.name} [te rule {index + 1}: {rule.rule}]: marked {rule.mark:#x}, table {rule.table}: "
            f"{chosen}{among}")
