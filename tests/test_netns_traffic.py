"""RoCEv2 agents on a real lab: collectives, accounting, captures, loss and CNPs."""
from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import RING_SEED, lab_namespaces, module_state_dir, require_root
from wire import frames, icrc_ok
from labctl import lifecycle as labmod
from labctl import state
from labctl import backends
from labctl.kernel import fastmaps, nsutil, rtnl
from labctl.telemetry.ledger import summary as ledger_summary
from labctl.traffic import placement
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.netns
MB = 1_000_000
# RING_SEED (conftest): the draw that puts the ring's two fabric hops on two spines; ring_spines()
# checks that premise on the lab's own routes.


def ring_spines(plan) -> list[str]:
    return placement.ring_spines(plan, labmod.trace_path)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The bundled leaf-spine (100 Mbit/s links at dilation 4000) without PFC, shared by this module's
    tests: the incasts here are about how loss is accounted and recovered (PFC has its own tests)."""
    require_root()
    name = f"lt{uuid.uuid4().hex[:6]}"
    with module_state_dir(tmp_path_factory):
        try:
            plan, d, _ = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"), ["pfc=false", RING_SEED], name=name)
            spines = ring_spines(plan)
            assert len(spines) == 2 and len(set(spines)) == 2, f"the ring's fabric hops share a spine: {spines}"
            yield plan, d
        finally:
            if state.lab_dir(name).path.exists():
                backends.get("netns").destroy(state.lab_dir(name))
            assert lab_namespaces(name + "-") == []


def workload(tmp_path: Path, text: str):
    f = tmp_path / "w.yml"
    f.write_text(text)
    return load_workload(f)


def rx_totals(doc: dict) -> dict:
    out = {"packets": 0, "bytes": 0, "gaps": 0, "late": 0, "ce": 0, "cnp_sent": 0}
    for c in doc["counters"].values():
        for q in c["rx"]:
            for k in out:
                out[k] += q[k]
    return out


def tx_packets(doc: dict) -> int:
    return sum(q["packets"] for c in doc["counters"].values() for q in c["tx"])


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather", "all_reduce"])
def test_ring_collective_accounts_every_byte_within_25_percent_of_alpha_beta(lab, tmp_path, collective):
    plan, d = lab
    w = workload(tmp_path, f"name: t\ncollective: {collective}\nsizes: [16MB]\nparticipants: all\n")
    factor = 2 if collective == "all_reduce" else 1
    per_rank = factor * 7 * (16 * MB // 8)
    ratios = []
    # every run must account for every byte and be no faster than the bound (that would mean bytes
    # went uncounted); the best of up to three must be at most 25% slower: eight Python agents, the
    # controller and the fabric share two cores (runs measured 1.02-1.19 here), and CI's host once
    # ran a whole stretch of the suite at 60-90% speed, which no single run survives
    for attempt in range(3):
        doc = run_workload(plan, d, w, tmp_path / f"run{attempt}")
        (r,) = doc["results"]
        assert r["wrong"] == 0 and not r["timed_out"]
        rx = rx_totals(doc)
        assert rx["gaps"] == 0 and rx["late"] == 0
        for rank, pr in r["per_rank"].items():
            assert pr["bytes_sent"] == per_rank
            assert sum(x[2] for x in pr["recvs"]) == per_rank  # bytes the receiver counted, message by message
        assert rx["packets"] == tx_packets(doc)  # every data packet sent was received
        assert r["ratio"] >= 0.97, f"{collective}: {r['time_s']:.3f} s, faster than ideal {r['ideal_s']:.3f} s"
        ratios.append(r["ratio"])
        if r["ratio"] <= 1.25:
            break
    assert min(ratios) <= 1.25, f"{collective}: {ratios} x the ideal {r['ideal_s']:.3f} s"
    assert (tmp_path / f"run{attempt}" / "results.json").exists()


def test_each_operation_waits_for_its_own_data_not_the_previous_ones(lab, tmp_path):
    """Operations number their transfers alike: an agent that remembered the previous operation's
    arrivals under the same ids started every ring step at once and reported messages received
    before the operation began. Each iteration must receive every message after its own start,
    and no iteration may beat the alpha-beta bound."""
    plan, d = lab
    w = workload(tmp_path, "name: it\ncollective: all_reduce\nsizes: [2MB, 4MB]\niterations: 2\n"
                           "participants: all\n")
    doc = run_workload(plan, d, w, tmp_path / "run")
    assert len(doc["results"]) == 4
    for r in doc["results"]:
        assert r["wrong"] == 0 and not r["timed_out"], r["label"]
        assert r["ratio"] >= 0.97, f"{r['label']} #{r['iteration']}: faster than the bound ({r['ratio']:.2f})"
        for rank, pr in r["per_rank"].items():
            early = [x for x in pr["recvs"] if x[1] < 0]
            assert not early, f"{r['label']} #{r['iteration']}, rank {rank}: received before it began: {early[:3]}"


def _tcpdump(ns: str, iface: str, out: Path) -> subprocess.Popen:
    p = subprocess.Popen(["ip", "netns", "exec", ns, "tcpdump", "-i", iface, "-s", "0", "-U", "-w", str(out),
                          "udp port 4791"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 5
    while out.stat().st_size == 0 if out.exists() else True:  # the pcap header appears once it listens
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    time.sleep(0.3)
    return p


def test_capture_on_spine_links_shows_real_roce_frames_that_tshark_decodes(lab, tmp_path):
    plan, d = lab
    pcaps, procs = [], []
    for spine in ("spine1", "spine2"):
        out = tmp_path / f"{spine}.pcap"
        procs.append(_tcpdump(plan.node(spine).namespace, "leaf1", out))
        pcaps.append(out)
    try:
        w = workload(tmp_path, "name: cap\ncollective: all_reduce\nsizes: [2MB]\nparticipants: all\n")
        doc = run_workload(plan, d, w, tmp_path / "run")
        assert doc["results"][0]["wrong"] == 0
        time.sleep(0.3)
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
            p.wait(timeout=10)
    captured = [f for p in pcaps for f in frames(p)]
    assert len(captured) > 100, "the ring's cross-server hops cross a spine toward leaf1"
    roce_mtu_frame = 14 + 20 + 8 + 12 + 16 + 4096 + 4 + 4  # largest: RETH + full payload + ImmDt
    assert max(len(f) for f in captured) <= roce_mtu_frame, "a GSO super-packet crossed the fabric"
    assert all(icrc_ok(f) for f in captured)
    assert all(f[15] >> 2 == 26 for f in captured if f[42] != 0x11)  # data in DSCP 26
    fields = []
    for p in pcaps:
        out = subprocess.run(["tshark", "-r", str(p), "-Y", "infiniband", "-T", "fields", "-e", "_ws.col.Protocol",
                              "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp",
                              "-e", "infiniband.bth.psn"], capture_output=True, text=True, check=True).stdout
        fields += [line.split("\t") for line in out.splitlines() if line]
    assert len(fields) == len(captured)
    assert {f[0] for f in fields} == {"RRoCE"}
    opcodes = {int(f[1]) for f in fields}
    assert opcodes <= {6, 7, 8, 9, 10, 11, 17} and {6, 7, 9} <= opcodes
    assert all(int(f[2], 16) >= 2 for f in fields)  # never QP0/QP1


def _qdisc_drops(plan) -> int:
    from pyroute2 import IPRoute
    from labctl.kernel import nsutil
    total = 0
    for node in plan.nodes:
        with nsutil.entered(node.namespace):
            ipr = IPRoute()
        try:
            for q in ipr.get_qdiscs():
                if q.get_attr("TCA_KIND") == "bfifo":
                    total += q.get_attr("TCA_STATS2").get_attr("TCA_STATS_QUEUE")["drops"]
        finally:
            ipr.close()
    return total


def test_incast_loss_is_accounted_by_the_receiver(lab, tmp_path):
    """7:1 into one GPU without PFC: queues overflow; the receiver's account matches the drop counters."""
    plan, d = lab
    before = _qdisc_drops(plan)
    w = workload(tmp_path, "name: inc\ncollective: incast\nsizes: [4MB]\nparticipants: all\n"
                           "root: srv1-gpu0\noptions: {timeout: 8s}\n")
    doc = run_workload(plan, d, w, tmp_path / "run")
    dropped = _qdisc_drops(plan) - before
    (r,) = doc["results"]
    rx = rx_totals(doc)
    sent = sum(q["packets"] for c in doc["counters"].values() for q in c["tx"] if q["packets"])
    lost = sent - rx["packets"]
    assert dropped > 100, "7 x 100 Mbit/s into 100 Mbit/s must overflow a 4 MiB buffer"
    assert lost <= dropped <= lost + 10  # a few ARP or ACK drops may add to the queues' count
    assert 0 < rx["gaps"] <= lost        # loss the PSNs reveal (a lost tail has no later PSN)
    assert r["wrong"] > 0  # incomplete messages (and, if a last packet was lost, missing ones)
    # the run's loss ledger names the same place and explains every gap
    ledger = doc["loss_ledger"]
    assert ledger["unexplained_gaps"] == 0 and ledger["psn_gaps"] == rx["gaps"]
    qdisc = [p for p in ledger["places"] if p["place"] == "qdisc"]
    assert qdisc and sum(p["count"] for p in qdisc) == dropped, ledger
    assert any(p["what"] == "roce" for p in qdisc) and ledger["lossless_drops"] == 0   # PFC off: roce is lossy
    # the queue time series saw the incast: the receiver's port filled up to its buffer and dropped
    import csv
    series = doc["queue_series"]
    assert series["rate_hz"] >= 100, series
    rows = [x for x in csv.DictReader(open(tmp_path / "run" / "queues.csv"))
            if x["node"] == "leaf1" and x["port"] == "srv1-gpu0" and x["class"] == "roce"]
    assert max(int(x["depth_bytes"]) for x in rows) > 3_000_000
    assert int(rows[-1]["drops"]) > 0


def test_a_collective_that_stopped_moving_gives_up_long_before_its_deadline(lab, tmp_path):
    """No `timeout` given and the receiver's link down: its message never comes. The run gives up
    once nothing has arrived for 2 x the bound or the lab's longest healthy silence (about 5.2 s
    here), not at the deadline (100 x the bound + 60 s, there for slow but moving runs: an emulated
    CPU runs the agents 5-10x slower)."""
    from labctl.traffic.pool import quiet_floor
    from labctl.traffic.run import time_outs
    plan, d = lab
    w = workload(tmp_path, "name: sr\ncollective: sendrecv\nsizes: [1MB]\n"
                           "participants: [srv2-gpu0, srv1-gpu0]\n")
    labmod.set_link_state(d, plan, plan.node("leaf1"), "srv1-gpu0", up=False)
    try:
        t0 = time.monotonic()
        doc = run_workload(plan, d, w, tmp_path / "run")
        took = time.monotonic() - t0
    finally:
        labmod.set_link_state(d, plan, plan.node("leaf1"), "srv1-gpu0", up=True)
    (r,) = doc["results"]
    deadline, quiet = time_outs(None, r["ideal_s"], quiet_floor(plan))
    assert r["timed_out"] and r["wrong"] >= 1, r
    # its time is how long it ran before giving up, not its last byte's (which read 0.23x the bound)
    assert quiet - 0.5 < r["time_s"] < took and r["ratio"] > 1, r
    assert deadline > 60 and 4.5 < quiet < 6, (deadline, quiet)
    assert quiet < took < quiet + 5, took
    assert labmod.pingall(plan, "backend")[1] == []       # the shared lab is whole again


def _agents_of(node) -> list[int]:
    pids = nsutil.pids_in({nsutil.inode(node.namespace)})
    assert pids, f"no agent runs in {node.namespace}"
    return pids


def _signal_all(pids: list[int], sig) -> None:
    for pid in pids:
        os.kill(pid, sig)


def _stopped(pids: list[int]) -> dict:
    """Each process's command and state once SIGSTOP reached it ('T'), as the kernel says."""
    deadline, out = time.monotonic() + 5, {}
    while time.monotonic() < deadline:
        out = {p: (Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")[:80].decode(errors="replace"),
                   Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]) for p in pids}
        if all(state == "T" for _, state in out.values()):
            break
        time.sleep(0.01)
    return out


def test_a_stall_of_the_waiting_agent_is_not_silence(lab, tmp_path):
    """A machine that stalls whole (a VM whose host is busy) stops every agent at once, and when it
    runs again nothing has arrived for longer than the quiet floor: because nothing ran, not because
    something was lost. Here the sender is stopped, its queue drains, the receiver is stopped for
    the quiet floor + 2 s, then let go 0.6 s before the sender (longer than its 0.2 s grace): the
    receiver must count the time it did not run as not silence, and the message arrives whole."""
    import threading
    from labctl.traffic.agent import RECEIVER_GRACE_S
    from labctl.traffic.pool import quiet_floor
    from labctl.traffic.run import time_outs
    plan, d = lab
    w = workload(tmp_path, "name: stall\ncollective: sendrecv\nsizes: [24MB]\n"
                           "participants: [srv2-gpu0, srv1-gpu0]\n")
    frozen = quiet_floor(plan) + 2.0
    out, seen = {}, {}
    runner = threading.Thread(target=lambda: out.update(doc=run_workload(plan, d, w, tmp_path / "run")))
    runner.start()
    try:
        gpu = plan.node("srv1-gpu0")

        def received() -> int:
            with nsutil.netlink_socket(gpu.namespace) as sock:
                return rtnl.link_dump(sock)["leaf1"]["rx_bytes"]
        start, deadline = received(), time.monotonic() + 60
        while received() - start < 4_000_000:     # the message is on its way (a sixth of it arrived)
            assert time.monotonic() < deadline and runner.is_alive(), "the message never started"
            time.sleep(0.02)
        sender, receiver = _agents_of(plan.node("srv2-gpu0")), _agents_of(gpu)
        _signal_all(sender, signal.SIGSTOP)
        last, still = received(), time.monotonic()
        while time.monotonic() - still < 0.3 and time.monotonic() < deadline:   # what was on its way has arrived
            time.sleep(0.05)
            now = received()
            if now != last:
                last, still = now, time.monotonic()
        _signal_all(receiver, signal.SIGSTOP)
        seen = {"sender": _stopped(sender), "receiver": _stopped(receiver)}
        time.sleep(frozen)
        _signal_all(receiver, signal.SIGCONT)
        time.sleep(0.6)
        _signal_all(sender, signal.SIGCONT)
    finally:
        for pid in nsutil.pids_in({nsutil.inode(plan.node(n).namespace) for n in ("srv1-gpu0", "srv2-gpu0")}):
            os.kill(pid, signal.SIGCONT)
        runner.join(timeout=120)
    (r,) = out["doc"]["results"]
    _, quiet = time_outs(None, r["ideal_s"], quiet_floor(plan))
    assert frozen + 0.6 > quiet + RECEIVER_GRACE_S, (frozen, quiet)   # the premise: silence, as the receiver sees it
    assert all(state == "T" for who in seen.values() for _, state in who.values()), seen
    ranks = {k: {x: v[x] for x in ("end_s", "gave_up_s", "missing")} for k, v in r["per_rank"].items()}
    assert not r["timed_out"] and r["wrong"] == 0, (ranks, seen, frozen)
    assert r["time_s"] > frozen + 1.1, r          # the stall is in its time, not hidden


NFT_MARK_CE = """table ip labctl_test {
  chain forward {
    type filter hook forward priority 0; policy accept;
    udp dport 4791 ip dscp 26 ip ecn set ce
  }
}
"""


def test_receivers_send_cnps_when_the_fabric_marks_ce(lab, tmp_path):
    plan, d = lab
    # leaf2 marks every RoCE packet to the receiver CE: its IP stack by an nftables rule in the
    # forward hook, its fast-path program (which the forward hook never sees) by a marking slot
    # set to always, as the controller sets it for a queue past Kmax
    leaf2 = plan.node("leaf2")
    port = next(i.index for i in leaf2.interfaces if i.peer_node == "srv2-gpu1")
    ns = leaf2.namespace
    with nsutil.netlink_socket(ns) as sock:
        marking = fastmaps.open_marking(sock, leaf2, writable=True)
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=NFT_MARK_CE, text=True, check=True)
    try:
        if marking is not None:
            marking.set(port, 3, 65536)
        w = workload(tmp_path, "name: cnp\ncollective: sendrecv\nsizes: [4MB]\n"
                               "participants: [srv1-gpu0, srv2-gpu1]\noptions: {cnp: true, cnp_interval: 50us}\n")
        doc = run_workload(plan, d, w, tmp_path / "run")
    finally:
        subprocess.run(["ip", "netns", "exec", ns, "nft", "delete", "table", "ip", "labctl_test"], check=True)
        if marking is not None:
            marking.set(port, 3, 0)
            marking.close()
    rx = rx_totals(doc)
    assert rx["ce"] == rx["packets"] > 900   # every data packet crossed leaf2, marked CE
    received = sum(q["cnp_received"] for c in doc["counters"].values() for q in c["tx"])
    assert rx["cnp_sent"] > 0 and received == rx["cnp_sent"]
    # at most one CNP per 50 us x dilation (200 ms in the lab) per QP
    duration = doc["results"][0]["time_s"]
    assert rx["cnp_sent"] <= duration / (50e-6 * plan.dilation) + 2


def test_fsdp_step_sends_3_n_minus_1_over_n_model_bytes(lab, tmp_path):
    plan, d = lab
    w = workload(tmp_path, "name: f\nfsdp: {layers: 2, hidden: 256, scale: 1.0, prefetch: true}\nparticipants: all\n")
    doc = run_workload(plan, d, w, tmp_path / "run")
    f = doc["fsdp"]
    assert all(r["wrong"] == 0 for r in doc["results"])
    for sent in f["bytes_per_rank"].values():
        assert sent == pytest.approx(f["expected_full_shard_bytes_per_rank"], rel=0.01)
    stages = [r["label"] for r in doc["results"]]
    assert stages[0].startswith("forward all_gather layer 0") and "reduce_scatter layer 1" in stages[2]


def test_reliable_mode_turns_incast_loss_into_retransmissions(lab, tmp_path):
    """Go-back-N: the same overflowing incast completes with every byte, and the loss shows as
    NAKs and retransmissions instead."""
    plan, d = lab
    before = _qdisc_drops(plan)
    w = workload(tmp_path, "name: rel\ncollective: incast\nsizes: [4MB]\nparticipants: all\nroot: srv1-gpu0\n"
                           "options: {reliable: true, timeout: 60s}\n")
    doc = run_workload(plan, d, w, tmp_path / "run")
    (r,) = doc["results"]
    assert _qdisc_drops(plan) - before > 0, "the fabric dropped"
    assert r["wrong"] == 0 and not r["timed_out"]
    assert sum(x[2] for x in r["per_rank"][str(doc["ranks"][0])]["recvs"]) == 7 * 4 * MB
    tx = [q for c in doc["counters"].values() for q in c["tx"]]
    rx = rx_totals(doc)
    assert sum(q["retransmitted"] for q in tx) > 0 and sum(q["naks"] for q in tx) > 0
    assert rx["gaps"] == 0  # go-back-N never accepts past a hole


def test_packets_lost_waiting_for_arp_are_in_the_ledger(lab, tmp_path):
    """labctl writes every neighbour in at build time; take one out and make its ARP go unanswered
    for a while, and the packets the kernel drops while resolving are counted and explain the gaps."""
    import threading
    from labctl.kernel import neighbours, netconf
    from labctl.telemetry import ledger
    plan, d = lab
    leaf2, gpu = plan.node("leaf2"), plan.node("srv2-gpu1")
    gpu_addr = gpu.iface("leaf2").address.split("/")[0]
    ignore = f"net.ipv4.conf.{gpu.iface('leaf2').name}.arp_ignore"
    w = workload(tmp_path, "name: arp\ncollective: sendrecv\nsizes: [4MB]\n"
                           "participants: [srv1-gpu0, srv2-gpu1]\noptions: {timeout: 5s}\n")
    # the message's dropped packets are waited for until the timeout: 5 s outlasts the ARP probe
    # that resolves the entry once it is answered again (about 1 s), and the rest arriving after it
    key = ("neighbour", "", "", "unresolved discards")
    before = ledger.machine_wide()[key]
    subprocess.run(["ip", "netns", "exec", gpu.namespace, "sysctl", "-qw", f"{ignore}=8"], check=True)
    subprocess.run(["ip", "netns", "exec", leaf2.namespace, "ip", "neigh", "del", gpu_addr, "dev", "srv2-gpu1"],
                   check=True)
    done: dict = {}

    def run() -> None:
        try:
            done["doc"] = run_workload(plan, d, w, tmp_path / "run")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            done["error"] = exc

    runner = threading.Thread(target=run)
    try:
        runner.start()
        deadline = time.monotonic() + 20
        while ledger.machine_wide()[key] - before < 100 and time.monotonic() < deadline and runner.is_alive():
            time.sleep(0.01)
        if ledger.machine_wide()[key] - before < 100:
            neigh = subprocess.run(["ip", "netns", "exec", leaf2.namespace, "ip", "-s", "neigh", "show", gpu_addr],
                                   capture_output=True, text=True).stdout
            pytest.fail(f"nothing waited for ARP: {ledger.machine_wide()[key] - before} discards; "
                        f"leaf2's entry: {neigh.strip()!r}; /proc/net/stat/arp_cache: "
                        f"{Path('/proc/net/stat/arp_cache').read_text()!r}; run: {done}")
    finally:
        # answer ARP again (the next probe resolves it), then put the permanent entry back
        subprocess.run(["ip", "netns", "exec", gpu.namespace, "sysctl", "-qw", f"{ignore}=0"], check=True)
        runner.join(timeout=60)
        netconf.commit_in(leaf2.namespace, neighbours.of_node(plan, "leaf2"))
    assert "doc" in done, done
    doc = done["doc"]
    led = doc["loss_ledger"]
    arp = sum(p["count"] for p in led["places"] if p["place"] == "neighbour")
    rx = rx_totals(doc)
    assert rx["gaps"] >= 100 and arp >= rx["gaps"], (rx, led)
    assert led["unexplained_gaps"] == 0 and doc["results"][0]["wrong"] > 0, led
    out = subprocess.run(["ip", "netns", "exec", leaf2.namespace, "ip", "neigh", "show", gpu_addr],
                         capture_output=True, text=True, check=True).stdout
    assert "PERMANENT" in out, out


def test_packets_a_router_drops_for_want_of_a_route_are_in_the_ledger(lab, tmp_path):
    """A routing daemon that withdrew a prefix leaves its router without a route: the packets it
    then drops are counted in IpExt InNoRoutes (/proc/net/netstat), not in /proc/net/snmp, and a
    message that never arrives leaves the receiver no PSN gap to see. The ledger must name them."""
    plan, d = lab
    leaf2 = plan.node("leaf2")
    dst = plan.node("srv1-gpu0").iface("leaf1").address.split("/")[0]
    (route,) = [r for r in leaf2.routes if ipaddress.ip_address(dst) in ipaddress.ip_network(r.dst)]
    w = workload(tmp_path, "name: noroute\ncollective: sendrecv\nsizes: [1MB]\n"
                           "participants: [srv2-gpu1, srv1-gpu0]\noptions: {timeout: 2s}\n")
    subprocess.run(["ip", "-n", leaf2.namespace, "route", "del", route.dst], check=True)
    try:
        doc = run_workload(plan, d, w, tmp_path / "run")
    finally:
        hops = [x for h in route.nexthops for x in ("nexthop", "via", h.via, "dev", h.dev, "weight", str(h.weight))]
        subprocess.run(["ip", "-n", leaf2.namespace, "route", "replace", route.dst, *hops], check=True)
    sent = tx_packets(doc)
    led = doc["loss_ledger"]
    no_route = sum(p["count"] for p in led["places"] if p["what"] == "InNoRoutes" and p["node"] == "leaf2")
    assert sent >= 240 and rx_totals(doc)["packets"] == 0 and doc["results"][0]["wrong"] > 0
    assert no_route >= sent, led                 # every one of them, at the router that dropped it
    assert "nothing lost" not in ledger_summary(led)


def test_every_port_knows_its_neighbours_from_the_start(lab):
    """A permanent ARP entry for every addressed port's peer, with the MAC the peer really has."""
    plan, _ = lab
    for node in plan.nodes:
        out = subprocess.run(["ip", "netns", "exec", node.namespace, "ip", "-j", "neigh", "show"],
                             capture_output=True, text=True, check=True).stdout
        have = {(e["dst"], e["dev"]): (e.get("lladdr"), e.get("state")) for e in json.loads(out)}
        for i in node.interfaces:
            if i.address and i.peer_address:
                peer_mac = plan.node(i.peer_node).iface(i.peer_iface).mac
                assert have.get((i.peer_address, i.name)) == (peer_mac, ["PERMANENT"]), (node.name, i.name, have)
