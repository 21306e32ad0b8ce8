"""The netlink codec every family shares: attributes packed by hand, and ONE reply parser.

rtnetlink (kernel/rtnl.py), qdisc statistics (telemetry/qdepth.py) and nftables counters
(telemetry/nftcounters.py) all read replies through `walk` (one message at a time) and `replies`
(messages up to a dump's end, an error raised with what was asked). Packing by hand is what keeps
the hot paths fast (see kernel/rtnl.py); tests/test_rtnl_encoding.py checks it against pyroute2.
"""
from __future__ import annotations

import os
import socket
import struct
from typing import Iterable, Iterator

# linux/netlink.h
NLM_F_REQUEST, NLM_F_ACK, NLM_F_ECHO, NLM_F_DUMP = 0x1, 0x4, 0x8, 0x300
NLM_F_EXCL, NLM_F_CREATE = 0x200, 0x400
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLA_F_NESTED = 0x8000
HEADER = struct.Struct("IHHII")


class NetlinkError(Exception):
    def __init__(self, code: int, what: str):
        super().__init__(f"{what}: {os.strerror(code)}")
        self.code = code
        self.what = what


def align(n: int) -> int:
    return (n + 3) & ~3


def message(kind: int, flags: int, body: bytes, seq: int = 1) -> bytes:
    """One netlink message: header (length, type, flags, sequence, port 0) and body."""
    return HEADER.pack(16 + len(body), kind, flags, seq, 0) + body


def attr(kind: int, payload: bytes) -> bytes:
    return struct.pack("HH", 4 + len(payload), kind) + payload + b"\0" * (align(len(payload)) - len(payload))


def nest(kind: int, *attrs: bytes) -> bytes:
    return attr(kind | NLA_F_NESTED, b"".join(attrs))


def u32(v: int) -> bytes:
    return struct.pack("I", v)


def cstr(s: str) -> bytes:
    return s.encode() + b"\0"


def parse_attrs(data: bytes, offset: int) -> dict[int, bytes]:
    """type -> payload of the attributes from `offset` on (the nested flag cleared)."""
    out = {}
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("HH", data, offset)
        if length < 4:
            break
        out[kind & ~NLA_F_NESTED] = data[offset + 4:offset + length]
        offset += align(length)
    return out


def walk(data: bytes) -> Iterator[tuple[int, int, int, int]]:
    """(type, sequence, offset, length) of each message in one datagram."""
    off, end = 0, len(data)
    unpack = struct.unpack_from
    while off + 16 <= end:
        length, kind, _flags, seq = unpack("IHHI", data, off)
        if length < 16:
            return
        yield kind, seq, off, length
        off += (length + 3) & ~3


def error_code(data: bytes, off: int) -> int:
    """The errno an NLMSG_ERROR message at `off` carries (0: an acknowledgement)."""
    return -struct.unpack_from("i", data, off + 16)[0]


def replies(datagrams: Iterable[bytes], what: str) -> Iterator[tuple[bytes, int, int]]:
    """(datagram, offset, length) of every reply message up to NLMSG_DONE or an acknowledgement;
    an error reply raises NetlinkError naming `what`."""
    for data in datagrams:
        for kind, _seq, off, length in walk(data):
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                code = error_code(data, off)
                if code:
                    raise NetlinkError(code, what)
                return
            yield data, off, length


def received(sock: socket.socket, size: int = 1 << 20) -> Iterator[bytes]:
    """The socket's datagrams, read as `replies` asks for them."""
    while True:
        yield sock.recv(size)


def dump(sock: socket.socket, request: bytes, what: str) -> Iterator[tuple[bytes, int, int]]:
    """Send one request and yield its reply messages (see `replies`)."""
    sock.sendall(request)
    yield from replies(received(sock), what)


def ended(data: bytes) -> bool:
    """Whether a datagram holds the end of a dump (NLMSG_DONE, or an error that stops it)."""
    return any(kind in (NLMSG_DONE, NLMSG_ERROR) for kind, _s, _o, _l in walk(data))
