"""Runtime control on a real lab: link failure and repair, rate changes, per-class counters."""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import require_root
from labctl import lifecycle as labmod
from labctl import state
from netutil import wait_for
from test_netns_shaping import measure_rate

ROOT = Path(__file__).resolve().parents[1]
LEAF_SPINE = ROOT / "topologies" / "leaf-spine.yml"
pytestmark = pytest.mark.netns


def spines_used(plan, src: str, dst: str) -> set[str]:
    return {labmod.trace_path(plan, src, dst, sport, 4791)[2]["node"] for sport in range(49152, 49152 + 16)}


def test_link_down_reconverges_and_link_up_restores(built_lab, lab_name):
    require_root()
    plan = built_lab(LEAF_SPINE)
    lab = state.lab_dir(lab_name)
    assert spines_used(plan, "srv2-gpu1", "srv1-gpu0") == {"spine1", "spine2"}
    changed = labmod.set_link_state(lab, plan, plan.node("leaf1"), "spine1", up=False)
    assert changed > 0 and lab.read_state()["links_down"] == [plan.node("leaf1").iface("spine1").link]
    assert spines_used(plan, "srv2-gpu1", "srv1-gpu0") == {"spine2"}   # remote leaves route around it
    tried, failed = labmod.pingall(plan, "backend")
    assert (tried, failed) == (56, [])
    labmod.set_link_state(lab, plan, plan.node("leaf1"), "spine1", up=True)
    assert spines_used(plan, "srv2-gpu1", "srv1-gpu0") == {"spine1", "spine2"}
    # going down flushed both ends' permanent neighbours; coming up wrote them back (no ARP needed)
    for n, port in (("leaf1", "spine1"), ("spine1", "leaf1")):
        node = plan.node(n)
        out = subprocess.run(["ip", "-n", node.namespace, "neigh", "show", "dev", port],
                             capture_output=True, text=True, check=True).stdout
        assert f"{node.iface(port).peer_address} lladdr" in out and "PERMANENT" in out, (n, out)
    assert labmod.pingall(plan) == (80, [])
    # the controller's PFC socket on the port that went down said ENETDOWN once: it must live on
    time.sleep(0.5)
    controller = next(h for h in labmod.helpers(lab) if h["helper"] == "controller")
    assert controller["running"], controller


def test_tc_set_rate_changes_the_measured_throughput_and_the_lab_s_record(built_lab, lab_name):
    """As `labctl tc set h1:r1 --rate 50M`: the port passes the new rate, and the lab's record says
    so, so that a later run's bound and time-outs are the port's (netconf sets the kernel alone)."""
    require_root()
    plan = built_lab(ROOT / "tests" / "topologies" / "chain.yml", sets=["defaults.rate=100M", "dilation=1"])
    lab = state.lab_dir(lab_name)
    h1 = plan.node("h1")
    labmod.tc_set(lab, plan, h1, "r1", rate="50M")
    assert measure_rate(plan) == pytest.approx(50e6, rel=0.05)
    recorded = labmod.load_plan(lab).node("h1").iface("r1").shaping
    assert recorded.rate_bps == h1.iface("r1").shaping.rate_bps == 50_000_000
    assert recorded.burst_bytes == 2 * recorded.quantum     # 1 ms of 50 Mbit/s is less than two frames
    labmod.tc_set(lab, plan, h1, "r1", rate="100M")
    assert measure_rate(plan) == pytest.approx(100e6, rel=0.05)
    assert labmod.load_plan(lab).node("h1").iface("r1").shaping.rate_bps == 100_000_000


def test_counters_show_each_class_traffic(built_lab, lab_name, state_dir):
    require_root()
    plan = built_lab(LEAF_SPINE)
    src, dst = plan.node("srv1-gpu1"), plan.node("srv1-gpu0")   # leaf2 -> spine -> leaf1 -> gpu0
    addr = dst.iface("leaf1").address.split("/")[0]

    def leaf1_class(cls: str) -> int:
        r = subprocess.run([sys.executable, "-m", "labctl", "counters", lab_name, "--json"], capture_output=True,
                           text=True, env={**os.environ, "LABCTL_STATE_DIR": str(state_dir)}, check=True)
        return sum(x["sent_packets"] for x in json.loads(r.stdout)
                   if x["node"] == "leaf1" and x["port"] == "srv1-gpu0" and x["class"] == cls)

    before = {c: leaf1_class(c) for c in ("roce", "cnp", "default")}
    from netutil import udp_socket_in
    for tos, count in ((26 << 2, 300), (48 << 2, 40), (0, 120)):
        s = udp_socket_in(src.namespace)
        s.setsockopt(0, 1, tos)  # IP_TOS
        for _ in range(count):
            s.sendto(b"x" * 500, (addr, 9))
        s.close()
    want = {"roce": 300, "cnp": 40, "default": 120}
    assert wait_for(lambda: all(leaf1_class(c) - before[c] >= n for c, n in want.items()), timeout=5)
    got = {c: leaf1_class(c) - before[c] for c in want}
    for c, n in want.items():
        assert n <= got[c] <= n + 3, got  # + a few ARP replies in the default class


def labctl_cli(state_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labctl", *args], capture_output=True, text=True,
                          env={**os.environ, "LABCTL_STATE_DIR": str(state_dir)})


def test_tc_set_turns_pfc_off_and_on_at_runtime_and_the_queue_series_shows_it(built_lab, lab_name, state_dir,
                                                                                tmp_path):
    """The same 7:1 incast: lossless with PFC on (pauses in queues.csv), lossy after
    `tc set --pfc off` on every switch (drops in queues.csv, at least the receivers' PSN gaps: a
    message's lost tail leaves no gap behind it), lossless
    again after `--pfc on`. Marks in queues.csv are the leaf's own nft counter of CE marks."""
    import csv
    from test_netns_pfc import FABRIC_ONLY, incast
    require_root()
    plan = built_lab(LEAF_SPINE, sets=FABRIC_ONLY)
    switches = [n.name for n in plan.nodes if n.forwarding]

    def run(tag: str) -> tuple[int, dict]:
        # without PFC a message whose last packet was dropped never arrives: its receiver waits out
        # the run's timeout, which only has to outlast the incast's 1.3 s
        doc = incast(plan, tmp_path / tag, ", cnp: true", timeout="5s" if tag == "off" else "15s")
        gaps = sum(q["gaps"] for c in doc["counters"].values() for q in c["rx"])
        first: dict = {}
        last: dict = {}
        with open(tmp_path / tag / "run" / "queues.csv") as f:
            for row in csv.DictReader(f):
                first.setdefault((row["node"], row["port"], row["class"]), row)
                last[(row["node"], row["port"], row["class"])] = row
        roce = [k for k in last if k[2] == "roce"]   # counters are cumulative: what this run added
        return gaps, {c: sum(float(last[k][c]) - float(first[k][c]) for k in roce)
                      for c in ("drops", "ecn_marked", "pfc_tx", "pfc_rx")}

    from labctl import state
    from labctl.dataplane import control
    lab_path = state.lab_dir(lab_name).path
    for tag, setting in (("on", None), ("off", "off"), ("again", "on")):
        if setting:                     # every switch in one command, as a user turns a fabric's PFC off
            generation = control.load(lab_path)["generation"]
            r = labctl_cli(state_dir, "tc", "set", *switches, "--pfc", setting, "--lab", lab_name)
            assert r.returncode == 0, r.stdout + r.stderr
            # the switches' settings reach the controller as one change, taken whole
            assert control.load(lab_path)["generation"] == generation + 1
            assert sorted(re.findall(r"applied pfc=\w+ to \d+ port class\(es\) on (\S+)", r.stdout)) == sorted(switches)
        (tmp_path / tag).mkdir()
        gaps, series = run(tag)
        if tag == "off":
            assert 0 < gaps <= series["drops"] and series["pfc_tx"] == 0, (gaps, series)
        else:
            assert gaps == 0 and series["drops"] == 0 and series["pfc_tx"] > 0, (tag, gaps, series)
            assert series["pfc_rx"] == series["pfc_tx"], (tag, series)   # every pause seen at the other end
        assert series["ecn_marked"] > 0, (tag, series)
    shown = json.loads(labctl_cli(state_dir, "tc", "show", "leaf1", "--json", "--lab", lab_name).stdout)
    assert all(q["pfc"] for q in shown["queues"] if q["lossless"])


def test_tc_set_ecn_thresholds_change_the_marking_and_bad_values_are_refused(built_lab, lab_name, state_dir):
    require_root()
    plan = built_lab(LEAF_SPINE)
    r = labctl_cli(state_dir, "tc", "set", "leaf1:srv1-gpu0", "--kmin", "100KB", "--kmax", "50KB", "--lab", lab_name)
    assert r.returncode != 0 and "kmin 100000 is above kmax 50000" in r.stderr, r.stderr
    r = labctl_cli(state_dir, "tc", "set", "srv1-gpu0", "--kmin", "1KB", "--lab", lab_name)
    assert r.returncode != 0 and "ECN settings apply to ECN classes on switches" in r.stderr, r.stderr
    # several targets: all are checked before any changes, so the switch before the GPU keeps its own
    r = labctl_cli(state_dir, "tc", "set", "leaf1", "srv1-gpu0", "--kmin", "1KB", "--lab", lab_name)
    assert r.returncode != 0 and "ECN settings apply to ECN classes on switches" in r.stderr, r.stderr
    shown = json.loads(labctl_cli(state_dir, "tc", "show", "leaf1", "--json", "--lab", lab_name).stdout)
    assert all(q["kmin"] != 1000 for q in shown["queues"] if q["ecn"]), shown["queues"]
    r = labctl_cli(state_dir, "tc", "set", "leaf1:srv1-gpu0", "--kmin", "100KB", "--kmax", "400KB", "--pmax", "0.5",
                   "--lab", lab_name)
    assert r.returncode == 0, r.stderr
    shown = json.loads(labctl_cli(state_dir, "tc", "show", "leaf1:srv1-gpu0", "--json", "--lab", lab_name).stdout)
    roce = next(q for q in shown["queues"] if q["class"] == "roce")
    assert (roce["kmin"], roce["kmax"], roce["pmax"]) == (100_000, 400_000, 0.5)
    # a port's new rate reaches the controller for its lossless classes, which it confirms
    from labctl.dataplane import control
    port = plan.node("leaf1").iface("spine1")
    lossless = [c.tc for c in port.shaping.classes if c.lossless]
    for rate, bps in (("50M", 50_000_000), (f"{port.shaping.rate_bps}bit", port.shaping.rate_bps)):
        r = labctl_cli(state_dir, "tc", "set", "leaf1:spine1", "--rate", rate, "--lab", lab_name)
        assert r.returncode == 0, r.stderr
        ports = control.load(state.lab_dir(lab_name).path)["ports"]
        assert lossless and {k: v["rate"] for k, v in ports.items() if "rate" in v} == \
            {f"leaf1:spine1:{tc}": bps for tc in lossless}


def test_pingall_samples_pairs_and_says_it_sampled(built_lab, lab_name, state_dir):
    require_root()
    built_lab(LEAF_SPINE)
    r = labctl_cli(state_dir, "pingall", lab_name, "--sample", "7", "--seed", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"pingall {lab_name}: 7/7 pairs reachable (a random sample, seed 3)" in r.stdout, r.stdout
    r = labctl_cli(state_dir, "pingall", lab_name, "--sample", "0")
    assert r.returncode == 2 and "--sample" in r.stderr, r.stderr
