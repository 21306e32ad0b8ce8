"""The two programs of ECN marking in the data path (kernel/ecnpath.py puts them on ports) and
the map value they share, per (port, class), 48 bytes:

    u64 arrived | u64 departed | s64 offset | u32 kmin | u32 span (kmax - kmin, >= 1)
    u32 pmax (n/65536 at Kmax) | u32 on | u64 marks
"""
from __future__ import annotations

import struct
import sys

from labctl.errors import LabError
from labctl.kernel.ebpf import (ADD_K, AND_K, ATOMIC_ADD_DW, BPF_FUNC_GET_PRANDOM_U32, BPF_FUNC_L3_CSUM_REPLACE,
                                BPF_FUNC_MAP_LOOKUP_ELEM, BPF_FUNC_SKB_LOAD_BYTES, BPF_FUNC_SKB_STORE_BYTES, CALL,
                                DIV_X, EXIT, JA, JEQ_K, JGE_X, JNE_K, JSGT_X, LDX_B, LDX_DW, LDX_H, LDX_W, MOV_K,
                                MOV_X, MUL_X, OR_K, R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10, RSH_K,
                                SKB_IFINDEX, SKB_LEN, STX_B, STX_DW, STX_W, SUB_X, TC_ACT_UNSPEC, Asm)

CLASSES = 8
ARRIVED, DEPARTED, OFFSET, KMIN, SPAN, PMAX, ON, MARKS = 0, 8, 16, 24, 28, 32, 36, 40
VALUE = 48
SCALE = 65536
ETH = 14
KEY, WORD, NEW_TOS, DRAW = -4, -8, -12, -24


def _port_of(a: Asm, bases: dict[int, int]) -> None:
    """R7 = the first slot of the port the packet is on (skb->ifindex: the egress port on egress,
    the arrival port on ingress), by `bases` {ifindex: first slot}; any other port jumps to "out".
    One program serves every port of a node (and one, as a rule, every far end of its ports): a
    program per port made `up` of the 1,024-GPU lab load and verify about 5,000 of them, where
    this loads about 350."""
    a.op(LDX_W, R2, R6, SKB_IFINDEX)
    for k, ifindex in enumerate(sorted(bases)):
        a.jump(JEQ_K, R2, f"port{k}", imm=ifindex)
    a.jump(JA, 0, "out")
    for k, ifindex in enumerate(sorted(bases)):
        a.label(f"port{k}")
        a.op(MOV_K, R7, imm=bases[ifindex])
        a.jump(JA, 0, "port")
    a.label("port")


def _class_of(a: Asm, classes: dict[int, int], tos_reg: int) -> None:
    """R1 = R7 (the port's first slot) + the class of the DSCP in `tos_reg`'s upper six bits; a
    DSCP in no class jumps to "out"."""
    a.op(MOV_X, R2, tos_reg)
    a.op(RSH_K, R2, imm=2)
    for dscp in sorted(classes):
        a.jump(JEQ_K, R2, f"dscp{dscp}", imm=dscp)
    a.jump(JA, 0, "out")
    for dscp, tc in sorted(classes.items()):
        a.label(f"dscp{dscp}")
        a.op(MOV_X, R1, R7)
        a.op(ADD_K, R1, imm=tc)
        a.jump(JA, 0, "slot")
    a.label("slot")


def _slot(a: Asm, map_fd: int) -> None:
    """R0: the value of slot R1, or "out"."""
    a.op(STX_W, R10, R1, KEY)
    a.ld_map(R1, map_fd)
    a.op(MOV_X, R2, R10)
    a.op(ADD_K, R2, imm=KEY)
    a.op(CALL, imm=BPF_FUNC_MAP_LOOKUP_ELEM)
    a.jump(JEQ_K, R0, "out", imm=0)


def _load_word(a: Asm) -> None:
    """The IP header's first 16 bits (version and IHL, DSCP and ECN) onto the stack at WORD, from
    wherever they lie in the frame (a packet socket's frame may hold only the Ethernet header in
    its linear part); a frame too short jumps to "out"."""
    a.op(MOV_X, R1, R6)
    a.op(MOV_K, R2, imm=ETH)
    a.op(MOV_X, R3, R10)
    a.op(ADD_K, R3, imm=WORD)
    a.op(MOV_K, R4, imm=2)
    a.op(CALL, imm=BPF_FUNC_SKB_LOAD_BYTES)
    a.jump(JNE_K, R0, "out", imm=0)


def mark_program(map_fd: int, bases: dict[int, int], classes: dict[int, int]) -> bytes:
    """The egress program of a node's ports, whose slots start at `bases` {ifindex: first slot}."""
    if sys.byteorder != "little":
        raise LabError("ECN marking in the data path is written for little-endian CPUs",
                       "set LABCTL_ECN_MARKING=controller")
    a = Asm()
    a.op(MOV_X, R6, R1)
    _port_of(a, bases)
    _load_word(a)
    a.op(LDX_B, R9, R10, WORD + 1)              # DSCP and ECN
    _class_of(a, classes, R9)
    _slot(a, map_fd)
    a.op(MOV_X, R8, R0)
    a.op(LDX_W, R7, R6, SKB_LEN)
    a.op(MOV_X, R1, R9)
    a.op(AND_K, R1, imm=3)
    a.jump(JEQ_K, R1, "count", imm=0)           # not ECN-capable: never marked
    a.jump(JEQ_K, R1, "count", imm=3)           # CE already
    a.op(LDX_W, R1, R8, ON)
    a.jump(JEQ_K, R1, "count", imm=0)
    # depth = arrived - departed - offset, as signed: the offset may overshoot by a frame in flight
    a.op(LDX_DW, R1, R8, ARRIVED)
    a.op(LDX_DW, R2, R8, DEPARTED)
    a.op(SUB_X, R1, R2)
    a.op(LDX_DW, R2, R8, OFFSET)
    a.op(SUB_X, R1, R2)
    a.op(LDX_W, R2, R8, KMIN)
    a.jump(JSGT_X, R2, "count", src=R1)         # below Kmin
    a.op(SUB_X, R1, R2)
    a.op(LDX_W, R2, R8, SPAN)
    a.jump(JGE_X, R1, "mark", src=R2)           # at or past Kmax: every ECT packet
    a.op(LDX_W, R3, R8, PMAX)
    a.op(MUL_X, R1, R3)
    a.op(DIV_X, R1, R2)                         # n = pmax x (depth - kmin) / (kmax - kmin)
    a.op(STX_DW, R10, R1, DRAW)
    a.op(CALL, imm=BPF_FUNC_GET_PRANDOM_U32)
    a.op(AND_K, R0, imm=SCALE - 1)
    a.op(LDX_DW, R1, R10, DRAW)
    a.jump(JGE_X, R0, "count", src=R1)          # draw >= n: not this one
    a.label("mark")
    # IP_ECN_set_ce(): the ECN bits become 11 and the header checksum follows. Through helpers,
    # which copy a shared (cloned) packet only when they write it: a direct write would make
    # every cloned packet's head be copied before the program ran
    a.op(MOV_X, R1, R9)
    a.op(OR_K, R1, imm=3)
    a.op(STX_B, R10, R1, NEW_TOS)
    a.op(MOV_X, R1, R6)
    a.op(MOV_K, R2, imm=ETH + 1)
    a.op(MOV_X, R3, R10)
    a.op(ADD_K, R3, imm=NEW_TOS)
    a.op(MOV_K, R4, imm=1)
    a.op(MOV_K, R5, imm=0)
    a.op(CALL, imm=BPF_FUNC_SKB_STORE_BYTES)
    a.jump(JNE_K, R0, "count", imm=0)
    a.op(MOV_X, R1, R6)
    a.op(MOV_K, R2, imm=ETH + 10)
    a.op(LDX_H, R3, R10, WORD)                  # the old and new first words, as they lie in memory:
    a.op(MOV_X, R4, R3)                         # on a little-endian CPU the DSCP/ECN byte is the high one
    a.op(OR_K, R4, imm=0x0300)
    a.op(MOV_K, R5, imm=2)
    a.op(CALL, imm=BPF_FUNC_L3_CSUM_REPLACE)
    a.op(MOV_K, R1, imm=1)
    a.op(ATOMIC_ADD_DW, R8, R1, MARKS)
    a.label("count")
    a.op(ATOMIC_ADD_DW, R8, R7, ARRIVED)
    a.label("out")
    a.op(MOV_K, R0, imm=TC_ACT_UNSPEC)
    a.op(EXIT)
    return a.assemble()


def depart_program(map_fd: int, bases: dict[int, int], classes: dict[int, int]) -> bytes:
    """The ingress program of the far ends of a node's ports: {far end's ifindex: the first slot of
    the port it faces}."""
    a = Asm()
    a.op(MOV_X, R6, R1)
    _port_of(a, bases)
    _load_word(a)
    a.op(LDX_B, R9, R10, WORD + 1)
    _class_of(a, classes, R9)
    _slot(a, map_fd)
    a.op(LDX_W, R1, R6, SKB_LEN)
    a.op(ATOMIC_ADD_DW, R0, R1, DEPARTED)
    a.label("out")
    a.op(MOV_K, R0, imm=TC_ACT_UNSPEC)
    a.op(EXIT)
    return a.assemble()


def profile(kmin: int, kmax: int, pmax: float, on: bool) -> bytes:
    """The 16 profile bytes of a slot (KMIN..MARKS)."""
    return struct.pack("=IIII", min(kmin, 0xFFFFFFFF), max(1, min(kmax - kmin, 0xFFFFFFFF)),
                       round(pmax * SCALE), int(on))
