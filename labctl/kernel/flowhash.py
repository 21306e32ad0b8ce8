"""The kernel side of labctl's own ECMP flow hash (plan/flowhash.py says why and what it computes).

Three parts: which hash a lab uses on this machine (`engine`), the tc program that sets each
packet's hash on a router's ports (assembled here as eBPF instructions and loaded with the bpf()
system call: no compiler is needed, and the function stays the one plan/flowhash.py computes),
and the route lookup that applies it (`next_hop`) for `labctl route`.
"""
from __future__ import annotations

import os
import platform
import socket

from labctl.kernel import ebpf, fastpath, rtnl, temark
from labctl.kernel.ebpf import (ADD_K, ADD_X, AND_K, AND_X, ARSH_K, BE, BPF_ANY, BPF_FUNC_KTIME_GET_NS,
                                  BPF_FUNC_MAP_LOOKUP_ELEM, BPF_FUNC_MAP_UPDATE_ELEM, BPF_FUNC_SET_HASH,
                                  BPF_FUNC_SKB_LOAD_BYTES, CALL, EXIT, JA, JEQ_K, JGE_K, JGT_X, JLT_K, JNE_K,
                                  JSGT_X, LDX_B, LDX_DW, LDX_H, LDX_W, LSH_K, MOD_K, MOV_K, MOV_X, MUL_K, MUL_X,
                                  OR_X, R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10, RSH_K, SKB_DATA,
                                  SKB_DATA_END, STX_DW, STX_W, SUB_K, SUB_X, TC_ACT_UNSPEC, XOR_X, Asm, _s32)
from labctl import switches
from labctl.errors import LabError
from labctl.plan.flowhash import (FINAL_STEPS, GOLDEN, ROCE_PORT, WEYL, FlowHash, hash32, initial, select,
                                  select_in_group, spray_slots, steer_targets)

ENV = "LABCTL_ECMP_HASH"
ENGINES = ("auto", "kernel", "bpf")
SEED_SYSCTL = "/proc/sys/net/ipv4/fib_multipath_hash_seed"


def engine() -> str:
    """"kernel" (the kernel's hash with its seed fixed) or "bpf" (labctl's): `auto` picks the
    kernel's where it has a settable seed (6.11+), and LABCTL_ECMP_HASH can force either."""
    wanted = switches.choice(ENV, ENGINES, "an ECMP hash engine")
    if wanted != "auto":
        return wanted
    if os.path.exists(SEED_SYSCTL) or not ebpf.supported():
        return "kernel"
    return "bpf"


def adopt(plan, hash_policy: int, hash_seed: int) -> None:
    """Give the plan's routers labctl's hash if this machine uses it: policy 1, under which the
    kernel places a forwarded packet by the L4 hash the program set (policy 3 would ignore it)."""
    if engine() != "bpf":
        return
    for node in plan.nodes:
        if not node.forwarding or node.bridged or node.flow_hash is not None:
            continue                            # a router with an lb: mode has its hash already
        node.flow_hash = FlowHash(l4=hash_policy == 1, seed=hash_seed)
        node.sysctls = {k: v for k, v in node.sysctls.items()
                        if k not in ("net.ipv4.fib_multipath_hash_fields", "net.ipv4.fib_multipath_hash_seed")}
        node.sysctls["net.ipv4.fib_multipath_hash_policy"] = "1"


# --- the program -------------------------------------------------------------------------------
ETH, IP_MIN, UDP_LEN = 14, 20, 8
FLOWS = 4096                # flows a router remembers for flowlet and spray (least recently seen go)
NAME, FLOW_MAP = "labctl_ecmp", "labctl_flows"
FLOW_VALUE = 16             # u64 last seen (ns), u64 packets (spray) or flowlet number (flowlet)
# the stack: the hash's state before the finaliser, the flow's key, now, a new flow's value
SAVED, KEY, NOW, NEW = -8, -16, -24, -40


def program(fh: FlowHash, flows_fd: int | None = None, depth_fd: int | None = None,
            multipath_fd: int | None = None) -> bytes:
    """The tc program: parse Ethernet/IPv4 (and TCP/UDP ports when hashing L4, and a RoCEv2
    packet's BTH destination QP in ecmp-qp) with the bounds checks the verifier wants, hash as
    plan/flowhash computes it for the router's mode, bpf_set_hash(), carry on. flowlet and spray
    keep each flow's state in `flows_fd` (an LRU hash map, FLOW_VALUE bytes under the flow's own
    32-bit hash); adaptive reads the router's uplink depths from `depth_fd` (kernel/lb.py), and
    takes its turn only for a destination in `multipath_fd` (an LPM map of the router's
    destinations with several next hops: kernel/fastpath.multipath_map)."""
    a = Asm()
    mode = fh.mode or "ecmp"

    def absorb(reg: int):
        a.op(XOR_X, R9, reg)
        a.ld64(R1, GOLDEN)
        a.op(MUL_X, R9, R1)
        a.op(MOV_X, R0, R9)
        a.op(RSH_K, R0, imm=32)
        a.op(XOR_X, R9, R0)

    def finalise():
        for shift, multiplier in FINAL_STEPS:
            a.op(MOV_X, R0, R9)
            a.op(RSH_K, R0, imm=shift)
            a.op(XOR_X, R9, R0)
            if multiplier:
                a.ld64(R1, multiplier)
                a.op(MUL_X, R9, R1)

    def lookup(map_fd: int, key_at: int):
        a.ld_map(R1, map_fd)
        a.op(MOV_X, R2, R10)
        a.op(ADD_K, R2, imm=key_at)
        a.op(CALL, imm=BPF_FUNC_MAP_LOOKUP_ELEM)

    a.op(MOV_X, R6, R1)
    a.op(LDX_W, R7, R6, SKB_DATA)
    a.op(LDX_W, R8, R6, SKB_DATA_END)
    a.op(MOV_X, R2, R7)
    a.op(ADD_K, R2, imm=ETH + IP_MIN)
    a.jump(JGT_X, R2, "out", src=R8)
    a.op(LDX_B, R2, R7, 12)                     # ethertype, byte by byte: no endianness to mind
    a.op(LDX_B, R3, R7, 13)
    a.op(LSH_K, R2, imm=8)
    a.op(OR_X, R2, R3)
    a.jump(JNE_K, R2, "out", imm=0x0800)
    a.op(LDX_B, R2, R7, ETH)                    # version and header length
    a.op(MOV_X, R3, R2)
    a.op(RSH_K, R3, imm=4)
    a.jump(JNE_K, R3, "out", imm=4)
    a.op(AND_K, R2, imm=0x0F)
    a.jump(JLT_K, R2, "out", imm=5)
    a.op(LSH_K, R2, imm=2)                      # IP header bytes, 20..60
    if fh.te:
        temark.emit(a, fh, ETH)
    a.ld64(R9, initial(fh))
    for offset in (ETH + 12, ETH + 16):         # source, destination address
        a.op(LDX_W, R3, R7, offset)
        a.op(BE, R3, imm=32)
        absorb(R3)
    if fh.l4:
        a.op(LDX_B, R4, R7, ETH + 9)            # protocol
        a.op(MOV_K, R5, imm=0)                  # ports: none unless TCP/UDP, unfragmented
        a.jump(JEQ_K, R4, "ports", imm=6)
        a.jump(JEQ_K, R4, "ports", imm=17)
        a.jump(JA, 0, "mix")
        a.label("ports")
        a.op(LDX_H, R3, R7, ETH + 6)            # flags and fragment offset
        a.op(BE, R3, imm=16)
        a.op(AND_K, R3, imm=0x3FFF)             # more fragments, or not the first
        a.jump(JNE_K, R3, "mix", imm=0)
        a.op(MOV_X, R3, R7)
        a.op(ADD_X, R3, R2)
        a.op(ADD_K, R3, imm=ETH)
        a.op(MOV_X, R0, R3)
        a.op(ADD_K, R0, imm=4)
        a.jump(JGT_X, R0, "mix", src=R8)
        a.op(LDX_W, R5, R3, 0)                  # source and destination port
        a.op(BE, R5, imm=32)
        a.label("mix")
        absorb(R4)
        absorb(R5)
        if mode == "ecmp-qp":
            # RoCEv2 (ports read, so unfragmented UDP, to 4791): BTH bytes 4..7 are a reserved byte
            # and the destination QP. skb_load_bytes, not the packet pointer: a segment of a GSO
            # send may hold its payload, BTH included, outside the linear part the pointer covers
            a.op(MOV_X, R3, R5)
            a.op(AND_K, R3, imm=0xFFFF)
            a.jump(JNE_K, R3, "hashed", imm=ROCE_PORT)
            a.jump(JNE_K, R4, "hashed", imm=17)
            a.op(MOV_X, R1, R6)
            a.op(ADD_K, R2, imm=ETH + UDP_LEN + 4)
            a.op(MOV_X, R3, R10)
            a.op(ADD_K, R3, imm=KEY)
            a.op(MOV_K, R4, imm=4)
            a.op(CALL, imm=BPF_FUNC_SKB_LOAD_BYTES)
            a.jump(JNE_K, R0, "hashed", imm=0)
            a.op(LDX_W, R3, R10, KEY)
            a.op(BE, R3, imm=32)
            a.op(AND_K, R3, imm=0xFFFFFF)
            absorb(R3)
            a.label("hashed")
    if mode == "flowlet":
        _flowlet(a, fh, flows_fd, absorb, finalise, lookup)
    elif mode == "spray":
        _spray(a, fh, flows_fd, finalise, lookup)
    elif mode == "adaptive":
        _adaptive(a, fh, depth_fd, finalise, lookup, multipath_fd)
    else:
        finalise()
    a.label("set")
    a.op(MOV_X, R1, R6)
    a.op(MOV_X, R2, R9)                         # the helper takes the low 32 bits
    a.op(CALL, imm=BPF_FUNC_SET_HASH)
    a.label("out")
    a.op(MOV_K, R0, imm=TC_ACT_UNSPEC)
    a.op(EXIT)
    return a.assemble()


def _new_flow(a: Asm, flows_fd: int, last_from: int | None, count: int):
    """A flow the map does not hold yet: {last seen, count} under its key."""
    if last_from is None:
        a.op(MOV_K, R1, imm=0)
    else:
        a.op(LDX_DW, R1, R10, last_from)
    a.op(STX_DW, R10, R1, NEW)
    a.op(MOV_K, R1, imm=count)
    a.op(STX_DW, R10, R1, NEW + 8)
    a.ld_map(R1, flows_fd)
    a.op(MOV_X, R2, R10)
    a.op(ADD_K, R2, imm=KEY)
    a.op(MOV_X, R3, R10)
    a.op(ADD_K, R3, imm=NEW)
    a.op(MOV_K, R4, imm=BPF_ANY)
    a.op(CALL, imm=BPF_FUNC_MAP_UPDATE_ELEM)


def _flowlet(a: Asm, fh: FlowHash, flows_fd: int, absorb, finalise, lookup):
    """A flow whose last packet is more than the gap ago starts a new flowlet (its number + 1),
    and the flowlet number goes into the hash: flowlet_hash."""
    a.op(STX_DW, R10, R9, SAVED)
    finalise()
    a.op(STX_W, R10, R9, KEY)                   # the flow's own hash: its key
    a.op(CALL, imm=BPF_FUNC_KTIME_GET_NS)
    a.op(STX_DW, R10, R0, NOW)
    lookup(flows_fd, KEY)
    a.jump(JNE_K, R0, "known", imm=0)
    _new_flow(a, flows_fd, NOW, 0)
    a.op(MOV_K, R3, imm=0)
    a.jump(JA, 0, "salted")
    a.label("known")
    a.op(LDX_DW, R1, R0, 0)                     # last seen
    a.op(LDX_DW, R2, R10, NOW)
    a.op(STX_DW, R0, R2, 0)
    a.op(SUB_X, R2, R1)
    a.op(LDX_DW, R3, R0, 8)                     # the flowlet number
    a.ld64(R4, fh.gap_ns)
    a.jump(JSGT_X, R2, "gap", src=R4)
    a.jump(JA, 0, "salted")
    a.label("gap")
    a.op(ADD_K, R3, imm=1)
    a.op(STX_DW, R0, R3, 8)
    a.label("salted")
    a.op(LDX_DW, R9, R10, SAVED)
    absorb(R3)
    finalise()


def _spray(a: Asm, fh: FlowHash, flows_fd: int, finalise, lookup):
    """Packet k of a flow: uplink (key + k) mod n where the router has one set of uplinks, else
    the flow's hash + k x WEYL (spray_hash)."""
    finalise()
    a.op(STX_W, R10, R9, KEY)
    lookup(flows_fd, KEY)
    a.jump(JNE_K, R0, "known", imm=0)
    _new_flow(a, flows_fd, None, 1)
    a.op(MOV_K, R3, imm=0)
    a.jump(JA, 0, "step")
    a.label("known")
    a.op(LDX_DW, R3, R0, 8)
    a.op(MOV_X, R4, R3)
    a.op(ADD_K, R4, imm=1)
    a.op(STX_DW, R0, R4, 8)
    a.label("step")
    if not fh.group:
        a.op(MUL_K, R3, imm=_s32(WEYL))         # sign-extended, but the low 32 bits are k x WEYL
        a.op(ADD_X, R9, R3)
        return
    slots = spray_slots(fh.weights)
    a.op(LDX_W, R4, R10, KEY)                   # the key, zero-extended
    a.op(ADD_X, R3, R4)
    a.op(MOD_K, R3, imm=len(slots))
    _steer(a, slots, R3)


def _steer(a: Asm, targets: list[int], reg: int):
    """R9 = targets[reg]: the hash that sends a packet where `reg` says (steer_targets)."""
    for k, target in enumerate(targets):
        a.jump(JNE_K, reg, f"not{k}", imm=k)
        a.ld64(R9, target)
        a.jump(JA, 0, "set")
        a.label(f"not{k}")


def _adaptive(a: Asm, fh: FlowHash, depth_fd: int, finalise, lookup, multipath_fd: int | None):
    """The uplink with the fewest bytes queued (adaptive_pick): depths[1 + k] are what entered
    uplink k's queue less what reached its far end; depths[0] is the last pick, after which the
    scan starts (ties go round). Branch-free minimum, so the verifier walks one path whatever n is.
    A packet to a destination with one next hop (down to a host, or an answer coming back from a
    spine) keeps its flow's hash and leaves the turn alone: counted, each ICMP error a receiver
    sent back moved the turn on, and with idle uplinks one flow took every other spine."""
    n = len(fh.group)
    if multipath_fd is not None:
        a.op(MOV_K, R1, imm=32)
        a.op(STX_W, R10, R1, NEW)
        a.op(LDX_W, R1, R7, ETH + 16)           # the destination (checked in bounds above)
        a.op(STX_W, R10, R1, NEW + 4)
        lookup(multipath_fd, NEW)
        a.jump(JNE_K, R0, "multipath", imm=0)
        finalise()
        a.jump(JA, 0, "set")
        a.label("multipath")
    finalise()                                  # without the map: the flow's own hash
    a.op(MOV_K, R1, imm=0)
    a.op(STX_W, R10, R1, KEY)
    lookup(depth_fd, KEY)
    a.jump(JEQ_K, R0, "set", imm=0)
    a.op(MOV_X, R7, R0)                         # the packet pointers are done with
    a.op(LDX_DW, R3, R7, 0)                     # the last pick: the scan starts after it
    a.op(ADD_K, R3, imm=1)
    a.op(MOD_K, R3, imm=n)
    a.jump(JGE_K, R3, "set", imm=n)             # never: it tells the verifier R3 < n
    a.op(MOV_X, R4, R3)                         # best
    a.op(MOV_X, R1, R3)
    a.op(LSH_K, R1, imm=3)
    a.op(ADD_X, R1, R7)
    a.op(LDX_DW, R5, R1, 8)                     # its depth
    for i in range(1, n):
        a.op(MOV_X, R1, R3)
        a.op(ADD_K, R1, imm=i)
        a.jump(JLT_K, R1, f"in{i}", imm=n)
        a.op(SUB_K, R1, imm=n)
        a.label(f"in{i}")
        a.op(MOV_X, R2, R1)
        a.op(LSH_K, R2, imm=3)
        a.op(ADD_X, R2, R7)
        a.op(LDX_DW, R0, R2, 8)
        a.op(SUB_X, R0, R5)                     # depth - best depth
        a.op(MOV_X, R2, R0)
        a.op(ARSH_K, R2, imm=63)                # all ones where this one is shallower
        a.op(AND_X, R0, R2)
        a.op(ADD_X, R5, R0)                     # best depth = min
        a.op(XOR_X, R1, R4)
        a.op(AND_X, R1, R2)
        a.op(XOR_X, R4, R1)                     # best = this one where shallower
    a.op(STX_DW, R7, R4, 0)
    _steer(a, steer_targets(fh.weights), R4)


def load(fh: FlowHash, depth_fd: int | None = None, routes: list = ()) -> int:
    """The program for `fh`, loaded: a descriptor the caller closes once filters hold it. flowlet
    and spray get a flow map of their own (the program holds it); adaptive reads `depth_fd`, and
    gets the multipath destinations of `routes` (plan Routes) in a map of its own."""
    if not ebpf.supported():
        raise LabError(f"labctl's ECMP hash cannot load on a {platform.machine()} CPU",
                       f"set {ENV}=kernel (the kernel's hash, with a seed random per boot before 6.11)")
    flows = None
    try:
        if fh.mode in ("flowlet", "spray"):
            flows = ebpf.lru_map(FLOWS, 4, FLOW_VALUE, FLOW_MAP)
        elif fh.mode == "adaptive":
            flows = fastpath.multipath_map(routes)
            return ebpf.load_program(program(fh, None, depth_fd, flows), NAME)
        return ebpf.load_program(program(fh, flows, depth_fd), NAME)
    except ebpf.BpfError as exc:
        if fh.mode is not None:
            raise LabError(f"the kernel refused labctl's load-balancing program ({fh.mode}): {exc}",
                           "a lab with routing.lb needs labctl's program on every router; without the "
                           "lb: key the kernel's own hash does ECMP") from None
        raise LabError(f"the kernel refused labctl's ECMP hash program: {exc}",
                       f"set {ENV}=kernel to use the kernel's hash (seed random per boot before 6.11)") from None
    finally:
        if flows is not None:
            os.close(flows)


# --- attaching it ------------------------------------------------------------------------------
PREF = 1                    # first on the port's ingress, before anything that redirects


def port_requests(index: int, fd: int, where: str) -> list[tuple[tuple[int, int, bytes], str]]:
    """clsact on a port and the program on its ingress (`tc filter add … ingress bpf da`)."""
    return ebpf.clsact_requests(index, fd, NAME, where, "ECMP hash program", ingress=True,
                                protocol=ebpf.ETH_P_IP, pref=PREF)


# --- where it sends a flow -----------------------------------------------------------------------
def next_hop(sock: socket.socket, fh: FlowHash, dst: str, src: str, iif: int, proto: int,
             sport: int | None, dport: int | None, h: int | None = None, mark: int = 0) -> dict:
    """The next hop a packet arriving on `iif` takes at a router hashing with `fh`: the route the
    kernel matches (`ip route get fibmatch`), and among its next hops the one the hash selects
    (`h`, else the 5-tuple's hash32). With several next hops, also what the choice was made from:
    `hash`, and `choices`, `weights`, `usable` in the route's order, `chosen`, and `select` (the
    kernel's hash-threshold function for this route). `mark`: the one a te: rule gave the packet
    (its table's route is the one matched, if it has one)."""
    hops, group = rtnl.route_fib_match(sock, dst, src, iif, mark)
    if len(hops) == 1:
        return {k: hops[0][k] for k in ("oif", "gateway") if hops[0].get(k) is not None}
    ip = lambda a: int.from_bytes(socket.inet_aton(a), "big")   # noqa: E731
    if h is None:
        h = hash32(fh, ip(src), ip(dst), proto, sport or 0, dport or 0)
    usable = [not hop["dead"] for hop in hops]
    weights = [hop["weight"] for hop in hops]
    # a nexthop group (FRR's routes) bounds over every member and skips the down ones at lookup
    how = select_in_group if group else select
    chosen = how(h, weights, usable)
    if chosen is None:
        return {}
    return {**{k: hops[chosen][k] for k in ("oif", "gateway") if hops[chosen].get(k) is not None},
            "hash": h, "choices": [hop["oif"] for hop in hops], "weights": weights, "usable": usable,
            "chosen": chosen, "select": how}
