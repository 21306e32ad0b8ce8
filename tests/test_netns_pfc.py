"""PFC on a real fabric: a lossless incast loses nothing, pauses cross the wire and are counted at both
ends; without PFC the same incast drops (and retransmits in reliable mode)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import require_root
from labctl import lifecycle as labmod
from labctl import state
from labctl.telemetry.queues import lab_queues
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

LEAF_SPINE = Path(__file__).resolve().parents[1] / "topologies" / "leaf-spine.yml"
pytestmark = pytest.mark.netns
# no NVLink: all seven senders cross the fabric into srv1-gpu0
FABRIC_ONLY = ["scale_up=false"]


def incast(plan, tmp_path: Path, options: str = "", timeout: str = "15s") -> dict:
    wf = tmp_path / "w.yml"
    wf.write_text("name: inc\ncollective: incast\nsizes: [4MB]\nparticipants: all\nroot: srv1-gpu0\n"
                  f"options: {{timeout: {timeout}{options}}}\n")
    return run_workload(plan, state.lab_dir(plan.lab), load_workload(wf), tmp_path / "run")


def pfc_counters(plan) -> dict[tuple[str, str], dict]:
    f = state.lab_dir(plan.lab).path / "pfc.json"
    time.sleep(0.5)  # the controller rewrites it every 0.2 s
    return {(p["node"], p["port"]): p for p in json.loads(f.read_text())["ports"]}


@pytest.mark.parametrize("reads", ["arrivals", "poll"])
def test_lossless_incast_loses_nothing_and_pauses_agree_at_both_ends(built_lab, tmp_path, monkeypatch, reads):
    """With either way of finding busy queues: the arrival counters (this kernel's default) and
    polling alone (where the counters cannot load)."""
    require_root()
    monkeypatch.setenv("LABCTL_QUEUE_READS", reads)
    plan = built_lab(LEAF_SPINE, sets=FABRIC_ONLY)
    assert plan.queue_reads == reads
    controller = state.lab_dir(plan.lab).read_state()["controller_pid"]
    # runs before the agents: real-time, so CPU-bound processes beside it cannot delay a pause
    assert os.sched_getscheduler(controller) == os.SCHED_FIFO
    assert os.sched_getparam(controller).sched_priority == labmod.HELPER_RT_PRIORITY
    spine1 = plan.node("spine1")
    pcap = tmp_path / "spine1-leaf1.pcap"
    cap = subprocess.Popen(["ip", "netns", "exec", spine1.namespace, "tcpdump", "-i", "leaf1", "-U", "-w", str(pcap),
                            "ether proto 0x8808"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # tcpdump writes the file's header once its capture is open: from then on it sees every frame
    # (a fixed sleep missed the first pauses while the machine was busy starting it)
    deadline = time.monotonic() + 30
    while not (pcap.exists() and pcap.stat().st_size >= 24) and time.monotonic() < deadline:
        assert cap.poll() is None, "tcpdump exited"
        time.sleep(0.05)
    try:
        doc = incast(plan, tmp_path)
        # the capture ends once leaf1 has sent its last pause: a resume can follow the incast's last
        # byte by one poll of the controller, after a capture stopped at a fixed delay
        settled = [-1, pfc_counters(plan)[("leaf1", "spine1")]["pfc_tx"]]
        while settled[-1] != settled[-2] and len(settled) < 20:
            settled.append(pfc_counters(plan)[("leaf1", "spine1")]["pfc_tx"])
    finally:
        cap.send_signal(signal.SIGINT)
        _, said = cap.communicate(timeout=10)     # tcpdump's own count, and any it dropped
    (r,) = doc["results"]
    rx = [q for c in doc["counters"].values() for q in c["rx"]]
    queues = lab_queues(plan)
    # the controller's reaction and the ledger go with a loss: they tell a late controller (and in
    # what: pfc.json slow_steps) from a stalled machine or a headroom sized too small
    why = (f"{doc['controller_reaction']}; ledger {doc['loss_ledger']['places']}; slow steps "
           f"{json.loads((state.lab_dir(plan.lab).path / 'pfc.json').read_text()).get('slow_steps')}")
    assert sum(q["drops"] for q in queues if q["lossless"]) == 0, f"a lossless queue dropped: {why}"
    assert r["wrong"] == 0 and sum(q["gaps"] for q in rx) == 0, why
    assert doc["controller_reaction"]["controller_within_headroom"], why
    counters = pfc_counters(plan)
    sent = {k: v for k, v in counters.items() if v["pfc_tx"]}
    assert sent, "the incast never paused anyone"
    for (node, port), c in sent.items():
        iface = plan.node(node).iface(port)
        peer = counters[(iface.peer_node, iface.peer_iface)]
        assert peer["pfc_rx"] == c["pfc_tx"], (node, port, c, peer)   # both ends of the link agree
        assert peer["paused_s"] > 0
    # on the wire: tshark decodes every frame leaf1 sent toward spine1 as class-based flow control
    out = subprocess.run(["tshark", "-r", str(pcap), "-T", "fields", "-e", "eth.src", "-e", "_ws.col.Info"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    leaf1_mac = plan.node("leaf1").iface("spine1").mac
    from_leaf1 = [line for line in out if line.startswith(leaf1_mac)]
    assert from_leaf1 and all("Class Based Flow Control" in line for line in from_leaf1)
    assert len(from_leaf1) == counters[("leaf1", "spine1")]["pfc_tx"], (settled, said)


def test_without_pfc_the_same_incast_drops_and_reliable_mode_retransmits(built_lab, tmp_path):
    require_root()
    plan = built_lab(LEAF_SPINE, sets=FABRIC_ONLY + ["pfc=false"])
    assert not any(c.lossless for n in plan.nodes for i in n.interfaces for c in i.shaping.classes)
    doc = incast(plan, tmp_path, timeout="5s")     # a dropped last packet is waited for until then
    rx = [q for c in doc["counters"].values() for q in c["rx"]]
    assert sum(q["drops"] for q in lab_queues(plan)) > 100 and sum(q["gaps"] for q in rx) > 0
    doc = incast(plan, tmp_path, ", reliable: true", timeout="60s")
    tx = [q for c in doc["counters"].values() for q in c["tx"]]
    assert doc["results"][0]["wrong"] == 0 and sum(q["retransmitted"] for q in tx) > 0


def test_congestion_spreads_to_a_victim_that_only_shares_an_upstream_port(built_lab, tmp_path):
    """A flow leaf3 -> leaf2 never touches the congested port (leaf1 -> srv1-gpu0), but when PFC
    cascades the spines pause leaf3's uplinks, and the victim waits behind the incast's traffic."""
    require_root()
    import itertools
    from labctl.traffic import schedule as sch
    from labctl.traffic.pool import AgentPool, RunOptions
    plan = built_lab(LEAF_SPINE, sets=FABRIC_ONLY)
    lab = state.lab_dir(plan.lab)
    # ranks: srvS-gpuG is rank 4(S-1)+G and sits on leaf G+1 (rail-optimised)
    receiver, senders, victim_src, victim_dst = 0, [1, 2, 3, 4, 7], 6, 5   # victim: leaf3 -> leaf2
    pool = AgentPool(plan, lab, [receiver, *senders, victim_src, victim_dst], RunOptions())
    try:
        def victim_time(with_incast: bool) -> float:
            ids = itertools.count()
            transfers = sch.sendrecv([victim_src, victim_dst], 8_000_000, ids=ids).transfers
            if with_incast:
                transfers += sch.incast([receiver, *senders], 4_000_000, ids=ids).transfers
            s = sch.Schedule("mix", [receiver, *senders, victim_src, victim_dst], 0, transfers)
            reports = pool.run(s, 0, timeout=60)
            assert all(not r["missing"] for r in reports.values())
            return max(x[2] for x in reports[victim_src]["sends"])

        alone = victim_time(False)
        spread = victim_time(True)
    finally:
        pool.close()
    assert spread > 1.3 * alone, f"victim alone {alone:.2f} s, beside the incast with PFC {spread:.2f} s"


def test_a_shared_buffer_pauses_earlier_than_the_port_xoff(built_lab, tmp_path):
    """qos.shared_buffer 2 MB (alpha 1) per switch: the incast queue on leaf1 pauses its feeders once
    it holds about half of what is free, ~1 MB, well below its own XOFF; still lossless."""
    import csv
    require_root()
    plan = built_lab(LEAF_SPINE, sets=FABRIC_ONLY + ["shared_buffer=2MB"])
    assert plan.shared_buffer and plan.shared_buffer.bytes == 2_000_000
    xoff = next(c for c in plan.node("leaf1").iface("srv1-gpu0").shaping.classes if c.lossless).xoff_bytes
    doc = incast(plan, tmp_path)
    rx = [q for c in doc["counters"].values() for q in c["rx"]]
    with open(tmp_path / "run" / "queues.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["class"] == "roce"]
    deepest = max(int(r["depth_bytes"]) for r in rows if (r["node"], r["port"]) == ("leaf1", "srv1-gpu0"))
    drops = sum(int(r["drops"]) for r in rows)
    assert sum(q["gaps"] for q in rx) == 0 and drops == 0, (sum(q["gaps"] for q in rx), drops, deepest)
    assert 0.6 * 1_000_000 < deepest < 0.6 * xoff, (deepest, xoff)
