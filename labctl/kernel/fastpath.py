"""The forwarding fast path: a router's IPv4 forwarding done by a tc program on its ports' ingress.

Every forwarded packet used to climb the full IP stack of each router namespace it crossed: the
route input, the netfilter forward hook (where nftables puts it in its class and marks ECN), the
output path. The program below does the part that costs and changes nothing:

- it asks the kernel's own FIB (`bpf_fib_lookup`, with the packet's 5-tuple, so an ECMP route
  picks the next hop the kernel's multipath hash would: policy, fields and seed included) for the
  egress port and the next hop's MAC addresses;
- it puts the packet in its traffic class by DSCP, as the nftables classify chain does
  (skb->priority = 1:(0x10+tc));
- it lowers the TTL, rewrites the Ethernet header and sends the packet to the egress port's
  transmit (as a clone, see the end of the program). The packet then passes that port's clsact egress and qdiscs like any other: HTB,
  the class leaves, PFC's TBF, the arrival counters are exactly those of the slow path.

It also marks ECN as the nftables rules of a slow-path router do (dataplane/ecn.py): an ECT(0) or
ECT(1) packet of a class becomes CE with the probability n/65536 that the controller keeps, per
egress port and class, in the program's marking map, and the map counts the marks. The controller
writes n into that map through memory, and still rewrites the nftables chain, which marks what
the router's IP stack forwards.

Whatever it does not handle goes on up the stack (TC_ACT_UNSPEC), unchanged: not IPv4, IP
options, a fragment, neither TCP nor UDP (ICMP, whose errors the kernel hashes by the inner
header), a TTL about to expire, a packet not addressed to this router, a route the FIB answers
with anything but a forwarded next hop with a known neighbour, an egress port that is not one of
the lab's. Such a packet is never ECN-marked by a fast-path router.

A packet whose route has several next hops takes the slow path. The kernel's custom hash
(policy 3, the 5-tuple and the lab's seed) hashes a forwarded packet and a FIB lookup differently:
the packet's hash is mixed once more with its inner header's, the lookup's is not. So on its own the
program would send a flow up a different spine than the kernel, than `labctl route` predicts, and
than the lab's seed draws. The program therefore keeps the router's multipath destinations in an
LPM map, written from the plan's routes at `up` and again whenever labctl replaces them. A
destination it finds there goes up the stack and takes the spine the kernel's hash picks. In a
leaf-spine that is the hop from a leaf up to the spines; the hops down from a spine and from a
leaf to a host take the fast path.

Routers whose hash is labctl's own program (an `lb:` mode, `te:` marks, or the `bpf` hash engine
of kernels before 6.11) keep the slow path: bpf_fib_lookup hashes the 5-tuple with the kernel's
function, not the hash the program gave the packet. So do routers whose routes labctl does not
write (FRR, or `exec:` lines that may add their own).
"""
from __future__ import annotations

import ipaddress
import mmap
import os
import struct

from labctl.errors import LabError
from labctl.kernel import ebpf, nsutil, rtnl
from labctl.kernel.ebpf import (ADD_K, ADD_X, AND_K, ATOMIC_ADD_DW, BE, BPF_FUNC_CLONE_REDIRECT,
                                BPF_FUNC_FIB_LOOKUP, BPF_FUNC_GET_PRANDOM_U32, BPF_FUNC_MAP_LOOKUP_ELEM,
                                CALL, EXIT, JA, JEQ_K, JGE_X, JGT_X, JLT_K, JNE_K, LDX_B, LDX_H, LDX_W, MOV_K, MOV_X, OR_X, R0, R1, R2, R3, R4, R6, R7, R8, R9, R10,
                                RSH_K, SKB_DATA, SKB_DATA_END, SKB_IFINDEX, SKB_PKT_TYPE, SKB_PRIORITY,
                                STX_B, STX_DW, STX_H, STX_W, TC_ACT_SHOT, TC_ACT_STOLEN, TC_ACT_UNSPEC, Asm)
from labctl.plan import qos
from labctl.plan.model import Node

ENV = "LABCTL_FORWARDING"
MODES = ("auto", "fast", "slow")
NAME, MARKING_MAP, COUNT_MAP = "labctl_fwd", "labctl_fwd_ecn", "labctl_fwd_n"
PREF = 100                  # last on the port's ingress: the flow hash and lb counters come first
ETH, IP_LEN = 14, 20
PARAMS = -64                # struct bpf_fib_lookup (linux/bpf.h), 64 bytes, on the stack
KEY, SLOT, DRAW, PREFIX = -72, -76, -80, -88
MULTIPATH_MAP, MULTIPATH_ENTRIES = "labctl_fwd_mp", 1024
CLASSES = 8                 # marking slots per port, one per traffic class
SLOT_SIZE = 16              # u32 n (mark with probability n/65536), u32 unused, u64 packets marked
AF_INET = 2
FIB_SUCCESS = 0             # BPF_FIB_LKUP_RET_SUCCESS
# clsact may be there already (the flow hash's): add or keep it, add the filter
ENSURE = rtnl.NLM_F_REQUEST | rtnl.NLM_F_ACK | rtnl.NLM_F_CREATE


def mode() -> str:
    """auto (the fast path where the program loads), fast (an error where it does not) or slow."""
    wanted = os.environ.get(ENV, "auto") or "auto"
    if wanted not in MODES:
        raise LabError(f"{ENV}={wanted!r} is not a forwarding path",
                       f"set {ENV} to one of {', '.join(MODES)} (or leave it unset: auto)")
    return wanted


def eligible(node: Node) -> bool:
    """Whether this node's forwarding can take the fast path: an IPv4 router (not a bridge) whose
    ECMP is the kernel's hash, on a CPU whose bpf() labctl knows."""
    return (node.forwarding and not node.bridged and node.flow_hash is None and node.static_routes
            and not node.exec and bool(node.interfaces))


def wanted(node: Node) -> bool:
    return mode() != "slow" and eligible(node) and (available() or mode() == "fast")


_AVAILABLE: list[bool] = []


def available() -> bool:
    """Whether this kernel loads the program (bpf_fib_lookup and bpf_redirect from tc, 4.18+):
    asked once, with throwaway maps."""
    if not _AVAILABLE:
        ok = ebpf.supported()
        if ok:
            fds = []
            try:
                fds = [marking_map(1), ebpf.array_map(1, 8, COUNT_MAP), multipath_map([])]
                fds.append(ebpf.load_program(program([1], {0: (0, qos.class_handle(0))}, *fds), NAME))
            except ebpf.BpfError:
                ok = False
            finally:
                for fd in fds:
                    os.close(fd)
        _AVAILABLE.append(ok)
    return _AVAILABLE[0]


def marking_map(ports: int) -> int:
    """The marking slots of a router with `ports` ports: CLASSES per port, in its ports' order,
    mapped into memory by the controller (which writes n) and the samplers (which read the counts)."""
    return ebpf.array_map(ports * CLASSES, SLOT_SIZE, MARKING_MAP, mmapable=True)


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
        for (ifindex, tc), count in self.marked().items():
            name = qos.ce_counter_name(ifindex, tc)
            marks[name] = marks.get(name, 0) + count
        return marks

    def close(self) -> None:
        self.mem.close()
        os.close(self.fd)


def open_marking(sock, node: Node, writable: bool = False) -> Marking | None:
    """The marking slots of a router on the fast path (its program found on its ports), else None."""
    found = maps(sock, node) if eligible(node) else {}
    fd = found.pop(MARKING_MAP, None)
    for other in found.values():
        os.close(other)
    return Marking(node, fd, writable) if fd is not None else None


def dscp_priorities(node: Node) -> dict[int, tuple[int, int]]:
    """DSCP → (traffic class, skb->priority) as the classify chain maps them (kernel/nft.py)."""
    if not node.interfaces or not node.interfaces[0].shaping.classes:
        return {}
    specs = [{"tc": c.tc, "dscp": c.dscp} for c in node.interfaces[0].shaping.classes]
    return {d: (tc, qos.class_handle(tc)) for d, tc in qos.dscp_map(specs).items()}


def multipath_map(routes: list) -> int:
    """The LPM map of a router's destinations with several next hops (plan Routes), filled."""
    multipath = [r.dst for r in routes if len(r.nexthops) > 1]
    fd = ebpf.lpm_map(max(MULTIPATH_ENTRIES, len(multipath)), 4, 1, MULTIPATH_MAP)
    try:
        add_multipath(fd, multipath)
    except ebpf.BpfError:
        os.close(fd)
        raise
    return fd


def add_multipath(fd: int, prefixes: list[str]) -> None:
    for dst in prefixes:
        net = ipaddress.ip_network(dst, strict=False)
        ebpf.update(fd, struct.pack("=I", net.prefixlen) + net.network_address.packed, b"\1")


def program(ports: list[int], classes: dict[int, tuple[int, int]], marking_fd: int, count_fd: int,
            multipath_fd: int) -> bytes:
    """The program for a router with lab ports `ports` (ifindexes) and DSCP → (tc, priority) `classes`."""
    a = Asm()
    a.op(MOV_X, R6, R1)

    def packet(check: int):
        """R7, R8: the frame's start and end, and at least `check` bytes of it, else the slow path."""
        a.op(LDX_W, R7, R6, SKB_DATA)
        a.op(LDX_W, R8, R6, SKB_DATA_END)
        a.op(MOV_X, R2, R7)
        a.op(ADD_K, R2, imm=check)
        a.jump(JGT_X, R2, "slow", src=R8)

    packet(ETH + IP_LEN + 4)
    a.op(LDX_W, R2, R6, SKB_PKT_TYPE)           # PACKET_HOST: addressed to this router
    a.jump(JNE_K, R2, "slow", imm=0)
    a.op(LDX_H, R2, R7, 12)
    a.op(BE, R2, imm=16)
    a.jump(JNE_K, R2, "slow", imm=0x0800)
    a.op(LDX_B, R2, R7, ETH)
    a.jump(JNE_K, R2, "slow", imm=0x45)         # IPv4 without options
    a.op(LDX_B, R2, R7, ETH + 8)
    a.jump(JLT_K, R2, "slow", imm=2)            # the kernel sends the time-exceeded error
    a.op(LDX_H, R2, R7, ETH + 6)
    a.op(BE, R2, imm=16)
    a.op(AND_K, R2, imm=0x3FFF)                 # more fragments, or not the first
    a.jump(JNE_K, R2, "slow", imm=0)
    a.op(LDX_B, R9, R7, ETH + 9)                # protocol
    a.jump(JEQ_K, R9, "l4", imm=6)
    a.jump(JNE_K, R9, "slow", imm=17)
    a.label("l4")
    # a destination with several next hops: the kernel's hash picks (see above)
    a.op(MOV_K, R1, imm=32)
    a.op(STX_W, R10, R1, PREFIX)
    a.op(LDX_W, R1, R7, ETH + 16)
    a.op(STX_W, R10, R1, PREFIX + 4)
    a.ld_map(R1, multipath_fd)
    a.op(MOV_X, R2, R10)
    a.op(ADD_K, R2, imm=PREFIX)
    a.op(CALL, imm=BPF_FUNC_MAP_LOOKUP_ELEM)
    a.jump(JNE_K, R0, "slow", imm=0)
    packet(ETH + IP_LEN + 4)
    a.op(LDX_B, R9, R7, ETH + 9)
    # struct bpf_fib_lookup: zeroed, then family, protocol, ports, tot_len, ifindex, tos, addresses
    a.op(MOV_K, R1, imm=0)
    for off in range(PARAMS, 0, 8):
        a.op(STX_DW, R10, R1, off)
    a.op(MOV_K, R1, imm=AF_INET)
    a.op(STX_B, R10, R1, PARAMS)
    a.op(STX_B, R10, R9, PARAMS + 1)
    a.op(LDX_H, R1, R7, ETH + IP_LEN)           # source port, as on the wire
    a.op(STX_H, R10, R1, PARAMS + 2)
    a.op(LDX_H, R1, R7, ETH + IP_LEN + 2)       # destination port
    a.op(STX_H, R10, R1, PARAMS + 4)
    a.op(LDX_H, R1, R7, ETH + 2)                # total length, in host order: the MTU check's
    a.op(BE, R1, imm=16)
    a.op(STX_H, R10, R1, PARAMS + 6)
    a.op(LDX_W, R1, R6, SKB_IFINDEX)
    a.op(STX_W, R10, R1, PARAMS + 8)
    a.op(LDX_B, R1, R7, ETH + 1)
    a.op(STX_B, R10, R1, PARAMS + 12)
    a.op(LDX_W, R1, R7, ETH + 12)
    a.op(STX_W, R10, R1, PARAMS + 16)
    a.op(LDX_W, R1, R7, ETH + 16)
    a.op(STX_W, R10, R1, PARAMS + 32)
    a.op(MOV_X, R1, R6)
    a.op(MOV_X, R2, R10)
    a.op(ADD_K, R2, imm=PARAMS)
    a.op(MOV_K, R3, imm=64)
    a.op(MOV_K, R4, imm=0)
    a.op(CALL, imm=BPF_FUNC_FIB_LOOKUP)
    a.jump(JNE_K, R0, "slow", imm=FIB_SUCCESS)
    a.op(LDX_W, R9, R10, PARAMS + 8)            # the egress port: one of the lab's, else the stack's
    for k, index in enumerate(ports):
        a.jump(JEQ_K, R9, f"port{k}", imm=index)
    a.jump(JA, 0, "slow")
    for k in range(len(ports)):
        a.label(f"port{k}")
        a.op(MOV_K, R1, imm=k * CLASSES)
        a.op(STX_W, R10, R1, SLOT)              # the port's first slot in the marking map
        a.jump(JA, 0, "port")
    a.label("port")
    packet(ETH + IP_LEN)
    if classes:
        a.op(LDX_B, R2, R7, ETH + 1)            # DSCP and ECN
        a.op(MOV_X, R3, R2)
        a.op(RSH_K, R3, imm=2)
        for dscp in sorted(classes):
            a.jump(JEQ_K, R3, f"dscp{dscp}", imm=dscp)
        a.jump(JA, 0, "forward")
        for dscp, (tc, priority) in sorted(classes.items()):
            a.label(f"dscp{dscp}")
            a.op(MOV_K, R1, imm=priority)
            a.op(STX_W, R6, R1, SKB_PRIORITY)
            a.op(AND_K, R2, imm=3)
            a.jump(JEQ_K, R2, "forward", imm=0)         # not ECN-capable: never marked
            a.jump(JEQ_K, R2, "forward", imm=3)         # CE already (nftables' rule matched ect0, ect1)
            a.op(MOV_K, R3, imm=tc)
            a.jump(JA, 0, "marking")
        # R3 the class: mark CE with the probability n/65536 the controller keeps in the port's
        # slot for it, as its nftables rule does on a slow-path router (dataplane/ecn.py)
        a.label("marking")
        a.op(LDX_W, R1, R10, SLOT)
        a.op(ADD_X, R1, R3)
        a.op(STX_W, R10, R1, KEY)
        a.op(CALL, imm=BPF_FUNC_GET_PRANDOM_U32)
        a.op(AND_K, R0, imm=0xFFFF)
        a.op(STX_W, R10, R0, DRAW)
        a.ld_map(R1, marking_fd)
        a.op(MOV_X, R2, R10)
        a.op(ADD_K, R2, imm=KEY)
        a.op(CALL, imm=BPF_FUNC_MAP_LOOKUP_ELEM)
        a.jump(JEQ_K, R0, "forward", imm=0)     # (an array map always answers in bounds)
        a.op(LDX_W, R1, R0, 0)                  # n
        a.op(LDX_W, R2, R10, DRAW)
        a.jump(JGE_X, R2, "forward", src=R1)    # draw >= n: not this one (n = 65536 marks all)
        a.op(MOV_X, R4, R0)
        packet(ETH + IP_LEN)
        # IP_ECN_set_ce(): ECT(0) or ECT(1) becomes CE, and the checksum follows (network order)
        a.op(LDX_B, R2, R7, ETH + 1)
        a.op(MOV_X, R3, R2)
        a.op(ADD_K, R3, imm=1)
        a.op(AND_K, R3, imm=3)                  # 3 for ECT(0), 2 for ECT(1)
        a.op(ebpf.OR_K, R2, imm=3)
        a.op(STX_B, R7, R2, ETH + 1)
        a.op(LDX_H, R1, R7, ETH + 10)
        a.op(BE, R1, imm=16)
        a.op(ADD_K, R1, imm=0xFFFB)
        a.op(ADD_X, R1, R3)
        a.jump(JLT_K, R1, "ce_sum", imm=0xFFFF)
        a.op(ADD_K, R1, imm=1)
        a.label("ce_sum")
        a.op(BE, R1, imm=16)
        a.op(STX_H, R7, R1, ETH + 10)
        a.op(MOV_K, R1, imm=1)
        a.op(ATOMIC_ADD_DW, R4, R1, 8)          # the slot's CE count
        a.label("forward")
        packet(ETH + IP_LEN)
    # TTL - 1, and the checksum as ip_decrease_ttl() updates it (in network order here)
    a.op(LDX_B, R1, R7, ETH + 8)
    a.op(ADD_K, R1, imm=-1)
    a.op(STX_B, R7, R1, ETH + 8)
    a.op(LDX_H, R1, R7, ETH + 10)
    a.op(BE, R1, imm=16)
    a.op(ADD_K, R1, imm=0x0100)
    a.jump(JLT_K, R1, "sum", imm=0xFFFF)
    a.op(ADD_K, R1, imm=1)
    a.label("sum")
    a.op(BE, R1, imm=16)                        # back to network order, the low 16 bits
    a.op(STX_H, R7, R1, ETH + 10)
    # the next hop's MAC addresses: dmac at 58, smac at 52 of the lookup's answer
    a.op(LDX_H, R1, R10, PARAMS + 58)
    a.op(STX_H, R7, R1, 0)
    a.op(LDX_W, R1, R10, PARAMS + 60)
    a.op(STX_W, R7, R1, 2)
    a.op(LDX_W, R1, R10, PARAMS + 52)
    a.op(STX_W, R7, R1, 6)
    a.op(LDX_H, R1, R10, PARAMS + 56)
    a.op(STX_H, R7, R1, 10)
    # count it (key 0 of the count map), then out by the egress port's transmit
    a.op(MOV_K, R1, imm=0)
    a.op(STX_W, R10, R1, KEY)
    a.ld_map(R1, count_fd)
    a.op(MOV_X, R2, R10)
    a.op(ADD_K, R2, imm=KEY)
    a.op(CALL, imm=BPF_FUNC_MAP_LOOKUP_ELEM)
    a.jump(JEQ_K, R0, "redirect", imm=0)
    a.op(MOV_K, R1, imm=1)
    a.op(ATOMIC_ADD_DW, R0, R1, 0)
    a.label("redirect")
    # a clone leaves, the packet itself is consumed: the clone carries no socket, so the sender's
    # send buffer is released here, as ip_rcv() releases it on the slow path. A plain redirect keeps
    # the packet charged to its sender's socket until a receiving host's IP stack: a queue in the
    # fabric then blocked the sender at its socket's send buffer, a back-pressure no switch exerts.
    a.op(MOV_X, R1, R6)
    a.op(MOV_X, R2, R9)
    a.op(MOV_K, R3, imm=0)
    a.op(CALL, imm=BPF_FUNC_CLONE_REDIRECT)
    a.jump(JNE_K, R0, "lost", imm=0)
    a.op(MOV_K, R0, imm=TC_ACT_STOLEN)
    a.op(EXIT)
    a.label("lost")                             # no memory for the clone: a drop, counted as one
    a.op(MOV_K, R0, imm=TC_ACT_SHOT)
    a.op(EXIT)
    a.label("slow")
    a.op(MOV_K, R0, imm=TC_ACT_UNSPEC)
    a.op(EXIT)
    return a.assemble()


def load(node: Node) -> int | None:
    """The node's program, loaded (a descriptor the caller closes once its ports hold it), or None
    where the slow path stays: not wanted, or (in auto) refused by this kernel."""
    if not wanted(node):
        return None
    marking = count = multipath = None
    try:
        marking = marking_map(len(node.interfaces))
        count = ebpf.array_map(1, 8, COUNT_MAP)
        multipath = multipath_map(node.routes)
        return ebpf.load_program(program([i.index for i in node.interfaces], dscp_priorities(node),
                                         marking, count, multipath), NAME)
    except ebpf.BpfError as exc:
        if mode() == "fast":
            raise LabError(f"{node.name}: the kernel refused the forwarding fast path: {exc}",
                           f"unset {ENV} (auto falls back to the kernel's forwarding) or set it to slow") from None
        return None
    finally:
        for fd in (marking, count, multipath):
            if fd is not None:
                os.close(fd)


def port_requests(index: int, fd: int, where: str) -> list[tuple[tuple[int, int, bytes], str]]:
    """The program on a port's ingress, after anything labctl puts there before it."""
    return ebpf.clsact_requests(index, fd, NAME, where, "forwarding fast path", ingress=True,
                                protocol=ebpf.ETH_P_IP, pref=PREF, flags=ENSURE)


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
    if not prefixes or not eligible(node):
        return
    with nsutil.netlink_socket(node.namespace) as sock:
        found = maps(sock, node)
    try:
        if MULTIPATH_MAP in found:
            add_multipath(found[MULTIPATH_MAP], prefixes)
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
