"""Traffic classes on a real bottleneck: DSCP decides the class at switches, weights share the link."""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from conftest import require_root
from labctl.kernel import nsutil

LEAF_SPINE = Path(__file__).resolve().parents[1] / "topologies" / "leaf-spine.yml"
pytestmark = pytest.mark.netns


def blast(namespace: str, dst: str, port: int, tos: int, stop: threading.Event) -> None:
    with nsutil.entered(namespace):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    payload = bytes(8000)
    while not stop.is_set():
        try:
            s.sendto(payload, (dst, port))
        except OSError:
            time.sleep(0.001)
    s.close()


def test_weighted_classes_share_a_bottleneck_by_weight(built_lab):
    require_root()
    plan = built_lab(LEAF_SPINE)
    dst_node = plan.node("srv1-gpu0")
    dst = dst_node.iface("leaf1").address.split("/")[0]
    with nsutil.entered(dst_node.namespace):
        socks = {p: socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for p in (7001, 7002)}
    for p, s in socks.items():
        s.bind((dst, p))
        s.settimeout(0.05)
    got = {7001: 0, 7002: 0}
    stop, measuring = threading.Event(), threading.Event()

    def receive(port):
        while not stop.is_set():
            try:
                n = len(socks[port].recv(65536))
            except socket.timeout:
                continue
            if measuring.is_set():
                got[port] += n

    threads = [threading.Thread(target=receive, args=(p,), daemon=True) for p in got]
    # roce (DSCP 26, weight 70) from leaf2's GPU, default (DSCP 0, weight 20) from leaf3's GPU
    threads += [threading.Thread(target=blast, args=(plan.node("srv1-gpu1").namespace, dst, 7001, 26 << 2, stop),
                                 daemon=True),
                threading.Thread(target=blast, args=(plan.node("srv1-gpu2").namespace, dst, 7002, 0, stop),
                                 daemon=True)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        measuring.set()
        time.sleep(3.0)
        measuring.clear()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
        for s in socks.values():
            s.close()
    roce, default = (got[p] * 8 / 3.0 / 1e6 for p in (7001, 7002))
    # guarantees 70 and 20 Mbit/s; the idle CNP class's 10 are lent equally (same prio, same quantum)
    assert roce == pytest.approx(75, abs=8) and default == pytest.approx(25, abs=8), (roce, default)
    assert roce + default == pytest.approx(100 * 8000 / 8042, rel=0.05)  # the link, less headers
