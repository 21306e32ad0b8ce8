"""What a lab's queues look like right now: per port and class, from qdisc dumps and the plan.

The settings shown (ECN profile, PFC on/off, XOFF) are the plan's unless the caller passes the
ones in force at runtime (`settings`, see dataplane/control.py).
"""
from __future__ import annotations

from types import SimpleNamespace

from labctl.kernel import ecnpath, fastmaps, nsutil
from labctl.plan import qos
from labctl.plan.model import LabPlan, Node
from labctl.telemetry import agentreport, nftcounters, qdepth


def plan_settings(plan: LabPlan, node: Node, iface, cls) -> SimpleNamespace:
    e = plan.ecn
    return SimpleNamespace(ecn=cls.ecn and node.switching, pfc=cls.lossless, kmin=cls.kmin_bytes or e.kmin,
                           kmax=cls.kmax_bytes or e.kmax, pmax=e.pmax,
                           xoff=cls.xoff_bytes, xon=cls.xon_bytes)


def node_queues(plan: LabPlan, node: Node, iface: str | None = None, settings=None) -> list[dict]:
    """Per port and class: the settings in force (`settings(node, iface, cls)`, else the plan's) and live stats."""
    settings = settings or (lambda n, i, c: plan_settings(plan, n, i, c))
    with nsutil.netlink_socket(node.namespace) as sock:
        stats = {(q.ifindex, q.handle >> 16): q for q in qdepth.dump(sock)}
        # a node marking in the data path counts its marks in its programs' map, and so does a
        # fast-path router for what its program forwards
        marking = ecnpath.open_queues(sock, node) or fastmaps.open_marking(sock, node)
    with nsutil.entered(node.namespace):
        nft_sock = nftcounters.open_socket()
    try:
        marks = nftcounters.read_marks(nft_sock, nftcounters.family_of(node))
    finally:
        nft_sock.close()
    if marking is not None:
        marks = marking.add_to(marks)
        marking.close()
    rows = []
    for i in node.interfaces:
        if iface and i.name != iface:
            continue
        for c in i.shaping.classes:
            q = stats.get((i.index, qos.leaf_handle(c.tc) >> 16))
            depth = q.backlog if q else 0
            st = settings(node, i, c)
            rows.append({"node": node.name, "port": i.name, "class": c.name, "tc": c.tc, "dscp": c.dscp,
                         "rate_bps": c.rate_bps, "ceil_bps": i.shaping.rate_bps, "prio": c.prio,
                         "buffer_bytes": c.buffer_bytes, "lossless": c.lossless, "ecn": st.ecn, "pfc": st.pfc,
                         "kmin": st.kmin, "kmax": st.kmax, "pmax": st.pmax,
                         "xoff_bytes": st.xoff if c.lossless else None, "xon_bytes": st.xon if c.lossless else None,
                         "depth_bytes": depth, "packets_queued": q.qlen if q else 0,
                         "sent_bytes": q.bytes if q else 0, "sent_packets": q.packets if q else 0,
                         "drops": q.drops if q else 0,
                         "ecn_marked": marks.get(qos.ce_counter_name(i.index, c.tc), 0),
                         "mark_probability": qos.marking_probability(depth, st.kmin, st.kmax, st.pmax)
                         if st.ecn else None})
    return rows


def lab_queues(plan: LabPlan, lab_path=None, settings=None) -> list[dict]:
    """Every port and class; with the lab directory, the PFC counters too."""
    rows = []
    for node in plan.nodes:
        if nsutil.exists(node.namespace):
            rows += node_queues(plan, node, settings=settings)
    if lab_path is not None:
        add_pfc(rows, lab_path)
    return rows


def add_pfc(rows: list[dict], lab_path) -> None:
    doc = agentreport.load(lab_path)
    if doc is None:
        return
    ports = {(p["node"], p["port"], p["tc"]): p for p in doc["ports"]}
    for r in rows:
        p = ports.get((r["node"], r["port"], r["tc"]))
        if p:
            r.update(pfc_tx=p["pfc_tx"], pfc_rx=p["pfc_rx"], paused_s=p["paused_s"], paused=p["paused"])
        elif r.get("lossless"):       # the controller lists only the ports that ever paused or were paused
            r.update(pfc_tx=0, pfc_rx=0, paused_s=0.0, paused=False)
