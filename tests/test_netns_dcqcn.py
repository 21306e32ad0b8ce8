"""DCQCN on a real bottleneck: two flows share it fairly without loss; without DCQCN they overflow it."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from conftest import require_root
from labctl import state
from labctl.telemetry.queues import node_queues
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
LEAF_SPINE = ROOT / "topologies" / "leaf-spine.yml"
pytestmark = pytest.mark.netns


def two_flows(plan, tmp_path: Path, dcqcn: bool, workload: Path | None = None) -> tuple[dict, list[int]]:
    """srv2-gpu1 and srv2-gpu2 (other server, so over the backend) both send 60 MB into srv1-gpu0."""
    wf = workload or tmp_path / f"w{dcqcn}.yml"
    if workload is None:
        wf.write_text("name: dc\ncollective: incast\nsizes: [60MB]\nparticipants: [srv1-gpu0, srv2-gpu1, srv2-gpu2]\n"
                      f"root: srv1-gpu0\noptions: {{cnp: true, dcqcn: {str(dcqcn).lower()}, timeout: 40s}}\n")
    depths: list[int] = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            depths.append(next(r["depth_bytes"] for r in node_queues(plan, plan.node("leaf1"), "srv1-gpu0")
                               if r["class"] == "roce"))
            time.sleep(0.01)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        doc = run_workload(plan, state.lab_dir(plan.lab), load_workload(wf), tmp_path / f"run-{wf.stem}")
    finally:
        stop.set()
        t.join(timeout=5)
    return doc, depths


def summary(doc: dict, depths: list[int]) -> dict:
    """Each sender's rate over the second half of the run, losses, DCQCN cuts and the deepest queue."""
    (r,) = doc["results"]
    senders = [pr["sends"] for pr in r["per_rank"].values() if pr["sends"]]
    start, end = max(s[0][1] for s in senders), min(s[-1][2] for s in senders)
    mid = (start + end) / 2
    rates = [sum(1 for x in s if mid <= x[2] <= end) * 524288 * 8 / (end - mid) for s in senders]
    rx = [q for c in doc["counters"].values() for q in c["rx"]]
    tx = [q for c in doc["counters"].values() for q in c["tx"] if q["packets"]]
    return {"rates_mbps": [round(x / 1e6, 1) for x in rates], "gaps": sum(q["gaps"] for q in rx),
            "wrong": r["wrong"], "cuts": [q.get("dcqcn_cuts", 0) for q in tx], "max_depth": max(depths),
            "mean_depth": sum(depths) / len(depths)}


def pauses_sent(plan) -> int:
    time.sleep(0.5)  # the controller rewrites its counters every 0.2 s
    f = state.lab_dir(plan.lab).path / "pfc.json"
    return sum(p["pfc_tx"] for p in json.loads(f.read_text())["ports"])


def test_dcqcn_holds_the_queue_in_the_marking_band_where_pfc_alone_holds_it_at_xoff(built_lab, tmp_path):
    """Two 60 MB flows into one 100 Mbit/s port of the lossless class (PFC on, as bundled).

    With DCQCN the senders slow down on CNPs: the queue stays in the marking band, far below XOFF,
    and no pause is needed. Without it the queue climbs to XOFF and PFC pauses the senders instead;
    both are lossless. Neither fairness within 20% nor full use of the link is asserted: with the
    reference increase steps (40/400 Mbit/s on a 400G line) recovery after a cut is slow, and runs
    ended 48/48, 68/24, under load 25/25, and once on CI 38/12.5 Mbit/s: the next test speeds the
    steps up. What is asserted is that neither flow starves: each keeps a tenth of the link, where a
    flow cut to DCQCN's floor (10 Mbit/s of 400G: 2.5 kbit/s in the lab) would fall far below it."""
    require_root()
    plan = built_lab(LEAF_SPINE)
    e = plan.ecn
    roce = next(c for c in plan.node("leaf1").iface("srv1-gpu0").shaping.classes if c.ecn)
    assert roce.lossless

    p0 = pauses_sent(plan)
    on = summary(*two_flows(plan, tmp_path, dcqcn=True))
    p1 = pauses_sent(plan)
    off = summary(*two_flows(plan, tmp_path, dcqcn=False))
    p2 = pauses_sent(plan)
    report = f"with DCQCN {on} ({p1 - p0} pauses), without {off} ({p2 - p1} pauses), XOFF {roce.xoff_bytes}"
    line = plan.node("leaf1").iface("srv1-gpu0").shaping.rate_bps / 1e6
    assert len(on["rates_mbps"]) == 2 and min(on["rates_mbps"]) >= line / 10, report  # both flows keep moving
    assert all(c >= 1 for c in on["cuts"]), report                                 # CNPs reached the senders
    assert e.kmin <= on["max_depth"] < 0.75 * roce.xoff_bytes, report              # held in the marking band
    assert on["gaps"] == 0 and on["wrong"] == 0, report
    assert off["max_depth"] >= 0.95 * roce.xoff_bytes and p2 - p1 > 0, report      # PFC holds it at XOFF
    assert off["gaps"] == 0 and off["wrong"] == 0, report                          # and still loses nothing
    assert p1 - p0 < (p2 - p1) / 4, report                                          # DCQCN needs far fewer


def test_accelerated_dcqcn_converges_to_a_fair_share_around_the_marking_band(built_lab, tmp_path):
    """workloads/dcqcn-fair.yml, the bundled workload as shipped (steps of 1% of the line per
    10 µs, g = 1/16): two 150 MB flows into one port end within 20% of an equal share over the
    second half, using at least 80% of the link, with the queue around Kmin (as
    tests/test_dcqcn.py predicts from the same parameters), no pause needed and every byte
    accounted."""
    require_root()
    plan = built_lab(LEAF_SPINE)
    e = plan.ecn
    roce = next(c for c in plan.node("leaf1").iface("srv1-gpu0").shaping.classes if c.ecn)
    p0 = pauses_sent(plan)
    doc, depths = two_flows(plan, tmp_path, dcqcn=True, workload=ROOT / "workloads" / "dcqcn-fair.yml")
    fair = summary(doc, depths)
    pauses = pauses_sent(plan) - p0
    # the bundled workload, whole: test_netns_bundled leaves its byte accounting to this test
    assert all(r["wrong"] == 0 and not r["timed_out"] for r in doc["results"]), doc["results"]
    rx = sum(q["packets"] for c in doc["counters"].values() for q in c["rx"])
    assert rx == sum(q["packets"] for c in doc["counters"].values() for q in c["tx"]) > 0
    assert doc["loss_ledger"]["lossless_drops"] == 0, doc["loss_ledger"]
    a, b = fair["rates_mbps"]
    line = plan.node("leaf1").iface("srv1-gpu0").shaping.rate_bps / 1e6
    report = f"{fair}, {pauses} pauses, line {line} Mbit/s, Kmin {e.kmin}, XOFF {roce.xoff_bytes}"
    assert abs(a - b) / ((a + b) / 2) < 0.2, report
    assert a + b > 0.8 * line, report
    assert e.kmin / 4 < fair["mean_depth"] < e.kmax and fair["max_depth"] < 0.75 * roce.xoff_bytes, report
    assert fair["gaps"] == 0 and fair["wrong"] == 0 and pauses == 0, report
