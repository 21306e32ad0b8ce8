"""RoCEv2 wire format: header templates crafted with scapy once, then PSN and ICRC patched per packet.

scapy needs ~1 ms to build one RoCE packet (its ICRC post_build); a patched template costs a few
microseconds, so senders keep up with the lab's links (docs/design.md §4 and §8). The templates
come from `crafting` (scapy): the controller crafts them and installs them in its agents, so that
an agent does not import scapy. Frames sent through a UDP socket get their Ethernet, IP and UDP
headers from the kernel; the ICRC covers the (masked) IP and UDP headers, so it is computed here
from the header the kernel will write: IP ID 0 (an unconnected socket with IP_PMTUDISC_DO), DF,
the final lengths, addresses and ports.
"""
from __future__ import annotations

import socket
import struct
import zlib
from functools import lru_cache

ROCE_PORT = 4791
DSCP_DATA = 26        # RoCE data: priority 3, lossless, ECN-capable
DSCP_CNP = 48         # CNP/control: priority 6, strict priority
ECT0, CE = 0b10, 0b11
TOS_DATA = DSCP_DATA << 2 | ECT0
TOS_CNP = DSCP_CNP << 2 | ECT0   # as ConnectX sends it (ToS 0xC2 in docs/design.md §6)

# IBA opcodes, RC transport
SEND_FIRST, SEND_MIDDLE, SEND_LAST, SEND_ONLY = 0x00, 0x01, 0x02, 0x04
WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_LAST_IMM, WRITE_ONLY, WRITE_ONLY_IMM = 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B
ACK = 0x11
CNP = 0x81
OPCODES = (SEND_FIRST, SEND_MIDDLE, SEND_LAST, SEND_ONLY, WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_LAST_IMM,
           WRITE_ONLY, WRITE_ONLY_IMM, ACK, CNP)    # every opcode the agents send
NAK_PSN_SEQ_ERR = 0x60  # AETH syndrome: NAK, PSN sequence error
HAS_RETH = {WRITE_FIRST, WRITE_ONLY, WRITE_ONLY_IMM}
HAS_IMM = {WRITE_LAST_IMM, WRITE_ONLY_IMM}
STARTS = {WRITE_FIRST, WRITE_ONLY, WRITE_ONLY_IMM, SEND_FIRST, SEND_ONLY}
ENDS = {WRITE_LAST, WRITE_LAST_IMM, WRITE_ONLY, WRITE_ONLY_IMM, SEND_LAST, SEND_ONLY}

BTH_LEN, RETH_LEN, IMM_LEN, AETH_LEN, ICRC_LEN = 12, 16, 4, 4, 4
FRAME_OVERHEAD = 14 + 20 + 8 + BTH_LEN + ICRC_LEN  # Ethernet + IPv4 + UDP + BTH + ICRC around a payload
PSN_MASK = 0xFFFFFF
GSO_MAX_SEGS = 15  # 15 x 4112 bytes: the most one 64 KB UDP datagram holds
ROCE_MTUS = (4096, 2048, 1024, 512, 256)


def roce_mtu(netdev_mtu: int) -> int:
    """The largest RoCE path MTU that fits the interface MTU minus 96 bytes of headers (1500 → 1024)."""
    for m in ROCE_MTUS:
        if m <= netdev_mtu - 96:
            return m
    raise ValueError(f"an MTU of {netdev_mtu} cannot carry RoCE (needs at least 352)")


def udp_sport(local_qpn: int, remote_qpn: int) -> int:
    """The UDP source port Linux derives from a QP pair (rdma_get_udp_sport): flow label, folded."""
    fl = local_qpn * remote_qpn
    fl ^= fl >> 20
    fl ^= fl >> 40
    fl &= 0xFFFFF
    return ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14)) | 0xC000


_TEMPLATES: dict[tuple, bytes] = {}


def install(table: dict[str, str]) -> None:
    """Templates crafted elsewhere (`crafting.table`: hex, keyed "bth:op:pad:ackreq:becn",
    "aeth:syndrome", "cnp"), used from now on in this process."""
    for key, value in table.items():
        kind, *fields = key.split(":")
        _TEMPLATES[(kind, *map(int, fields))] = bytes.fromhex(value)


def _crafted(key: tuple) -> bytes:
    """A template no table held: crafted here, once (this imports scapy)."""
    from labctl.traffic import crafting
    kind, *fields = key
    t = {"bth": crafting.bth, "aeth": crafting.aeth, "cnp": crafting.cnp_body}[kind](*fields)
    _TEMPLATES[key] = t
    return t


def bth_template(opcode: int, padcnt: int = 0, ackreq: bool = False, becn: bool = False) -> bytes:
    """The 12 BTH bytes for an opcode, with QP and PSN 0, as scapy crafts them."""
    key = ("bth", opcode, padcnt, int(ackreq), int(becn))
    return _TEMPLATES.get(key) or _crafted(key)


def bth(opcode: int, dqpn: int, psn: int, padcnt: int = 0, ackreq: bool = False, becn: bool = False) -> bytes:
    t = bth_template(opcode, padcnt, ackreq, becn)
    return t[:5] + (dqpn & PSN_MASK).to_bytes(3, "big") + t[8:9] + (psn & PSN_MASK).to_bytes(3, "big")


def reth(va: int, rkey: int, length: int) -> bytes:
    return struct.pack("!QII", va, rkey, length)  # scapy has no RETH class


def imm(value: int) -> bytes:
    return struct.pack("!I", value & 0xFFFFFFFF)


def aeth(syndrome: int, msn: int) -> bytes:
    t = _TEMPLATES.get(("aeth", syndrome)) or _crafted(("aeth", syndrome))
    return t[:1] + (msn & PSN_MASK).to_bytes(3, "big")


def cnp_body() -> bytes:
    return _TEMPLATES.get(("cnp",)) or _crafted(("cnp",))


def ipv4_header(src: str, dst: str, total_len: int, tos: int = TOS_DATA, ident: int = 0, ttl: int = 64) -> bytes:
    h = struct.pack("!BBHHHBBH4s4s", 0x45, tos, total_len, ident, 0x4000, ttl, socket.IPPROTO_UDP, 0,
                    socket.inet_aton(src), socket.inet_aton(dst))
    s = sum(struct.unpack("!10H", h))
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return h[:10] + struct.pack("!H", ~s & 0xFFFF) + h[12:]


@lru_cache(maxsize=4096)
def icrc_prefix(src: str, dst: str, sport: int, udp_payload_len: int, ident: int = 0, dport: int = ROCE_PORT) -> int:
    """CRC-32 state after 8×0xFF + the masked IPv4 header + the masked UDP header.

    Masked: ToS, TTL and the IP checksum, the UDP checksum. Lengths, ID, flags, addresses and ports
    are not masked, so they must be the ones on the wire.
    """
    ip = bytearray(ipv4_header(src, dst, 20 + 8 + udp_payload_len, ident=ident))
    ip[1] = 0xFF
    ip[8] = 0xFF
    ip[10:12] = b"\xff\xff"
    udp = struct.pack("!HHHH", sport, dport, 8 + udp_payload_len, 0xFFFF)
    return zlib.crc32(b"\xff" * 8 + bytes(ip) + udp)


def icrc(prefix_crc: int, body: bytes | bytearray | memoryview) -> bytes:
    """ICRC over BTH (byte 4 — FECN, BECN, reserved — masked to 0xFF) and everything after it."""
    masked = bytes(body[:4]) + b"\xff" + bytes(body[5:BTH_LEN])
    crc = zlib.crc32(body[BTH_LEN:], zlib.crc32(masked, prefix_crc))
    return struct.pack("<I", crc)


def udp_payload(src: str, dst: str, sport: int, headers: bytes, payload: bytes | memoryview = b"",
                ident: int = 0) -> bytes:
    """BTH + extension headers + payload (padded to 4) + ICRC: what goes into the UDP datagram."""
    pad = -len(payload) % 4
    body = headers + bytes(payload) + b"\0" * pad
    return body + icrc(icrc_prefix(src, dst, sport, len(body) + ICRC_LEN, ident), body)


def verify_icrc(frame: bytes) -> bool:
    """Check the ICRC of a whole Ethernet frame (IPv4, no VLAN): written independently of the sender
    path above (masks applied to a copy of the wire bytes)."""
    ihl = (frame[14] & 0x0F) * 4
    ip = bytearray(frame[14:14 + ihl])
    udp = bytearray(frame[14 + ihl:22 + ihl])
    ip_total = struct.unpack("!H", ip[2:4])[0]
    rest = bytearray(frame[22 + ihl:14 + ip_total - 4])
    ip[1], ip[8] = 0xFF, 0xFF
    ip[10:12] = b"\xff\xff"
    udp[6:8] = b"\xff\xff"
    rest[4] = 0xFF
    want = struct.unpack("<I", frame[14 + ip_total - 4:14 + ip_total])[0]
    return zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(rest)) == want


def message_opcodes(length: int, mtu: int, with_imm: bool = True) -> list[tuple[int, int]]:
    """(opcode, payload bytes) per packet of an RDMA WRITE of `length` bytes at RoCE MTU `mtu`."""
    if length <= mtu:
        return [(WRITE_ONLY_IMM if with_imm else WRITE_ONLY, length)]
    n = -(-length // mtu)
    out = [(WRITE_FIRST, mtu)] + [(WRITE_MIDDLE, mtu)] * (n - 2)
    out.append((WRITE_LAST_IMM if with_imm else WRITE_LAST, length - mtu * (n - 1)))
    return out


@lru_cache(maxsize=8)
def zero_run_crc(n: int) -> tuple[int, list[int], list[int], list[int], list[int]]:
    """Tables that give zlib.crc32(bytes(n), state) in four lookups.

    CRC-32 over a fixed run of zero bytes is affine in the starting state: f(s) = f(0) ^ L(s), with
    L linear, so L is the XOR of its value on each byte of s. The payload of RoCE frames here is
    zeros (the lab moves bytes, not tensors), so the ICRC of a 4 KB frame costs four lookups
    instead of a 4 KB scan.
    """
    zeros = bytes(n)
    f0 = zlib.crc32(zeros, 0)
    tables = [[zlib.crc32(zeros, b << (8 * i)) ^ f0 for b in range(256)] for i in range(4)]
    return f0, *tables


def crc_over_zeros(n: int, state: int) -> int:
    f0, t0, t1, t2, t3 = zero_run_crc(n)
    return f0 ^ t0[state & 255] ^ t1[(state >> 8) & 255] ^ t2[(state >> 16) & 255] ^ t3[state >> 24]


class MessageBuilder:
    """Builds every UDP payload of RDMA WRITE messages on one QP, fast: templates plus patches.

    Middle packets (the bulk of a message) reuse one bytearray whose PSN and ICRC are patched in
    place: a consumer must send each yielded payload before asking for the next.
    """

    def __init__(self, src: str, dst: str, sport: int, dqpn: int, mtu: int, rkey: int = 0x1000):
        self.src, self.dst, self.sport, self.dqpn, self.mtu, self.rkey = src, dst, sport, dqpn, mtu, rkey
        self.zeros = memoryview(bytes(mtu + 4))
        self.middle = bytearray(bth(WRITE_MIDDLE, dqpn, 0) + bytes(mtu) + bytes(ICRC_LEN))
        self.masked = bytearray(self.middle[:BTH_LEN])
        self.masked[4] = 0xFF
        self.middle_prefix = icrc_prefix(src, dst, sport, len(self.middle))
        zero_run_crc(mtu)
        self._gso: bytearray | None = None

    def gso_batches(self, psn: int, length: int, immediate: int, va: int = 0, max_segments: int = GSO_MAX_SEGS):
        """Yield (first psn, buffer, segment size, count): runs of up to `max_segments` Middle packets
        in one buffer for a single UDP_SEGMENT send, and every other packet on its own.

        The kernel numbers the IP IDs of a GSO send's segments 0, 1, 2, … (an unconnected socket with
        DF starts at 0), and the ICRC covers the IP ID, so segment k's ICRC uses ID k.
        """
        seg = len(self.middle)
        if self._gso is None:
            self._gso = bytearray(self.middle) * max_segments
            self._gso_prefix = [icrc_prefix(self.src, self.dst, self.sport, seg, ident=k)
                                for k in range(max_segments)]
        buf, prefixes, masked, mtu = self._gso, self._gso_prefix, self.masked, self.mtu
        pack = struct.pack_into
        count, first = 0, psn
        for opcode, size in message_opcodes(length, mtu):
            if opcode == WRITE_MIDDLE:
                if count == 0:
                    first = psn
                off = count * seg
                pack("!I", buf, off + 8, psn)
                pack("!I", masked, 8, psn)
                pack("<I", buf, off + BTH_LEN + mtu, crc_over_zeros(mtu, zlib.crc32(masked, prefixes[count])))
                count += 1
                if count == max_segments:
                    yield first, memoryview(buf)[:count * seg], seg, count
                    count = 0
            else:
                if count:
                    yield first, memoryview(buf)[:count * seg], seg, count
                    count = 0
                yield psn, self._packet(opcode, psn, size, length, immediate, va), 0, 1
            psn = (psn + 1) & PSN_MASK
        if count:
            yield first, memoryview(buf)[:count * seg], seg, count

    def _packet(self, opcode: int, psn: int, size: int, length: int, immediate: int, va: int) -> bytes:
        pad = -size % 4
        hdr = bth(opcode, self.dqpn, psn, padcnt=pad, ackreq=opcode in ENDS)
        if opcode in HAS_RETH:
            hdr += reth(va, self.rkey, length)
        if opcode in HAS_IMM:
            hdr += imm(immediate)
        body = hdr + self.zeros[:size + pad].tobytes()
        return body + icrc(icrc_prefix(self.src, self.dst, self.sport, len(body) + ICRC_LEN), body)

    def packets(self, psn: int, length: int, immediate: int, va: int = 0):
        """Yield (psn, udp_payload) for one message starting at `psn`."""
        ops = message_opcodes(length, self.mtu)
        middle, masked, prefix, mtu = self.middle, self.masked, self.middle_prefix, self.mtu
        pack = struct.pack_into
        for opcode, size in ops:
            if opcode == WRITE_MIDDLE:
                pack("!I", middle, 8, psn)
                pack("!I", masked, 8, psn)
                pack("<I", middle, BTH_LEN + mtu, crc_over_zeros(mtu, zlib.crc32(masked, prefix)))
                yield psn, middle
            else:
                yield psn, self._packet(opcode, psn, size, length, immediate, va)
            psn = (psn + 1) & PSN_MASK


def send_payload(src: str, dst: str, sport: int, dqpn: int, psn: int, data: bytes) -> bytes:
    """RC SEND Only: a small control message (at most one MTU), padded to 4 with PadCnt."""
    return udp_payload(src, dst, sport, bth(SEND_ONLY, dqpn, psn, padcnt=-len(data) % 4, ackreq=True), data)


def ack_payload(src: str, dst: str, sport: int, dqpn: int, psn: int, msn: int, syndrome: int = 0) -> bytes:
    """RC ACK (syndrome 0) or NAK (e.g. 0x60, PSN sequence error) with AETH."""
    return udp_payload(src, dst, sport, bth(ACK, dqpn, psn) + aeth(syndrome, msn))


def cnp_payload(src: str, dst: str, sport: int, dqpn: int, ident: int = 0) -> bytes:
    """Congestion notification: opcode 0x81, BECN set, PSN 0, 16 reserved zero bytes."""
    return udp_payload(src, dst, sport, bth(CNP, dqpn, 0, becn=True) + cnp_body(), ident=ident)


def parse_bth(data: bytes | memoryview) -> tuple[int, int, int, int, bool]:
    """(opcode, padcnt, dest QP, PSN, becn) of a UDP payload."""
    opcode, flags, _pkey, fb_qp, a_psn = struct.unpack_from("!BBHII", data, 0)
    return opcode, (flags >> 4) & 3, fb_qp & PSN_MASK, a_psn & PSN_MASK, bool(fb_qp >> 30 & 1)


def frame(src_mac: str, dst_mac: str, src: str, dst: str, sport: int, payload: bytes, tos: int = TOS_DATA,
          ident: int = 0) -> bytes:
    """A whole Ethernet frame around a UDP payload (for pcaps and tests; agents send via sockets)."""
    udp = struct.pack("!HHHH", sport, ROCE_PORT, 8 + len(payload), 0)
    ip = ipv4_header(src, dst, 20 + len(udp) + len(payload), tos=tos, ident=ident)
    return bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex(src_mac.replace(":", "")) + b"\x08\x00" + ip + udp + payload
