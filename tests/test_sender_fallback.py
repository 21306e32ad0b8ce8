"""A kernel before 6.11 refuses UDP GSO from a device without checksum offload (EIO, and sends
nothing): the sender then goes on one packet per send from the refused batch, and the receiver gets
every packet once, in order, with an ICRC that holds for the IP ID 0 each single send carries.
Real UDP sockets on loopback; only the refusal is the old kernel's, played by the socket."""
from __future__ import annotations

import errno
import random
import socket

from labctl.traffic import roce
from labctl.traffic.receiver import Receiver
from labctl.traffic.sender import UDP_SEGMENT, Sender

SRC, DST, MTU = "127.0.0.1", "127.0.0.2", 1024


class RefusesGso(socket.socket):
    refused = 0

    def sendmsg(self, buffers, ancdata=(), flags=0, address=None):
        if any(level == socket.SOL_UDP and kind == UDP_SEGMENT for level, kind, _ in ancdata):
            RefusesGso.refused += 1
            raise OSError(errno.EIO, "UDP GSO needs checksum offload on this device")
        return super().sendmsg(buffers, ancdata, flags, address)


class OldKernelSender(Sender):
    socket_type = RefusesGso


class NoSender:
    """The receiver's replies need peers; with none it answers nobody."""


def received_singly(rx: Receiver, payloads: list, src: str, dst: str):
    """Each datagram's ICRC holds for the IP ID 0 a single send carries; fed to `rx`, its one QP."""
    for payload, (_, sport) in payloads:
        prefix = roce.icrc_prefix(src, dst, sport, len(payload), ident=0)
        assert roce.icrc(prefix, payload[:-roce.ICRC_LEN]) == payload[-roce.ICRC_LEN:]
        rx.packet(memoryview(payload), src, roce.TOS_DATA)
    (q,) = rx.qps.values()
    return q


def test_a_refused_gso_send_goes_on_packet_by_packet_and_every_packet_arrives_once():
    rx_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx_sock.bind((DST, roce.ROCE_PORT))
    rx_sock.settimeout(2)
    tx = OldKernelSender(rank=0, mtu=MTU, sport_policy="per-qp", rng=random.Random(1), reliable=False)
    try:
        messages = [(7, 40 * MTU + 100), (8, 3 * MTU)]
        for imm, nbytes in messages:
            tx.send_message({"dst": 1, "qp": 0, "src_addr": SRC, "dst_addr": DST, "nbytes": nbytes, "id": imm})
        want = sum(len(roce.message_opcodes(n, MTU)) for _, n in messages)
        rx = Receiver(1, {}, NoSender(), None, reliable=False)
        payloads = [rx_sock.recvfrom(65535) for _ in range(want)]
    finally:
        rx_sock.close()
        for s in tx.sockets.values():
            s.close()
    assert RefusesGso.refused == 1 and tx.gso is False, "one refusal, then no GSO is tried again"
    q = received_singly(rx, payloads, SRC, DST)
    assert (q.packets, q.gaps, q.reordered, q.messages) == (want, 0, 0, 2)
    assert rx.arrived[7][1:] == (40 * MTU + 100, True) and rx.arrived[8][1:] == (3 * MTU, True)
    (qtx,) = tx.qps.values()
    assert qtx.packets == want
