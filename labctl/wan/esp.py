"""ESP in tunnel mode with AES-GCM (RFC 4303, RFC 4106), in user space: this kernel has no ESP.

    Ether | outer IPv4 (proto 50, a -> b) | SPI | seq | IV (8) | AES-GCM(inner IPv4 | pad | pad len | 4) | ICV (16)

Nonce = 4-byte salt | 8-byte IV, a 64-bit packet counter; the AAD is SPI | seq (its low 32 bits). The outer header
copies the inner DSCP and ECN (RFC 4301 §5.1.2, RFC 6040 normal mode), and decapsulation carries a
CE mark on the outer header into the inner one, so congestion marks survive the tunnel.
`wireshark_sa` writes the SA in Wireshark's esp_sa table format so captures can be decrypted.
"""
from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAX_PACKETS = 2**64 - 1     # one SA seals at most this many: every IV once

from labctl.plan import qos

ETH_P_IP = 0x0800
IPPROTO_ESP, IPPROTO_IPIP = 50, 4
ICV = 16
# what ESP adds on the wire (54-57 bytes): plan/qos.py, where the routers' shapers charge it too
MIN_OVERHEAD, MAX_OVERHEAD = qos.ESP_MIN_OVERHEAD, qos.ESP_MAX_OVERHEAD
padding, overhead = qos.esp_padding, qos.esp_overhead
ECN_CE = 3
WIRESHARK_ALGO = "AES-GCM with 16 octet ICV [RFC4106]"


@dataclass
class Sa:
    """One direction's security association."""
    spi: int
    key: bytes              # 16 bytes (AES-128)
    salt: bytes             # 4 bytes
    src: str                # outer source, the encrypting end's address
    dst: str
    seq: int = 0            # packets sealed: the 64-bit counter behind both the IV and the wire's sequence number
    aead: AESGCM = field(init=False, repr=False)

    def __post_init__(self):
        self.aead = AESGCM(self.key)

    @classmethod
    def new(cls, spi: int, src: str, dst: str) -> "Sa":
        return cls(spi, os.urandom(16), os.urandom(4), src, dst)

    def to_dict(self) -> dict:
        return {"spi": self.spi, "key": self.key.hex(), "salt": self.salt.hex(), "src": self.src, "dst": self.dst}

    @classmethod
    def from_dict(cls, d: dict) -> "Sa":
        return cls(d["spi"], bytes.fromhex(d["key"]), bytes.fromhex(d["salt"]), d["src"], d["dst"])

    def wireshark_sa(self) -> str:
        """One line of Wireshark's esp_sa file (Preferences > Protocols > ESP > ESP SAs)."""
        return (f'"IPv4","{self.src}","{self.dst}","0x{self.spi:08x}","{WIRESHARK_ALGO}",'
                f'"0x{(self.key + self.salt).hex()}","NULL",""')


def _ip_checksum(header: bytes) -> int:
    s = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def encapsulate(sa: Sa, frame: bytes) -> bytes | None:
    """The ESP frame for an Ethernet frame carrying IPv4; None for anything else (not tunnelled)."""
    if len(frame) < 34 or struct.unpack_from("!H", frame, 12)[0] != ETH_P_IP:
        return None
    inner = frame[14:]
    # GCM's nonce must never repeat under one key: the IV counts all 64 bits (a 32-bit one wrapped
    # after 4e9 packets and sealed again with nonces already used); the header carries the low 32
    # bits, as extended sequence numbers do (RFC 4303 §2.2.1)
    if sa.seq >= MAX_PACKETS:
        raise OverflowError(f"SA {sa.spi:#x} sealed {MAX_PACKETS} packets: rekey before its IV would repeat")
    sa.seq += 1
    iv = struct.pack("!Q", sa.seq)
    pad = padding(len(inner))
    plaintext = inner + bytes(range(1, pad + 1)) + bytes((pad, IPPROTO_IPIP))
    head = struct.pack("!II", sa.spi, sa.seq & 0xFFFFFFFF)
    esp = head + iv + sa.aead.encrypt(sa.salt + iv, plaintext, head)
    tos = inner[1]
    outer = struct.pack("!BBHHHBBH4s4s", 0x45, tos, 20 + len(esp), sa.seq & 0xFFFF, 0x4000, 64, IPPROTO_ESP, 0,
                        socket.inet_aton(sa.src), socket.inet_aton(sa.dst))
    outer = outer[:10] + struct.pack("!H", _ip_checksum(outer)) + outer[12:]
    return frame[:14] + outer + esp


def decapsulate(sas: dict[int, Sa], frame: bytes) -> bytes | None:
    """The inner Ethernet frame, or None when the frame is not ESP for a known SA or fails its ICV."""
    if len(frame) < 14 + 20 + 16 + ICV or struct.unpack_from("!H", frame, 12)[0] != ETH_P_IP:
        return None
    ihl = (frame[14] & 0x0F) * 4
    if frame[14 + 9] != IPPROTO_ESP:
        return None
    outer_ecn = frame[15] & 3
    off = 14 + ihl
    spi, _seq = struct.unpack_from("!II", frame, off)
    sa = sas.get(spi)
    if sa is None:
        return None
    try:
        plaintext = sa.aead.decrypt(sa.salt + frame[off + 8:off + 16], frame[off + 16:], frame[off:off + 8])
    except InvalidTag:
        return None
    pad = plaintext[-2]
    inner = bytearray(plaintext[:-2 - pad])
    if outer_ecn == ECN_CE and inner[1] & 3 in (1, 2):     # RFC 6040: a CE on the way in survives
        inner[1] |= ECN_CE
        inner[10:12] = b"\0\0"
        inner[10:12] = struct.pack("!H", _ip_checksum(bytes(inner[:(inner[0] & 0x0F) * 4])))
    return frame[:14] + bytes(inner)
