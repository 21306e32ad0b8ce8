"""The te: step of labctl's tc program (plan/te.py): before the flow hash, the first rule whose
DSCP set and destination port match the packet writes its mark into skb->mark, which the
router's fib rules then send to the rule's own table. kernel/flowhash.py's program calls it with
the registers it keeps (R6 the skb, R7/R8 the packet's start and end, R2 the IP header's length)."""
from __future__ import annotations

from labctl.kernel.ebpf import (ADD_K, ADD_X, AND_K, BE, JA, JEQ_K, JGT_X, JNE_K, LDX_B, LDX_H, MOV_K, MOV_X, R0,
                                R1, R2, R3, R4, R5, R6, R7, R8, RSH_K, STX_W, Asm)
from labctl.plan.flowhash import FlowHash

SKB_MARK = 8                # __sk_buff.mark, which a tc program may write


def emit(a: Asm, fh: FlowHash, eth: int) -> None:
    """The first te: rule that matches sets the packet's mark (te_mark): R3 the DSCP, R5 the
    protocol, R4 the destination port of an unfragmented TCP or UDP packet (else 0). R2, the IP
    header's length, is kept for the hash after."""
    a.op(LDX_B, R3, R7, eth + 1)                # DSCP and ECN
    a.op(RSH_K, R3, imm=2)
    a.op(MOV_K, R4, imm=0)
    if any(m.dport for m in fh.te):
        a.op(LDX_B, R5, R7, eth + 9)
        a.jump(JEQ_K, R5, "te_ports", imm=6)
        a.jump(JEQ_K, R5, "te_ports", imm=17)
        a.jump(JA, 0, "te_rules")
        a.label("te_ports")
        a.op(LDX_H, R0, R7, eth + 6)            # flags and fragment offset
        a.op(BE, R0, imm=16)
        a.op(AND_K, R0, imm=0x3FFF)
        a.jump(JNE_K, R0, "te_rules", imm=0)
        a.op(MOV_X, R1, R7)
        a.op(ADD_X, R1, R2)
        a.op(ADD_K, R1, imm=eth)
        a.op(MOV_X, R0, R1)
        a.op(ADD_K, R0, imm=4)
        a.jump(JGT_X, R0, "te_rules", src=R8)
        a.op(LDX_H, R4, R1, 2)                  # destination port
        a.op(BE, R4, imm=16)
        a.label("te_rules")
    for k, m in enumerate(fh.te):
        miss, hit = f"te_miss{k}", f"te_hit{k}"
        for d in m.dscp:
            a.jump(JEQ_K, R3, miss if m.negate else hit, imm=d)
        if not m.negate:
            a.jump(JA, 0, miss)
        a.label(hit)
        if m.dport:
            a.jump(JNE_K, R4, miss, imm=m.dport)
        a.op(MOV_K, R0, imm=m.mark)              # under 2^31: no sign to extend
        a.op(STX_W, R6, R0, SKB_MARK)
        a.jump(JA, 0, "te_done")
        a.label(miss)
    a.label("te_done")
