"""The forwarding fast path's program without root (tests/bpfvm.py runs it; the kernel's answer to
bpf_fib_lookup is a stub here): what it forwards and how it rewrites it, what it leaves to the
kernel untouched, the ECN hand-off, and the hash policy its routers get.
tests/test_netns_fastpath.py runs it in the kernel."""
from __future__ import annotations

import random
import struct

import pytest
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether

from labctl.errors import LabError
from labctl.kernel import fastpath, fastprog
from tests.bpfvm import ArrayMap, LpmMap, Skb, Vm

MARKING, COUNT, MULTIPATH = 5, 6, 7
PORTS = [2, 3, 4]
CLASSES = {26: (3, 0x10013), 48: (6, 0x10016)}
SMAC, DMAC = bytes.fromhex("02000000aa01"), bytes.fromhex("02000000bb02")


class Fib:
    """bpf_fib_lookup's stub: answers `rc` with egress port `oif`, and keeps what it was asked."""

    def __init__(self, rc: int = 0, oif: int = 3):
        self.rc, self.oif, self.asked = rc, oif, None

    def __call__(self, params: bytearray) -> int:
        self.asked = bytes(params)
        if self.rc == 0:
            struct.pack_into("=I", params, 8, self.oif)
            params[52:58], params[58:64] = SMAC, DMAC
        return self.rc


def run(frame: bytes, fib: Fib | None = None, marking: dict | None = None, pkt_type: int = 0,
        classes=CLASSES, draw: int = 0, multipath=("10.9.0.0/16", "10.2.0.16/31"), owned: bool = True,
        linear: int | None = None) -> tuple[int, Skb, dict]:
    """`marking`: {(port ifindex, tc): n}; `draw`: what bpf_get_prandom_u32() answers; `multipath`:
    the router's destinations with several next hops; `owned`: the packet is still charged to its
    sender's socket (the first router after a host); `linear`: bytes in the packet's linear part."""
    maps = {MARKING: ArrayMap(len(PORTS) * fastpath.CLASSES, fastpath.SLOT_SIZE), COUNT: ArrayMap(1, 8),
            MULTIPATH: LpmMap(multipath)}
    for (ifindex, tc), n in (marking or {}).items():
        key = PORTS.index(ifindex) * fastpath.CLASSES + tc
        maps[MARKING].put(struct.pack("<I", key), struct.pack("=IIQ", n, 0, 0))
    skb = Skb(frame, linear)
    skb.pkt_type, skb.ifindex, skb.sk = pkt_type, 2, 0xFFFF_8880_0000_1000 if owned else 0
    vm = Vm(maps, fib=fib or Fib(), prandom=lambda: draw)
    rc = vm.run(fastprog.program(PORTS, classes, MARKING, COUNT, MULTIPATH), skb)
    return rc, skb, maps


def marks(maps: dict, ifindex: int, tc: int) -> int:
    key = PORTS.index(ifindex) * fastpath.CLASSES + tc
    return struct.unpack_from("=Q", maps[MARKING].values[key], 8)[0]


def udp(ttl: int = 64, tos: int = 0, **ip) -> bytes:
    return bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
                 / IP(src="10.1.0.1", dst="10.2.0.9", ttl=ttl, tos=tos, **ip) / UDP(sport=49152, dport=4791)
                 / (b"x" * 64))


def test_a_udp_packet_is_routed_rewritten_classified_and_redirected_to_the_fib_s_port():
    fib = Fib(oif=3)
    rc, skb, maps = run(udp(tos=26 << 2), fib)
    assert rc == 4 and skb.redirected == (3, 0)
    out = Ether(skb.frame)
    assert (out.src, out.dst) == ("02:00:00:00:aa:01", "02:00:00:00:bb:02")
    assert out[IP].ttl == 63
    assert _ones_sum(skb.frame[14:34]) == 0xFFFF            # the header's checksum still holds
    assert skb.priority == 0x10013                          # DSCP 26 is class 3: 1:13
    assert struct.unpack("=Q", maps[COUNT].values[0])[0] == 1
    asked = fib.asked
    family, proto, sport, dport, tot_len, ifindex, tos = struct.unpack_from("=BB2s2sHIB", asked, 0)
    assert (family, proto, sport, dport) == (2, 17, struct.pack("!H", 49152), struct.pack("!H", 4791))
    assert (tot_len, ifindex, tos) == (20 + 8 + 64, 2, 26 << 2)
    assert asked[16:20] == bytes([10, 1, 0, 1]) and asked[32:36] == bytes([10, 2, 0, 9])


def test_a_packet_no_socket_owns_leaves_by_a_plain_redirect_and_an_owned_one_as_a_clone():
    """A clone releases the sender's socket (bpf_clone_redirect); from the second router on no
    socket owns the packet, and a plain redirect spares the clone and the copy of the head."""
    for owned, rc_expected in ((True, 4), (False, 7)):
        rc, skb, maps = run(udp(tos=26 << 2), Fib(oif=3), owned=owned)
        assert rc == rc_expected and skb.redirected == (3, 0) and skb.cloned == owned, owned
        out = Ether(skb.frame)
        assert out[IP].ttl == 63 and (out.src, out.dst) == ("02:00:00:00:aa:01", "02:00:00:00:bb:02")
        assert struct.unpack("=Q", maps[COUNT].values[0])[0] == 1


def test_a_frame_with_only_its_ethernet_header_in_the_linear_part_is_pulled_and_forwarded():
    """A packet socket's TX ring (trafgen's default) leaves the IP header in fragments."""
    frame = udp()
    rc, skb, _ = run(frame, Fib(oif=3), linear=14)
    assert rc == 4 and skb.linear >= 38 and Ether(skb.frame)[IP].ttl == 63


def test_a_dscp_no_class_names_keeps_its_priority_and_still_takes_the_fast_path():
    rc, skb, _ = run(udp(tos=10 << 2))
    assert rc == 4 and skb.priority == 0


@pytest.mark.parametrize("why, frame, fib, pkt_type", [
    ("ARP", bytes(Ether() / ARP()), Fib(), 0),
    ("IP options", bytes(Ether() / IP(options=b"\x01\x01\x01\x01", dst="10.2.0.9") / UDP()), Fib(), 0),
    ("TTL about to expire", udp(ttl=1), Fib(), 0),
    ("a fragment", udp(flags="MF"), Fib(), 0),
    ("not the first fragment", udp(frag=8), Fib(), 0),
    ("ICMP", bytes(Ether() / IP(dst="10.2.0.9") / ICMP()), Fib(), 0),
    ("not addressed to this router", udp(), Fib(), 3),
    ("no neighbour yet", udp(), Fib(rc=7), 0),
    ("not forwarded (local)", udp(), Fib(rc=4), 0),
    ("an egress port that is not the lab's", udp(), Fib(oif=9), 0),
    ("a destination with several next hops", bytes(Ether() / IP(dst="10.2.0.17") / UDP()), Fib(), 0),
    ("inside a multipath prefix", bytes(Ether() / IP(dst="10.9.3.4") / UDP()), Fib(), 0),
    ("shorter than its headers", bytes(Ether() / IP(dst="10.2.0.9", proto=17)), Fib(), 0),
])
def test_what_the_program_does_not_handle_goes_up_the_stack_untouched_without_a_hash(why, frame, fib, pkt_type):
    rc, skb, maps = run(frame, fib, pkt_type=pkt_type)
    assert rc == -1, why
    assert skb.frame == frame and skb.redirected is None and skb.priority == 0
    assert struct.unpack("=Q", maps[COUNT].values[0])[0] == 0


def test_an_ecn_capable_packet_of_a_marking_class_becomes_ce_with_the_slot_s_probability():
    always = {(3, 3): 65536}
    for ect in (2, 1):                                               # ECT(0), ECT(1)
        rc, skb, maps = run(udp(tos=26 << 2 | ect), marking=always, draw=0xFFFFFFFF)
        assert rc == 4 and skb.frame[15] == 26 << 2 | 3, ect         # CE, the DSCP kept
        assert _ones_sum(skb.frame[14:34]) == 0xFFFF and marks(maps, 3, 3) == 1
    rc, skb, maps = run(udp(tos=26 << 2 | 3), marking=always)        # CE already: as nftables, not counted
    assert rc == 4 and skb.frame[15] == 26 << 2 | 3 and marks(maps, 3, 3) == 0
    rc, skb, maps = run(udp(tos=26 << 2), marking=always)            # not ECN-capable: never marked
    assert skb.frame[15] == 26 << 2 and marks(maps, 3, 3) == 0
    for n, draw, marked in ((0, 0, False), (32768, 0x1234_7FFF, True), (32768, 0x0000_8000, False),
                            (1, 0xFFFF_0000, True), (1, 1, False)):
        rc, skb, maps = run(udp(tos=26 << 2 | 2), marking={(3, 3): n}, draw=draw)
        assert rc == 4 and (skb.frame[15] & 3 == 3) == marked and marks(maps, 3, 3) == int(marked), (n, draw)
    # another class, another port: their own slots
    assert run(udp(tos=48 << 2 | 2), marking=always)[1].frame[15] & 3 == 2
    assert run(udp(tos=26 << 2 | 2), Fib(oif=4), marking=always)[1].frame[15] & 3 == 2


def _kernel_set_ce(check_be: int, tos: int) -> int:
    """IP_ECN_set_ce() on a little-endian CPU (include/net/inet_ecn.h)."""
    ecn = (tos + 1) & 3
    native = struct.unpack("<H", struct.pack("!H", check_be))[0]
    native += struct.unpack("<H", struct.pack("!H", 0xFFFB))[0] + struct.unpack("<H", struct.pack("!H", ecn))[0]
    native = (native + (native >= 0xFFFF)) & 0xFFFF
    return struct.unpack("!H", struct.pack("<H", native))[0]


def test_the_ce_checksum_update_is_the_kernel_s_for_every_checksum_value():
    for ect in (1, 2):
        for check in [c for c in range(0x10000) if c % 97 == 0 or c < 0x10 or c >= 0xFF00]:
            frame = bytearray(udp(tos=26 << 2 | ect))
            struct.pack_into("!H", frame, 14 + 10, check)
            _, skb, _ = run(bytes(frame), marking={(3, 3): 65536})
            # the program marks, then lowers the TTL: the kernel's two updates in that order
            want = _kernel_decrease_ttl(_kernel_set_ce(check, ect))
            assert struct.unpack_from("!H", skb.frame, 24)[0] == want, (ect, hex(check))


def _ones_sum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def _kernel_decrease_ttl(check_be: int) -> int:
    """ip_decrease_ttl() on a little-endian CPU: the checksum read in host order, htons(0x0100) added."""
    native = struct.unpack("<H", struct.pack("!H", check_be))[0]
    native += 0x0001
    native = (native + (native >= 0xFFFF)) & 0xFFFF
    return struct.unpack("!H", struct.pack("<H", native))[0]


def test_the_ttl_and_checksum_update_is_the_kernel_s_for_every_checksum_value():
    rng = random.Random(7)
    for check in list(range(0xFE00, 0x10000)) + [rng.randrange(0x10000) for _ in range(300)]:
        frame = bytearray(udp(ttl=rng.randrange(2, 256)))
        struct.pack_into("!H", frame, 14 + 10, check)
        rc, skb, _ = run(bytes(frame))
        assert rc == 4
        got = struct.unpack_from("!H", skb.frame, 14 + 10)[0]
        assert got == _kernel_decrease_ttl(check), hex(check)
        assert skb.frame[14 + 8] == frame[14 + 8] - 1


def test_a_valid_header_stays_valid():
    for ttl in (2, 64, 255):
        rc, skb, _ = run(udp(ttl=ttl, tos=26 << 2))
        assert rc == 4 and _ones_sum(skb.frame[14:34]) == 0xFFFF


def test_the_mode_is_checked(monkeypatch):
    monkeypatch.setenv(fastpath.ENV, "turbo")
    with pytest.raises(LabError) as err:
        fastpath.mode()
    assert "auto, fast, slow" in err.value.fix


def _plan():
    from labctl.plan.compile import compile_plan
    from labctl.topology import sources
    return compile_plan(sources.load("topologies/leaf-spine.yml"), "poll")


def test_a_routers_multipath_destinations_are_the_plan_s_routes_with_several_next_hops():
    leaf = _plan().node("leaf1")
    multipath = [r.dst for r in leaf.routes if len(r.nexthops) > 1]
    assert multipath and len(multipath) < len(leaf.routes)         # up to the spines; down to its hosts
    maps = LpmMap(multipath)
    for r in leaf.routes:
        addr = r.dst.split("/")[0]
        key = struct.pack("<I", 32) + bytes(int(b) for b in addr.split("."))
        assert (maps.get(key) is not None) == (len(r.nexthops) > 1), r.dst


def test_hosts_bridges_frr_exec_and_routers_with_labctl_s_own_hash_keep_the_slow_path():
    plan = _plan()
    hosts = [n for n in plan.nodes if not n.forwarding]
    assert hosts and not any(fastpath.eligible(n) for n in hosts)
    leaf = plan.node("leaf1")
    assert fastpath.eligible(leaf)
    from dataclasses import replace
    from labctl.plan.flowhash import FlowHash
    assert not fastpath.eligible(replace(leaf, flow_hash=FlowHash(l4=True, seed=1)))
    assert not fastpath.eligible(replace(leaf, static_routes=False))
    assert not fastpath.eligible(replace(leaf, exec=[["ip", "route", "add", "10.0.0.0/8", "via", "10.1.0.1"]]))
