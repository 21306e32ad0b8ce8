"""Changing a running lab: cut and restore links (routes reconverge), port rates, ECN and PFC settings."""
from __future__ import annotations

from dataclasses import replace

from labctl import state
from labctl.kernel import neighbours
from labctl.errors import LabError
from labctl.lifecycle.labs import backend_of, change_record
from labctl.plan import qos, te
from labctl.plan.model import LabPlan, Node
from labctl.plan.routing import routes_without
from labctl.units import parse_rate, parse_size


def set_link_state(lab: state.LabDir, plan: LabPlan, node: Node, iface: str, up: bool) -> int:
    """Cut or restore a link (both ends) and reconverge every node's routes, as BGP would.

    Routes are static in a lab, so without this the other switches would keep hashing flows
    toward the dead link. Returns how many routes changed.
    """
    backend = backend_of(lab)
    port = node.iface(iface)
    peer = plan.node(port.peer_node)
    down = set(lab.read_state().get("links_down", []))
    old = routes_without(plan, down)
    down = down - {port.link} if up else down | {port.link}
    for n, i in ((node, port), (peer, peer.iface(port.peer_iface))):
        backend.set_link(n, i, up, neighbours.of_port(plan, n.name, i.name))
    # recorded before the routes move: if reconverging fails, the next call still knows the link's state
    lab.write_state(links_down=sorted(down))
    new = routes_without(plan, down)
    changed = sum(backend.replace_routes(n, old[n.name], new[n.name]) for n in plan.nodes
                  if old[n.name] != new[n.name])
    # a te: rule's table follows its router's routes: a path cut leaves it (the rule's traffic
    # takes the paths still up), and a path restored comes back into it
    for n in plan.nodes:
        for rule in n.te:
            shares = dict(zip(rule.paths, rule.weights))
            was, now = (te.rule_routes(replace(n, routes=r[n.name]), shares) for r in (old, new))
            if was != now:
                changed += backend.replace_routes(n, was, now, rule.table)
    return changed


def converge_after_link_change(lab: state.LabDir, plan: LabPlan, since: float) -> float | None:
    """Seconds (lab time) from `since` (time.monotonic() of the cut) until the lab's routing
    software has converged on the links now up; None if labctl's static routes are all there is
    (they moved already)."""
    import time
    from labctl.lifecycle import convergence
    if not convergence.routing_nodes(plan):
        return None
    convergence.wait_converged(plan, set(lab.read_state().get("links_down", [])))
    return time.monotonic() - since


def set_rate(lab: state.LabDir, plan: LabPlan, node: Node, iface: str, rate_bps: int) -> None:
    """A port's rate, in the kernel and then in the lab's record: the runs after it take their α-β
    bounds, time-outs and agents' line rates from the plan (the caller's, and the record's)."""
    backend_of(lab).set_rate(node, node.iface(iface), rate_bps)
    port = plan.node(node.name).iface(iface)
    port.shaping = qos.reshaped(port.shaping, rate_bps)
    shaping = port.shaping

    def record(recorded: LabPlan) -> None:
        recorded.node(node.name).iface(iface).shaping = shaping
    change_record(lab, f"labctl tc set {node.name}:{iface}", record)


SIZES, FRACTIONS, SWITCHES = ("kmin", "kmax", "xoff", "xon"), ("pmax",), ("ecn", "pfc")


def settings_from_text(values: dict) -> dict:
    """`tc set` options as users give them (sizes like 200KB, on/off) as the controller's settings."""
    out = {}
    for name, value in values.items():
        if value is None:
            continue
        try:
            if name in SIZES:
                out[name] = parse_size(value)
            elif name in FRACTIONS:
                out[name] = float(value)
            elif name in SWITCHES:
                if value not in (True, False, "on", "off"):
                    raise ValueError(f"{value!r} is not on or off")
                out[name] = value in (True, "on")
            else:
                raise LabError(f"{name!r} is not a setting of tc set", "settings: rate, ecn, kmin, kmax, pmax, "
                               "pfc, xoff, xon, class")
        except ValueError as exc:
            raise LabError(f"--{name}: {exc}") from None
    return out


def tc_check(lab: state.LabDir, plan: LabPlan, node: Node, iface: str | None, class_name: str | None = None,
             rate: str | None = None, **settings) -> tuple[int | None, dict]:
    """What `tc_set` would change, checked, with nothing changed: (the new rate or None, the
    controller's settings for each port class they apply to, as control.pick gives them)."""
    from labctl.dataplane import control
    changes = settings_from_text(settings)
    if rate is None and not changes:
        raise LabError("nothing to change", "give --rate, --ecn, --kmin/--kmax/--pmax, --pfc or --xoff/--xon")
    bps = None
    if rate is not None:
        if iface is None:
            raise LabError("--rate needs a port", f"write NODE:PORT, e.g. {node.name}:{node.interfaces[0].name}")
        if class_name is not None:
            # a class's share of a port follows its weight (qos.classes): --rate shapes the port
            # whole, and a --class beside it (misspelled or not) was silently ignored
            raise LabError(f"--rate shapes the port {node.name}:{iface} whole; --class {class_name} does not "
                           "apply to it", "give --rate without --class (each class keeps its share of the port's "
                           "rate), and --class with --ecn, --kmin/--kmax/--pmax, --pfc or --xoff/--xon")
        try:
            bps = parse_rate(rate)
        except ValueError as exc:
            raise LabError(f"--rate: {exc}") from None
        if bps < qos.MIN_CLASS_BPS:
            raise LabError(f"--rate {rate}: a port is shaped to {qos.MIN_CLASS_BPS // 1000} kbit/s at least",
                           "give 8K or more (to stop a port, `labctl link down NODE:PORT`)")
    return bps, control.pick(lab.path, plan, node, iface, class_name, changes) if changes else {}


def tc_set(lab: state.LabDir, plan: LabPlan, node: Node, iface: str | None, class_name: str | None = None,
           rate: str | None = None, **settings) -> tuple[int | None, int]:
    """A port's rate (at once, in the kernel) and ECN/PFC settings (through the controller, confirmed).
    Returns (the new rate or None, how many port classes took the settings)."""
    return tc_set_many([(lab, plan, node, iface)], class_name, rate, **settings)[0]


def tc_set_many(targets: list[tuple[state.LabDir, LabPlan, Node, str | None]], class_name: str | None = None,
                rate: str | None = None, **settings) -> list[tuple[int | None, int]]:
    """`tc_set` on several (lab, plan, node, port) targets: every one checked before any is changed,
    and each lab's controller given all of its targets' settings as one change, which it takes
    whole. The rates change once the controllers confirmed: one that does not answer leaves every
    port's rate as it was. Returns (the new rate or None, port classes changed) per target."""
    from labctl.dataplane import control
    checked = [tc_check(lab, plan, node, iface, class_name, rate, **settings) for lab, plan, node, iface in targets]
    per_lab: dict = {}
    for (lab, _, node, iface), (bps, picked) in zip(targets, checked):
        mine = per_lab.setdefault(lab.path, {})
        for k, v in picked.items():
            mine.setdefault(k, {}).update(v)
        for c in node.iface(iface).shaping.classes if bps is not None else ():
            if c.lossless:   # the controller times the class's pauses, and opens its gate, at the port's rate
                mine.setdefault(control.key(node.name, iface, c.tc), {})["rate"] = bps
    for lab_path, picked in per_lab.items():
        if picked:
            control.send(lab_path, picked)
    for (lab, plan, node, iface), (bps, _) in zip(targets, checked):
        if bps is not None:
            set_rate(lab, plan, node, iface, bps)
    return [(bps, len(picked)) for bps, picked in checked]
