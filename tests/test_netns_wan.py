"""The scale-across WAN on real namespaces: delay, rate, buffer vs BDP, ESP, HSDP, distance."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import host_cpu, require_root
from labctl import lifecycle as labmod
from labctl import state
from labctl.traffic import fsdp, schedule as sch
from labctl.traffic.run import run_workload
from labctl.traffic.tcpflow import FlowRun, Sequence, Target
from labctl.traffic.workload import load_workload
from labctl.lifecycle.capture import Capture
from labctl.wan.keys import tshark_options

ROOT = Path(__file__).resolve().parents[1]
WAN = ROOT / "tests" / "topologies" / "wan.yml"
SCALE_ACROSS = ROOT / "topologies" / "scale-across.yml"
pytestmark = pytest.mark.netns


def one_flow(plan, size: int, congestion: str = "cubic") -> dict:
    """One TCP flow h1 -> h2 across the WAN; its goodput after the first 3 s (past slow start)."""
    h1, h2 = plan.node("h1"), plan.node("h2")
    target = Target("h2", h2.namespace, h2.interfaces[0].address.split("/")[0])
    run = FlowRun([Sequence("bulk", "h1", h1.namespace, [target], size, congestion=congestion)]).start()
    run.wait(timeout=120)
    (t,) = run.close()
    marks = t["received_at"]
    start = next(m for m in marks if m[0] >= t["start_s"] + 3)
    t["steady_bps"] = (marks[-1][1] - start[1]) * 8 / (marks[-1][0] - start[0])
    return t


def wan_counters(plan) -> list[dict]:
    time.sleep(0.5)  # the line rewrites wan.json every 0.2 s
    return json.loads((state.lab_dir(plan.lab).path / "wan.json").read_text())["directions"]


def test_wan_round_trip_rate_and_buffer_against_the_bandwidth_delay_product(built_lab, lab_name, tmp_path):
    """10 km at dilation 1000: 49 ms one way, so ping sees 98 ms (within 10%). One CUBIC flow fills
    the 100 Mbit/s WAN within 5% with the default buffer (4 MiB, over the 1.2 MB BDP here); with a
    buffer of 0.12 BDP it cannot (measured 57 Mbit/s)."""
    require_root()
    plan = built_lab(WAN)
    wan = next(lk for lk in plan.links if lk.wire)
    assert wan.lab_delay_ns == 49_000_000 and wan.lab_rate_bps == 100_000_000
    h2 = plan.node("h2").interfaces[0].address.split("/")[0]
    out = subprocess.run(["ip", "netns", "exec", plan.node("h1").namespace, "ping", "-c", "5", "-i", "0.2", "-q", h2],
                         capture_output=True, text=True, check=True).stdout
    avg_ms = float(out.strip().splitlines()[-1].split("=")[1].split("/")[1])
    assert avg_ms == pytest.approx(98, rel=0.10), out
    # One loss at 98 ms RTT costs CUBIC seconds of recovery, and a host that stalls for a moment makes
    # one (CI measured 84 Mbit/s once): the fastest of up to three flows is what the WAN allows, and a
    # shaper or buffer that was wrong would fail all three. A flow during which the hypervisor stole
    # over 5% of the machine does not count against the three (ci86: 16 s of 50 CPU-seconds stolen,
    # all three flows at 78-94 Mbit/s, then 3 of 3 at 100 right after): up to six flows in all
    attempts = []
    while len(attempts) < 6 and sum(not t["stolen_share"] > 0.05 for t in attempts) < 3:
        before = host_cpu()
        deep = one_flow(plan, 100_000_000)
        busy, idle, steal = (b - a for a, b in zip(before, host_cpu()))
        deep["stolen_share"] = steal / max(busy + idle + steal, 1e-9)
        assert deep["received"] == 100_000_000, deep
        attempts.append(deep)
        if deep["steady_bps"] == pytest.approx(100e6, rel=0.05):
            break
    seen = [(round(t["steady_bps"] / 1e6, 1), t["retransmits"], f"{t['stolen_share']:.0%} stolen") for t in attempts]
    best = max(attempts, key=lambda t: t["steady_bps"])     # a stolen machine only ever slows a flow
    assert best["steady_bps"] == pytest.approx(100e6, rel=0.05), f"Mbit/s, retransmits, machine stolen: {seen}"
    assert all(t["steady_bps"] < 1.05 * 100e6 for t in attempts), seen   # no attempt beats the shaper
    labmod.down(lab_name)
    small = tmp_path / "wan.yml"
    small.write_text(WAN.read_text().replace("distance: 10}", "distance: 10, buffer: 150KB}"))
    plan = built_lab(small)
    shallow = one_flow(plan, 40_000_000)
    assert shallow["steady_bps"] < 0.8 * 100e6 and shallow["retransmits"] > 0, shallow
    lost = sum(d["overflow"] + d["lost"] for d in wan_counters(plan))
    assert lost == 0   # the losses are the DCI router's queue, not the line


def test_encrypted_wan_carries_only_esp_that_tshark_decrypts_to_roce(built_lab, lab_name, tmp_path):
    """encrypt=true: the fibre between the DCI routers carries only ESP; tshark with the lab's esp_sa
    decrypts every frame to RRoCE. The cost of ESP is measured against the same run unencrypted."""
    require_root()
    wf = tmp_path / "x.yml"
    wf.write_text("name: x\ncollective: sendrecv\nsizes: [8MB]\nparticipants: [z1-srv1-gpu0, z2-srv1-gpu0]\n")
    times = {}
    for encrypt in (False, True):
        plan = built_lab(SCALE_ACROSS, [f"encrypt={str(encrypt).lower()}", "distance=1"])
        wan = next(lk for lk in plan.links if lk.wire)
        pcap = tmp_path / f"fibre-{encrypt}.pcapng"
        cap = Capture(plan, f"wire{wan.id}.a:fibre", pcap, snaplen=0)   # whole frames: ESP needs them to decrypt
        try:
            doc = run_workload(plan, state.lab_dir(plan.lab), load_workload(wf), tmp_path / f"run-{encrypt}")
        finally:
            cap.stop()
        assert doc["results"][0]["wrong"] == 0
        # a shared host that loses its CPUs for a moment only ever slows a run: the fastest of three
        # is what the lab can do, and each run must still deliver every byte
        runs = [doc] + [run_workload(plan, state.lab_dir(plan.lab), load_workload(wf), tmp_path / f"run-{encrypt}-{i}")
                        for i in (1, 2)]
        assert all(d["results"][0]["wrong"] == 0 for d in runs)
        times[encrypt] = min(d["results"][0]["time_s"] for d in runs)
        if encrypt:
            lab_path = state.lab_dir(plan.lab).path
            protos = subprocess.run(["tshark", "-r", str(pcap), "-T", "fields", "-e", "frame.protocols"],
                                    capture_output=True, text=True, check=True).stdout.split()
            assert len(protos) > 1000 and all(p == "eth:ethertype:ip:esp" for p in protos), set(protos)
            opened = subprocess.run(["tshark", "-r", str(pcap), *tshark_options(lab_path), "-T", "fields",
                                     "-e", "frame.protocols", "-e", "infiniband.bth.opcode"],
                                    capture_output=True, text=True, check=True).stdout.splitlines()
            assert all("esp:ip:udp:infiniband" in line for line in opened), opened[:3]
            opcodes = {line.split("\t")[1] for line in opened}
            assert "7" in opcodes and opcodes <= {"6", "7", "8", "9", "10", "11", "17"}, opcodes  # WRITEs, ACKs
        labmod.down(lab_name)
    overhead = times[True] / times[False] - 1
    print(f"ESP overhead: {overhead:+.1%} ({times[False]:.2f} s -> {times[True]:.2f} s for 8 MB, best of 3)")
    # ESP adds ~62 B to a 9 KB frame (0.7%) and the line encrypts faster than the link: the README
    # measured +0.1%; 10% either way leaves room for a shared 2-core machine's noise (one CI run of
    # one sample each measured +32%, which the best of three absorbs)
    assert abs(overhead) < 0.1, times


def test_hsdp_sends_only_the_replica_all_reduce_across_the_wan(built_lab, tmp_path):
    """HYBRID_SHARD grouped by zone on two 4-GPU zones: all-gathers and reduce-scatters stay in a
    building; the line carries the replica all-reduce alone, its bytes within 5% of the schedule's."""
    require_root()
    plan = built_lab(SCALE_ACROSS, ["distance=1"])
    wf = tmp_path / "hsdp.yml"
    wf.write_text("name: hsdp\nfsdp: {layers: 4, hidden: 256, strategy: HYBRID_SHARD, group_by: zone, scale: 1.0}\n")
    before = sum(d["delivered_bytes"] for d in wan_counters(plan))
    doc = run_workload(plan, state.lab_dir(plan.lab), load_workload(wf), tmp_path / "run")
    crossed = sum(d["delivered_bytes"] for d in wan_counters(plan)) - before
    ranks = sorted(doc["nodes"], key=int)
    zone = {int(r): plan.node(doc["nodes"][r]).zone for r in ranks}
    model = fsdp.model_from(None, 4, 256, None, "bf16")
    order = sorted(map(int, ranks), key=lambda r: (zone[r], r))
    replica = 0
    for stage in fsdp.fsdp_step(model, order, "HYBRID_SHARD", 4):
        for c in stage:
            for group in c.groups:
                s = sch.GENERATORS[c.collective](list(group), c.size, 512 * 1024, 1)
                crossing = sum(t.nbytes for t in s.transfers if zone[t.src] != zone[t.dst])
                if "replica" in c.label:
                    assert crossing == sum(t.nbytes for t in s.transfers)
                    replica += crossing
                else:
                    assert crossing == 0, c.label
    assert replica > 0 and all(r["wrong"] == 0 for r in doc["results"])
    assert crossed == pytest.approx(replica * (1 + 62 / 4096), rel=0.05), (crossed, replica)
    # the report judges it by HSDP's own formula with the groups group_by: made (4 a zone, 2
    # replicas), not by g = n (it once read 0.978 of a formula for one group of all 8)
    f = doc["fsdp"]
    assert f["expected_formula"].endswith("g=4 r=2"), f["expected_formula"]
    sent = sum(f["bytes_per_rank"].values()) / len(f["bytes_per_rank"])
    assert sent == pytest.approx((3 * 3 / 4 + 2 * 1 / 2 / 4) * f["model_bytes_scaled"], rel=0.01), f


def test_an_all_reduce_across_zones_slows_as_the_wan_gets_longer(built_lab, lab_name, tmp_path):
    require_root()
    wf = tmp_path / "ar.yml"
    wf.write_text("name: ar\ncollective: all_reduce\nsizes: [4MB]\n")
    times = {}
    for km in (1, 10, 25):
        plan = built_lab(SCALE_ACROSS, [f"distance={km}"])
        doc = run_workload(plan, state.lab_dir(plan.lab), load_workload(wf), tmp_path / f"run{km}",
                           trace=labmod.trace_path)
        times[km] = doc["results"][0]["time_s"]
        # one spine per zone, 800G leaf-spine links under 400G NICs: no switch chose a path, so no
        # ring hop shares a link by ECMP's draw, and the run says none did
        placed = doc["ring_placement"]
        assert placed["hops"] and placed["note"] is None, placed
        labmod.down(lab_name)
    one_way = {km: km * 4.9e-6 * 4000 for km in times}
    print(f"all-reduce 4 MB across two zones: {times} s lab")
    # the ring crosses the WAN twice per step: each extra km adds at least a few one-way delays
    assert times[1] < times[10] < times[25], times
    assert times[25] - times[1] > 2 * (one_way[25] - one_way[1]), (times, one_way)


def test_the_line_loses_and_jitters_as_told_but_never_reorders(built_lab, tmp_path):
    """loss 0.1 and jitter 20 us (x1000 = 20 ms): 1000 numbered datagrams h1 -> h2; about 10% missing,
    exactly the ones the line counts as lost, and the rest in sending order."""
    import socket
    from netutil import udp_socket_in
    require_root()
    lossy = tmp_path / "wan.yml"
    lossy.write_text(WAN.read_text().replace("distance: 10}", "distance: 10, loss: 0.1, jitter: 20us}"))
    plan = built_lab(lossy)
    h2 = plan.node("h2")
    addr = h2.interfaces[0].address.split("/")[0]
    rx = udp_socket_in(h2.namespace)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)   # read after sending: hold them all
    rx.bind((addr, 9000))
    rx.settimeout(1.0)
    tx = udp_socket_in(plan.node("h1").namespace)
    for k in range(1000):
        tx.sendto(k.to_bytes(4, "big") + bytes(200), (addr, 9000))
        time.sleep(0.0005)
    got = []
    try:
        while True:
            got.append(int.from_bytes(rx.recv(2048)[:4], "big"))
    except socket.timeout:
        pass
    lost = sum(d["lost"] for d in wan_counters(plan) if d["name"].startswith("dci1"))
    assert got == sorted(got), "reordered"
    assert 1000 - len(got) == lost and 0.06 < lost / 1000 < 0.14, (len(got), lost)


def _line_pid(lab_path: Path) -> int:
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"labctl.wan.line" in argv and str(lab_path).encode() in argv:
            return int(proc.name)
    raise AssertionError(f"no WAN line runs for {lab_path}")


def test_the_line_holds_what_arrives_while_it_waits_for_a_cpu(built_lab, tmp_path):
    """The line is a process and a busy VM can stop it for tens of ms (CI saw 46 ms). A fibre does not
    drop while nobody reads it: stopped for 400 ms in the middle of an 8 MB send (at 100 Mbit/s, 5 MB
    reach its sockets meanwhile), the line loses nothing, lets the frames out at the link's rate (as
    one burst they overran the far router's lossless queue) and the send completes."""
    require_root()
    import os
    import signal
    import threading
    plan = built_lab(SCALE_ACROSS, ["distance=1"])
    lab = state.lab_dir(plan.lab)
    pid = _line_pid(lab.path)
    wf = tmp_path / "x.yml"
    wf.write_text("name: x\ncollective: sendrecv\nsizes: [8MB]\nparticipants: [z1-srv1-gpu0, z2-srv1-gpu0]\n")
    before = {d["name"]: d for d in wan_counters(plan)}

    wan_json = lab.path / "wan.json"
    sent_before = sum(d["bytes"] for d in before.values())

    def stall():
        # once the send is under way (the agents may take over a second to start on a busy machine:
        # a fixed 0.5 s once stopped the line before any data came)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            moved = sum(d["bytes"] for d in json.loads(wan_json.read_text())["directions"]) - sent_before
            if moved > 200_000:
                break
            time.sleep(0.01)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.4)
        os.kill(pid, signal.SIGCONT)
    staller = threading.Thread(target=stall)
    staller.start()
    try:
        doc = run_workload(plan, lab, load_workload(wf), tmp_path / "run")
    finally:
        staller.join()
        os.kill(pid, signal.SIGCONT)
    after = wan_counters(plan)
    crossed = sum(d["frames"] - before[d["name"]]["frames"] for d in after)
    assert crossed > 1000, after             # 8 MB in ~9 KB frames, plus ACKs
    # the stall met traffic: frames left up to the 400 ms late (within 100 ms of it)
    assert max(d["max_lag_us"] for d in after) > 300_000, after
    for d in after:
        for field in ("socket_drops", "overflow", "lost"):
            assert d[field] == before[d["name"]][field], (field, d)
    assert doc["results"][0]["wrong"] == 0 and doc["loss_ledger"]["total"] == 0, doc["loss_ledger"]


RATE_LAB = """name: {name}
dilation: 1
nodes:
  h1: {{kind: host}}
  h2: {{kind: host}}
links:
  - {{endpoints: [h1, h2], rate: 10M, latency: 1ms}}
"""
UDP_BLAST = """import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
t0, sent = time.monotonic(), 0
while time.monotonic() < t0 + 2.0:
    s.sendto(bytes(1400), ("{dst}", 9))
    sent += 1
    time.sleep(max(0.0, sent * 1400 * 8 / 30e6 - (time.monotonic() - t0)))
"""


def test_tc_set_rate_on_a_port_that_feeds_the_line_is_the_line_s_rate_too(state_dir, lab_name, tmp_path):
    """The line paced each direction at the rate `up` gave: a port set from 10 to 40 Mbit/s still
    delivered 9.9 across a delayed link. 30 Mbit/s for 2 s must arrive at about 30 once it is 40."""
    require_root()
    f = tmp_path / "lab.yml"
    f.write_text(RATE_LAB.format(name=lab_name))
    plan, lab, _ = labmod.up(str(f), name=lab_name)
    try:
        labmod.tc_set(lab, plan, plan.node("h1"), "h2", rate="40M")
        time.sleep(0.5)                              # the line looks at the record every 0.2 s
        h2 = plan.node("h2")

        def received() -> int:
            out = json.loads(subprocess.run(["ip", "-n", h2.namespace, "-s", "-j", "link", "show", "h1"],
                                            capture_output=True, text=True, check=True).stdout)
            return out[0]["stats64"]["rx"]["bytes"]
        before = received()
        subprocess.run(["ip", "netns", "exec", plan.node("h1").namespace, "python3", "-c",
                        UDP_BLAST.format(dst=h2.interfaces[0].address.split("/")[0])], check=True, timeout=30)
        time.sleep(0.1)
        got = received() - before
        assert got * 8 / 2.1 > 22e6, f"{got * 8 / 2.1 / 1e6:.1f} Mbit/s arrived"
    finally:
        labmod.down(lab_name)
