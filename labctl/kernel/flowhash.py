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

from labctl.kernel import ebpf, rtnl
from labctl.kernel.ebpf import (ADD_K, ADD_X, AND_K, BE, BPF_FUNC_SET_HASH, CALL, EXIT, JA, JEQ_K, JGT_X,
                                  JLT_K, JNE_K, LDX_B, LDX_H, LDX_W, LSH_K, MOV_K, MOV_X, MUL_X, OR_X, R0, R1,
                                  R2, R3, R4, R5, R6, R7, R8, R9, RSH_K, SKB_DATA, SKB_DATA_END, TC_ACT_UNSPEC,
                                  XOR_X, Asm)
from labctl.errors import LabError
from labctl.plan.flowhash import FINAL_STEPS, GOLDEN, FlowHash, hash32, initial, select, select_in_group

ENV = "LABCTL_ECMP_HASH"
ENGINES = ("auto", "kernel", "bpf")
SEED_SYSCTL = "/proc/sys/net/ipv4/fib_multipath_hash_seed"


def engine() -> str:
    """"kernel" (the kernel's hash with its seed fixed) or "bpf" (labctl's): `auto` picks the
    kernel's where it has a settable seed (6.11+), and LABCTL_ECMP_HASH can force either."""
    wanted = os.environ.get(ENV, "auto") or "auto"
    if wanted not in ENGINES:
        raise LabError(f"{ENV}={wanted!r} is not an ECMP hash engine",
                       f"set {ENV} to one of {', '.join(ENGINES)} (or leave it unset: auto)")
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
        if not node.forwarding or node.bridged:
            continue
        node.flow_hash = FlowHash(l4=hash_policy == 1, seed=hash_seed)
        node.sysctls = {k: v for k, v in node.sysctls.items()
                        if k not in ("net.ipv4.fib_multipath_hash_fields", "net.ipv4.fib_multipath_hash_seed")}
        node.sysctls["net.ipv4.fib_multipath_hash_policy"] = "1"


# --- the program -------------------------------------------------------------------------------
ETH, IP_MIN = 14, 20


def program(fh: FlowHash) -> bytes:
    """The tc program: parse Ethernet/IPv4 (and TCP/UDP ports when hashing L4) with the bounds
    checks the verifier wants, hash as plan/flowhash.hash32 does, bpf_set_hash(), carry on."""
    a = Asm()

    def absorb(reg: int):
        a.op(XOR_X, R9, reg)
        a.ld64(R1, GOLDEN)
        a.op(MUL_X, R9, R1)
        a.op(MOV_X, R0, R9)
        a.op(RSH_K, R0, imm=32)
        a.op(XOR_X, R9, R0)

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
    for shift, multiplier in FINAL_STEPS:
        a.op(MOV_X, R0, R9)
        a.op(RSH_K, R0, imm=shift)
        a.op(XOR_X, R9, R0)
        if multiplier:
            a.ld64(R1, multiplier)
            a.op(MUL_X, R9, R1)
    a.op(MOV_X, R1, R6)
    a.op(MOV_X, R2, R9)                         # the helper takes the low 32 bits
    a.op(CALL, imm=BPF_FUNC_SET_HASH)
    a.label("out")
    a.op(MOV_K, R0, imm=TC_ACT_UNSPEC)
    a.op(EXIT)
    return a.assemble()


def load(fh: FlowHash) -> int:
    """The program for `fh`, loaded: a descriptor the caller closes once filters hold it."""
    if not ebpf.supported():
        raise LabError(f"labctl's ECMP hash cannot load on a {platform.machine()} CPU",
                       f"set {ENV}=kernel (the kernel's hash, with a seed random per boot before 6.11)")
    try:
        return ebpf.load_program(program(fh), "labctl_ecmp")
    except ebpf.BpfError as exc:
        raise LabError(f"the kernel refused labctl's ECMP hash program: {exc}",
                       f"set {ENV}=kernel to use the kernel's hash (seed random per boot before 6.11)") from None


# --- attaching it ------------------------------------------------------------------------------
PREF = 1                    # first on the port's ingress, before anything that redirects


def port_requests(index: int, fd: int, where: str) -> list[tuple[tuple[int, int, bytes], str]]:
    """clsact on a port and the program on its ingress (`tc filter add … ingress bpf da`)."""
    return ebpf.clsact_requests(index, fd, "labctl_ecmp", where, "ECMP hash program", ingress=True,
                                protocol=ebpf.ETH_P_IP, pref=PREF)


# --- where it sends a flow -----------------------------------------------------------------------
def next_hop(sock: socket.socket, fh: FlowHash, dst: str, src: str, iif: int, proto: int,
             sport: int | None, dport: int | None) -> dict:
    """The next hop a packet arriving on `iif` takes at a router hashing with `fh`: the route the
    kernel matches (`ip route get fibmatch`), and among its next hops the one the hash selects."""
    hops, group = rtnl.route_fib_match(sock, dst, src, iif)
    if len(hops) == 1:
        return {k: hops[0][k] for k in ("oif", "gateway") if hops[0].get(k) is not None}
    ip = lambda a: int.from_bytes(socket.inet_aton(a), "big")   # noqa: E731
    h = hash32(fh, ip(src), ip(dst), proto, sport or 0, dport or 0)
    usable = [not hop["dead"] for hop in hops]
    weights = [hop["weight"] for hop in hops]
    # a nexthop group (FRR's routes) bounds over every member and skips the down ones at lookup
    chosen = (select_in_group if group else select)(h, weights, usable)
    if chosen is None:
        return {}
    return {k: hops[chosen][k] for k in ("oif", "gateway") if hops[chosen].get(k) is not None}
