"""A receive batch counted run by run (traffic/rxbatch.py) ends in exactly the state that counting
each packet does: real datagrams on loopback, from two source addresses and several QPs, with
losses, duplicates, reordering and CE marks, in each receiver mode; every counter, every PSN
remembered, every transfer's arrival and every ACK, NAK and CNP sent are compared. No root."""
from __future__ import annotations

import random
import socket
import time

import pytest

from labctl.traffic import mmsg, roce
from labctl.traffic.receiver import Receiver
from labctl.traffic.rxbatch import MIN_BATCH, BatchReader

MTU = 256
SOURCES = ("127.0.0.1", "127.0.0.2")


class Replies:
    """The receiver's sender side, recording what it was asked to send (ACKs, NAKs, CNPs), in order."""

    reliable = False

    def __init__(self):
        self.sent: list = []

    def on_cnp(self, dqpn):
        self.sent.append(("cnp-in", dqpn))

    def on_ack(self, dqpn, psn, syndrome):
        self.sent.append(("ack-in", dqpn, psn, syndrome))

    def socket_for(self, my_ip, sport, tos):
        return self

    def sendto(self, payload, address):
        self.sent.append(("out", bytes(payload), address))


def stream(rng: random.Random, messages: int) -> list[tuple[int, bytes, int]]:
    """(source index, UDP payload, ToS) of several QPs' messages, interleaved in bursts, with some
    packets lost, sent twice, swapped with the next one or CE-marked."""
    qps = [(s, dqpn) for s in range(2) for dqpn in (0x101, 0x202)]
    psn = {qp: 0 for qp in qps}
    queues = {qp: [] for qp in qps}
    for k in range(messages):
        qp = rng.choice(qps)
        length = rng.choice([MTU // 2, MTU * 3, MTU * 40, MTU * 40 + 7, MTU * 90])
        builder = roce.MessageBuilder(SOURCES[qp[0]], "127.0.0.1", 4000 + qp[1], qp[1], MTU)
        queues[qp] += [(qp[0], bytes(p)) for _, p in builder.packets(psn[qp], length, k)]
        psn[qp] = (psn[qp] + len(roce.message_opcodes(length, MTU))) & roce.PSN_MASK
    out: list = []
    while any(queues.values()):
        qp = rng.choice([q for q in qps if queues[q]])
        k = rng.randint(1, 80)
        out += queues[qp][:k]
        queues[qp] = queues[qp][k:]
    return out


def perturbed(rng: random.Random, packets: list, p: float) -> list[tuple[int, bytes, int]]:
    out: list = []
    for src, payload in packets:
        tos = roce.TOS_DATA | (3 if rng.random() < p else 0)
        r = rng.random()
        if r < p:
            continue                                   # lost
        out.append((src, payload, tos))
        if r < 2 * p:
            out.append((src, payload, tos))            # sent twice
    for i in range(len(out) - 1):
        if rng.random() < p:
            out[i], out[i + 1] = out[i + 1], out[i]    # overtaken
    return out


def state(receiver: Receiver, replies: Replies) -> dict:
    qps = {}
    for key, q in receiver.qps.items():
        qps[key] = (q.public(), q.expected_psn, q.next_exp, q.msg_bytes, q.msg_first, q.untracked, q.full_size,
                    q.nak_for, sorted(q.missing), sorted(q.ahead), sorted(q.held.items()),
                    [list(e) for e in q.unfinished])
    arrived = {k: (got, whole) for k, (_, got, whole) in receiver.arrived.items()}
    return {"qps": qps, "arrived": arrived, "replies": replies.sent}


def both_ways(datagrams: list, reliable: bool, ooo: str, batch: int = 64) -> tuple[dict, dict, int]:
    """The state after counting `datagrams` one by one, and after reading them through recvmmsg in
    batches counted by BatchReader; and how many packets the batches counted as runs."""
    peers = {s: (1, "127.0.0.1") for s in SOURCES}
    one = Receiver(0, peers, Replies(), 0.0, reliable, ooo)
    for src, payload, tos in datagrams:
        one.packet(memoryview(payload), SOURCES[src], tos)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(1)
    senders: dict[int, dict] = {0: {}, 1: {}}      # a socket per source address and ToS
    batched = Receiver(0, peers, Replies(), 0.0, reliable, ooo)
    reader = BatchReader(batched, mmsg.Receiver(rx, batch=batch))
    counted = [0]
    take_run = batched.take_run

    def counting(src_ip, dqpn, psn, count, size_sum, last_size):
        ok = take_run(src_ip, dqpn, psn, count, size_sum, last_size)
        counted[0] += count if ok else 0
        return ok
    batched.take_run = counting
    sent = received = 0
    for start in range(0, len(datagrams), 200):       # well inside the socket's buffer each time
        for src, payload, tos in datagrams[start:start + 200]:
            sock = senders[src].get(tos)
            if sock is None:
                sock = senders[src][tos] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.bind((SOURCES[src], 0))
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            sock.sendto(payload, rx.getsockname())
            sent += 1
        deadline = time.monotonic() + 5
        while received < sent:
            assert time.monotonic() < deadline, f"loopback delivered {received} of {sent}"
            n = reader.rx.recv()
            reader.take(n)
            received += n
    return state(one, one.sender), state(batched, batched.sender), counted[0]


@pytest.mark.parametrize("reliable, ooo", [(False, "drop"), (True, "drop"), (True, "tolerate")],
                         ids=["unreliable", "go-back-n", "tolerate"])
@pytest.mark.parametrize("seed", range(4))
def test_a_batch_counted_run_by_run_ends_where_counting_each_packet_does(reliable, ooo, seed):
    rng = random.Random(seed)
    datagrams = perturbed(rng, stream(rng, 40), p=0.01 * seed)
    one, batched, counted = both_ways(datagrams, reliable, ooo)
    assert one == batched
    assert one["qps"], "the stream reached the receiver"
    if not reliable or seed == 0:
        # (a reliable receiver that lost a packet holds what came after it until the sender, absent
        # here, resends: from there on each packet is counted alone, in both ways)
        assert counted > len(datagrams) // 2, f"only {counted} of {len(datagrams)} packets were counted as runs"


def test_small_batches_go_one_by_one_and_agree_too():
    rng = random.Random(9)
    datagrams = perturbed(rng, stream(rng, 10), p=0.02)
    one, batched, counted = both_ways(datagrams, True, "drop", batch=MIN_BATCH - 1)
    assert one == batched and counted == 0


def middle(dqpn: int, psn: int, size: int, pad: int = 0) -> bytes:
    return roce.bth(roce.WRITE_MIDDLE, dqpn, psn, padcnt=pad) + bytes(size + pad) + bytes(roce.ICRC_LEN)


def test_runs_never_join_what_differs_and_read_only_this_batch():
    """Cases a random stream rarely makes: two QPs, and two sources, whose PSNs follow each other
    back to back (a run must not cross them); Middles of different sizes and with pad; datagrams
    shorter than a header; and a batch that comes with no ToS (the option turned off) after one
    whose packets were CE-marked: the stale ToS bytes in the buffer must not count."""
    first = [(0, roce.bth(roce.WRITE_FIRST, 0x101, 0) + bytes(16 + MTU + 4), 0),
             (0, roce.bth(roce.WRITE_FIRST, 0x202, 8) + bytes(16 + MTU + 4), 0),
             (1, roce.bth(roce.WRITE_FIRST, 0x101, 8) + bytes(16 + MTU + 4), 0)]
    batch1 = first + [(1, middle(0x101, k, MTU), 3) for k in range(9, 17)] + \
        [(0, middle(0x101, k, MTU), 0) for k in range(1, 9)] + [(0, middle(0x202, k, MTU), 0) for k in range(9, 17)]
    batch2 = [(0, bytes(14), 0), (0, middle(0x101, 9, 1, pad=2)[:17], 0)] + \
        [(0, middle(0x101, k, MTU - 4 * (k % 3), pad=k % 4), 0) for k in range(9, 17)] + \
        [(1, middle(0x101, k, MTU), 0) for k in range(17, 25)]
    peers = {s: (1, "127.0.0.1") for s in SOURCES}
    one = Receiver(0, peers, Replies(), 0.0, False, "drop")
    for src, payload, tos in batch1:
        one.packet(memoryview(payload), SOURCES[src], roce.TOS_DATA | tos)
    for src, payload, tos in batch2:
        one.packet(memoryview(payload), SOURCES[src], 0)         # read with no ToS at all
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(1)
    batched = Receiver(0, peers, Replies(), 0.0, False, "drop")
    reader = BatchReader(batched, mmsg.Receiver(rx))
    senders = {}
    for number, datagrams in enumerate((batch1, batch2)):
        if number == 1:
            rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 0)
        for src, payload, tos in datagrams:
            sock = senders.get((src, tos))
            if sock is None:
                sock = senders[(src, tos)] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.bind((SOURCES[src], 0))
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, roce.TOS_DATA | tos)
            sock.sendto(payload, rx.getsockname())
        got = 0
        while got < len(datagrams):
            n = reader.rx.recv()
            assert n, "loopback delivered the batch"
            reader.take(n)
            got += n
    assert state(one, one.sender) == state(batched, batched.sender)
    a, b, c = (batched.qps[k] for k in ((SOURCES[0], 0x101), (SOURCES[0], 0x202), (SOURCES[1], 0x101)))
    assert (a.packets, a.ce, a.expected_psn, a.full_size) == (17, 0, 17, MTU - 4), a
    assert (b.packets, b.expected_psn) == (9, 17) and (c.packets, c.ce, c.expected_psn) == (17, 8, 25), (b, c)
