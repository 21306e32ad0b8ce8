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
