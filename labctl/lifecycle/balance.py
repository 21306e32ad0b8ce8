"""Why a router sends a flow where it does, in each load-balancing mode: what `labctl route`
prints under the path (docs/load-balancing.md). The hash is the one the router's program gives
the flow's next packet (plan/flowhash.py), computed here from the flow and from what the program
remembers (kernel/lb.py): a flow's flowlet or packet count, the uplinks' depths."""
from __future__ import annotations

import socket
import time

from labctl.kernel import lb
from labctl.lifecycle.labs import change_record
from labctl.plan import flowhash as fhm
from labctl.plan.lb import describe
from labctl.plan.model import LabPlan, Node


def _ip(a: str) -> int:
    return int.from_bytes(socket.inet_aton(a), "big")


def packet_hash(node: Node, src: str, dst: str, proto: int, sport: int, dport: int, qp: int | None) -> tuple[int, dict]:
    """(the hash of the flow's next packet at `node`, what it was made of)."""
    fh = node.flow_hash
    s, d = _ip(src), _ip(dst)
    key = fhm.hash32(fh, s, d, proto, sport, dport, qp=qp)
    facts = {"mode": fh.mode, "key": key, "inputs": f"{src} > {dst} proto {proto} ports {sport} > {dport}"}
    if fh.mode == "ecmp-qp":
        roce = proto == fhm.UDP and dport == fhm.ROCE_PORT
        facts["inputs"] += f", dest QP {qp:#08x}" if roce and qp is not None else " (not RoCEv2: no QP)"
        return key, facts
    if fh.mode == "flowlet":
        st = lb.flow_state(node, key)
        last, number = st if st else (None, 0)
        facts.update(last=last, number=number, now=time.monotonic_ns(), state=fhm.state(fh, s, d, proto, sport, dport))
        return fhm.flowlet_hash(fh, facts["state"], number), facts
    if fh.mode == "spray":
        st = lb.flow_state(node, key)
        facts["count"] = st[1] if st else 0
        return fhm.spray_hash(key, facts["count"], fh.weights), facts
    if fh.mode == "adaptive" and fh.group:
        got = lb.depths(node)
        if got is not None:
            last, depths = got
            pick = fhm.adaptive_pick(depths, last)
            facts.update(depths=depths, pick=pick)
            return fhm.steer_targets(fh.weights)[pick], facts
    return key, facts


def explain(plan: LabPlan, node: Node, facts: dict, got: dict) -> str:
    """One or two lines on the choice `got` (flowhash.next_hop's answer) made from `facts`."""
    names = {i.index: f"{i.name}" for i in node.interfaces}
    choices = [names.get(o, str(o)) for o in got["choices"]]
    pick = choices[got["chosen"]]
    d = plan.dilation
    mode = facts["mode"]
    head = f"{node.name} [{describe(node.flow_hash, d)}]"
    if mode in ("ecmp", "ecmp-qp"):
        return (f"{head}: hash of {facts['inputs']} = {got['hash']:#010x}: {pick} "
                f"(next hop {got['chosen'] + 1} of {len(choices)}: {', '.join(choices)})")
    if mode == "spray":
        turn = [choices[got["select"](fhm.spray_hash(facts["key"], facts["count"] + k, node.flow_hash.weights),
                                      got["weights"], got["usable"])]
                for k in range(2 * len(choices))]
        return (f"{head}: every packet of the flow takes the next of {', '.join(choices)} in turn; "
                f"{facts['count']} sent so far, the next ones: {' '.join(turn)}")
    if mode == "flowlet":
        gap = node.flow_hash.gap_ns
        nxt = choices[got["select"](fhm.flowlet_hash(node.flow_hash, facts["state"], facts["number"] + 1),
                                    got["weights"], got["usable"])]
        rule = (f"a pause longer than {gap / d / 1e3:g} us of fabric time ({gap / 1e6:g} ms lab) starts "
                f"flowlet {facts['number'] + 1}, on {nxt}")
        if facts["last"] is None:
            return f"{head}: no packet of this flow seen yet: its first flowlet takes {pick}; {rule}"
        idle = (facts["now"] - facts["last"]) / 1e6
        when = ("the gap has passed, so its next packet does" if idle * 1e6 > gap
                else f"the flow's last packet was {idle:.1f} ms (lab) ago")
        return f"{head}: flowlet {facts['number']} on {pick}; {rule}; {when}"
    if mode == "adaptive":
        if "depths" not in facts:
            return f"{head}: no uplink depths to compare here: hash {got['hash']:#010x}: {pick}"
        depths = ", ".join(f"{node.flow_hash.group[k]} {v:,} B" for k, v in enumerate(facts["depths"]))
        return (f"{head}: queued now toward {depths}: the shallowest is "
                f"{node.flow_hash.group[facts['pick']]} (ties go round in turn): {pick}")
    return f"{head}: {pick}"


def dest_qp(plan: LabPlan, start: str, dest: str, k: int) -> int:
    """The BTH destination QP of QP `k` of a pair of GPUs, as the agents number them (the
    receiver's QP: traffic/sender.qpn); `k` itself between other nodes."""
    from labctl.traffic.sender import qpn
    by_name = {n.name: n for n in plan.nodes}
    a, b = by_name.get(start), by_name.get(dest)
    if a is not None and b is not None and a.rank is not None and b.rank is not None:
        return qpn(b.rank, a.rank, k)
    return k


def routers_for(plan: LabPlan, target: str) -> list[Node]:
    """The routers a target names: `all`, a tier (leaf, spine) or one node."""
    from labctl.errors import LabError
    from labctl.plan.lb import TIERS, tier
    mine = lb.routers(plan)
    if not mine:
        raise LabError(f"lab {plan.lab!r} names no lb: its routers balance by the kernel's own ECMP hash, which "
                       "labctl cannot change while the lab runs",
                       "add `lb: ecmp` under routing: in the lab file (docs/load-balancing.md), then down and up")
    by_name = {n.name: n for n in plan.nodes}
    if target == "all":
        out = mine
    elif target in TIERS:
        out = [n for n in mine if tier(n, by_name) == target]
        if not out:
            raise LabError(f"lab {plan.lab!r} has no {target} router that runs labctl's load balancing",
                           "`labctl lb` lists each router and its tier")
    else:
        out = [n for n in mine if n.name == target]
        if not out:
            known = ", ".join(["all", *TIERS, *(n.name for n in mine)]) or "none: the lab names no lb:"
            raise LabError(f"{target!r} is not a router of lab {plan.lab!r} that runs labctl's load balancing",
                           f"name one of: {known}")
    return out


def mode_error(plan: LabPlan, node: Node, text: str) -> str | None:
    """Why `node` cannot balance by `text`, or None (the checks of plan/lb.py, at run time)."""
    from labctl.topology.schema import _lb_mode
    try:
        _lb_mode(text)
    except ValueError as exc:
        return str(exc)
    if text == "ecmp-qp" and not node.flow_hash.l4:
        return "ecmp-qp hashes the 5-tuple and the QP, but the lab's hash_policy is 0 (addresses only)"
    if node.te and text in ("spray", "adaptive"):
        return f"{node.name} has te: rules, and {text} steers among its main routes' next hops, not a rule's"
    if text == "adaptive" and any(len(r.nexthops) > 1 for r in node.routes) and not node.flow_hash.group:
        return f"{node.name}'s multipath routes go through different sets of next hops"
    return None


def checked(plan: LabPlan, target: str, text: str) -> list[Node]:
    """The routers `labctl lb TARGET=MODE` would change, once each is known able to (LabError if
    not): every setting of one command is checked before any is made."""
    from labctl.errors import LabError
    nodes = routers_for(plan, target)
    for node in nodes:
        why = mode_error(plan, node, text)
        if why:
            raise LabError(f"{node.name}: {why}", "modes: ecmp, ecmp-qp, flowlet:GAP (e.g. flowlet:50us), spray, adaptive")
    return nodes


def set_mode(lab, plan: LabPlan, target: str, text: str) -> list[str]:
    """`labctl lb TARGET=MODE`: these routers balance by `text` from now on; the lab's record says
    so. Returns the routers changed."""
    import dataclasses
    from labctl.plan.lb import parse
    nodes = checked(plan, target, text)
    mode, gap = parse(text)
    for node in nodes:
        lb.set_mode(node, dataclasses.replace(node.flow_hash, mode=mode, gap_ns=int(gap * plan.dilation)))
    modes = {n.name: n.flow_hash for n in nodes}

    def record(recorded: LabPlan) -> None:
        for name, flow_hash in modes.items():
            recorded.node(name).flow_hash = flow_hash
    change_record(lab, f"labctl lb {target}={text}", record)
    return [n.name for n in nodes]
