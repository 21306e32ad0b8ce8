"""ECN thresholds scaled with the link's rate, on a real standing queue: with `qos.ecn.rate: 400M`
a 100 Mbit/s port marks from a quarter of the profile's Kmin, where an unscaled port never would."""
from __future__ import annotations

import socket
import statistics
import threading
import time
from pathlib import Path

import pytest

from conftest import require_root
from labctl.kernel import nsutil, rtnl
from labctl.kernel.netconf import set_rate as set_port_rate
from labctl.plan import qos
from labctl.telemetry import qdepth
from test_netns_ecn import TOS_ROCE_ECT0, Receiver

BOTTLENECK = Path(__file__).parent / "topologies" / "bottleneck.yml"
pytestmark = pytest.mark.netns


def test_a_slower_port_marks_at_its_scaled_thresholds(built_lab, tmp_path):
    require_root()
    topo = tmp_path / "scaled.yml"
    text = BOTTLENECK.read_text()
    assert "qos:" not in text
    topo.write_text(text + "qos: {ecn: {kmin: 400KB, kmax: 1600KB, pmax: 0.2, rate: 400M}}\n")
    plan = built_lab(topo)
    h1, r1, h2 = plan.node("h1"), plan.node("r1"), plan.node("h2")
    egress = r1.iface("h2")
    roce = next(c for c in egress.shaping.classes if c.ecn)
    assert (roce.kmin_bytes, roce.kmax_bytes) == (100_000, 400_000)    # 100M of 400M: a quarter
    with nsutil.entered(r1.namespace):
        qsock = rtnl.open_socket()

    def depth() -> int:
        return next(q.backlog for q in qdepth.dump(qsock)
                    if q.ifindex == egress.index and q.handle >> 16 == qos.leaf_handle(roce.tc) >> 16)

    dst = h2.iface("r1").address.split("/")[0]
    rx = Receiver(h2.namespace, dst)
    rx.start()
    stop = threading.Event()
    with nsutil.entered(h1.namespace):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, TOS_ROCE_ECT0)

    def blast():
        while not stop.is_set():
            tx.sendto(bytes(8000), (dst, 7000))

    sender = threading.Thread(target=blast, daemon=True)
    h1_port = h1.iface("r1")
    results = []
    try:
        set_port_rate(h1, h1_port, 100_000_000)
        sender.start()
        # inside the scaled band (below the unscaled Kmin), then above the scaled Kmax (the unscaled
        # profile would mark 3% there, the scaled one every packet)
        for target in (250_000, 600_000):
            set_port_rate(h1, h1_port, 200_000_000)
            deadline = time.monotonic() + 5
            while depth() < target and time.monotonic() < deadline:
                time.sleep(0.0005)
            set_port_rate(h1, h1_port, 100_000_000)
            time.sleep(0.3)
            rx.packets = rx.ce = 0
            rx.counting.set()
            samples = []
            t_end = time.monotonic() + 1.5
            while time.monotonic() < t_end:
                samples.append(depth())
                time.sleep(0.005)
            rx.counting.clear()
            scaled = statistics.mean(qos.marking_probability(d, 100_000, 400_000, 0.2) for d in samples)
            unscaled = statistics.mean(qos.marking_probability(d, 400_000, 1_600_000, 0.2) for d in samples)
            results.append((statistics.mean(samples), rx.packets, rx.ce / max(1, rx.packets), scaled, unscaled))
    finally:
        stop.set()
        rx.stop.set()
        sender.join(timeout=5)
        qsock.close()
    report = [f"depth {m / 1e3:.0f} kB: marked {f:.3f}, scaled profile {s:.3f}, unscaled {u:.3f} ({n} packets)"
              for m, n, f, s, u in results]
    print("\n".join(report))
    (m1, n1, f1, s1, u1), (m2, n2, f2, s2, u2) = results
    assert 100_000 < m1 < 400_000 and m2 > 400_000 and n1 > 1000 and n2 > 1000, report
    assert u1 == 0 and 0.02 < s1 < 0.2, report       # the unscaled profile would not mark here at all
    assert s2 == 1.0 and u2 < 0.1, report
    for frac, want, n in ((f1, s1, n1), (f2, s2, n2)):
        tolerance = max(0.1 * want, 3 * (want * (1 - want) / n) ** 0.5) if want < 1 else 0.02
        assert frac == pytest.approx(want, abs=tolerance), report
