"""A DCQCN-paced QP sends one frame at a time once its rate would hold a whole GSO batch back for
longer than PACED_BATCH_MAX_S: its receiver then hears a frame every frame's time, not nothing for
fifteen. At line rate the same message goes in GSO batches. Real UDP sockets on loopback."""
from __future__ import annotations

import random
import socket
import time
from pathlib import Path

import pytest

from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology
from labctl.traffic import roce
from labctl.traffic.dcqcn import Params
from labctl.traffic.pool import STALL_MARGIN_S, paced_silence, quiet_floor
from labctl.traffic.receiver import Receiver
from labctl.traffic.sender import PACED_BATCH_MAX_S, UDP_SEGMENT, Sender

from test_sender_fallback import NoSender, received_singly

SRC, DST, MTU = "127.0.0.1", "127.0.0.4", 1024
PACKETS = 12                     # a First, ten Middles (one GSO batch at line rate), a Last


class CountsSends(socket.socket):
    sends: list[int] = []        # segments per send

    def sendmsg(self, buffers, ancdata=(), flags=0, address=None):
        gso = [kind for level, kind, _ in ancdata if level == socket.SOL_UDP and kind == UDP_SEGMENT]
        CountsSends.sends.append(-1 if gso else 1)
        return super().sendmsg(buffers, ancdata, flags, address)


class CountingSender(Sender):
    socket_type = CountsSends


def send_one_message(line_rate: float, reliable: bool = False, rto: float = 0.0):
    """(segments per send, seconds the send took, the datagrams received, timeouts right after)"""
    CountsSends.sends = []
    rx_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx_sock.bind((DST, roce.ROCE_PORT))
    rx_sock.settimeout(2)
    tx = CountingSender(rank=0, mtu=MTU, sport_policy="per-qp", rng=random.Random(1), reliable=reliable,
                        dcqcn=Params())
    try:
        t0 = time.monotonic()
        tx.send_message({"dst": 1, "qp": 0, "src_addr": SRC, "dst_addr": DST, "nbytes": PACKETS * MTU, "id": 5,
                         "line_rate": line_rate})
        took = time.monotonic() - t0
        if reliable:
            tx.service(rto)
        payloads = [rx_sock.recvfrom(65535) for _ in range(PACKETS)]
    finally:
        rx_sock.close()
        for s in tx.sockets.values():
            s.close()
    (q,) = tx.qps.values()
    return CountsSends.sends, took, payloads, q.timeouts


def slow_rate() -> float:
    """A rate at which ten Middles would take 2 x PACED_BATCH_MAX_S: one frame every 0.04 s."""
    return 0.5 * 10 * (MTU + roce.FRAME_OVERHEAD) * 8 / PACED_BATCH_MAX_S


def test_at_line_rate_the_middle_frames_leave_in_one_gso_batch():
    sends, _, _, _ = send_one_message(100e6)
    assert sends.count(-1) == 1 and len(sends) == 3, sends


def test_a_rate_too_slow_for_a_batch_sends_frame_by_frame_and_every_frame_arrives_intact():
    rate = slow_rate()
    sends, took, payloads, _ = send_one_message(rate)
    assert sends == [1] * PACKETS, sends
    # paced frame by frame: the first frame leaves at once, each next one a frame's time later (no
    # sooner; later only by what the machine's scheduling adds: this runs beside other tests)
    paced = (PACKETS - 1) * (MTU + roce.FRAME_OVERHEAD) * 8 / rate
    assert 0.95 * paced <= took <= 3 * paced, (took, paced)
    q = received_singly(Receiver(1, {}, NoSender(), None, reliable=False), payloads, SRC, DST)
    assert (q.packets, q.gaps, q.reordered, q.messages) == (PACKETS, 0, 0, 1)


def test_the_silence_a_dcqcn_run_allows_is_a_frame_at_the_minimum_rate():
    plan = compile_plan(load_topology(Path(__file__).resolve().parents[1] / "topologies" / "leaf-spine.yml"))
    frame = roce.roce_mtu(max(i.mtu for n in plan.nodes for i in n.interfaces)) + roce.FRAME_OVERHEAD
    assert paced_silence(plan, Params()) == pytest.approx(frame * 8 / (10e6 / 4000))   # 10 Mbit/s, dilated
    assert 10 < paced_silence(plan, Params()) < 20         # a 4 KB frame at 2.5 kbit/s: about 13 s
    assert quiet_floor(plan, Params()) == pytest.approx(STALL_MARGIN_S + 2 * paced_silence(plan, Params()))
    assert quiet_floor(plan) < quiet_floor(plan, Params()) / 4          # without DCQCN, the lab's own


def test_a_paced_message_slower_to_leave_than_the_timer_is_not_timed_out_once_out():
    """The go-back-N timer counts from the message's last packet out, not from when it was queued:
    here it takes 0.44 s to leave, against a 0.2 s timer, and nothing is resent right after."""
    sends, took, _, timeouts = send_one_message(slow_rate(), reliable=True, rto=PACED_BATCH_MAX_S)
    assert took > 2 * PACED_BATCH_MAX_S and len(sends) == PACKETS
    assert timeouts == 0
