"""Captures read without any of labctl's code: a classic pcap file's frames, and RoCEv2's ICRC
computed from the specification (independent of labctl.traffic.roce)."""
from __future__ import annotations

import struct
import zlib
from pathlib import Path


def frames(pcap: Path):
    """Frames of a classic pcap file, read without any of labctl's code."""
    data = pcap.read_bytes()
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _orig = struct.unpack_from("<IIII", data, off)
        yield data[off + 16:off + 16 + incl]
        off += 16 + incl


def icrc_ok(frame: bytes) -> bool:
    """RoCEv2 ICRC from the spec, independent of labctl.traffic.roce: CRC-32 over 8 bytes of 0xFF,
    the IP header with ToS, TTL and checksum set to ones, the UDP header with checksum set to ones,
    the BTH with its FECN/BECN byte set to ones, and the rest up to the ICRC (little-endian)."""
    ip_len = struct.unpack("!H", frame[16:18])[0]
    pkt = bytearray(frame[14:14 + ip_len])
    pkt[1] = pkt[8] = 0xFF
    pkt[10] = pkt[11] = 0xFF
    pkt[26] = pkt[27] = 0xFF
    pkt[32] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(pkt[:-4])) == int.from_bytes(pkt[-4:], "little")
