"""Queue depths and counters of every qdisc in a namespace, from one raw RTM_GETQDISC dump.

A qdisc dump returns every device's qdiscs whatever ifindex is asked for, so one dump
per namespace per poll gives every class's leaf: backlog (bytes queued), drops, bytes and packets
sent. Parsed by hand: pyroute2 takes ~50x longer per dump.
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from labctl.kernel import rtnl

RTM_GETQDISC = 38
TCA_STATS2 = 7
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
    header = struct.pack("IHHII", 16 + 20, RTM_GETQDISC, rtnl.NLM_F_REQUEST | rtnl.NLM_F_DUMP, seq, 0)
    sock.sendall(header + struct.pack("BxxxiIII", socket.AF_UNSPEC, 0, 0, 0, 0))
    chunks = []
    while True:
        data = sock.recv(1 << 20)
        chunks.append(data)
        off = 0
        while off + 16 <= len(data):
            length, kind = struct.unpack_from("IH", data, off)
            if kind in (rtnl.NLMSG_DONE, rtnl.NLMSG_ERROR):
                return chunks
            off += rtnl._align(length)


def parse_dump(chunks: list[bytes]) -> list[QueueStats]:
    out: list[QueueStats] = []
    for data in chunks:
        off = 0
        while off + 16 <= len(data):
            length, kind, _f, _s, _p = struct.unpack_from("IHHII", data, off)
            if kind == rtnl.NLMSG_DONE:
                return out
            if kind == rtnl.NLMSG_ERROR:
                raise rtnl.NetlinkError(-struct.unpack_from("i", data, off + 16)[0], "qdisc dump")
            _fam, ifindex, handle, _parent, _info = struct.unpack_from("BxxxiIII", data, off + 16)
            attrs = rtnl.parse_attrs(data[off:off + length], 36)
            qkind = attrs.get(rtnl.TCA_KIND, b"").rstrip(b"\0").decode()
            stats = rtnl.parse_attrs(attrs.get(TCA_STATS2, b""), 0)
            basic = stats.get(TCA_STATS_BASIC, b"")
            nbytes, npkts = struct.unpack_from("QI", basic) if len(basic) >= 12 else (0, 0)
            queue = stats.get(TCA_STATS_QUEUE, b"")
            qlen, backlog, drops, _req, over = struct.unpack_from("5I", queue) if len(queue) >= 20 else (0,) * 5
            out.append(QueueStats(ifindex, handle, qkind, backlog, qlen, drops, nbytes, npkts, over))
            off += rtnl._align(length)
    return out


NLM_F_ECHO = 0x8


def get_messages(wanted: set[tuple[int, int]]) -> tuple[list[bytes], list[tuple[int, int]]]:
    """An RTM_GETQDISC GET per queue of `wanted` (by handle, NLM_F_ECHO so the reply is unicast),
    in key order, each numbered by its place in that order."""
    keys = sorted(wanted)
    return [struct.pack("IHHII", 36, RTM_GETQDISC, rtnl.NLM_F_REQUEST | NLM_F_ECHO, k, 0)
            + struct.pack("BxxxiIII", socket.AF_UNSPEC, ifindex, major << 16, 0, 0)
            for k, (ifindex, major) in enumerate(keys)], keys


def backlogs_get(sock: socket.socket, request: tuple[bytes, list], expect: int | None = None) -> dict[tuple[int, int], int]:
    """Backlogs of exactly the queues in a prepared request (get_messages joined, with its keys):
    the kernel serialises only those. `expect`: how many GETs the buffer holds, if not one per key."""
    buf, keys = request
    unpack = struct.unpack_from
    sock.sendall(buf)
    out: dict[tuple[int, int], int] = {}
    while len(out) < (len(keys) if expect is None else expect):
        data = sock.recv(1 << 20)
        off, end = 0, len(data)
        while off + 16 <= end:
            length, kind, _flags, seq = unpack("IHHI", data, off)
            if kind == rtnl.NLMSG_ERROR:
                code = -unpack("i", data, off + 16)[0]
                if code:
                    raise rtnl.NetlinkError(code, "qdisc get")
                off += (length + 3) & ~3
                continue
            backlog = _backlog(data, off + 36, off + length)
            if backlog is not None:
                out[keys[seq]] = backlog
            off += (length + 3) & ~3
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
