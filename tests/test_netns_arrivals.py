"""The arrival counters on a real switch port: what the tc program counts per class is, byte for
byte, what HTB's class leaves took in; a packet in no class is counted once for the port."""
from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from conftest import require_root
from labctl.kernel import nsutil
from labctl.dataplane import arrivals
from labctl.plan import qos
from labctl.telemetry import qdepth

LEAF_SPINE = Path(__file__).resolve().parents[1] / "topologies" / "leaf-spine.yml"
pytestmark = pytest.mark.netns
ROCE_DSCP, ROCE_TC, DEFAULT_TC = 26, 3, 0
UDP_IP_ETH = 8 + 20 + 14


def send(namespace: str, dst: str, tos: int, size: int, count: int) -> None:
    with nsutil.entered(namespace):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        for _ in range(count):
            s.sendto(bytes(size), (dst, 9))
            time.sleep(0.0002)        # well below the link rate: nothing is dropped on the way
    finally:
        s.close()


def leaf_bytes(sock, ifindex: int) -> dict[int, int]:
    return {q.handle: q.bytes for q in qdepth.dump(sock) if q.ifindex == ifindex}


def test_the_kernels_arrival_counts_are_the_bytes_htb_queued(built_lab):
    require_root()
    plan = built_lab(LEAF_SPINE, sets=["scale_up=false"])
    assert plan.queue_reads == "arrivals"     # this kernel loads the program: the lab's controller counts too
    leaf, src = plan.node("leaf1"), plan.node("srv2-gpu0")
    port = leaf.iface("srv1-gpu0")
    dst = plan.node("srv1-gpu0").iface("leaf1").address.split("/")[0]
    counters = arrivals.Counters(1)
    try:
        with nsutil.netlink_socket(leaf.namespace) as sock:
            # beside the controller's own program (pref 1), which lets the packet go on to this one
            counters.attach(sock, [(port.index, 0, "leaf1:srv1-gpu0")], pref=2)
            before, counted = leaf_bytes(sock, port.index), counters.snapshot()
            send(src.namespace, dst, ROCE_DSCP << 2, 1000, 300)
            send(src.namespace, dst, 0, 500, 200)
            time.sleep(0.3)
            after = leaf_bytes(sock, port.index)
        got = counters.snapshot() - counted
    finally:
        counters.close()
    roce = after[qos.leaf_handle(ROCE_TC)] - before[qos.leaf_handle(ROCE_TC)]
    default = after[qos.leaf_handle(DEFAULT_TC)] - before[qos.leaf_handle(DEFAULT_TC)]
    assert roce == 300 * (1000 + UDP_IP_ETH)
    assert got[ROCE_TC] == roce                 # classified by nftables' meta priority, as HTB reads it
    assert default == 200 * (500 + UDP_IP_ETH)
    assert got[arrivals.OTHER] == default       # priority 0: HTB's default class, the port's own counter
    assert sum(got) == roce + default
