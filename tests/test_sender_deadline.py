"""A go-back-N sender stops resending at its operation's deadline, and keeps the receiver's request
for the next operation. Under spray, go-back-N receivers ask for a resend on every reordered
packet, and the resends are reordered in turn: an agent that went on resending ran a 15 s
operation to 29 s. Real UDP sockets on loopback; the NAK is the receiver's, played by on_ack."""
from __future__ import annotations

import random
import socket
import time

from labctl.traffic import roce
from labctl.traffic.sender import Sender

SRC, DST, MTU = "127.0.0.1", "127.0.0.3", 1024


def sent_after_nak(deadline: float) -> tuple[int, int | None, int]:
    """Send one 20-packet message, NAK it from PSN 5, and resend: (packets resent, the request
    left for later, packets that reached the receiver's socket in all)."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind((DST, roce.ROCE_PORT))
    rx.settimeout(0.2)
    tx = Sender(rank=0, mtu=MTU, sport_policy="per-qp", rng=random.Random(1), reliable=True)
    try:
        tx.send_message({"dst": 1, "qp": 0, "src_addr": SRC, "dst_addr": DST, "nbytes": 20 * MTU, "id": 9})
        (lq, q), = tx.qps.items()
        tx.on_ack(lq, 5, roce.NAK_PSN_SEQ_ERR)
        tx.deadline = deadline
        tx.go_back(q)
        got = 0
        try:
            while True:
                rx.recvfrom(65535)
                got += 1
        except socket.timeout:
            pass
        return q.retransmitted, q.resend_from, got
    finally:
        rx.close()
        for s in tx.sockets.values():
            s.close()


def test_before_its_deadline_the_sender_resends_from_the_nak():
    resent, left, got = sent_after_nak(time.monotonic() + 60)
    assert (resent, left, got) == (15, None, 20 + 15)


def test_past_its_deadline_the_sender_resends_nothing_and_keeps_the_request():
    resent, left, got = sent_after_nak(time.monotonic() - 0.001)
    assert (resent, left, got) == (0, 5, 20)


def test_a_qp_idle_past_its_timer_does_not_resend_a_new_message_at_once():
    """The timer runs only while something is unacknowledged: a QP whose last ACK came longer than
    the timer ago sends a new message once, and resends it only if no ACK comes within the timer."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind((DST, roce.ROCE_PORT))
    tx = Sender(rank=0, mtu=MTU, sport_policy="per-qp", rng=random.Random(1), reliable=True)
    message = {"dst": 1, "qp": 0, "src_addr": SRC, "dst_addr": DST, "nbytes": 4 * MTU, "id": 9}
    rto = 0.3                                            # far above a stall between two lines
    try:
        tx.send_message(message)
        (lq, q), = tx.qps.items()
        tx.on_ack(lq, 3, 0)                              # all four packets acknowledged
        assert not q.unacked
        time.sleep(3 * rto)                              # idle for longer than the timer
        tx.send_message(message)
        assert tx.service(rto) and (q.timeouts, q.retransmitted) == (0, 0)
        time.sleep(2 * rto)                              # no ACK within the timer: the tail was lost
        tx.service(rto)
        assert (q.timeouts, q.retransmitted) == (1, 4)
    finally:
        rx.close()
        for s in tx.sockets.values():
            s.close()


def test_a_dcqcn_qp_resends_at_its_cut_rate_not_at_once():
    """A NIC's rate limiter holds every packet of its QP: after a CNP cut, go-back-N's resends leave
    at the QP's DCQCN rate, as its first sends do (they once left in one burst, whatever the rate)."""
    from labctl.traffic.dcqcn import Params
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind((DST, roce.ROCE_PORT))
    line = 80e6                                     # the QP's line rate, bit/s
    tx = Sender(rank=0, mtu=MTU, sport_policy="per-qp", rng=random.Random(1), reliable=True, gso=False,
                dcqcn=Params().scaled(4000))      # its timers: 0.22 s, far longer than the resend
    try:
        tx.send_message({"dst": 1, "qp": 0, "src_addr": SRC, "dst_addr": DST, "nbytes": 20 * MTU, "id": 9,
                         "line_rate": line})
        (lq, q), = tx.qps.items()
        tx.on_cnp(lq)                               # alpha 1: the rate halves
        rate = q.rp.rc
        assert rate == line / 2
        line_floor = 19 * (MTU + roce.FRAME_OVERHEAD) * 8 / line
        tx.on_ack(lq, 0, roce.NAK_PSN_SEQ_ERR)
        t0 = time.monotonic()
        tx.go_back(q)
        took = time.monotonic() - t0
        assert q.retransmitted == 20
        # 20 frames at the cut rate (the first leaves at once: its predecessor's end has passed)
        floor = 19 * (MTU + roce.FRAME_OVERHEAD) * 8 / rate
        assert floor * 0.9 < took < floor * 3 + 0.2, (took, floor)
        assert took > 1.8 * line_floor                  # slower than the line: the cut rate held
    finally:
        rx.close()
        for s in tx.sockets.values():
            s.close()
