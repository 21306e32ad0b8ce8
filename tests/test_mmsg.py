"""recvmmsg through ctypes, on loopback (no root): each datagram with its source and IP ToS."""
from __future__ import annotations

import socket

from labctl.traffic import mmsg


def _pair():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    rx.settimeout(2)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x8a)
    return rx, tx, mmsg.Receiver(rx, batch=8)


def test_each_datagram_comes_with_its_source_and_tos():
    rx, tx, r = _pair()
    for k in range(3):
        tx.sendto(bytes([k]) * (100 + k), rx.getsockname())
    got = []
    for _ in range(5):          # each recv waits up to the socket's 2 s for the first datagram
        if len(got) == 3:
            break
        got += [(bytes(r.payload(i)), r.source(i), r.tos(i)) for i in range(r.recv())]
    assert [(p[0], len(p)) for p, *_ in got] == [(0, 100), (1, 101), (2, 102)]
    assert {s for _, s, _ in got} == {socket.inet_aton("127.0.0.1")}
    assert {t for _, _, t in got} == {0x8a}
