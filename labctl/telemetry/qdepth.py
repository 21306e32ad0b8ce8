"""Queue depths and counters of every qdisc in a namespace, from one raw RTM_GETQDISC dump.

A qdisc dump returns every device's qdiscs whatever ifindex is asked for, so one dump
per namespace per poll gives every class's leaf: backlog (bytes queued), drops, bytes and packets
sent. Parsed by hand: pyroute2 takes ~50x longer per dump.
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from labctl.kernel import netlink

RTM_GETQDISC = 38
TCA_KIND, TCA_STATS2 = 1, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE = 1, 3


@dataclass
class QueueStats:
    ifindex: int
    handle: int
    kind: str
    backlog: int
    qlen: int
    drops: int
    bytes: int
    packets: int
    overlimits: int


def dump(sock: socket.socket, seq: int = 1) -> list[QueueStats]:
    """Every qdisc of the socket's namespace. The kernel holds rtnl while it answers dump_raw; a
    caller that must not hold it while preempted runs that part real-time and parses afterwards
    (telemetry/sampler.py)."""
    return parse_dump(dump_raw(sock, seq))


def dump_raw(sock: socket.socket, seq: int = 1) -> list[bytes]:
    """The replies of one RTM_GETQDISC dump, unparsed (only scanned for its end)."""
    sock.sendall(netlink.message(RTM_GETQDISC, netlink.NLM_F_REQUEST | netlink.NLM_F_DUMP,
                                 struct.pack("BxxxiIII", socket.AF_UNSPEC, 0, 0, 0, 0), seq))
    chunks = []
    for data in netlink.received(sock):
        chunks.append(data)
        if netlink.ended(data):
            return chunks
    return chunks


def parse_dump(chunks: list[bytes]) -> list[QueueStats]:
    return [_stats(data, off, length) for data, off, length in netlink.replies(chunks, "qdisc dump")]


def _stats(data: bytes, off: int, length: int) -> QueueStats:
    _fam, ifindex, handle, _parent, _info = struct.unpack_from("BxxxiIII", data, off + 16)
    attrs = netlink.parse_attrs(data[off:off + length], 36)
    qkind = attrs.get(TCA_KIND, b"").rstrip(b"\0").decode()
    stats = netlink.parse_attrs(attrs.get(TCA_STATS2, b""), 0)
    basic = stats.get(TCA_STATS_BASIC, b"")
    nbytes, npkts = struct.unpack_from("QI", basic) if len(basic) >= 12 else (0, 0)
    queue = stats.get(TCA_STATS_QUEUE, b"")
    qlen, backlog, drops, _req, over = struct.unpack_from("5I", queue) if len(queue) >= 20 else (0,) * 5
    return QueueStats(ifindex, handle, qkind, backlog, qlen, drops, nbytes, npkts, over)


class RepeatedDump:
    """parse_dump for the same namespace's dump taken again and again (the queue sampler, 200 times
    a second): only the qdiscs of `wanted` (ifindex, handle major), and a qdisc whose message is
    byte for byte the one of the previous dump is not parsed again. Parsing every qdisc of an idle
    16-node lab took 3 ms a sample, most of a core at 200 Hz."""

    def __init__(self, wanted: set[tuple[int, int]]):
        self.wanted = wanted
        self.last: dict[tuple[int, int], tuple[bytes, QueueStats]] = {}

    def parse(self, chunks: list[bytes]) -> list[QueueStats]:
        out = []
        unpack, wanted, last = struct.unpack_from, self.wanted, self.last
        for data, off, length in netlink.replies(chunks, "qdisc dump"):
            ifindex, handle = unpack("iI", data, off + 20)
            key = (ifindex, handle >> 16)
            if key not in wanted:
                continue
            raw = data[off + 20:off + length]        # the message less its header, whose sequence varies
            seen = last.get(key)
            if seen is None or seen[0] != raw:
                seen = last[key] = (raw, _stats(data, off, length))
            out.append(seen[1])
        return out


def get_messages(wanted: set[tuple[int, int]]) -> tuple[list[bytes], list[tuple[int, int]]]:
    """An RTM_GETQDISC GET per queue of `wanted` (by handle, NLM_F_ECHO so the reply is unicast),
    in key order, each numbered by its place in that order."""
    keys = sorted(wanted)
    return [netlink.message(RTM_GETQDISC, netlink.NLM_F_REQUEST | netlink.NLM_F_ECHO,
                            struct.pack("BxxxiIII", socket.AF_UNSPEC, ifindex, major << 16, 0, 0), k)
            for k, (ifindex, major) in enumerate(keys)], keys


def backlogs_get(sock: socket.socket, request: tuple[bytes, list], expect: int | None = None) -> dict[tuple[int, int], int]:
    """Backlogs of exactly the queues in a prepared request (get_messages joined, with its keys):
    the kernel serialises only those. `expect`: how many GETs the buffer holds, if not one per key."""
    buf, keys = request
    sock.sendall(buf)
    out: dict[tuple[int, int], int] = {}
    while len(out) < (len(keys) if expect is None else expect):
        data = sock.recv(1 << 20)
        for kind, seq, off, length in netlink.walk(data):
            if kind == netlink.NLMSG_ERROR:
                code = netlink.error_code(data, off)
                if code:
                    raise netlink.NetlinkError(code, "qdisc get")
                continue
            backlog = _backlog(data, off + 36, off + length)
            if backlog is not None:
                out[keys[seq]] = backlog
    return out


def _backlog(data: bytes, a: int, stop: int) -> int | None:
    """The backlog in a qdisc message's TCA_STATS2/TCA_STATS_QUEUE, walking only as far as needed."""
    unpack = struct.unpack_from
    while a + 4 <= stop:
        alen, atype = unpack("HH", data, a)
        if atype & 0x7FFF == TCA_STATS2:
            b, bstop = a + 4, a + alen
            while b + 4 <= bstop:
                blen, btype = unpack("HH", data, b)
                if btype == TCA_STATS_QUEUE:
                    return unpack("I", data, b + 8)[0]  # after qlen
                b += (blen + 3) & ~3
            return None
        a += (alen + 3) & ~3
    return None
