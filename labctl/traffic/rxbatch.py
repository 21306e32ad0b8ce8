"""A receive batch accounted run by run: the in-order Middle packets of a QP in one pass.

At a full lab rate a recvmmsg batch holds up to 64 frames, most of them WRITE Middle packets of
one or two QPs, each the PSN after the one before. receiver.Receiver accounts a packet in about
2.4 µs of Python, and eight agents spent a fifth of their CPU there. Here the batch's BTHs, lengths,
sources and ToS values are read as numpy arrays straight from recvmmsg's buffers, cut into runs
(same QP, consecutive PSNs, Middle, not CE-marked), and a run that starts at its QP's expected PSN,
with nothing held or seen ahead, is counted in one step: what Receiver.packet would do to each of
its packets, summed (a Middle's only effects are these counts). Every other packet, and every run
the QP's state does not allow, goes through Receiver.packet one by one, in arrival order.

A small batch (the receiver keeping up, one frame per call) is not worth the arrays: below
MIN_BATCH the packets go one by one. `LABCTL_RX_BATCH=off` sends every batch one by one, for
`bench/collectives.py --rx one,batch`, which measures both side by side.
"""
from __future__ import annotations

import ctypes
import os
import socket

import numpy as np

from labctl.traffic import roce

MIN_BATCH = 8
ENV = "LABCTL_RX_BATCH"
OVERHEAD = roce.BTH_LEN + roce.ICRC_LEN


class Headers:
    """numpy views of a recvmmsg batch's buffers (mmsg.Receiver's), made once and read per batch."""

    def __init__(self, data, slot: int, batch: int, msgs, msg_size: int, len_at: int, controllen_at: int,
                 names, name_size: int, control, control_size: int, tos_at: int):
        def field(buf, dtype, offset, stride):
            return np.ndarray((batch,), dtype=dtype, buffer=buf, offset=offset, strides=(stride,))
        size_t = np.uint64 if ctypes.sizeof(ctypes.c_size_t) == 8 else np.uint32
        self.opcode = field(data, np.uint8, 0, slot)
        self.flags = field(data, np.uint8, 1, slot)
        self.dqpn = field(data, ">u4", 4, slot)
        self.psn = field(data, ">u4", 8, slot)
        self.length = field(msgs, np.uint32, len_at, msg_size)
        self.controllen = field(msgs, size_t, controllen_at, msg_size)
        self.src = field(names, ">u4", 4, name_size)              # sockaddr_in's address, network order
        self.tos = field(control, np.uint8, tos_at, control_size)  # the IP_TOS cmsg's byte
        self.tos_at = tos_at


class BatchReader:
    """Feeds one recvmmsg batch at a time to a receiver.Receiver."""

    def __init__(self, receiver, rx):
        self.receiver, self.rx = receiver, rx
        self.min_batch = MIN_BATCH if os.environ.get(ENV, "on") != "off" else 1 << 30
        self.h = rx.headers()
        self.names: dict[int, str] = {}

    def name(self, address: int) -> str:
        n = self.names.get(address)
        if n is None:
            n = self.names[address] = socket.inet_ntoa(address.to_bytes(4, "big"))
        return n

    def take(self, n: int) -> None:
        """Account the batch's first `n` datagrams, in the order they arrived."""
        rx, packet, h = self.rx, self.receiver.packet, self.h
        if n < self.min_batch:
            for i in range(n):
                packet(rx.payload(i), self.name(int(h.src[i])), rx.tos(i))
            return
        op, flags, length = h.opcode[:n], h.flags[:n], h.length[:n]
        src, dqpn, psn = h.src[:n], h.dqpn[:n], h.psn[:n]
        tos = h.tos[:n] * (h.controllen[:n] > h.tos_at)     # a batch without the cmsg has no ToS
        plain = (op == roce.WRITE_MIDDLE) & ((tos & 3) != roce.CE) & (length >= OVERHEAD + 3)
        # a run: plain packets of one QP whose PSNs follow each other (the 32-bit field's step of
        # one is a step of one in the 24-bit PSN too); every other packet is a run of its own
        joined = plain[1:] & plain[:-1] & (src[1:] == src[:-1]) & (dqpn[1:] == dqpn[:-1]) & \
            ((psn[1:] - psn[:-1]) == 1)
        cuts = (np.flatnonzero(~joined) + 1).tolist() + [n]
        sizes = [0] + np.cumsum(length.astype(np.int64) - OVERHEAD - ((flags >> 4) & 3)).tolist()  # before i: sizes[i]
        plain, src, dqpn, psn, tos = plain.tolist(), src.tolist(), dqpn.tolist(), psn.tolist(), tos.tolist()
        take_run, mask, s = self.receiver.take_run, roce.PSN_MASK, 0
        for e in cuts:
            if plain[s] and take_run(self.name(src[s]), dqpn[s] & mask, psn[s] & mask, e - s, sizes[e] - sizes[s],
                                     sizes[e] - sizes[e - 1]):
                s = e
                continue
            for i in range(s, e):
                packet(rx.payload(i), self.name(src[i]), tos[i])
            s = e
