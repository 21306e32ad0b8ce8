"""ECN marking in the data path: every packet marked on the queue depth it meets, in the kernel.

The controller's marking (dataplane/ecn.py) sets a probability per port and class from the depth
it last read, and the packets meet that probability until its next read: up to a millisecond and
a read's cost later, and in 16 steps. A switch marks on the depth each packet finds. Here a
switch port does the same, with two tc programs per port and one array map per switch:

- on the port's egress, before the packet enters its class queue, the **marking program** finds
  the class from the DSCP (the classify chain's own map), takes the class's depth from the map,
  marks an ECT packet CE with the RED-like probability of that depth (0 below Kmin, rising to
  Pmax at Kmax, 1 above: qos.marking_probability), and adds the packet's length to what arrived;
- on the ingress of the port at the far end of the link (a neighbour's port, a host's NIC, or a
  WAN line's near port), the **departure program** adds the length to what left.

So a class's depth is what entered the queue and has not reached the far end: the queue itself,
plus the few frames between the queue and the neighbour's receive (a veth hands a frame over in
the same call, the neighbour's CPU backlog holds it briefly). A frame lost between the two
counters (a lossy class's full queue) would stay counted: the controller, which still reads
queues for PFC, puts the estimate back on the backlog it reads whenever the two disagree by more
than `SLACK` (`Queues.resync`).

Each (port, class) has a 48-byte value in that map (its layout and the programs: ecnprog.py),
mapped into the controller's memory. The controller writes the profile (and `labctl tc set`
through it); `up` writes the plan's.

    LABCTL_ECN_MARKING=auto|datapath|controller   (auto: the data path where the programs load)
"""
from __future__ import annotations

import mmap
import os
import struct
import sys
from typing import TYPE_CHECKING

from labctl import switches
from labctl.errors import LabError
from labctl.kernel import ebpf, nsutil, rtnl
from labctl.kernel.ecnprog import CLASSES, KMIN, MARKS, VALUE, depart_program, mark_program, profile

if TYPE_CHECKING:
    import numpy as np
from labctl.plan import qos
from labctl.plan.model import LabPlan, Node
from labctl.plan.share import carries_agent

ENV = "LABCTL_ECN_MARKING"
MODES = ("auto", "datapath", "controller")
MAP, MARK, DEPART = "labctl_ecnq", "labctl_ecnmark", "labctl_ecndep"
PREF_MARK = PREF_DEPART = 4   # after the arrival counter (egress 1) and lb's counters (2, 3); before the fast path (ingress 100)
HANDLE = 1
# Two full-size jumbo frames: what may sit between a queue and its neighbour's receive when the
# controller reads it, so a difference below this is the wire, not a lost frame
SLACK = 2 * 9216


def mode() -> str:
    return switches.choice(ENV, MODES, "a way of marking ECN")


_AVAILABLE: list[bool] = []


def available() -> bool:
    """Whether this kernel loads both programs (asked once, with a throwaway map)."""
    if not _AVAILABLE:
        ok = ebpf.supported() and sys.byteorder == "little"
        fds = []
        if ok:
            try:
                fds.append(ebpf.array_map(CLASSES, VALUE, MAP, mmapable=True))
                fds.append(ebpf.load_program(mark_program(fds[0], {1: 0}, {26: 3}), MARK))
                fds.append(ebpf.load_program(depart_program(fds[0], {1: 0}, {26: 3}), DEPART))
            except ebpf.BpfError:
                ok = False
            finally:
                for fd in fds:
                    os.close(fd)
        _AVAILABLE.append(ok)
    return _AVAILABLE[0]


def dscp_classes(node: Node) -> dict[int, int]:
    """DSCP -> traffic class as the node's classify chain maps them (kernel/nft.py)."""
    if not node.interfaces or not node.interfaces[0].shaping.classes:
        return {}
    specs = [{"tc": c.tc, "dscp": c.dscp} for c in node.interfaces[0].shaping.classes]
    return dict(qos.dscp_map(specs))


def far_end(plan: LabPlan, node: Node, iface) -> tuple[str, int] | None:
    """(namespace, ifindex) of the port that receives what `iface` sends, if labctl made it."""
    link = plan.links[iface.link] if 0 <= iface.link < len(plan.links) else None
    if link is not None and link.wire is not None:
        mine = f"{node.name}:{iface.name}"
        return (link.wire.near, link.wire.near_index) if link.a == mine else (link.wire.far, link.wire.far_index)
    peer = next((n for n in plan.nodes if n.name == iface.peer_node), None)
    if peer is None:
        return None
    port = next((i for i in peer.interfaces if i.name == iface.peer_iface), None)
    return (peer.namespace, port.index) if port is not None else None


def marking_nodes(plan: LabPlan) -> list[tuple[Node, list[tuple[str, int] | None]]]:
    """Switching nodes with an ECN class whose every port's far end labctl made, with those ends."""
    out = []
    for node in plan.nodes:
        if not (node.switching and any(c.ecn for i in node.interfaces for c in i.shaping.classes)):
            continue
        if carries_agent(node):          # its own agent marks (an exported lab's, plan/share.py)
            continue
        ends = [far_end(plan, node, i) for i in node.interfaces]
        if all(e is not None for e in ends):
            out.append((node, ends))
    return out


def wire(plan: LabPlan, settings) -> list[str]:
    """At `up`: the programs on every marking node's ports and their far ends, and the plan's
    profiles (`settings(node, iface, cls)`: control.PortSettings). The names of the nodes that mark
    in the data path; the others are left to the controller's marking."""
    if mode() == "controller":
        return []
    done = []
    for node, ends in marking_nodes(plan):
        try:
            _wire_node(node, ends, settings)
        except (ebpf.BpfError, rtnl.NetlinkError) as exc:
            if mode() == "datapath":
                raise LabError(f"{node.name}: ECN marking in the data path failed: {exc}",
                               f"unset {ENV} (auto leaves the marking to the controller)") from None
            continue
        done.append(node.name)
    return done


def _wire_node(node: Node, ends: list[tuple[str, int]], settings) -> None:
    classes = dscp_classes(node)
    fd = ebpf.array_map(len(node.interfaces) * CLASSES, VALUE, MAP, mmapable=True)
    progs: list[int] = []
    try:
        for k, iface in enumerate(node.interfaces):
            for c in iface.shaping.classes:
                s = settings(node, iface, c)
                value = bytes(KMIN) + profile(s.kmin, s.kmax, s.pmax, s.ecn) + bytes(8)
                ebpf.update(fd, struct.pack("=I", k * CLASSES + c.tc), value)
        progs.append(ebpf.load_program(mark_program(fd, {i.index: k * CLASSES for k, i in enumerate(node.interfaces)},
                                                    classes), MARK))
        by_ns: dict[str, list[tuple[int, int, bool, str]]] = {
            node.namespace: [(i.index, progs[0], False, f"{node.name}:{i.name}") for i in node.interfaces]}
        # far ends in other namespaces may share an ifindex: one departure program per set of distinct ones
        groups: list[dict[int, int]] = []
        placed = []
        for k, (iface, (ns, index)) in enumerate(zip(node.interfaces, ends)):
            group = next((g for g in groups if index not in g), None)
            if group is None:
                groups.append(group := {})
            group[index] = k * CLASSES
            placed.append((iface, ns, index, group))
        departs = [ebpf.load_program(depart_program(fd, g, classes), DEPART) for g in groups]
        progs.extend(departs)
        for iface, ns, index, group in placed:
            prog = departs[next(n for n, g in enumerate(groups) if g is group)]
            by_ns.setdefault(ns, []).append((index, prog, True, f"far end of {node.name}:{iface.name}"))
        for ns, ports in by_ns.items():
            with nsutil.netlink_socket(ns) as sock:
                batch = rtnl.Batch(sock)
                for index, prog, ingress, where in ports:
                    name, what = (DEPART, "ECN departures") if ingress else (MARK, "ECN marking")
                    for request, text in ebpf.clsact_requests(
                            index, prog, name, where, what, ingress=ingress, protocol=ebpf.ETH_P_IP,
                            pref=PREF_DEPART if ingress else PREF_MARK, handle=HANDLE, flags=rtnl.ENSURE):
                        batch.add(request, text)
                batch.commit()
    finally:
        for p in progs:
            os.close(p)             # the filters hold the programs, the programs the map
        os.close(fd)


class Queues:
    """A marking node's slots, mapped into memory: profiles written, depths and marks read."""

    def __init__(self, node: Node, fd: int, writable: bool = False):
        self.node, self.fd = node, fd
        self.places = {i.index: k for k, i in enumerate(node.interfaces)}
        entries = len(node.interfaces) * CLASSES
        size = -(-entries * VALUE // mmap.PAGESIZE) * mmap.PAGESIZE
        self.mem = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
        import numpy as np      # here, not at the top: every labctl command imports this module
        # one row of six 64-bit words per slot: arrived, departed, offset, (kmin, span), (pmax, on), marks
        self.rows = np.frombuffer(self.mem, dtype=np.int64, count=entries * VALUE // 8).reshape(entries, VALUE // 8)
        self.corrections = 0

    def row(self, ifindex: int, tc: int) -> int:
        return self.places[ifindex] * CLASSES + tc

    def set_profile(self, ifindex: int, tc: int, kmin: int, kmax: int, pmax: float, on: bool) -> None:
        at = self.row(ifindex, tc) * VALUE
        self.mem[at + KMIN:at + MARKS] = profile(kmin, kmax, pmax, on)

    def depth(self, ifindex: int, tc: int) -> int:
        arrived, departed, offset = self.rows[self.row(ifindex, tc), :3]
        return int(arrived - departed - offset)

    def counts(self) -> np.ndarray:
        """What arrived and departed on every slot now: taken before a read of the backlogs, for `resync`."""
        return self.rows[:, :2].copy()

    def resync(self, ifindex: int, tc: int, backlog: int, before: np.ndarray) -> bool:
        """Put the estimate back on a `backlog` read after the counts `before` were taken, where they
        cannot be the same queue: what arrived and has not departed exceeds the backlog by more than
        the wire holds (`SLACK`) even taking the counts least in its favour (a frame lost after it
        was counted in), or the offset is past what could be missing (one that overshot). True if it
        changed the offset."""
        k = self.row(ifindex, tc)
        arrived, departed, offset = (int(v) for v in self.rows[k, :3])
        low = int(before[k, 0]) - departed - backlog      # the least arrived-less-departed could exceed it by
        high = arrived - int(before[k, 1]) - backlog      # and the most
        if low - offset > SLACK:
            new = low
        elif offset - high > SLACK:
            new = high
        else:
            return False
        self.rows[k, 2] = new
        self.corrections += 1
        return True

    def marked(self) -> dict[tuple[int, int], int]:
        out = {}
        for iface in self.node.interfaces:
            for tc in range(CLASSES):
                count = int(self.rows[self.row(iface.index, tc), MARKS // 8])
                if count:
                    out[(iface.index, tc)] = count
        return out

    def add_to(self, marks: dict[str, int]) -> dict[str, int]:
        """CE counts by counter name (telemetry/nftcounters.read_marks) with the programs' added."""
        return qos.add_marks(marks, self.marked())

    def close(self) -> None:
        self.rows = None
        self.mem.close()
        os.close(self.fd)


def open_queues(sock, node: Node, writable: bool = False) -> Queues | None:
    """The slots of a node that marks in the data path (its marking program found on a port), else None."""
    for i in node.interfaces:
        prog = ebpf.attached(sock, i.index, ingress=False, pref=PREF_MARK)
        if prog is None:
            continue
        found = ebpf.program_maps(prog)
        fd = found.pop(MAP, None)
        for other in found.values():
            os.close(other)
        if fd is not None:
            return Queues(node, fd, writable)
    return None
