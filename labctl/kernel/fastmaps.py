"""A running router's fast-path maps (kernel/fastpath.py): its marking slots, which the controller
writes and the samplers read through memory, its multipath destinations, and what it forwarded."""
from __future__ import annotations

import mmap
import os
import struct

from labctl.kernel import ebpf, fastpath, nsutil
from labctl.kernel.fastpath import CLASSES, COUNT_MAP, MARKING_MAP, MULTIPATH_MAP, PREF, SLOT_SIZE
from labctl.plan import qos
from labctl.plan.model import Node


def slot(node: Node, ifindex: int, tc: int) -> int:
    """A (port, class)'s place in the node's marking map."""
    k = next(k for k, i in enumerate(node.interfaces) if i.index == ifindex)
    return k * CLASSES + tc


class Marking:
    """A running router's marking slots, mapped into memory: n written, counts read, no system call."""

    def __init__(self, node: Node, fd: int, writable: bool = False):
        self.node, self.fd = node, fd
        size = -(-len(node.interfaces) * CLASSES * SLOT_SIZE // mmap.PAGESIZE) * mmap.PAGESIZE
        self.mem = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))

    def set(self, ifindex: int, tc: int, n: int) -> None:
        struct.pack_into("=I", self.mem, slot(self.node, ifindex, tc) * SLOT_SIZE, n)

    def marked(self) -> dict[tuple[int, int], int]:
        """(ifindex, tc) -> CE marks the program made, for every slot that made any."""
        out = {}
        for k, iface in enumerate(self.node.interfaces):
            for tc in range(CLASSES):
                count = struct.unpack_from("=Q", self.mem, ((k * CLASSES + tc) * SLOT_SIZE) + 8)[0]
                if count:
                    out[(iface.index, tc)] = count
        return out

    def add_to(self, marks: dict[str, int]) -> dict[str, int]:
        """nftables' CE counts by counter name (telemetry/nftcounters.read_marks) with the program's added."""
        return qos.add_marks(marks, self.marked())

    def close(self) -> None:
        self.mem.close()
        os.close(self.fd)


def open_marking(sock, node: Node, writable: bool = False) -> Marking | None:
    """The marking slots of a router on the fast path (its program found on its ports), else None."""
    found = maps(sock, node) if fastpath.eligible(node) else {}
    fd = found.pop(MARKING_MAP, None)
    for other in found.values():
        os.close(other)
    return Marking(node, fd, writable) if fd is not None else None


def maps(sock, node: Node) -> dict[str, int]:
    """The fast path's maps on a running router (descriptors the caller closes), or {} on the slow path."""
    for i in node.interfaces:
        prog = ebpf.attached(sock, i.index, ingress=True, pref=PREF)
        if prog is not None:
            return ebpf.program_maps(prog)
    return {}


def note_multipath(node: Node, routes: list) -> None:
    """Routes labctl just wrote (netconf.replace_routes): their multipath destinations into the
    program's map. A destination that became single-path stays listed and takes the slow path,
    which picks the same next hop."""
    prefixes = [r.dst for r in routes if len(r.nexthops) > 1]
    if not prefixes or not fastpath.eligible(node):
        return
    with nsutil.netlink_socket(node.namespace) as sock:
        found = maps(sock, node)
    try:
        if MULTIPATH_MAP in found:
            fastpath.add_multipath(found[MULTIPATH_MAP], prefixes)
    finally:
        for fd in found.values():
            os.close(fd)


def forwarded(node: Node) -> int | None:
    """Packets the node's fast path has forwarded, or None if it runs the slow path."""
    with nsutil.netlink_socket(node.namespace) as sock:
        found = maps(sock, node)
    try:
        fd = found.get(COUNT_MAP)
        raw = ebpf.lookup(fd, struct.pack("=I", 0), 8) if fd is not None else None
        return struct.unpack("=Q", raw)[0] if raw else None
    finally:
        for fd in found.values():
            os.close(fd)
