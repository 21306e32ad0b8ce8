"""The forwarding fast path: a router's IPv4 forwarding done by a tc program on its ports' ingress.

Every forwarded packet used to climb the full IP stack of each router namespace it crossed: the
route input, the netfilter forward hook (where nftables puts it in its class and marks ECN), the
output path. The program (kernel/fastprog.py) does the part that costs and changes nothing:

- it asks the kernel's own FIB (`bpf_fib_lookup`) for the egress port and the next hop's MAC
  addresses, for a destination with one next hop (one with several is left to the stack, below);
- it puts the packet in its traffic class by DSCP, as the nftables classify chain does
  (skb->priority = 1:(0x10+tc));
- it lowers the TTL, rewrites the Ethernet header and sends the packet to the egress port's
  transmit (a packet still charged to its sender's socket as a clone, see the end of the
  program). The packet then passes that port's clsact egress and qdiscs like any other: HTB,
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
import os
import struct

from labctl import switches
from labctl.errors import LabError
from labctl.kernel import ebpf, fastprog, rtnl
from labctl.kernel.fastprog import CLASSES
from labctl.plan import qos
from labctl.plan.model import Node

ENV = "LABCTL_FORWARDING"
MODES = ("auto", "fast", "slow")
NAME, MARKING_MAP, COUNT_MAP = "labctl_fwd", "labctl_fwd_ecn", "labctl_fwd_n"
PREF = 100                  # last on the port's ingress: the flow hash and lb counters come first
MULTIPATH_MAP, MULTIPATH_ENTRIES = "labctl_fwd_mp", 1024
SLOT_SIZE = 16              # u32 n (mark with probability n/65536), u32 unused, u64 packets marked


def mode() -> str:
    """auto (the fast path where the program loads), fast (an error where it does not) or slow."""
    return switches.choice(ENV, MODES, "a forwarding path")


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
                fds.append(ebpf.load_program(fastprog.program([1], {0: (0, qos.class_handle(0))}, *fds), NAME))
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
        return ebpf.load_program(fastprog.program([i.index for i in node.interfaces], dscp_priorities(node),
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
                                protocol=ebpf.ETH_P_IP, pref=PREF, flags=rtnl.ENSURE)
