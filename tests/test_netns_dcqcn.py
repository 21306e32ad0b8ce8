"""DCQCN on a real bottleneck: two flows share it fairly without loss; without DCQCN they overflow it."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from conftest import require_root
from labctl import state
from labctl.dataplane.inspect import node_queues
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


def test_dcqcn_fills_the_bottleneck_without_loss_where_line_rate_senders_overflow(built_lab, tmp_path):
    """Fairness within 20% is not asserted: over a 10 s lab run (~2.5 ms of real fabric time at
    D = 4000) the split varied from 48/48 to 68/24 Mbit/s between runs (see the issue notes)."""
    require_root()
    plan = built_lab(LEAF_SPINE)
    e = plan.ecn
    buffer = next(c.buffer_bytes for c in plan.node("leaf1").iface("srv1-gpu0").shaping.classes if c.ecn)

    doc, depths = two_flows(plan, tmp_path, dcqcn=True)
    (r,) = doc["results"]
    senders = [pr["sends"] for pr in r["per_rank"].values() if pr["sends"]]
    # steady state: each flow's rate over the second half of the time both were sending
    start, end = max(s[0][1] for s in senders), min(s[-1][2] for s in senders)
    mid = (start + end) / 2
    slice_bytes = 524288
    rates = [sum(1 for x in s if mid <= x[2] <= end) * slice_bytes * 8 / (end - mid) for s in senders]
    assert len(rates) == 2 and min(rates) > 0.15 * 100e6, rates         # both flows keep moving
    assert sum(rates) == pytest.approx(100e6 * 4096 / 4154, rel=0.15)    # and together they fill the link
    rx = [q for c in doc["counters"].values() for q in c["rx"]]
    tx = [q for c in doc["counters"].values() for q in c["tx"] if q["packets"]]
    assert r["wrong"] == 0 and sum(q["gaps"] for q in rx) == 0          # no loss, no PFC needed
    assert all(q["dcqcn_cuts"] >= 1 for q in tx)
    assert e.kmin <= max(depths) < buffer                                 # the queue reached the marking band

    doc, depths = two_flows(plan, tmp_path, dcqcn=False)
    rx = [q for c in doc["counters"].values() for q in c["rx"]]
    assert sum(q["gaps"] for q in rx) > 100 and max(depths) > 0.9 * buffer  # line-rate senders overflow it
