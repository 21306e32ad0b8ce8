"""RoCEv2 wire format against the docs/design.md §6 vectors, scapy's dissector and an independent ICRC check."""
from __future__ import annotations

import pytest
from scapy.all import Ether
from scapy.contrib.roce import BTH

from labctl.traffic import roce

CX4_CNP = bytes.fromhex(
    "e41d2dab2bc27cfe90643b32080045c2003c718c4000401191610a0011010a001201000012b7002800008100ffff40000118"
    "00000000" "00000000000000000000000000000000" "82fd002a")


def test_cnp_vector_icrc_is_reproduced_exactly():
    assert roce.verify_icrc(CX4_CNP)
    payload = roce.cnp_payload("10.0.17.1", "10.0.18.1", 0, 0x118, ident=0x718C)
    assert payload == CX4_CNP[42:]
    assert payload[-4:].hex() == "82fd002a"


def test_corrupted_frame_fails_the_icrc():
    bad = bytearray(CX4_CNP)
    bad[50] ^= 1  # a bit of the destination QP
    assert not roce.verify_icrc(bytes(bad))


def test_masked_fields_do_not_change_the_icrc():
    f = bytearray(CX4_CNP)
    f[15] = 0x03   # ToS: ECN set to CE by a switch
    f[22] = 7      # TTL after some hops
    f[24:26] = b"\x12\x34"  # IP checksum
    f[46] = 0xC0   # FECN/BECN
    assert roce.verify_icrc(bytes(f))


@pytest.mark.parametrize("l,r,sport", [(0x11, 0x22, 49730), (0x123, 0x456, 60881), (0x1000, 0x1001, 53264)])
def test_udp_sport_vectors(l, r, sport):
    assert roce.udp_sport(l, r) == sport


@pytest.mark.parametrize("mtu,roce_mtu", [(1500, 1024), (9000, 4096), (4200, 4096), (2200, 2048), (1280, 1024)])
def test_roce_mtu_rule(mtu, roce_mtu):
    assert roce.roce_mtu(mtu) == roce_mtu


def _dissect(payload: bytes, src="10.1.0.16", dst="10.1.0.27", sport: int = 0xC123) -> Ether:
    f = roce.frame("02:00:00:00:00:01", "02:00:00:00:00:02", src, dst, sport, payload)
    assert roce.verify_icrc(f)
    pkt = Ether(f)
    again = pkt.copy()
    again[BTH].icrc = None  # scapy computes the ICRC itself: it must agree with ours
    assert bytes(again)[-4:] == payload[-4:]
    return pkt


@pytest.mark.parametrize("length,opcodes", [
    (100, [roce.WRITE_ONLY_IMM]), (4096, [roce.WRITE_ONLY_IMM]),
    (4097, [roce.WRITE_FIRST, roce.WRITE_LAST_IMM]),
    (3 * 4096 + 2, [roce.WRITE_FIRST, roce.WRITE_MIDDLE, roce.WRITE_MIDDLE, roce.WRITE_LAST_IMM])])
def test_write_messages_round_trip_through_scapy(length, opcodes):
    b = roce.MessageBuilder("10.1.0.16", "10.1.0.27", 0xC123, dqpn=0x100234, mtu=4096)
    pkts = [(psn, bytes(p)) for psn, p in b.packets(psn=0xFFFFFE, length=length, immediate=0xCAFE)]
    assert [roce.parse_bth(p)[0] for _, p in pkts] == opcodes
    total = 0
    for k, (psn, payload) in enumerate(pkts):
        pkt = _dissect(payload)
        h = pkt[BTH]
        assert h.opcode == opcodes[k] and h.dqpn == 0x100234 and h.psn == (0xFFFFFE + k) & 0xFFFFFF
        assert h.icrc == int.from_bytes(payload[-4:], "big")  # scapy shows the wire bytes
        assert h.ackreq == (k == len(pkts) - 1)
        assert len(payload) % 4 == 0 and h.padcount == (-min(4096, length - total) % 4)
        total += 4096
    first = pkts[0][1]
    if opcodes[0] in roce.HAS_RETH:
        assert int.from_bytes(first[12 + 12:12 + 16], "big") == length  # RETH DMA length
    last = pkts[-1][1]
    imm_at = 12 + (16 if opcodes[-1] in roce.HAS_RETH else 0)
    assert int.from_bytes(last[imm_at:imm_at + 4], "big") == 0xCAFE


def test_ack_and_nak_round_trip():
    for syndrome in (0, roce.NAK_PSN_SEQ_ERR):
        pkt = _dissect(roce.ack_payload("10.1.0.27", "10.1.0.16", 0xC123, 0x100777, 42, 9, syndrome),
                       "10.1.0.27", "10.1.0.16")
        assert pkt[BTH].opcode == roce.ACK and pkt[BTH].psn == 42
        assert pkt["AETH"].syndrome == syndrome and pkt["AETH"].msn == 9


def test_cnp_round_trip():
    pkt = _dissect(roce.cnp_payload("10.1.0.27", "10.1.0.16", 0xC123, 0x100777), "10.1.0.27", "10.1.0.16")
    assert pkt[BTH].opcode == roce.CNP and pkt[BTH].becn == 1 and pkt[BTH].psn == 0
    assert len(bytes(pkt["UDP"].payload)) == 12 + 16 + 4


@pytest.mark.parametrize("n", [4, 1024, 4096])
def test_crc_over_zeros_matches_zlib(n):
    import random
    import zlib
    rng = random.Random(n)
    for _ in range(200):
        state = rng.getrandbits(32)
        assert roce.crc_over_zeros(n, state) == zlib.crc32(bytes(n), state)


def test_fast_packets_equal_slow_ones():
    """The builder's packets (templates patched, ICRC over zeros by table) against the same bytes
    built the slow way: the headers and payload it put out, with the ICRC computed in full."""
    b = roce.MessageBuilder("10.1.0.16", "10.1.0.27", 0xC123, dqpn=0x100234, mtu=4096)
    ops = []
    for psn, payload in b.packets(psn=100, length=5 * 4096, immediate=7):
        body = bytes(payload)
        ops.append(roce.parse_bth(body)[0])
        slow = roce.udp_payload("10.1.0.16", "10.1.0.27", 0xC123, body[:12], body[12:-4])
        assert body[:-4] == slow[:-4] and body[-4:] == slow[-4:], hex(ops[-1])
    assert ops[0] == roce.WRITE_FIRST and ops[-1] == roce.WRITE_LAST_IMM and roce.WRITE_MIDDLE in ops


@pytest.mark.parametrize("length", [100, 4096 * 3, 4096 * 40 + 17])
def test_gso_batches_are_the_same_packets_with_ip_id_per_segment(length):
    """A GSO send's segment k leaves with IP ID k: its ICRC must be computed with that ID."""
    b = roce.MessageBuilder("10.1.0.16", "10.1.0.27", 0xC123, dqpn=0x100234, mtu=4096)
    ref = [bytes(p) for _, p in roce.MessageBuilder("10.1.0.16", "10.1.0.27", 0xC123, 0x100234, 4096)
           .packets(7, length, 9)]
    got = []
    for psn, buf, seg, count in b.gso_batches(7, length, 9):
        data = bytes(buf)
        parts = [data[i * seg:(i + 1) * seg] for i in range(count)] if count > 1 else [data]
        for k, part in enumerate(parts):
            f = roce.frame("02:00:00:00:00:01", "02:00:00:00:00:02", "10.1.0.16", "10.1.0.27", 0xC123, part,
                           ident=k if count > 1 else 0)
            assert roce.verify_icrc(f)
            got.append(part)
    assert [g[:-4] for g in got] == [r[:-4] for r in ref]
    assert all(len(g) <= 4096 + 12 + 16 + 4 + 4 for g in got)


def test_send_only_round_trip():
    pkt = _dissect(roce.send_payload("10.1.0.16", "10.1.0.27", 0xC123, 0x100777, 5, b"ready"))
    assert pkt[BTH].opcode == roce.SEND_ONLY and pkt[BTH].padcount == 3 and pkt[BTH].psn == 5


def test_templates_the_controller_hands_over_are_what_scapy_crafts_and_the_agent_needs_no_scapy():
    """The agents send headers from the table the controller crafted with scapy (crafting.table):
    each entry is scapy's own bytes, an AETH patched with its MSN equals scapy's AETH, and the
    agent's module imports no scapy (its 0.17 s of CPU per agent was most of a run's start)."""
    import subprocess
    import sys

    from scapy.compat import raw
    from scapy.contrib.roce import AETH

    from labctl.traffic import crafting
    table = crafting.table(roce.OPCODES)
    assert len(table) == len(roce.OPCODES) * 16 + len(crafting.SYNDROMES) + 1
    for key, value in table.items():
        kind, *fields = key.split(":")
        if kind == "bth":
            op, pad, ack, becn = map(int, fields)
            assert bytes.fromhex(value) == crafting.bth(op, pad, bool(ack), bool(becn))
            assert bytes.fromhex(value)[0] == op and (bytes.fromhex(value)[1] >> 4) & 3 == pad
    roce.install(table)
    for syndrome in crafting.SYNDROMES:
        for msn in (0, 1, 0xABCDEF, 0x1234567):
            assert roce.aeth(syndrome, msn) == raw(AETH(syndrome=syndrome, msn=msn & 0xFFFFFF))
    assert roce.cnp_body() == bytes(16)
    probe = "import sys, labctl.traffic.agent; print(sorted(m for m in sys.modules if m.startswith('scapy')))"
    out = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]", out.stdout
