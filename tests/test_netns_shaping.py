"""Links are shaped to their (dilated) rate: measured on real veths through a forwarding hop."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from conftest import require_root
from labctl import lifecycle as labmod
from netutil import udp_socket_in

CHAIN = Path(__file__).parent / "topologies" / "chain.yml"
pytestmark = pytest.mark.netns


def measure_rate(plan, seconds: float = 2.0) -> float:
    """L2 bit/s arriving at h2 while h1 sends 8 KB UDP datagrams as fast as its shaped NIC takes them."""
    h1, h2 = plan.node("h1"), plan.node("h2")
    dst = h2.interfaces[0].address.split("/")[0]
    stop = threading.Event()
    sock = udp_socket_in(h1.namespace)

    def blast():
        payload = b"\0" * 8000
        while not stop.is_set():
            sock.sendto(payload, (dst, 9))  # discard port: h2 answers with ICMP, which is fine

    t = threading.Thread(target=blast, daemon=True)
    t.start()
    try:
        time.sleep(0.5)  # let queues reach their steady state
        a = labmod.live_links(h2.namespace)["r1"]["rx_bytes"]
        t0 = time.monotonic()
        time.sleep(seconds)
        b = labmod.live_links(h2.namespace)["r1"]["rx_bytes"]
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        t.join(timeout=5)
        sock.close()
    return (b - a) * 8 / elapsed


@pytest.mark.parametrize("rate,dilation,lab_bps", [("100M", 1, 100e6), ("1G", 1, 1e9), ("400G", 400, 1e9)])
def test_shaped_throughput_within_5_percent(built_lab, rate, dilation, lab_bps):
    require_root()
    plan = built_lab(CHAIN, sets=[f"defaults.rate={rate}", f"dilation={dilation}"])
    measured = measure_rate(plan)
    assert measured == pytest.approx(lab_bps, rel=0.05), f"{measured / 1e6:.1f} Mbit/s vs {lab_bps / 1e6:.0f}"
