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
from labctl.kernel import fastpath
from tests.bpfvm import ArrayMap, HashMap, Skb, Vm

MARKING, COUNT = 5, 6
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
        classes=CLASSES) -> tuple[int, Skb, dict]:
    maps = {MARKING: HashMap(4), COUNT: ArrayMap(1, 8)}
    for key, on in (marking or {}).items():
        maps[MARKING].put(struct.pack("=I", key), struct.pack("=I", on))
    skb = Skb(frame)
    skb.pkt_type, skb.ifindex = pkt_type, 2
    rc = Vm(maps, fib=fib or Fib()).run(fastpath.program(PORTS, classes, MARKING, COUNT), skb)
    return rc, skb, maps


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
])
def test_what_the_program_does_not_handle_goes_up_the_stack_untouched_without_a_hash(why, frame, fib, pkt_type):
    rc, skb, maps = run(frame, fib, pkt_type=pkt_type)
    assert rc == -1, why
    assert skb.frame == frame and skb.redirected is None and skb.priority == 0
    assert skb.hash_cleared                                 # the kernel re-hashes it as the FIB lookup would
    assert struct.unpack("=Q", maps[COUNT].values[0])[0] == 0


def test_an_ecn_capable_packet_of_a_marking_class_goes_to_nftables_and_the_rest_stays_fast():
    marking = {fastpath.marking_key(3, 3): 1}
    assert run(udp(tos=26 << 2 | 2), marking=marking)[0] == -1          # ECT(0), class 3 marking on port 3
    assert run(udp(tos=26 << 2 | 3), marking=marking)[0] == -1          # CE already: nftables counts it too
    assert run(udp(tos=26 << 2), marking=marking)[0] == 4               # not ECN-capable: never marked
    assert run(udp(tos=48 << 2 | 2), marking=marking)[0] == 4           # another class
    assert run(udp(tos=26 << 2 | 2), marking={fastpath.marking_key(3, 3): 0})[0] == 4   # flag cleared
    assert run(udp(tos=26 << 2 | 2), Fib(oif=4), marking=marking)[0] == 4               # another port


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
    return compile_plan(sources.load("topologies/leaf-spine.yml", [], [], None, None, None), "poll")


def test_fast_path_routers_hash_with_policy_1_and_the_slow_path_keeps_the_custom_policy(monkeypatch):
    monkeypatch.setattr(fastpath, "_AVAILABLE", [True])
    monkeypatch.delenv(fastpath.ENV, raising=False)
    plan = _plan()
    fastpath.adopt(plan)
    routers = [n for n in plan.nodes if fastpath.eligible(n)]
    assert {n.name for n in routers} >= {"leaf1", "spine1"}
    for n in routers:
        assert n.sysctls["net.ipv4.fib_multipath_hash_policy"] == "1"
        assert "net.ipv4.fib_multipath_hash_fields" not in n.sysctls
        assert n.sysctls["net.ipv4.fib_multipath_hash_seed"] == "1"
    monkeypatch.setenv(fastpath.ENV, "slow")
    plan = _plan()
    fastpath.adopt(plan)
    assert all(n.sysctls["net.ipv4.fib_multipath_hash_policy"] == "3" for n in plan.nodes if fastpath.eligible(n))


def test_hosts_bridges_and_routers_with_labctl_s_own_hash_keep_the_slow_path(monkeypatch):
    plan = _plan()
    hosts = [n for n in plan.nodes if not n.forwarding]
    assert hosts and not any(fastpath.eligible(n) for n in hosts)
    leaf = next(n for n in plan.nodes if n.name == "leaf1")
    from labctl.plan.flowhash import FlowHash
    leaf.flow_hash = FlowHash(l4=True, seed=1)
    assert not fastpath.eligible(leaf)
