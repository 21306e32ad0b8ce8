"""Links between machines, without Docker: labctl's VXLAN ends, made between three machine
namespaces joined by an underlay bridge, straight into the nodes' namespaces with the planned
names, MACs, MTUs and ifindexes. A ping crosses them, and so does an 802.1Qbb pause frame, bit for
bit. The cluster test does this under Swarm; this one needs only the kernel, so the VM tier runs
it on Debian's 6.1 too, where a fixed ifindex is checked against the machine's namespace (the
sender's), not the node's."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid

import pytest

from conftest import lab_namespaces, require_root
from labctl.cluster import vxlan
from labctl.cluster.machines import Machine
from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology_text

pytestmark = pytest.mark.netns

LAB = """
name: vx
nodes:
  h1: {kind: gpu, server: s1}
  h2: {kind: gpu, server: s2}
  r1: {kind: switch, fabric: backend}
fabrics:
  backend: {kind: scale-out}
links:
  - endpoints: [h1, r1]
  - endpoints: [h2, r1]
placement:
  r1: m1
  h1: m2
  h2: m3
"""
PFC = bytes.fromhex("0180c2000001" "02aabbccddee" "8808" "0101" "0008" + "0000" * 3 + "ffff" + "0000" * 4)
PFC += bytes(60 - len(PFC))


def ip(ns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", ns, *args], check=True, capture_output=True)


@pytest.fixture
def machines():
    """Three machine namespaces on one underlay bridge, and a namespace per node."""
    require_root()
    prefix = f"ltvx{uuid.uuid4().hex[:4]}-"
    under = prefix + "ul"
    subprocess.run(["ip", "netns", "add", under], check=True)
    try:
        ip(under, "link", "add", "ul0", "type", "bridge")
        ip(under, "link", "set", "ul0", "up")
        found = {}
        for k, name in enumerate(("m1", "m2", "m3"), start=1):
            ns = prefix + name
            subprocess.run(["ip", "netns", "add", ns], check=True)
            ip(under, "link", "add", name, "mtu", "9100", "type", "veth", "peer", "name", "eth0", "mtu", "9100",
               "netns", ns)
            ip(under, "link", "set", name, "master", "ul0", "up")
            ip(ns, "addr", "add", f"192.168.77.{k}/24", "dev", "eth0")
            ip(ns, "link", "set", "eth0", "up")
            found[name] = Machine(name, f"unix:///run/{ns}.sock", f"192.168.77.{k}", ns)
        nodes = {}
        for node in ("h1", "h2", "r1"):
            subprocess.run(["ip", "netns", "add", prefix + node], check=True)
            nodes[node] = prefix + node
        yield found, nodes, prefix
    finally:
        for ns in lab_namespaces(prefix):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert lab_namespaces(prefix) == []


def links(ns: str) -> dict[str, dict]:
    out = subprocess.run(["ip", "-n", ns, "-j", "-d", "link", "show"], check=True, capture_output=True, text=True)
    return {d["ifname"]: d for d in json.loads(out.stdout)}


def test_vxlan_ends_appear_in_the_nodes_as_planned_and_carry_ip_and_pause_frames(machines):
    found, nodes, prefix = machines
    plan = compile_plan(load_topology_text(LAB, "vx.yml"))
    fds = {node: os.open(f"/run/netns/{ns}", os.O_RDONLY) for node, ns in nodes.items()}
    try:
        assert vxlan.create(plan, found, fds, 10000) == 2
    finally:
        for fd in fds.values():
            os.close(fd)
    for node in ("h1", "h2", "r1"):
        seen = links(nodes[node])
        for iface in plan.node(node).interfaces:
            d = seen[iface.name]
            assert (d["ifindex"], d["address"], d["mtu"]) == (iface.index, iface.mac, iface.mtu), (node, d)
            assert iface.index >= 1 << 30
            info = d["linkinfo"]["info_data"]
            assert info["port"] == vxlan.PORT and info["id"] >= 10000
    h1, r1 = plan.node("h1"), plan.node("r1")
    a, b = h1.iface("r1"), r1.iface("h1")
    ip(nodes["h1"], "addr", "add", "10.99.0.1/30", "dev", a.name)
    ip(nodes["r1"], "addr", "add", "10.99.0.2/30", "dev", b.name)
    for node, iface in (("h1", a), ("r1", b)):
        ip(nodes[node], "link", "set", iface.name, "up")
    # an end's UDP socket (made as it comes up) lives in its machine's namespace, where the
    # underlay is, and none in the node's
    for ns, held in ((found["m2"].netns, True), (found["m1"].netns, True), (nodes["h1"], False), (nodes["r1"], False)):
        ss = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Huan", f"sport = :{vxlan.PORT}"],
                            capture_output=True, text=True, check=True).stdout
        assert bool(ss.strip()) == held, (ns, ss)
    ping = subprocess.run(["ip", "netns", "exec", nodes["h1"], "ping", "-c", "3", "-i", "0.2", "-W", "2", "10.99.0.2"],
                          capture_output=True, text=True)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    # an 802.1Qbb pause frame sent on h1's port arrives on r1's unchanged (no bridge drops it)
    from labctl.kernel import nsutil
    with nsutil.entered(nodes["r1"]):
        rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x8808))
    with nsutil.entered(nodes["h1"]):
        tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    try:
        rx.bind((b.name, 0))
        rx.settimeout(3)
        tx.bind((a.name, 0))
        tx.send(PFC)
        got = rx.recv(2048)
    finally:
        rx.close()
        tx.close()
    assert got[:len(PFC)] == PFC
