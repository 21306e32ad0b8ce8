"""Load-balancing modes in the kernel's data path: every router's programs, wired at `up` and
changed while the lab runs (`labctl lb`), and what they remember, read back for `labctl route`.

On each router of a lab with `lb:` (plan/lb.py):

- its flow-hash program (kernel/flowhash.py) on the ingress of every port, for its mode;
- on each uplink (a port of its multipath next hops), an egress counter that adds every IPv4
  frame's length to the uplink's depth as the frame enters the queue;
- on each port whose far end is such an uplink, an ingress counter that takes the length away
  again as the frame arrives.

So an uplink's depth is what entered its queue and has not reached the far end yet: the queue
and the wire, and it grows while PFC holds the queue. One array map per router holds its depths
(value: adaptive's last pick, then one signed 64-bit depth per uplink), whatever its
mode, so that `labctl route` can show them and a change to `adaptive` finds them counting. A frame
lost between the two counters (a lossy class's full queue, a WAN line's loss) stays counted: the
depth is then an upper bound, and `labctl route` shows it.
"""
from __future__ import annotations

import os
import struct

from labctl.errors import LabError
from labctl.kernel import ebpf, fastpath, flowhash, nsutil, rtnl
from labctl.kernel.ebpf import (ADD_K, ATOMIC_ADD_DW, BPF_FUNC_MAP_LOOKUP_ELEM, CALL, EXIT, JEQ_K, LDX_W, MOV_K,
                                MOV_X, NEG, R0, R1, R2, R6, R10, SKB_LEN, STX_W, TC_ACT_UNSPEC, Asm)
from labctl.plan.flowhash import FlowHash
from labctl.plan.model import LabPlan, Node

DEPTH_MAP, COUNTER = "labctl_depth", "labctl_depth"
HANDLE = 1                          # a fixed handle: setting a mode again replaces the filter
PREF_HASH, PREF_DRAIN, PREF_QUEUE = flowhash.PREF, 2, 3    # egress pref 1 is the controller's
ENSURE = rtnl.ENSURE


def counter_program(map_fd: int, slot: int, sign: int) -> bytes:
    """depths[1 + slot] += sign x skb->len (atomically: every CPU forwards)."""
    a = Asm()
    a.op(MOV_X, R6, R1)
    a.op(MOV_K, R1, imm=0)
    a.op(STX_W, R10, R1, -4)
    a.ld_map(R1, map_fd)
    a.op(MOV_X, R2, R10)
    a.op(ADD_K, R2, imm=-4)
    a.op(CALL, imm=BPF_FUNC_MAP_LOOKUP_ELEM)
    a.jump(JEQ_K, R0, "out", imm=0)
    a.op(LDX_W, R1, R6, SKB_LEN)
    if sign < 0:
        a.op(NEG, R1)
    a.op(ATOMIC_ADD_DW, R0, R1, 8 * (1 + slot))
    a.label("out")
    a.op(MOV_K, R0, imm=TC_ACT_UNSPEC)
    a.op(EXIT)
    return a.assemble()


def routers(plan: LabPlan) -> list[Node]:
    """The routers whose programs labctl runs for their lb: mode."""
    return [n for n in plan.nodes if n.flow_hash is not None and n.flow_hash.mode is not None]


def uplinks(plan: LabPlan) -> dict[tuple[str, str], tuple[str, int]]:
    """(router, port) of every uplink -> (that router, its place among the router's uplinks)."""
    return {(n.name, port): (n.name, k) for n in routers(plan) for k, port in enumerate(n.flow_hash.group)}


def wire(plan: LabPlan) -> None:
    """At `up`: every router's programs and depth counters (see the module's docstring)."""
    mine = routers(plan)
    if not mine:
        return
    ups = uplinks(plan)
    far = {(n.name, i.name): ups[(i.peer_node, i.peer_iface)] for n in mine for i in n.interfaces
           if (i.peer_node, i.peer_iface) in ups}
    maps: dict[str, int] = {}
    try:
        for n in mine:
            if n.flow_hash.group:
                maps[n.name] = ebpf.array_map(1, 8 * (1 + len(n.flow_hash.group)), DEPTH_MAP)
        for n in mine:
            _attach(n, maps, ups, far)
    except ebpf.BpfError as exc:
        raise LabError(f"the kernel refused labctl's load-balancing counters: {exc}",
                       "a lab with routing.lb needs eBPF (Linux 5.5+, as root); without lb: the kernel's "
                       "ECMP hash needs none") from None
    finally:
        for fd in maps.values():
            os.close(fd)


def _attach(node: Node, maps: dict[str, int], ups: dict, far: dict) -> None:
    fds = []
    try:
        with nsutil.netlink_socket(node.namespace) as sock:
            batch = rtnl.Batch(sock)
            fds.append(flowhash.load(node.flow_hash, maps.get(node.name), node.routes))
            for i in node.interfaces:
                where = f"{node.name}:{i.name}"
                _add(batch, i.index, fds[0], where, "flow hash", True, PREF_HASH, flowhash.NAME)
                if (node.name, i.name) in ups:
                    owner, slot = ups[(node.name, i.name)]
                    fds.append(ebpf.load_program(counter_program(maps[owner], slot, +1), COUNTER))
                    _add(batch, i.index, fds[-1], where, "uplink depth (queued)", False, PREF_QUEUE, COUNTER)
                if (node.name, i.name) in far:
                    owner, slot = far[(node.name, i.name)]
                    fds.append(ebpf.load_program(counter_program(maps[owner], slot, -1), COUNTER))
                    _add(batch, i.index, fds[-1], where, "far uplink depth (arrived)", True, PREF_DRAIN, COUNTER)
            try:
                batch.commit()
            except rtnl.NetlinkError as exc:
                raise LabError(f"{exc.what} failed: {os.strerror(exc.code)}") from None
    finally:
        for fd in fds:
            os.close(fd)           # the filters hold the programs, the programs their maps


def _add(batch: rtnl.Batch, index: int, fd: int, where: str, what: str, ingress: bool, pref: int, name: str):
    for request, text in ebpf.clsact_requests(index, fd, name, where, what, ingress=ingress,
                                              protocol=ebpf.ETH_P_IP, pref=pref, handle=HANDLE, flags=ENSURE):
        batch.add(request, text)


def set_mode(node: Node, fh: FlowHash) -> None:
    """A running router's mode, changed: its flow-hash program replaced on every port (a flowlet
    or spray program starts with no flow remembered; the depths go on counting)."""
    if node.flow_hash is None or node.flow_hash.mode is None:
        raise LabError(f"{node.name} does not run labctl's load-balancing program",
                       "name lb: in the lab file (routing.lb: ecmp keeps today's hashing) and build it again")
    depth = None
    try:
        with nsutil.netlink_socket(node.namespace) as sock:
            maps = _maps_of(sock, node, PREF_QUEUE, ingress=False)
            try:
                depth = maps.pop(DEPTH_MAP, None)
                prog = flowhash.load(fh, depth, node.routes)
            finally:
                for fd in maps.values():
                    os.close(fd)
            try:
                batch = rtnl.Batch(sock)
                for i in node.interfaces:
                    _add(batch, i.index, prog, f"{node.name}:{i.name}", "flow hash", True, PREF_HASH, flowhash.NAME)
                batch.commit()
            except rtnl.NetlinkError as exc:
                raise LabError(f"{exc.what} failed: {os.strerror(exc.code)}") from None
            finally:
                os.close(prog)
    finally:
        if depth is not None:
            os.close(depth)
    node.flow_hash = fh


def note_multipath(node: Node, routes: list) -> None:
    """Routes labctl just wrote (netconf.replace_routes): their multipath destinations into an
    adaptive router's map, as for the fast path (fastmaps.note_multipath)."""
    prefixes = [r.dst for r in routes if len(r.nexthops) > 1]
    if not prefixes or node.flow_hash is None or node.flow_hash.mode != "adaptive":
        return
    with nsutil.netlink_socket(node.namespace) as sock:
        found = _maps_of(sock, node, PREF_HASH, ingress=True)
    try:
        if fastpath.MULTIPATH_MAP in found:
            fastpath.add_multipath(found[fastpath.MULTIPATH_MAP], prefixes)
    finally:
        for fd in found.values():
            os.close(fd)


def _maps_of(sock, node: Node, pref: int, ingress: bool) -> dict[str, int]:
    """The maps of the program at `pref` on the first port that has one (uplink counters sit on
    the uplinks, the flow hash on every port)."""
    ports = [node.iface(p) for p in node.flow_hash.group] if pref == PREF_QUEUE else node.interfaces
    for i in ports:
        prog = ebpf.attached(sock, i.index, ingress=ingress, pref=pref)
        if prog is not None:
            return ebpf.program_maps(prog)
    return {}


def depths(node: Node) -> tuple[int, list[int]] | None:
    """(adaptive's last pick; bytes in each uplink's queue and wire now, in the group's order), or
    None without counters."""
    if not node.flow_hash or not node.flow_hash.group:
        return None
    with nsutil.netlink_socket(node.namespace) as sock:
        maps = _maps_of(sock, node, PREF_QUEUE, ingress=False)
    try:
        fd = maps.get(DEPTH_MAP)
        n = len(node.flow_hash.group)
        raw = ebpf.lookup(fd, struct.pack("=I", 0), 8 * (1 + n)) if fd is not None else None
        if not raw:
            return None
        turn, *values = struct.unpack(f"=Q{n}q", raw)
        return turn, values
    finally:
        for fd in maps.values():
            os.close(fd)


def flow_state(node: Node, key: int) -> tuple[int, int] | None:
    """(last seen, CLOCK_MONOTONIC ns; packets or flowlet number) the router's flowlet or spray
    program holds for the flow whose own hash is `key`, or None if it holds none."""
    with nsutil.netlink_socket(node.namespace) as sock:
        maps = _maps_of(sock, node, PREF_HASH, ingress=True)
    try:
        fd = maps.get(flowhash.FLOW_MAP)
        raw = ebpf.lookup(fd, struct.pack("=I", key), flowhash.FLOW_VALUE) if fd is not None else None
        return struct.unpack("=QQ", raw) if raw else None
    finally:
        for fd in maps.values():
            os.close(fd)
