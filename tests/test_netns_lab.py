"""The netns backend on real namespaces, veths and qdiscs: build, reach, route, tear down."""
from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

import pytest

from conftest import lab_namespaces, require_root
from labctl import lifecycle as labmod
from labctl import state
from labctl.kernel import nsutil
from netutil import ping, send_udp, wait_for

ROOT = Path(__file__).resolve().parents[1]
LEAF_SPINE = ROOT / "topologies" / "leaf-spine.yml"

pytestmark = pytest.mark.netns


def gpu_addresses(plan) -> dict[str, str]:
    return {n.name: next(i.address.split("/")[0] for i in n.interfaces if i.fabric == "backend")
            for n in plan.nodes if n.kind == "gpu"}


def test_every_gpu_pings_every_other_gpu_across_the_fabric(built_lab, lab_name):
    require_root()
    plan = built_lab(LEAF_SPINE)
    addrs = gpu_addresses(plan)
    assert len(addrs) == 8
    procs = {}
    for a, b in itertools.permutations(addrs, 2):
        procs[(a, b)] = ping(plan.node(a).namespace, addrs[b])
    failed = [(a, b) for (a, b), p in procs.items() if p.wait(timeout=10) != 0]
    assert not failed, f"{len(failed)} of {len(procs)} pings failed: {failed[:5]}"
    # pingall agrees: 56 backend pairs + 2 servers x 12 NVLink pairs
    tried, failed = labmod.pingall(plan)
    assert (tried, failed) == (56 + 24, [])


def test_status_reports_every_port_up_with_the_planned_address(built_lab, lab_name):
    require_root()
    plan = built_lab(LEAF_SPINE)
    s = labmod.status(state.lab_dir(lab_name))
    ports = [p for n in s["nodes"] for p in n["interfaces"]]
    assert len(ports) == 2 * len(plan.links)
    assert {p["state"] for p in ports} == {"up"}
    assert all(n["present"] for n in s["nodes"])
    live = subprocess.run(["ip", "-n", plan.node("leaf1").namespace, "-br", "addr", "show", "spine1"],
                          capture_output=True, text=True, check=True).stdout
    assert plan.node("leaf1").iface("spine1").address in live


def test_every_port_has_the_planned_class_tree(built_lab, lab_name):
    """HTB 1:1 at the dilated link rate; per traffic class 1:(0x10+tc) at its share with the link as
    ceil (strict classes at prio 0) over a bfifo of the class's buffer; DSCP → class on switches."""
    require_root()
    plan = built_lab(LEAF_SPINE)
    from pyroute2 import IPRoute
    for node in (plan.node("leaf1"), plan.node("srv1-gpu0")):
        with nsutil.entered(node.namespace):
            ipr = IPRoute()
        try:
            for iface in node.interfaces:
                s = iface.shaping
                classes = {c["handle"] & 0xFFFF: c.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")
                           for c in ipr.get_classes(index=iface.index) if c.get_attr("TCA_KIND") == "htb"}
                assert classes[1]["rate"] == s.rate_bps // 8
                assert len(s.classes) == 3 and set(classes) == {1} | {0x10 + c.tc for c in s.classes}
                for c in s.classes:
                    got = classes[0x10 + c.tc]
                    assert (got["rate"], got["ceil"], got["prio"]) == (c.rate_bps // 8, s.rate_bps // 8, c.prio)
                leaves = {q["handle"] >> 16: q for q in ipr.get_qdiscs() if q["index"] == iface.index}
                assert leaves[1].get_attr("TCA_KIND") == "htb"
                for c in s.classes:
                    leaf = leaves[0x20 + c.tc]
                    # lossless classes sit on a TBF, which a PFC pause can stop; the others on a bfifo
                    assert leaf.get_attr("TCA_KIND") == ("tbf" if c.lossless else "bfifo")
                    assert leaf["parent"] == 0x10010 + c.tc
        finally:
            ipr.close()
    rules = subprocess.run(["ip", "netns", "exec", plan.node("leaf1").namespace, "nft", "list", "ruleset"],
                           capture_output=True, text=True, check=True).stdout
    assert "ip dscp af31 meta priority set 1:13" in rules and "ip dscp cs6 meta priority set 1:16" in rules


def test_route_predicts_the_spine_and_real_udp_follows_it(built_lab, lab_name):
    """labctl route asks the kernel per source port; real flows then show the same split in counters."""
    require_root()
    plan = built_lab(LEAF_SPINE)
    src, dst = plan.node("srv1-gpu0"), plan.node("srv2-gpu1")
    dst_addr = gpu_addresses(plan)["srv2-gpu1"]
    sports = range(49152, 49152 + 32)
    predicted = {}
    for sport in sports:
        hops = labmod.trace_path(plan, src.name, dst.name, sport, 4791)
        assert [h["node"] for h in hops][0::4] == ["srv1-gpu0", "srv2-gpu1"]
        predicted[sport] = hops[2]["node"]  # gpu -> leaf1 -> spineN -> leaf2 -> gpu
    assert set(predicted.values()) == {"spine1", "spine2"}, "32 ports should use both spines"

    leaf1 = plan.node("leaf1")
    per_flow = 50
    before = labmod.live_links(leaf1.namespace)
    for sport in sports:
        send_udp(src.namespace, dst_addr, sport, 4791, b"x" * 1000, per_flow)
    expected = {s: per_flow * sum(1 for v in predicted.values() if v == s) for s in ("spine1", "spine2")}

    def sent_now():
        after = labmod.live_links(leaf1.namespace)
        return {s: after[s]["tx_packets"] - before[s]["tx_packets"] for s in ("spine1", "spine2")}

    # the host's 100 Mbit/s shaper is still draining the 1.6 MB just sent: wait for the counters to settle
    wait_for(lambda: all(v >= expected[k] for k, v in sent_now().items()), timeout=10)
    sent = sent_now()
    for spine in ("spine1", "spine2"):
        # a few ARP packets may cross too; the UDP counts must match the prediction exactly otherwise
        assert expected[spine] <= sent[spine] <= expected[spine] + 4, (sent, expected)


def test_down_leaves_no_namespace_process_or_record(built_lab, lab_name, state_dir):
    require_root()
    plan = built_lab(LEAF_SPINE)
    ns = plan.node("leaf1").namespace
    sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "60"])
    inode = nsutil.inode(ns)
    assert wait_for(lambda: os.stat(f"/proc/{sleeper.pid}/ns/net").st_ino == inode)  # it is inside now
    try:
        removed = labmod.down(lab_name)
        assert len(removed) == len(plan.nodes)
        assert sleeper.wait(timeout=5) is not None, "a process inside the lab survived down"
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
    assert lab_namespaces(lab_name + "-") == []
    assert not state.lab_dir(lab_name).path.exists()


def test_down_works_without_the_topology_file(built_lab, lab_name, tmp_path):
    require_root()
    copy = tmp_path / "mine.yml"
    copy.write_text(LEAF_SPINE.read_text())
    built_lab(copy)
    copy.unlink()
    labmod.down(lab_name)
    assert lab_namespaces(lab_name + "-") == []


def test_two_labs_side_by_side(built_lab, lab_name):
    require_root()
    other = lab_name + "b"
    try:
        plan_a = built_lab(LEAF_SPINE)
        plan_b = built_lab(LEAF_SPINE, name=other)
        assert plan_a.node("leaf1").namespace != plan_b.node("leaf1").namespace
        labmod.down(lab_name)
        addrs = gpu_addresses(plan_b)
        p = ping(plan_b.node("srv1-gpu0").namespace, addrs["srv2-gpu3"])
        assert p.wait(timeout=10) == 0, p.stdout.read()
        assert lab_namespaces(lab_name + "-") == []
        assert len(lab_namespaces(other + "-")) == len(plan_b.nodes)
    finally:
        if state.lab_dir(other).path.exists():
            labmod.down(other)


def test_failure_half_way_rolls_back_everything(state_dir, lab_name):
    """A route the kernel refuses (gateway not on any connected subnet), on the last node to be set up."""
    require_root()
    from labctl import backends
    from labctl.errors import LabError
    from labctl.plan.compile import compile_plan
    from labctl.plan.model import NextHop, Route
    from labctl.topology.load import load_topology
    plan = compile_plan(load_topology(LEAF_SPINE, name=lab_name))
    last = plan.nodes[-1]
    last.routes.append(Route("10.200.0.0/24", [NextHop("10.250.0.1", last.interfaces[0].name)]))
    d = state.claim(lab_name, plan.to_dict(), None)
    with pytest.raises(LabError, match="route 10.200.0.0/24"):
        backends.get("netns").apply(plan, d)
    assert lab_namespaces(lab_name + "-") == []
    assert not d.path.exists()


def test_existing_namespace_is_never_taken_over(state_dir, lab_name):
    require_root()
    from labctl.errors import LabError
    squatter = f"{lab_name}-leaf1"
    subprocess.run(["ip", "netns", "add", squatter], check=True)
    try:
        with pytest.raises(LabError, match="it exists already, and no lab labctl knows of made it"):
            labmod.up(str(LEAF_SPINE), name=lab_name)
        assert lab_namespaces(lab_name + "-") == [squatter]
    finally:
        subprocess.run(["ip", "netns", "del", squatter], check=True)


def test_up_of_a_running_lab_is_refused(built_lab, lab_name):
    require_root()
    from labctl.errors import LabError
    built_lab(LEAF_SPINE)
    with pytest.raises(LabError, match="already up"):
        labmod.up(str(LEAF_SPINE), name=lab_name)
