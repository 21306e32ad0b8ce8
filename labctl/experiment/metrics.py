"""Metrics of one run (experiment step), from its run directory: results.json and queues.csv."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from statistics import mean

from labctl.experiment import wan
from labctl.telemetry.fabricports import link_imbalance
from labctl.kinds import fabric_kind
from labctl.plan.model import LabPlan


def queue_deltas(run_dir: Path) -> dict[tuple[str, str, str], dict]:
    """(node, port, class) -> what changed during the run (first to last row) and the deepest depth."""
    first: dict = {}
    last: dict = {}
    deepest: dict = {}
    with open(run_dir / "queues.csv") as f:
        for row in csv.DictReader(f):
            key = (row["node"], row["port"], row["class"])
            first.setdefault(key, row)
            last[key] = row
            deepest[key] = max(deepest.get(key, 0), int(row["depth_bytes"]))
    out = {}
    for key, row in last.items():
        d = {c: float(row[c]) - float(first[key][c])
             for c in ("sent_bytes", "sent_packets", "drops", "ecn_marked", "pfc_tx", "pfc_rx", "paused_s")}
        d["max_depth"] = deepest[key]
        out[key] = d
    return out


def uplink_imbalance(plan: LabPlan, deltas: dict) -> float:
    """Worst leaf's max/mean bytes over its uplinks (ports toward switches), among leaves that sent."""
    worst = 1.0
    for node in plan.nodes:
        if not node.forwarding or all(plan.node(i.peer_node).forwarding for i in node.interfaces):
            continue                      # only switches with hosts below them (leaves)
        ups = [i.name for i in node.interfaces if plan.node(i.peer_node).forwarding
               and fabric_kind(plan.fabrics[i.fabric].kind).leaf_spine]
        sent = [sum(d["sent_bytes"] for k, d in deltas.items() if k[0] == node.name and k[1] == u) for u in ups]
        if len(sent) > 1 and sum(sent) > 1_000_000:
            worst = max(worst, max(sent) / mean(sent))
    return worst


def ring_collisions(placement: dict) -> int:
    """Ring hops that leave a switch by a port another hop of the ring takes too (results.json's
    ring_placement)."""
    from labctl.traffic.placement import shared_links
    return len({(h["from"], h["to"]) for hs in shared_links(placement.get("hops", [])).values() for h in hs})


def predicted_imbalance(plan: LabPlan, doc: dict) -> float:
    """link_imbalance as the hash predicts it: the spine of every pair's QPs as `labctl route`
    traces them (results.json's fabric_paths), each pair's bytes shared equally by its QPs and
    taken as equal across pairs, as in a ring. 0 where the run has no such trace (a mode whose
    path is per packet, more QPs than traced), or where a path's spine is not an uplink of both its
    leaves (more than two tiers, or zones joined by a WAN): the model is of one leaf-spine."""
    from labctl.traffic.placement import paths_fixed
    from labctl.traffic.pool import gpu_ranks, path_ports
    paths = doc.get("fabric_paths") or []
    if not paths or not paths_fixed(plan):
        return 0.0
    ranks = gpu_ranks(plan)
    qps: dict[tuple[int, int], int] = {}
    for p in paths:
        qps[(p["src"], p["dst"])] = qps.get((p["src"], p["dst"]), 0) + 1
    load: dict[str, dict[str, int | float]] = {}
    for p in paths:
        ia, ib = path_ports(plan, ranks[p["src"]], ranks[p["dst"]])
        share = 1 / qps[(p["src"], p["dst"])]
        for leaf, way in ((ia.peer_node, "up"), (ib.peer_node, "down")):
            ports = load.setdefault(leaf, {})
            ups = [i for i in plan.node(leaf).interfaces if plan.node(i.peer_node).forwarding]
            for i in ups:
                ports.setdefault(i.name, {"up": 0.0, "down": 0.0})
            port = next((i.name for i in ups if i.peer_node == p["spine"]), None)
            if port is None:
                return 0.0
            ports[port][way] += share
    return link_imbalance(load, floor=0)["worst"]


def reordering_metrics(r: dict) -> dict[str, float]:
    return {"reordered_share": r.get("reordered_share", 0.0), "naks": r.get("naks", 0),
            "retransmitted_bytes": r.get("retransmitted_bytes", 0)}


def run_metrics(plan: LabPlan, run_dir: Path, wan_bytes: float = 0.0) -> dict[str, float]:
    doc = json.loads((run_dir / "results.json").read_text())
    results = doc["results"]
    rx = [q for c in doc["counters"].values() for q in c.get("rx", [])]
    tx = [q for c in doc["counters"].values() for q in c.get("tx", [])]
    deltas = queue_deltas(run_dir)
    lossless = {(n.name, i.name, c.name) for n in plan.nodes for i in n.interfaces for c in i.shaping.classes
                if c.lossless}
    frontend = frontend_ports(plan)
    flows = doc.get("flows", [])
    span = (max(f["start_s"] + f["seconds"] for f in flows) - min(f["start_s"] for f in flows)) if flows else 0
    main = results
    busbw = [r["busbw_GBps"] for r in main]
    ideal_busbw = [r["busbw_GBps"] * r["ratio"] for r in main if r.get("ratio")]
    return {
        "time_s": sum(r["time_s"] for r in main),
        "busbw": mean(busbw) if busbw else 0.0,
        "ideal_busbw": mean(ideal_busbw) if ideal_busbw else 0.0,
        "ratio": sum(r["time_s"] for r in main) / max(1e-12, sum(r["ideal_s"] for r in main)) if main else 0.0,
        "wrong": sum(r["wrong"] for r in results),
        "gaps": sum(q["gaps"] for q in rx),
        "retransmits": sum(q.get("retransmitted", 0) for q in tx),
        "ce_marks": sum(q["ce"] for q in rx),
        "drops": sum(d["drops"] for d in deltas.values()),
        "lossless_drops": sum(d["drops"] for k, d in deltas.items() if k in lossless),
        "frontend_drops": sum(d["drops"] for k, d in deltas.items() if k[:2] in frontend),
        "ecn_marked": sum(d["ecn_marked"] for d in deltas.values()),
        "pfc_tx": sum(d["pfc_tx"] for d in deltas.values()),
        "pfc_rx": sum(d["pfc_rx"] for d in deltas.values()),
        "max_depth": max([d["max_depth"] for k, d in deltas.items() if k in lossless] or [0]),
        "uplink_imbalance": uplink_imbalance(plan, deltas),
        "link_imbalance": link_imbalance(doc.get("uplinks") or {})["worst"],
        **reordering_metrics(doc.get("reordering") or {}),
        "ring_collisions": ring_collisions(doc.get("ring_placement") or {}),
        "predicted_imbalance": predicted_imbalance(plan, doc),
        "wan_bytes": wan_bytes,
        "tcp_goodput_bps": sum(f["received"] for f in flows) * 8 / span if span else 0.0,
        "tcp_retransmits": sum(f.get("retransmits", 0) for f in flows),
        "victim_time_s": sum(r.get("victim_s") or 0.0 for r in results),
        "fsdp_bytes_ratio": _fsdp_ratio(doc),
        **wan.wan_metrics(plan, deltas),
        **train_metrics(plan, run_dir, doc),
    }


def frontend_ports(plan: LabPlan) -> set[tuple[str, str]]:
    """(node, port) of every port on a frontend fabric (lossy: storage, checkpoints, management)."""
    return {(n.name, i.name) for n in plan.nodes for i in n.interfaces
            if i.fabric in plan.fabrics and fabric_kind(plan.fabrics[i.fabric].kind).name == "frontend"}


def train_metrics(plan: LabPlan, run_dir: Path, doc: dict) -> dict[str, float]:
    t = doc.get("train")
    if not t:
        return {}
    from labctl.estimate import train as model
    from labctl.traffic.train_run import step_config
    from labctl.traffic.workload import load_workload
    loaded = load_workload(run_dir / "workload.yml")
    ranks = [int(r) for r in doc["ranks"]]
    cfg = step_config(plan, loaded, ranks)
    alpha = loaded.workload.options.alpha * 1e-9 * plan.dilation
    swapped = model.with_placement(cfg, list(cfg.placement[:-2]) + [cfg.placement[-1], cfg.placement[-2]])
    flip = model.flip_distance_km(cfg, swapped, lambda km: model.lab_cluster(plan, ranks, alpha, km))
    cluster = model.lab_cluster(plan, ranks, alpha)
    steps = loaded.workload.warmup + loaded.workload.iterations     # every step crossed the WAN's ports
    return {"wan_expected_bytes": steps * t["fabric_wire_bytes_expected"]["scaleacross"],
            "duty_cycle": t["duty_cycle"],
            "wan_hidden_fraction": t["wan_hidden_fraction"] or 0.0,
            "model_step_s": model.step_time(cfg, cluster)["step_s"],
            "model_swapped_step_s": model.step_time(swapped, cluster)["step_s"],
            "model_flip_km": -1.0 if flip is None else flip,
            "ep_hot_ratio": t.get("ep_hot_ratio", 0.0), "ep_hot_expected": t.get("ep_hot_ratio_expected", 0.0),
            "ep_busy_s": t["ep_busy_s"]}


def _fsdp_ratio(doc: dict) -> float:
    f = doc.get("fsdp")
    if not f or not f["bytes_per_rank"]:
        return 0.0
    # against the strategy's own formula (runs recorded before it existed were all measured against FULL_SHARD's)
    return mean(f["bytes_per_rank"].values()) / f.get("expected_bytes_per_rank", f["expected_full_shard_bytes_per_rank"])
