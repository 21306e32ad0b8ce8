"""Reordering seen at one point of the fabric: RoCE frames in a capture whose PSN comes after a later one.

A real switch never reorders a flow, and an RC receiver drops what arrives out of order, so the
lab must not reorder either. A capture on a port shows the order at that hop; this counts, per
flow (source, destination, destination QP), the data frames whose PSN is behind the highest one
already seen. Go-back-N retransmissions count too (they are behind by design), so judge a
lossless run, not a reliable-mode one. Reads pcap (tcpdump) and pcapng (dumpcap) of Ethernet.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from labctl.traffic import roce

PCAPNG_SHB, PCAPNG_IDB, PCAPNG_EPB, PCAPNG_SPB = 0x0A0D0D0A, 1, 6, 3
ETH_P_IP = 0x0800
CONTROL_OPCODES = (roce.ACK, roce.CNP)


def frames(path: Path):
    """Every captured frame's bytes, in capture order."""
    data = Path(path).read_bytes()
    if data[:4] == struct.pack("<I", PCAPNG_SHB):
        yield from _pcapng(data)
    else:
        yield from _pcap(data)


def _pcap(data: bytes):
    magic = struct.unpack_from("<I", data, 0)[0]
    order = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    off = 24
    while off + 16 <= len(data):
        incl = struct.unpack_from(order + "I", data, off + 8)[0]
        yield data[off + 16:off + 16 + incl]
        off += 16 + incl


def _pcapng(data: bytes):
    order = "<" if struct.unpack_from("<I", data, 8)[0] == 0x1A2B3C4D else ">"
    off = 0
    while off + 12 <= len(data):
        kind, length = struct.unpack_from(order + "II", data, off)
        if length < 12:
            return
        if kind == PCAPNG_EPB:
            captured = struct.unpack_from(order + "I", data, off + 20)[0]
            yield data[off + 28:off + 28 + captured]
        elif kind == PCAPNG_SPB:
            yield data[off + 12:off + length - 4]
        off += length


def roce_data(frame: bytes):
    """(source, destination, destination QP, PSN) of a RoCEv2 data frame, else None."""
    if len(frame) < 14 + 20 + 8 + roce.BTH_LEN or struct.unpack_from("!H", frame, 12)[0] != ETH_P_IP:
        return None
    ihl = (frame[14] & 0x0F) * 4
    if frame[14 + 9] != 17:
        return None
    udp = 14 + ihl
    if len(frame) < udp + 8 + roce.BTH_LEN or struct.unpack_from("!H", frame, udp + 2)[0] != roce.ROCE_PORT:
        return None
    bth = udp + 8
    if frame[bth] in CONTROL_OPCODES:
        return None
    dqpn = int.from_bytes(frame[bth + 5:bth + 8], "big")
    psn = int.from_bytes(frame[bth + 9:bth + 12], "big")
    return frame[26:30], frame[30:34], dqpn, psn


@dataclass
class Order:
    frames: int = 0                      # RoCE data frames seen
    reordered: int = 0                   # of those, behind a PSN already seen on their flow
    per_flow: dict = field(default_factory=dict)   # "src>dst/qp" -> reordered frames

    def to_dict(self) -> dict:
        return {"frames": self.frames, "flows": len(self.per_flow), "reordered": self.reordered,
                "reordered_flows": {k: v for k, v in self.per_flow.items() if v}}


def reordering(path: Path) -> Order:
    out = Order()
    highest: dict[tuple, int] = {}
    for f in frames(path):
        got = roce_data(f)
        if got is None:
            continue
        src, dst, qp, psn = got
        key = (src, dst, qp)
        out.frames += 1
        name = f"{'.'.join(map(str, src))}>{'.'.join(map(str, dst))}/{qp:#x}"
        out.per_flow.setdefault(name, 0)
        top = highest.get(key)
        if top is None or 0 < (psn - top) & roce.PSN_MASK < 1 << 23:
            highest[key] = psn
        else:
            out.reordered += 1
            out.per_flow[name] += 1
    return out
