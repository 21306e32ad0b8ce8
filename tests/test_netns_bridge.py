"""The bridge kind on real namespaces: an L2 segment of two Linux bridges, GPUs and a router on it.
Every pair reaches every other, a flow's path crosses the segment to the router, and the bridges'
queues are shaped, marked and paused like a switch's: a 2:1 RoCE incast through them is lossless."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import require_root
from labctl import lifecycle as labmod
from labctl import state
from labctl.telemetry.queues import lab_queues
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

BRIDGED = Path(__file__).resolve().parent / "topologies" / "bridged.yml"
pytestmark = pytest.mark.netns


def test_a_bridged_segment_reaches_every_pair_and_routes_through_its_router(built_lab):
    require_root()
    plan = built_lab(BRIDGED)
    tried, failed = labmod.pingall(plan)
    assert tried == 4 * 3 and failed == []
    links = json.loads(subprocess.run(["ip", "-n", plan.node("s1").namespace, "-j", "link", "show"],
                                      capture_output=True, text=True, check=True).stdout)
    masters = {x["ifname"]: x.get("master") for x in links}
    assert masters["g1"] == masters["s2"] == masters["r1"] == "br0"
    addrs = json.loads(subprocess.run(["ip", "-n", plan.node("s1").namespace, "-j", "addr", "show"],
                                      capture_output=True, text=True, check=True).stdout)
    assert not [a for x in addrs if x["ifname"] != "lo" for a in x.get("addr_info", [])]   # L2 only
    hops = [h["node"] for h in labmod.trace_path(plan, "g2", "h4", 49152, 4791)]
    assert hops == ["g2", "r1", "h4"], hops
    # every member of the segment knows every other member's MAC before any traffic (no ARP wait)
    for seg in plan.segments:
        members = {(e.split(":")[0], e.split(":")[1]) for k in seg.links for e in (plan.links[k].a, plan.links[k].b)
                   if not plan.node(e.split(":")[0]).bridged}
        for node, port in members:
            neigh = json.loads(subprocess.run(["ip", "-n", plan.node(node).namespace, "-j", "neigh", "show", "dev",
                                               port], capture_output=True, text=True, check=True).stdout)
            have = {(e["dst"], e["lladdr"]) for e in neigh if "PERMANENT" in e.get("state", [])}
            want = {(plan.node(n).iface(p).address.split("/")[0], plan.node(n).iface(p).mac)
                    for n, p in members if (n, p) != (node, port)}
            assert want and want <= have, (node, port, want - have)


def test_a_roce_incast_through_bridges_is_lossless_with_pauses_and_marks(built_lab, tmp_path):
    require_root()
    plan = built_lab(BRIDGED)
    wf = tmp_path / "w.yml"
    wf.write_text("name: inc\ncollective: incast\nsizes: [4MB]\nparticipants: [g1, g2, g3]\nroot: g1\n"
                  "options: {timeout: 20s}\n")
    lab = state.lab_dir(plan.lab)
    # the incast peaks near 350 KB: XOFF low enough that the bridge must pause its feeders
    labmod.tc_set(lab, plan, plan.node("s2"), "s1", xoff="150KB", xon="100KB")
    doc = run_workload(plan, lab, load_workload(wf), tmp_path / "run")
    (r,) = doc["results"]
    rx = [q for c in doc["counters"].values() for q in c["rx"]]
    assert r["wrong"] == 0 and sum(q["gaps"] for q in rx) == 0
    assert doc["loss_ledger"]["total"] == 0, doc["loss_ledger"]
    rows = {(q["node"], q["port"], q["class"]): q for q in lab_queues(plan, lab.path)}
    # both senders hang off s2, so the queue builds on s2's port toward s1 (one 100M link for two)
    s2_s1 = rows[("s2", "s1", "roce")]
    assert s2_s1["sent_packets"] > 2 * 900 and s2_s1["drops"] == 0
    assert s2_s1["ecn_marked"] > 0                      # the bridge's queue was marked (bridge family rules)
    assert sum(q.get("pfc_tx", 0) for q in rows.values() if q["node"] == "s2") > 0   # and it paused g2, g3


BEHIND_A_LINE = """name: {name}
dilation: 1
nodes:
  h1: {{kind: host}}
  s1: {{kind: bridge}}
  h2: {{kind: host}}
links:
  - {{endpoints: [h1, s1], rate: 100M, latency: 1ms}}
  - {{endpoints: [s1, h2], rate: 10M}}
"""
BLAST = """import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end, sent = time.monotonic() + 2.0, 0
while time.monotonic() < end:
    s.sendto(bytes(1400), ("{dst}", 9))
    sent += 1
    time.sleep(max(0.0, sent * 1400 * 8 / 30e6 - (time.monotonic() - end + 2.0)))
print(sent)
"""


def test_a_bridge_behind_a_delayed_line_drops_at_its_bottleneck(state_dir, lab_name, tmp_path):
    """A frame the WAN line puts on a port is charged to the line's socket until it leaves the far
    side; across a bridge that is after the bridge's egress queue, so a small send buffer held the
    overflow instead of the 10M port's queue: no drop, and seconds of delay in the line. 30 Mbit/s
    for 2 s into a 10M port with a 4 MiB queue must drop about 7.5 - 2.5 - 4.2 = 0.8 MB there."""
    require_root()
    f = tmp_path / "lab.yml"
    f.write_text(BEHIND_A_LINE.format(name=lab_name))
    plan, lab, _ = labmod.up(str(f), name=lab_name)
    try:
        dst = plan.node("h2").interfaces[0].address.split("/")[0]
        sent = int(subprocess.run(["ip", "netns", "exec", plan.node("h1").namespace, "python3", "-c",
                                   BLAST.format(dst=dst)], capture_output=True, text=True, check=True).stdout)
        assert sent * 1400 > 7e6, sent
        stats = json.loads(subprocess.run(["tc", "-n", plan.node("s1").namespace, "-s", "-j", "qdisc", "show",
                                           "dev", "h2"], capture_output=True, text=True, check=True).stdout)
        drops = sum(q.get("drops", 0) for q in stats)
        assert drops * 1442 > 0.3e6, stats           # at its queue, not in the line
        wan = json.loads((lab.path / "wan.json").read_text())
        assert max(d["max_lag_us"] for d in wan["directions"]) < 500_000, wan
    finally:
        labmod.down(lab_name)
