"""The loss ledger: every place a lab can lose a packet, counted, so that no loss goes unexplained.

Places, each read before and after a run (the ledger is the difference):
  * qdisc drops, per node, port and traffic class (a queue over its buffer);
  * device drops and errors, rx and tx, per port (a veth whose peer could not take the packet),
    less the controller's kick frames, which no protocol takes and the kernel counts as rx drops;
  * per-CPU backlog drops (/proc/net/softnet_stat: the kernel's input queue was full; machine-wide);
  * IP discards and routing failures per namespace, and UDP receive-buffer and input errors
    (/proc/net/snmp: a forwarding node out of memory or routes, an agent too slow to read), with
    forwarded packets that found no route (InNoRoutes, in /proc/net/netstat: a router whose
    routing daemon withdrew a prefix drops them there, and /proc/net/snmp has no such column);
  * packets dropped while waiting for ARP (/proc/net/stat/arp_cache, machine-wide: labctl writes
    every neighbour in at build time, so this stays 0 unless something else flushed them);
  * frames the WAN line lost on purpose, dropped for want of room, or that its sockets dropped while
    it waited for a CPU (wan.json).

Switch ports carry single packets (the hosts' NICs segment before the wire: veths have no UDP
segmentation offload with checksums off), so a qdisc drop is one packet, and one PSN when it is a
RoCE data packet. A run's PSN gaps minus the drops that can explain them is reported as
`unexplained_gaps`, never hidden.
"""
from __future__ import annotations

import json
from pathlib import Path

from labctl.kernel import nsutil, rtnl
from labctl.plan import qos
from labctl.telemetry import agentreport, qdepth
from labctl.plan.model import LabPlan

DEVICE_FIELDS = ("rx_dropped", "tx_dropped", "rx_errors", "tx_errors")
UDP_FIELDS = ("RcvbufErrors", "InErrors")
IP_FIELDS = ("InDiscards", "InHdrErrors", "InAddrErrors", "OutDiscards", "OutNoRoutes")
IPEXT_FIELDS = ("InNoRoutes", "InTruncatedPkts")
MACHINE_WIDE = (("softnet", "backlog drops"), ("neighbour", "unresolved discards"))
WAN_FIELDS = ("lost", "overflow", "bad_icv", "socket_drops", "send_errors")


def snapshot(plan: LabPlan, lab_path: Path | None = None) -> dict[tuple, int]:
    """Every counter of the ledger now: {(place, node, port, what): count}."""
    out: dict[tuple, int] = {}
    kicks = _kicks_received(plan, lab_path) if lab_path is not None else {}
    for node in plan.nodes:
        if not nsutil.exists(node.namespace):
            continue
        with nsutil.netlink_socket(node.namespace) as sock:
            leaves = {(q.ifindex, q.handle >> 16): q.drops for q in qdepth.dump(sock)}
            links = rtnl.link_dump(sock)
        for i in node.interfaces:
            for c in i.shaping.classes:
                out[("qdisc", node.name, i.name, c.name)] = leaves.get((i.index, qos.leaf_handle(c.tc) >> 16), 0)
            for field in DEVICE_FIELDS:
                out[("device", node.name, i.name, field)] = links.get(i.name, {}).get(field, 0)
            out[("device", node.name, i.name, "rx_dropped")] -= kicks.get((node.name, i.name), 0)
        with nsutil.entered(node.namespace):
            snmp = _snmp()
        for proto, fields in (("Udp", UDP_FIELDS), ("Ip", IP_FIELDS), ("IpExt", IPEXT_FIELDS)):
            for field in fields:
                out[(proto.lower(), node.name, "", field)] = snmp.get(proto, {}).get(field, 0)
    out.update(machine_wide())
    if lab_path is not None:
        for d in _wan_directions(Path(lab_path)):
            for field in WAN_FIELDS:
                out[("wan", d.get("name", "?"), "", field)] = int(d.get(field, 0))
    return out


def ledger(before: dict[tuple, int], after: dict[tuple, int], plan: LabPlan, psn_gaps: int) -> dict:
    """What was lost between two snapshots, where, and whether it explains the receivers' PSN gaps."""
    places = []
    for key, value in after.items():
        n = value - before.get(key, 0)
        if n > 0:
            place, node, port, what = key
            places.append({"place": place, "node": node, "port": port, "what": what, "count": n})
    lossless = {(n.name, i.name, c.name) for n in plan.nodes for i in n.interfaces for c in i.shaping.classes
                if c.lossless}
    lossless_drops = sum(p["count"] for p in places
                         if p["place"] == "qdisc" and (p["node"], p["port"], p["what"]) in lossless)
    total = sum(p["count"] for p in places)
    return {"places": places, "total": total, "lossless_drops": lossless_drops, "psn_gaps": psn_gaps,
            "unexplained_gaps": max(0, psn_gaps - total)}


def since_up(plan: LabPlan, lab) -> dict:
    """The ledger of everything since the lab came up: its namespaces' counters started at zero
    then; the machine-wide per-CPU backlog drops are counted from the value `up` recorded."""
    after = snapshot(plan, lab.path)
    at_up = lab.read_state().get("machine_counters_at_up", {})
    before = {(place, "", "", what): int(at_up.get(f"{place} {what}", 0)) for place, what in MACHINE_WIDE}
    return ledger(before, after, plan, 0)


def summary(led: dict) -> str:
    """One line for the run's report."""
    if not led["places"] and not led["psn_gaps"]:
        return "loss ledger: nothing lost anywhere (queues, devices, CPU backlogs, ARP, IP, sockets, WAN line)"
    where = ", ".join(f"{p['count']} {p['place']} {p['what']} at {p['node']}{':' + p['port'] if p['port'] else ''}"
                      for p in sorted(led["places"], key=lambda p: -p["count"])[:4])
    more = f" (+{len(led['places']) - 4} places)" if len(led["places"]) > 4 else ""
    text = f"loss ledger: {led['total']} lost: {where}{more}; {led['lossless_drops']} in lossless classes"
    if led["unexplained_gaps"]:
        text += f"; {led['unexplained_gaps']} PSN gaps NOT explained by any counter"
    return text


def _kicks_received(plan: LabPlan, lab_path: Path) -> dict[tuple[str, str], int]:
    """(node, port) -> kick frames its neighbour's agent sent it (agentreport.py)."""
    ports = (agentreport.load(lab_path) or {}).get("ports") or []
    out: dict[tuple[str, str], int] = {}
    for p in ports:
        iface = plan.node(p["node"]).iface(p["port"])
        key = (iface.peer_node, iface.peer_iface)
        out[key] = out.get(key, 0) + int(p.get("kicks", 0))
    return out


def _snmp() -> dict[str, dict[str, int]]:
    """The calling thread's namespace's IP and UDP counters, and IpExt's (/proc/thread-self/net
    follows setns)."""
    try:
        text = Path("/proc/thread-self/net/snmp").read_text()
        text += Path("/proc/thread-self/net/netstat").read_text()
    except OSError:
        return {}
    rows: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        proto, _, rest = line.partition(":")
        rows.setdefault(proto, []).append(rest.split())
    return {p: {k: int(v) for k, v in zip(r[0], r[1])} for p, r in rows.items() if len(r) == 2}


def machine_wide() -> dict[tuple, int]:
    """The counters no namespace owns: per-CPU backlog drops and ARP's unresolved discards."""
    return {("softnet", "", "", "backlog drops"): _softnet_drops(),
            ("neighbour", "", "", "unresolved discards"): _arp_unresolved_discards()}


def machine_wide_text() -> dict[str, int]:
    """machine_wide() as `up` records it in the lab's state."""
    return {f"{k[0]} {k[3]}": v for k, v in machine_wide().items()}


def _softnet_drops() -> int:
    """Packets dropped because a CPU's input backlog was full (second column, hex, per CPU)."""
    try:
        return sum(int(line.split()[1], 16) for line in Path("/proc/net/softnet_stat").read_text().splitlines())
    except (OSError, IndexError, ValueError):
        return 0


def _arp_unresolved_discards() -> int:
    """Packets the neighbour table dropped while an address was unresolved (summed over CPUs)."""
    try:
        lines = Path("/proc/net/stat/arp_cache").read_text().split("\n")
        col = lines[0].split().index("unresolved_discards")
        return sum(int(line.split()[col], 16) for line in lines[1:] if line.strip())
    except (OSError, IndexError, ValueError):
        return 0


def _wan_directions(lab_path: Path) -> list[dict]:
    try:
        return json.loads((lab_path / "wan.json").read_text()).get("directions", [])
    except (OSError, ValueError, AttributeError):
        return []
