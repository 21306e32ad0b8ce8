"""WAN traffic engineering without root: te: rules compile to tables over the chosen paths only,
the tc program (run in tests/bpfvm.py) marks exactly the packets the model's te_mark says, and the
kernel's hash-threshold choice over a rule's weights splits flows as the weights say.
tests/test_netns_te.py checks the same on a real lab, by port counters."""
from __future__ import annotations

import random
import socket
import struct
from pathlib import Path

from bpfvm import Skb, Vm
from labctl.kernel import flowhash as kernel_side
from labctl.plan import te
from labctl.plan.compile import compile_plan
from labctl.plan.flowhash import FlowHash, TeMatch, hash32, select, te_mark
from labctl.topology.load import load_topology

ROOT = Path(__file__).resolve().parents[1]


def frame(saddr: int, daddr: int, tos: int, proto: int = 17, sport: int = 49152, dport: int = 4791,
          flags: int = 0x4000, ihl: int = 5) -> bytes:
    ip = struct.pack("!BBHHHBBHII", 0x40 | ihl, tos, 20 + 8 + 64, 0, flags, 64, proto, 0, saddr, daddr)
    ip += bytes(4 * (ihl - 5))
    return bytes(12) + b"\x08\x00" + ip + struct.pack("!HHHH", sport, dport, 72, 0) + bytes(64)


def run(fh: FlowHash, pkt: bytes) -> Skb:
    skb = Skb(pkt)
    assert Vm().run(kernel_side.program(fh), skb) == -1
    return skb


def test_the_first_matching_rule_marks():
    fh = FlowHash(True, 1, te=[TeMatch([26], False, 0, 11), TeMatch([], True, 5201, 12),
                               TeMatch([26, 48], True, 0, 13)])
    assert te_mark(fh, 26, 17, 4791) == (11, 0)
    assert te_mark(fh, 0, 6, 5201) == (12, 1)              # any DSCP, to port 5201
    assert te_mark(fh, 0, 17, 5201, fragment=True) == (13, 2)   # a fragment has no ports: the next rule
    assert te_mark(fh, 48, 17, 4791) == (0, None)          # CNP: no rule
    assert te_mark(fh, 10, 1, 0) == (13, 2)                # everything no other class claims


def test_program_marks_as_the_model_and_hashes_as_before():
    rnd = random.Random(3)
    matches = [TeMatch([26], False, 0, te.MARK_BASE + 1), TeMatch([], True, 5201, te.MARK_BASE + 2),
               TeMatch([26, 48], True, 4791, te.MARK_BASE + 3)]
    fh = FlowHash(True, 7, te=matches)
    plain = FlowHash(True, 7)
    marked = set()
    for _ in range(400):
        s, d = rnd.getrandbits(32), rnd.getrandbits(32)
        dscp = rnd.choice((0, 10, 26, 48, 63))
        proto = rnd.choice((6, 17, 17, 1))
        dport = rnd.choice((4791, 5201, 80))
        sport = rnd.getrandbits(16)
        frag = rnd.random() < 0.15
        ihl = rnd.choice((5, 5, 7))
        skb = run(fh, frame(s, d, dscp << 2 | rnd.getrandbits(2), proto, sport, dport,
                            0x2001 if frag else 0x4000, ihl))
        want, _ = te_mark(fh, dscp, proto, dport, fragment=frag)
        assert skb.mark == want, (dscp, proto, dport, frag)
        assert skb.hash == hash32(plain, s, d, proto, sport, dport, fragment=frag)
        marked.add(want)
    assert marked == {0, *(m.mark for m in matches)}, "every rule, and no rule, was exercised"


def _dci(plan, name):
    return next(n for n in plan.nodes if n.name == name)


def test_pin_puts_only_the_far_zone_on_the_short_path():
    plan = compile_plan(load_topology(ROOT / "topologies/scale-across.yml", ["wan_paths=2", "te=pin"]))
    dci = _dci(plan, "z1-dci1")
    (rule,) = dci.te
    assert rule.paths == ["z2-dci1"] and dci.flow_hash.te[0].dscp == [26]
    far = {r.dst for r in dci.routes if len(r.nexthops) == 2}
    assert far and {r.dst for r in rule.routes} == far, "every route over the WAN, and no other"
    assert all([h.dev for h in r.nexthops] == ["z2-dci1"] for r in rule.routes)
    assert dci.sysctls["net.ipv4.fib_multipath_hash_policy"] == "1"


def test_weights_by_rate_split_flows_as_the_weights_say():
    plan = compile_plan(load_topology(ROOT / "topologies/scale-across.yml",
                                      ["wan_paths=2", "te=weights", "long_rate=100G"]))
    dci = _dci(plan, "z1-dci1")
    (rule,) = dci.te
    assert rule.weights == [4, 1]                         # 400G and 100G
    route = rule.routes[0]
    weights = [h.weight for h in route.nexthops]
    ip = lambda a: int.from_bytes(socket.inet_aton(a), "big")   # noqa: E731
    picks = [select(hash32(dci.flow_hash, ip("10.1.0.1"), ip("10.1.0.13"), 17, sport, 4791), weights, [True, True])
             for sport in range(20000, 24000)]
    assert abs(picks.count(0) / len(picks) - 0.8) < 0.02


def test_a_lab_without_te_writes_the_plan_it_wrote_before():
    plan = compile_plan(load_topology(ROOT / "topologies/scale-across.yml", ["wan_paths=2"]))
    d = plan.to_dict()
    assert all("te" not in n and (n["flow_hash"] is None or "te" not in n["flow_hash"]) for n in d["nodes"])
    with_te = compile_plan(load_topology(ROOT / "topologies/scale-across.yml", ["wan_paths=2", "te=pin"]))
    again = type(with_te).from_dict(with_te.to_dict())
    assert _dci(again, "z1-dci1").te == _dci(with_te, "z1-dci1").te
    assert _dci(again, "z1-dci1").flow_hash == _dci(with_te, "z1-dci1").flow_hash
