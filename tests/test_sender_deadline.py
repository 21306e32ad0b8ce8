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


def paced_resend(deadline_after: float | None) -> tuple[float, object, float]:
    """A 20-packet message on a QP cut to half its 80 Mbit/s line rate, NAKed from PSN 0 and resent
    (the deadline `deadline_after` s into the resend, if given): (seconds the resend took, the QP,
    its cut rate)."""
    from labctl.traffic.dcqcn import Params
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind((DST, roce.ROCE_PORT))
    tx = Sender(rank=0, mtu=MTU, sport_policy="per-qp", rng=random.Random(1), reliable=True, gso=False,
                dcqcn=Params().scaled(4000))      # its timers: 0.22 s, far longer than the resend
    try:
        tx.send_message({"dst": 1, "qp": 0, "src_addr": SRC, "dst_addr": DST, "nbytes": 20 * MTU, "id": 9,
                         "line_rate": 80e6})
        (lq, q), = tx.qps.items()
        tx.on_cnp(lq)                               # alpha 1: the rate halves
        tx.on_ack(lq, 0, roce.NAK_PSN_SEQ_ERR)
        t0 = time.monotonic()
        if deadline_after is not None:
            tx.deadline = t0 + deadline_after
        tx.go_back(q)
        return time.monotonic() - t0, q, q.rp.rc
    finally:
        rx.close()
        for s in tx.sockets.values():
            s.close()


def test_a_paced_resend_cut_short_by_the_deadline_keeps_its_place():
    """The deadline comes a quarter into the resend: the rest is left, and the next operation's
    first pass resends from the first packet not yet sent again."""
    full = 19 * (MTU + roce.FRAME_OVERHEAD) * 8 / 40e6
    _, q, _ = paced_resend(full / 4)
    assert 0 < q.retransmitted < 20 and q.resend_from == q.retransmitted, (q.retransmitted, q.resend_from)


def test_a_dcqcn_qp_resends_at_its_cut_rate_not_at_once():
    """A NIC's rate limiter holds every packet of its QP: after a CNP cut, go-back-N's resends leave
    at the QP's DCQCN rate, as its first sends do (they once left in one burst, whatever the rate)."""
    took, q, rate = paced_resend(None)
    assert rate == 80e6 / 2 and q.retransmitted == 20
    # 20 frames at the cut rate (the first leaves at once: its predecessor's end has passed), twice
    # the line's time
    floor = 19 * (MTU + roce.FRAME_OVERHEAD) * 8 / rate
    assert floor * 0.9 < took < floor * 3 + 0.2, (took, floor)
