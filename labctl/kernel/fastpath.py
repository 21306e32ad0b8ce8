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

Whatever it does not handle goes on up the stack (TC_ACT_UNSPEC), unchanged: not IPv4, IP
options, a fragment, neither TCP nor UDP (ICMP, whose errors the kernel hashes by the inner
header), a TTL about to expire, a packet not addressed to this router, a route the FIB answers
with anything but a forwarded next hop with a known neighbour, an egress port that is not one of
the lab's. And an ECN-capable packet whose egress class is marking right now: ECN marking stays in
nftables (dataplane/ecn.py), with its probability and counters, and the controller flags each
(port, class) it has set marking in this program's map, so those packets take the slow path
while the flag is up.

One hash for both paths. For the kernel's hash (6.11+, the seed settable) labctl's slow path uses
the custom policy 3 over the 5-tuple, and that policy hashes a forwarded packet and a FIB lookup
differently (the packet's hash is mixed once more with its inner header's). Policy 1 hashes both
from the same five fields, but it takes a forwarded packet's hash as it is when one is set, and
RPS or the sending socket set a random one. So a fast-path router hashes with policy 1 and its
program clears the packet's hash before it hands a packet up the stack: whichever path a packet
takes, and for `labctl route` (the kernel's `ip route get`), the next hop is the same function of
the 5-tuple and the lab's seed.

Routers whose hash is labctl's own program (an `lb:` mode, `te:` marks, or the `bpf` hash engine
of kernels before 6.11) keep the slow path: bpf_fib_lookup hashes the 5-tuple with the kernel's
function, not the hash the program gave the packet.
"""
from __future__ import annotations

import os
import struct

from labctl.errors import LabError
from labctl.kernel import ebpf, nsutil, rtnl
from labctl.kernel.ebpf import (ADD_K, AND_K, ATOMIC_ADD_DW, BE, BPF_FUNC_FIB_LOOKUP, BPF_FUNC_MAP_LOOKUP_ELEM,
                                BPF_FUNC_CLONE_REDIRECT, BPF_FUNC_SET_HASH_INVALID, CALL, EXIT, JA, JEQ_K, JGE_K, JGT_X, JLT_K, JNE_K, LDX_B,
                                LDX_H, LDX_W, MOV_K, MOV_X, OR_X, R0, R1, R2, R3, R4, R6, R7, R8, R9, R10,
                                RSH_K, SKB_DATA, SKB_DATA_END, SKB_IFINDEX, SKB_PKT_TYPE, SKB_PRIORITY,
                                STX_B, STX_DW, STX_H, STX_W, TC_ACT_SHOT, TC_ACT_STOLEN, TC_ACT_UNSPEC, Asm)
from labctl.plan import qos
from labctl.plan.model import Node

ENV = "LABCTL_FORWARDING"
MODES = ("auto", "fast", "slow")
NAME, MARKING_MAP, COUNT_MAP = "labctl_fwd", "labctl_fwd_ecn", "labctl_fwd_n"
PREF = 100                  # last on the port's ingress: the flow hash and lb counters come first
MARKING_ENTRIES = 1 << 14
ETH, IP_LEN = 14, 20
PARAMS = -64                # struct bpf_fib_lookup (linux/bpf.h), 64 bytes, on the stack
KEY = -72
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
    return node.forwarding and not node.bridged and node.flow_hash is None and bool(node.interfaces)


def wanted(node: Node) -> bool:
    return mode() != "slow" and eligible(node) and (available() or mode() == "fast")


def adopt(plan) -> None:
    """Policy 1 instead of the custom 5-tuple policy on the routers that take the fast path (see
    above); an L3 hash (policy 0) is the same on both paths and stays."""
    if mode() == "slow" or not available():
        return
    for node in plan.nodes:
        if eligible(node) and node.sysctls.get("net.ipv4.fib_multipath_hash_policy") == "3":
            node.sysctls = {k: v for k, v in node.sysctls.items() if k != "net.ipv4.fib_multipath_hash_fields"}
            node.sysctls["net.ipv4.fib_multipath_hash_policy"] = "1"


_AVAILABLE: list[bool] = []


def available() -> bool:
    """Whether this kernel loads the program (bpf_fib_lookup and bpf_redirect from tc, 4.18+):
    asked once, with throwaway maps."""
    if not _AVAILABLE:
        ok = ebpf.supported()
        if ok:
            fds = []
            try:
                fds = [ebpf.hash_map(1, 4, 4, MARKING_MAP), ebpf.array_map(1, 8, COUNT_MAP)]
                fds.append(ebpf.load_program(program([1], {0: (0, qos.class_handle(0))}, fds[0], fds[1]), NAME))
            except ebpf.BpfError:
                ok = False
            finally:
                for fd in fds:
                    os.close(fd)
        _AVAILABLE.append(ok)
    return _AVAILABLE[0]


def marking_key(ifindex: int, tc: int) -> int:
    return ifindex << 4 | tc


def dscp_priorities(node: Node) -> dict[int, tuple[int, int]]:
    """DSCP → (traffic class, skb->priority) as the classify chain maps them (kernel/nft.py)."""
    if not node.interfaces or not node.interfaces[0].shaping.classes:
        return {}
    specs = [{"tc": c.tc, "dscp": c.dscp} for c in node.interfaces[0].shaping.classes]
    return {d: (tc, qos.class_handle(tc)) for d, tc in qos.dscp_map(specs).items()}


def program(ports: list[int], classes: dict[int, tuple[int, int]], marking_fd: int, count_fd: int) -> bytes:
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
    for index in ports:
        a.jump(JEQ_K, R9, "port", imm=index)
    a.jump(JA, 0, "slow")
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
            a.op(MOV_K, R3, imm=tc)
            a.jump(JA, 0, "marking")
        a.label("marking")                      # R9 egress port, R3 class: is it marking now?
        a.op(MOV_X, R1, R9)
        a.op(ebpf.LSH_K, R1, imm=4)
        a.op(OR_X, R1, R3)
        a.op(STX_W, R10, R1, KEY)
        a.ld_map(R1, marking_fd)
        a.op(MOV_X, R2, R10)
        a.op(ADD_K, R2, imm=KEY)
        a.op(CALL, imm=BPF_FUNC_MAP_LOOKUP_ELEM)
        a.jump(JEQ_K, R0, "forward", imm=0)
        a.op(LDX_W, R1, R0, 0)
        a.jump(JNE_K, R1, "slow", imm=0)
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
    a.op(MOV_X, R1, R6)
    a.op(CALL, imm=BPF_FUNC_SET_HASH_INVALID)
    a.op(MOV_K, R0, imm=TC_ACT_UNSPEC)
    a.op(EXIT)
    return a.assemble()


def load(node: Node) -> int | None:
    """The node's program, loaded (a descriptor the caller closes once its ports hold it), or None
    where the slow path stays: not wanted, or (in auto) refused by this kernel."""
    if not wanted(node):
        return None
    marking = count = None
    try:
        marking = ebpf.hash_map(MARKING_ENTRIES, 4, 4, MARKING_MAP)
        count = ebpf.array_map(1, 8, COUNT_MAP)
        return ebpf.load_program(program([i.index for i in node.interfaces], dscp_priorities(node),
                                         marking, count), NAME)
    except ebpf.BpfError as exc:
        if mode() == "fast":
            raise LabError(f"{node.name}: the kernel refused the forwarding fast path: {exc}",
                           f"unset {ENV} (auto falls back to the kernel's forwarding) or set it to slow") from None
        return None
    finally:
        for fd in (marking, count):
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


def set_marking(fd: int, ifindex: int, tc: int, marking: bool) -> None:
    """Flag (or clear) a port's class as marking now: its ECN-capable packets take the slow path."""
    ebpf.update(fd, struct.pack("=I", marking_key(ifindex, tc)), struct.pack("=I", int(marking)))


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
