"""DCQCN on a real bottleneck: two flows share it fairly without loss; without DCQCN they overflow it."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from conftest import require_root
from labctl import state
from labctl.dataplane.queues import node_queues
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

LEAF_SPINE = Path(__file__).resolve().parents[1] / "topologies" / "leaf-spine.yml"
pytestmark = pytest.mark.netns


def two_flows(plan, tmp_path: Path, dcqcn: bool) -> tuple[dict, list[int]]:
    """srv2-gpu1 and srv2-gpu2 (other server, so over the backend) both send 60 MB into srv1-gpu0."""
    wf = tmp_path / f"w{dcqcn}.yml"
    wf.write_text("name: dc\ncollective: incast\nsizes: [60MB]\nparticipants: [srv1-gpu0, srv2-gpu1, srv2-gpu2]\n"
                  f"root: srv1-gpu0\noptions: {{cnp: true, dcqcn: {str(dcqcn).lower()}, timeout: 10s}}\n")
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
        doc = run_workload(plan, state.lab_dir(plan.lab), load_workload(wf), tmp_path / f"run{dcqcn}")
    finally:
        stop.set()
        t.join(timeout=5)
    return doc, depths


def test_dcqcn_fills_the_bottleneck_and_loses_far_less_than_line_rate_senders(built_lab, tmp_path):
    """Two 60 MB flows into one 100 Mbit/s port, with and without DCQCN (CNPs on ECN marks).

    Fairness within 20% is not asserted: over a 10 s lab run (~2.5 ms of real fabric time at
    D = 4000) the split varied from 48/48 to 68/24 Mbit/s between runs (see the issue notes).
    Loss is compared, not required to be zero: on a loaded 2-core machine a late CNP can let the
    queue touch the buffer once (seen: 55 of 229 messages in one full-suite run, 0 alone)."""
    require_root()
    plan = built_lab(LEAF_SPINE)
    e = plan.ecn
    buffer = next(c.buffer_bytes for c in plan.node("leaf1").iface("srv1-gpu0").shaping.classes if c.ecn)

    def summary(doc, depths):
        (r,) = doc["results"]
        senders = [pr["sends"] for pr in r["per_rank"].values() if pr["sends"]]
        start, end = max(s[0][1] for s in senders), min(s[-1][2] for s in senders)
        mid = (start + end) / 2
        rates = [sum(1 for x in s if mid <= x[2] <= end) * 524288 * 8 / (end - mid) for s in senders]
        rx = [q for c in doc["counters"].values() for q in c["rx"]]
        tx = [q for c in doc["counters"].values() for q in c["tx"] if q["packets"]]
        return {"rates_mbps": [round(x / 1e6, 1) for x in rates], "gaps": sum(q["gaps"] for q in rx),
                "cuts": [q.get("dcqcn_cuts", 0) for q in tx], "max_depth": max(depths),
                "sent": sum(q["packets"] for q in tx)}

    on = summary(*two_flows(plan, tmp_path, dcqcn=True))
    off = summary(*two_flows(plan, tmp_path, dcqcn=False))
    report = f"with DCQCN {on}, without {off}"
    assert len(on["rates_mbps"]) == 2 and min(on["rates_mbps"]) > 15, report       # both flows keep moving
    assert sum(on["rates_mbps"]) == pytest.approx(100 * 4096 / 4154, rel=0.15), report  # together: the link
    assert all(c >= 1 for c in on["cuts"]) and on["max_depth"] >= e.kmin, report  # marks reached the senders
    assert off["gaps"] > 0.02 * off["sent"] and off["max_depth"] > 0.9 * buffer, report  # overflow without
    assert on["gaps"] <= 0.1 * off["gaps"], report                                  # DCQCN cuts the loss 10x+
