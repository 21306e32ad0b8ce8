"""ESP's cost on the wire, from a capture on the WAN fibre: every packet grows by exactly what RFC
4303 with AES-GCM adds, and the line spends the link's rate on the sealed size, not the inner one."""
from __future__ import annotations

import statistics
import subprocess
from pathlib import Path

import pytest

from conftest import require_root
from labctl import state
from labctl.lifecycle.capture import Capture
from labctl.traffic.tcpflow import FlowRun, Sequence, Target
from labctl.wan import esp
from labctl.wan.keys import tshark_options

pytestmark = pytest.mark.netns

# 20G at dilation 1000 is 20 Mbit/s in the lab; MTU 1500 so that ESP's 54-57 bytes are 3.6% of a
# frame, well outside the 2% the pacing must meet (at 9000 they would be 0.6%, inside it).
TOPOLOGY = """\
name: espwire
dilation: 1000
fabrics:
  wan: {kind: scale-across}
nodes:
  h1: {kind: host, zone: a}
  dci1: {kind: router, fabric: wan, zone: a}
  dci2: {kind: router, fabric: wan, zone: b}
  h2: {kind: host, zone: b}
links:
  - {endpoints: [h1, dci1], rate: 400G, mtu: 1500}
  - {endpoints: [dci1, dci2], rate: 20G, distance: 1, encrypt: true, mtu: 1500}
  - {endpoints: [dci2, h2], rate: 400G, mtu: 1500}
"""


def fibre_packets(pcap: Path, lab_path: Path, src: str) -> list[tuple[float, int, int]]:
    """(time, frame bytes, inner IPv4 bytes) of each ESP packet from `src`, decrypted with the lab's SAs."""
    out = subprocess.run(["tshark", "-r", str(pcap), *tshark_options(lab_path), "-Y", f"esp && ip.src == {src}",
                          "-T", "fields", "-e", "frame.time_epoch", "-e", "frame.len", "-e", "ip.len"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    rows = []
    for line in out:
        t, frame, lens = line.split("\t")
        outer, inner = (int(x) for x in lens.split(",")[:2])   # outer IPv4, then the decrypted inner one
        assert int(frame) == 14 + outer
        rows.append((float(t), int(frame), inner))
    return rows


def test_the_fibre_carries_esp_paced_at_the_link_rate_on_its_sealed_size(built_lab, tmp_path):
    require_root()
    topo = tmp_path / "espwire.yml"
    topo.write_text(TOPOLOGY)
    plan = built_lab(topo)
    wan = next(lk for lk in plan.links if lk.wire)
    assert wan.encrypt and wan.lab_rate_bps == 20_000_000
    dci1 = plan.node("dci1")
    port = next(i for i in dci1.interfaces if i.link == wan.id)
    assert port.shaping.overhead_bytes == esp.MAX_OVERHEAD     # the router's shaper charges ESP too
    h1, h2 = plan.node("h1"), plan.node("h2")
    pcap = tmp_path / "fibre.pcapng"
    cap = Capture(plan, f"wire{wan.id}.a:fibre", pcap, snaplen=0)   # whole frames: ESP needs them to decrypt
    try:
        target = Target("h2", h2.namespace, h2.interfaces[0].address.split("/")[0])
        run = FlowRun([Sequence("bulk", "h1", h1.namespace, [target], 6_000_000)]).start()
        run.wait(timeout=60)
        (flow,) = run.close()
    finally:
        cap.stop()
    assert flow["received"] == 6_000_000
    rows = fibre_packets(pcap, state.lab_dir(plan.lab).path, port.address.split("/")[0])
    full = [r for r in rows if r[2] == 1500]
    assert len(full) > 3000, len(rows)
    # size: each packet grows by outer IPv4 20 + SPI/seq 8 + IV 8 + pad + 2 + ICV 16, exactly
    for _, frame, inner in rows:
        assert frame - 14 - inner == esp.overhead(inner), (frame, inner)
    assert {frame - 14 - inner for _, frame, inner in full} == {esp.overhead(1500)} == {56}
    # spacing: skip slow start (the first second), then the link is busy with full frames. The
    # gap between two back-to-back sealed frames is the sealed frame at the link's rate
    start = rows[0][0] + 1.0
    busy = [r for r in rows if r[0] >= start]
    gaps = [b[0] - a[0] for a, b in zip(busy, busy[1:]) if a[2] == 1500 and b[2] == 1500]
    sealed_gap = (14 + 1500 + 56) * 8 / wan.lab_rate_bps
    inner_gap = (14 + 1500) * 8 / wan.lab_rate_bps
    median = statistics.median(gaps)
    wire_bps = sum(r[1] for r in busy[1:]) * 8 / (busy[-1][0] - busy[0][0])
    print(f"median gap {median * 1e6:.1f} us (sealed size at the rate: {sealed_gap * 1e6:.1f} us, "
          f"inner: {inner_gap * 1e6:.1f} us); on the wire {wire_bps / 1e6:.2f} Mbit/s of 20")
    assert median == pytest.approx(sealed_gap, rel=0.02), (median, sealed_gap)
    assert abs(median / inner_gap - 1) > 0.02         # pacing the inner size would fail the line above
    assert wire_bps == pytest.approx(wan.lab_rate_bps, rel=0.02), wire_bps
