"""The fast path's program (kernel/fastpath.py says what it does and why), as eBPF instructions."""
from __future__ import annotations

from labctl.kernel import ebpf
from labctl.kernel.ebpf import (ADD_K, ADD_X, AND_K, ATOMIC_ADD_DW, BE, BPF_FUNC_CLONE_REDIRECT,
                                BPF_FUNC_FIB_LOOKUP, BPF_FUNC_GET_PRANDOM_U32, BPF_FUNC_MAP_LOOKUP_ELEM,
                                BPF_FUNC_REDIRECT, BPF_FUNC_SKB_PULL_DATA, CALL, EXIT, JA, JEQ_K, JGE_X, JGT_X,
                                JLT_K, JNE_K, LDX_B, LDX_DW, LDX_H, LDX_W, MOV_K, MOV_X, R0, R1, R2, R3, R4, R6,
                                R7, R8, R9, R10, RSH_K, SKB_DATA, SKB_DATA_END, SKB_IFINDEX, SKB_PKT_TYPE,
                                SKB_PRIORITY, SKB_SK, STX_B, STX_DW, STX_H, STX_W, TC_ACT_SHOT, TC_ACT_STOLEN,
                                TC_ACT_UNSPEC, Asm)

ETH, IP_LEN = 14, 20
PARAMS = -64                # struct bpf_fib_lookup (linux/bpf.h), 64 bytes, on the stack
KEY, SLOT, DRAW, PREFIX = -72, -76, -80, -88
AF_INET = 2
FIB_SUCCESS = 0             # BPF_FIB_LKUP_RET_SUCCESS
CLASSES = 8                 # marking slots per port, one per traffic class


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

    def lookup(map_fd: int, key_at: int):
        """R0: the value under the key on the stack at `key_at`, or 0."""
        a.ld_map(R1, map_fd)
        a.op(MOV_X, R2, R10)
        a.op(ADD_K, R2, imm=key_at)
        a.op(CALL, imm=BPF_FUNC_MAP_LOOKUP_ELEM)

    # A frame whose headers are not all in the packet's linear part (a packet socket's TX ring
    # writes only the Ethernet header there) is pulled in first, else the slow path would get it
    a.op(LDX_W, R7, R6, SKB_DATA)
    a.op(LDX_W, R8, R6, SKB_DATA_END)
    a.op(MOV_X, R2, R7)
    a.op(ADD_K, R2, imm=ETH + IP_LEN + 4)
    a.jump(JGT_X, R2, "pull", src=R8)
    a.jump(JA, 0, "linear")
    a.label("pull")
    a.op(MOV_X, R1, R6)
    a.op(MOV_K, R2, imm=ETH + IP_LEN + 4)
    a.op(CALL, imm=BPF_FUNC_SKB_PULL_DATA)      # fails on a shorter packet: the slow path's
    a.jump(JNE_K, R0, "slow", imm=0)
    a.label("linear")
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
    lookup(multipath_fd, PREFIX)
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
        lookup(marking_fd, KEY)
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
    lookup(count_fd, KEY)
    a.jump(JEQ_K, R0, "redirect", imm=0)
    a.op(MOV_K, R1, imm=1)
    a.op(ATOMIC_ADD_DW, R0, R1, 0)
    a.label("redirect")
    # A packet still charged to its sender's socket (the first router after a host) leaves as a
    # clone and the packet itself is consumed: the clone carries no socket, so the sender's send
    # buffer is released here, as ip_rcv() releases it on the slow path. A plain redirect kept it
    # charged until a receiving host's IP stack: a queue in the fabric then blocked the sender at
    # its socket's send buffer, a back-pressure no switch exerts. A packet with no socket (from
    # the second router on) leaves by a plain redirect: bpf_clone_redirect() would also copy the
    # consumed packet's head (it makes the original writable again after cloning).
    a.op(LDX_DW, R1, R6, SKB_SK)
    a.jump(JNE_K, R1, "clone", imm=0)
    a.op(MOV_X, R1, R9)
    a.op(MOV_K, R2, imm=0)
    a.op(CALL, imm=BPF_FUNC_REDIRECT)           # TC_ACT_REDIRECT
    a.op(EXIT)
    a.label("clone")
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
