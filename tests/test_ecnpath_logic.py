"""ECN marking in the data path without root (tests/bpfvm.py runs the programs): each packet is
marked on the depth it meets, with the profile's probability, and the header's checksum holds;
the far end's program counts what left. tests/test_netns_ecn.py runs them in the kernel."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from labctl.kernel import ecnpath, ecnprog
from labctl.plan import qos
from tests.bpfvm import ArrayMap, Skb, Vm

MAP = 5
CLASSES = {26: 3, 48: 6}
PORT = 1                       # the port's place on its node: slots 8..15
IFINDEX = 1                    # bpfvm's skb->ifindex
BASES = {7: 0, IFINDEX: PORT * ecnprog.CLASSES}
KMIN, KMAX, PMAX = 100_000, 400_000, 0.2
ROOT = Path(__file__).resolve().parents[1]


def frame(tos: int) -> bytes:
    return bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
                 / IP(src="10.1.0.1", dst="10.2.0.9", tos=tos) / UDP(sport=49152, dport=4791) / (b"x" * 1000))


def slot(m: ArrayMap, tc: int) -> bytearray:
    return m.values[PORT * ecnprog.CLASSES + tc]


def with_depth(depth: int, on: bool = True, tc: int = 3) -> ArrayMap:
    m = ArrayMap(2 * ecnprog.CLASSES, ecnprog.VALUE)
    for k in range(len(m.values)):
        m.values[k][ecnprog.KMIN:ecnprog.MARKS] = ecnprog.profile(KMIN, KMAX, PMAX, on)
    struct.pack_into("=QQq", slot(m, tc), 0, depth + 5000, 3000, 2000)     # arrived - departed - offset
    return m


def mark(tos: int, m: ArrayMap, draw: int = 0) -> Skb:
    skb = Skb(frame(tos))
    rc = Vm({MAP: m}, prandom=lambda: draw).run(ecnprog.mark_program(MAP, BASES, CLASSES), skb)
    assert rc == -1                                          # TC_ACT_UNSPEC: the packet goes on to its queue
    return skb


def ones_sum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def counts(m: ArrayMap, tc: int = 3) -> tuple[int, int, int]:
    arrived, departed, _ = struct.unpack_from("=QQq", slot(m, tc), 0)
    return arrived, departed, struct.unpack_from("=Q", slot(m, tc), ecnprog.MARKS)[0]


@pytest.mark.parametrize("ect", [0b10, 0b01])
def test_an_ect_packet_past_kmax_becomes_ce_with_a_valid_checksum_and_is_counted(ect):
    m = with_depth(KMAX + 1)
    skb = mark(26 << 2 | ect, m)
    assert skb.written and skb.frame[15] == 26 << 2 | 0b11
    assert ones_sum(skb.frame[14:34]) == 0xFFFF              # the header's checksum still holds
    arrived, _, marks = counts(m)
    assert marks == 1 and arrived == KMAX + 1 + 5000 + len(skb.frame)


def test_below_kmin_not_ect_ce_already_or_marking_off_leave_the_packet_untouched_but_counted():
    for tos, m in ((26 << 2 | 0b10, with_depth(KMIN - 1)), (26 << 2, with_depth(KMAX * 2)),
                   (26 << 2 | 0b11, with_depth(KMAX * 2)), (26 << 2 | 0b10, with_depth(KMAX * 2, on=False))):
        before = counts(m)[0]
        skb = mark(tos, m)
        assert not skb.written and skb.frame == frame(tos)
        assert counts(m)[2] == 0 and counts(m)[0] == before + len(skb.frame)


def test_a_negative_estimate_is_below_kmin():
    m = with_depth(0)
    struct.pack_into("=q", slot(m, 3), 16, 10**9)            # an offset past what arrived
    assert not mark(26 << 2 | 0b10, m).written


def test_a_dscp_in_no_class_is_neither_marked_nor_counted():
    m = with_depth(KMAX * 2)
    skb = mark(10 << 2 | 0b10, m)
    assert not skb.written
    assert all(counts(m, tc) == (0, 0, 0) or tc == 3 for tc in range(ecnprog.CLASSES))
    assert counts(m)[0] == KMAX * 2 + 5000


@pytest.mark.parametrize("depth", [KMIN, 150_000, 250_000, 399_000])
def test_on_the_ramp_a_packet_is_marked_exactly_when_its_draw_is_below_the_profile(depth):
    """Every draw the program can make (the low 16 bits of bpf_get_prandom_u32, in steps): the marked
    share is qos.marking_probability's, to one step of 1/65536."""
    want = qos.marking_probability(depth, KMIN, KMAX, PMAX)
    draws = range(0, 65536, 64)
    marked = sum(mark(26 << 2 | 0b10, with_depth(depth), draw).written for draw in draws)
    assert marked / len(draws) == pytest.approx(want, abs=64 / 65536 + 1e-9)


def test_the_far_end_counts_what_left_by_the_same_class():
    m = with_depth(0)
    code = ecnprog.depart_program(MAP, BASES, CLASSES)
    for tos in (26 << 2 | 0b10, 48 << 2, 10 << 2):
        assert Vm({MAP: m}).run(code, Skb(frame(tos))) == -1
    assert counts(m, 3)[1] == 3000 + len(frame(0))
    assert counts(m, 6)[1] == len(frame(0))
    assert sum(counts(m, tc)[1] for tc in range(ecnprog.CLASSES)) == 3000 + 2 * len(frame(0))


def test_each_port_of_the_program_has_its_own_slots_and_an_unknown_port_is_left_alone():
    m = with_depth(KMAX * 2)
    skb = Skb(frame(26 << 2 | 0b10))
    skb.ifindex = 7                                          # the node's other port: slots 0..7
    assert Vm({MAP: m}).run(ecnprog.mark_program(MAP, BASES, CLASSES), skb) == -1
    assert not skb.written                                   # its class 3 slot is empty: depth 0
    assert struct.unpack_from("=Q", m.values[3], 0)[0] == len(skb.frame)
    assert counts(m)[0] == KMAX * 2 + 5000                   # port 1's slot untouched
    for code in (ecnprog.mark_program(MAP, BASES, CLASSES), ecnprog.depart_program(MAP, BASES, CLASSES)):
        skb = Skb(frame(26 << 2 | 0b10))
        skb.ifindex = 9
        before = [bytes(v) for v in m.values.values()]
        assert Vm({MAP: m}).run(code, skb) == -1 and not skb.written
        assert [bytes(v) for v in m.values.values()] == before


def test_profile_bytes_keep_a_span_of_at_least_one_and_pmax_in_65536ths():
    kmin, span, pmax, on = struct.unpack("=IIII", ecnprog.profile(500, 500, 0.2, True))
    assert (kmin, span, pmax, on) == (500, 1, round(0.2 * 65536), 1)
    assert struct.unpack("=IIII", ecnprog.profile(100, 300, 1.0, False)) == (100, 200, 65536, 0)


def test_every_marking_node_of_the_bundled_labs_has_every_far_end_and_wan_ports_end_at_the_line():
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml"))
    nodes = {n.name for n, _ in ecnpath.marking_nodes(plan)}
    switching = {n.name for n in plan.nodes if n.switching}
    assert nodes == switching and nodes
    for node, ends in ecnpath.marking_nodes(plan):
        for iface, (ns, index) in zip(node.interfaces, ends):
            peer = plan.node(iface.peer_node)
            assert (ns, index) == (peer.namespace, peer.iface(iface.peer_iface).index)
    wan = compile_plan(load_topology(ROOT / "topologies" / "scale-across.yml"))
    wired = [lk for lk in wan.links if lk.wire is not None]
    assert wired
    ends = {(n.name, i.name): e for n, es in ecnpath.marking_nodes(wan) for i, e in zip(n.interfaces, es)}
    for lk in wired:
        assert ends[tuple(lk.a.split(":"))] == (lk.wire.near, lk.wire.near_index)
        assert ends[tuple(lk.b.split(":"))] == (lk.wire.far, lk.wire.far_index)
