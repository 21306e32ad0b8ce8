"""The load-balancing modes without root: each mode's tc program, run instruction by instruction
(tests/bpfvm.py) on crafted frames, gives the hash the model in plan/flowhash.py computes, and
the model spreads as each mode promises. tests/test_netns_lb.py checks the same on a real lab."""
from __future__ import annotations

import random
from pathlib import Path
import socket
import struct

import pytest

from bpfvm import ArrayMap, HashMap, LpmMap, Skb, Vm
from labctl.kernel import flowhash as kernel_side
from labctl.kernel import lb as lbwire
from labctl.plan.flowhash import (WEYL, FlowHash, adaptive_pick, flowlet_hash, hash32, select, spray_hash, state,
                                  steer_targets)

FLOWS_FD, DEPTH_FD, MULTIPATH_FD = 7, 8, 9


def frame(saddr: int, daddr: int, proto: int = 17, sport: int = 49152, dport: int = 4791, qp: int = 0,
          ihl: int = 5, flags: int = 0x4000, payload: int = 64) -> bytes:
    """Ethernet + IPv4 (+ options to `ihl`) + UDP/TCP ports + a BTH whose destination QP is `qp`."""
    ip = struct.pack("!BBHHHBBHII", 0x40 | ihl, 0, 20 + 8 + 12 + payload, 0, flags, 64, proto, 0, saddr, daddr)
    ip += bytes(4 * (ihl - 5))
    l4 = struct.pack("!HHHH", sport, dport, 8 + 12 + payload, 0)
    bth = struct.pack("!BBHII", 0x07, 0, 0xFFFF, qp & 0xFFFFFF, 5)
    return bytes(12) + b"\x08\x00" + ip + l4 + bth + bytes(payload)


def run(fh: FlowHash, pkt: bytes, vm: Vm | None = None, linear: int | None = None) -> int | None:
    vm = vm or Vm()
    skb = Skb(pkt, linear)
    assert vm.run(kernel_side.program(fh, FLOWS_FD, DEPTH_FD), skb) == -1     # TC_ACT_UNSPEC: carry on
    return skb.hash


def addr(text: str) -> int:
    return int.from_bytes(socket.inet_aton(text), "big")


@pytest.mark.parametrize("mode", [None, "ecmp"])
def test_ecmp_program_computes_the_models_hash(mode):
    rnd = random.Random(5)
    for l4 in (True, False):
        fh = FlowHash(l4=l4, seed=rnd.getrandbits(32), mode=mode)
        for _ in range(200):
            s, d, sp, dp = rnd.getrandbits(32), rnd.getrandbits(32), rnd.getrandbits(16), rnd.getrandbits(16)
            proto = rnd.choice((6, 17, 1, 47))
            ihl = rnd.choice((5, 5, 6, 15))
            frag = rnd.random() < 0.2
            got = run(fh, frame(s, d, proto, sp, dp, ihl=ihl, flags=0x2001 if frag else 0x4000))
            assert got == hash32(fh, s, d, proto, sp, dp, fragment=frag)


def test_what_is_not_ipv4_keeps_its_hash():
    fh = FlowHash(True, 1, "spray")
    arp = bytes(12) + b"\x08\x06" + bytes(28)
    assert run(fh, arp) is None
    assert run(fh, frame(1, 2)[:30]) is None                         # shorter than an IP header
    bad_version = bytearray(frame(1, 2))
    bad_version[14] = 0x65
    assert run(fh, bytes(bad_version)) is None


def test_ecmp_qp_hashes_the_bth_destination_qp_of_rocev2_only():
    fh = FlowHash(True, 3, "ecmp-qp")
    s, d = addr("10.1.0.1"), addr("10.1.0.9")
    seen = set()
    for qp in (0x100000, 0x100001, 0x10100B, 0xFFFFFF):
        got = run(fh, frame(s, d, qp=qp))
        assert got == hash32(fh, s, d, 17, 49152, 4791, qp=qp)
        seen.add(got)
    assert len(seen) == 4, "each QP of one 5-tuple is a flow of its own"
    # in ecmp mode the QP is not hashed; UDP to another port and TCP are hashed as in ecmp
    assert hash32(FlowHash(True, 3, "ecmp"), s, d, 17, 49152, 4791, qp=5) == hash32(FlowHash(True, 3), s, d, 17,
                                                                                   49152, 4791)
    assert run(fh, frame(s, d, sport=1, dport=4792, qp=9)) == hash32(fh, s, d, 17, 1, 4792)
    assert run(fh, frame(s, d, proto=6, dport=4791, qp=9)) == hash32(fh, s, d, 6, 49152, 4791)
    # the BTH outside the linear part (a segment of a GSO send): still read, by skb_load_bytes
    assert run(fh, frame(s, d, qp=0x10100B), linear=14 + 20 + 8) == hash32(fh, s, d, 17, 49152, 4791, qp=0x10100B)


@pytest.mark.parametrize("weights", [[1, 1, 1, 1], [1, 1, 1], [2, 1]])
def test_spray_takes_a_routers_uplinks_in_strict_turn(weights):
    n = len(weights)
    fh = FlowHash(True, 1, "spray", group=[f"spine{k + 1}" for k in range(n)], weights=weights)
    vm = Vm({FLOWS_FD: HashMap(kernel_side.FLOW_VALUE)})
    s, d = addr("10.1.0.1"), addr("10.1.0.9")
    key = hash32(fh, s, d, 17, 49152, 4791)
    got = [run(fh, frame(s, d), vm) for _ in range(3 * n)]
    assert got == [spray_hash(key, k, weights) for k in range(3 * n)]
    picks = [select(h, weights, [True] * n) for h in got]
    rnd = [k for k, w in enumerate(weights) for _ in range(w)]   # a link of weight 2 counts twice
    assert picks == [rnd[(key + k) % len(rnd)] for k in range(3 * n)]     # from the flow's own place


def test_spray_walks_the_next_hops_in_turn_where_routes_differ_in_them():
    fh = FlowHash(True, 1, "spray")
    flows = HashMap(kernel_side.FLOW_VALUE)
    vm = Vm({FLOWS_FD: flows})
    s, d = addr("10.1.0.1"), addr("10.1.0.9")
    key = hash32(fh, s, d, 17, 49152, 4791)
    got = [run(fh, frame(s, d), vm) for _ in range(64)]
    assert got == [spray_hash(key, k) for k in range(64)]
    assert struct.unpack("<QQ", flows.values[struct.pack("<I", key)]) == (0, 64)
    for n in (2, 3, 4, 8):
        counts = [0] * n
        for h in got:
            counts[select(h, [1] * n, [True] * n)] += 1
        assert max(counts) - min(counts) <= 2, (n, counts)
    # another flow has its own count
    other = run(fh, frame(s, d, sport=49153), vm)
    assert other == spray_hash(hash32(fh, s, d, 17, 49153, 4791), 0)


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_spray_balances_any_flow_over_n_next_hops_within_a_few_packets(n):
    rnd = random.Random(n)
    for _ in range(50):
        key = rnd.getrandbits(32)
        packets = rnd.randrange(50, 5000)
        counts = [0] * n
        for k in range(packets):
            counts[select(spray_hash(key, k), [1] * n, [True] * n)] += 1
        # a low-discrepancy sequence: the shares differ by a few packets (the log of their
        # number), where a random choice per packet would differ by about sqrt(packets / n)
        assert max(counts) - min(counts) <= 6, (n, packets, counts)
    assert WEYL % 2 == 1


def test_flowlet_keeps_its_path_within_the_gap_and_draws_again_after_it():
    gap = 200_000_000                                  # 50 us of fabric time at dilation 4000
    fh = FlowHash(True, 1, "flowlet", gap_ns=gap)
    now = [1_000_000_000]
    flows = HashMap(kernel_side.FLOW_VALUE)
    vm = Vm({FLOWS_FD: flows}, clock=lambda: now[0])
    s, d = addr("10.1.0.1"), addr("10.1.0.9")
    h = state(fh, s, d, 17, 49152, 4791)
    key = hash32(fh, s, d, 17, 49152, 4791)
    expected, number = [], 0
    for pause in (0, 1000, gap // 2, gap, gap + 1, 10, 3 * gap, gap - 1, gap + 5_000_000):
        now[0] += pause
        if pause > gap:
            number += 1
        expected.append(flowlet_hash(fh, h, number))
        assert run(fh, frame(s, d), vm) == expected[-1], pause
        assert struct.unpack("<QQ", flows.values[struct.pack("<I", key)]) == (now[0], number)
    assert number == 3
    assert len(set(expected)) == 4


@pytest.mark.parametrize("weights", [[1, 1], [1, 1, 1, 1], [1, 3, 2], [1] * 8])
def test_adaptive_sends_each_packet_to_the_shallowest_uplink(weights):
    n = len(weights)
    fh = FlowHash(True, 1, "adaptive", group=[f"spine{k + 1}" for k in range(n)], weights=weights)
    depth = ArrayMap(1, 8 * (n + 1))
    vm = Vm({DEPTH_FD: depth})
    rnd = random.Random(n)
    targets = steer_targets(weights)
    for last in list(range(n)) * 10:
        depths = [rnd.choice((0, 0, 1500, 4096, 9000, 2 ** 40, -1500)) for _ in range(n)]
        depth.values[0][:] = struct.pack(f"<Q{n}q", last, *depths)
        got = run(fh, frame(rnd.getrandbits(32), rnd.getrandbits(32)), vm)
        pick = adaptive_pick(depths, last)
        assert got == targets[pick]
        assert select(got, weights, [True] * n) == pick
        assert depths[pick] == min(depths)
        assert struct.unpack_from("<Q", depth.values[0])[0] == pick          # the next scan starts after it


def test_adaptive_uplinks_that_tie_take_packets_in_turn():
    def picks(depths, count):
        out, last = [], len(depths) - 1
        for _ in range(count):
            last = adaptive_pick(depths, last)
            out.append(last)
        return out
    assert picks([0, 0, 0], 6) == [0, 1, 2, 0, 1, 2]
    # an uplink whose queue builds drops out, and the others share its part evenly
    assert picks([5, 0, 0, 0], 6) == [1, 2, 3, 1, 2, 3]


def test_adaptive_takes_its_turn_only_for_a_multipath_destination():
    """A packet to a destination with one next hop (an answer going down to a host) keeps its
    flow's hash and leaves the turn where it was: with idle uplinks a flow then takes them in turn
    even while its receiver's ICMP errors come back through the same router."""
    n = 4
    fh = FlowHash(True, 1, "adaptive", group=[f"spine{k + 1}" for k in range(n)], weights=[1] * n)
    depth = ArrayMap(1, 8 * (n + 1))
    vm = Vm({DEPTH_FD: depth, MULTIPATH_FD: LpmMap(["10.2.0.0/16"])})
    code = kernel_side.program(fh, None, DEPTH_FD, MULTIPATH_FD)
    targets = steer_targets(fh.weights)
    up, down = frame(addr("10.1.0.1"), addr("10.2.0.9")), frame(addr("10.2.0.9"), addr("10.1.0.1"))
    picks = []
    for k in range(8):
        skb = Skb(up)
        assert vm.run(code, skb) == -1
        picks.append(targets.index(skb.hash))
        turn = struct.unpack_from("<Q", depth.values[0])[0]
        skb = Skb(down)
        assert vm.run(code, skb) == -1
        assert struct.unpack_from("<Q", depth.values[0])[0] == turn          # left alone
        assert skb.hash == run(FlowHash(True, 1, "ecmp", group=fh.group, weights=fh.weights), down)
    assert picks == [1, 2, 3, 0, 1, 2, 3, 0]         # from the turn after the last (0)


def test_depth_counters_add_at_the_queue_and_take_away_at_the_far_end():
    depth = ArrayMap(1, 8 * 3)
    vm = Vm({DEPTH_FD: depth})
    pkt = frame(1, 2)
    for slot in (0, 1, 1):
        assert vm.run(lbwire.counter_program(DEPTH_FD, slot, +1), Skb(pkt)) == -1
    assert struct.unpack("<Qqq", depth.values[0]) == (0, len(pkt), 2 * len(pkt))
    assert vm.run(lbwire.counter_program(DEPTH_FD, 1, -1), Skb(pkt)) == -1
    assert struct.unpack("<Qqq", depth.values[0]) == (0, len(pkt), len(pkt))


def test_every_mode_is_whole_instructions_whose_jumps_land_inside_it():
    for mode in (None, "ecmp", "ecmp-qp", "flowlet", "spray", "adaptive"):
        fh = FlowHash(True, 1, mode, gap_ns=5, group=["a", "b", "c"], weights=[1, 1, 1])
        code = kernel_side.program(fh, FLOWS_FD, DEPTH_FD)
        insns = [struct.unpack_from("=BBhi", code, k) for k in range(0, len(code), 8)]
        assert insns[-1][0] == kernel_side.EXIT
        for k, (op, _regs, off, _imm) in enumerate(insns):
            if op & 0x07 == 0x05 and op not in (kernel_side.CALL, kernel_side.EXIT):
                assert 0 <= k + 1 + off < len(insns), (mode, k, off)


def test_link_imbalance_is_max_over_mean_per_leaf_and_direction():
    from labctl.telemetry.fabricports import link_imbalance
    uplinks = {"leaf1": {"spine1": {"up": 3_000_000, "down": 1_000_000}, "spine2": {"up": 1_000_000, "down": 1_000_000}},
               "leaf2": {"spine1": {"up": 0, "down": 0}, "spine2": {"up": 0, "down": 500}}}
    got = link_imbalance(uplinks)
    assert got["worst"] == 1.5 and got["per_leaf"] == {"leaf1 up": 1.5, "leaf1 down": 1.0}
    assert link_imbalance({"leaf1": {"a": {"up": 0, "down": 0}, "b": {"up": 0, "down": 0}}}, floor=0)["worst"] == 1.0


def test_a_collision_is_two_ring_hops_out_of_one_switch_port():
    from labctl.experiment.metrics import ring_collisions
    from labctl.traffic.placement import collision_note
    hops = [{"from": "a", "to": "b", "sport": 1, "spine": "spine1", "links": ["leaf1:spine1", "spine1:leaf2"]},
            {"from": "c", "to": "d", "sport": 1, "spine": "spine1", "links": ["leaf3:spine1", "spine1:leaf4"]},
            {"from": "e", "to": "f", "sport": 1, "spine": "spine2", "links": ["leaf1:spine2", "spine2:leaf4"]}]
    assert collision_note(hops) is None and ring_collisions({"hops": hops}) == 0    # one spine, no shared link
    hops[2]["links"] = ["leaf1:spine1", "spine1:leaf4"]
    note = collision_note(hops)
    assert "a -> b and e -> f on leaf1:spine1" in note and "c -> d and e -> f on spine1:leaf4" in note
    assert "about 2x its bound" in note
    assert ring_collisions({"hops": hops}) == 3


def test_a_shared_port_is_a_collision_only_where_ecmp_chose_it_and_its_rate_is_short():
    from labctl.experiment.metrics import ring_collisions
    from labctl.traffic.causes import explain
    from labctl.traffic.placement import busiest, collision_note

    def hop(a, b, links, ecmp, uplink_bps):
        return {"from": a, "to": b, "sport": 1, "spine": "spine1", "links": links, "ecmp_links": ecmp,
                "link_bps": {link: uplink_bps for link in links}, "hop_bps": 400}
    # the only way on (a zone's one spine, a DCI router): the topology's, not a draw
    only_way = [hop(x, y, ["leaf1:spine1", "spine1:dci1"], [], 400) for x, y in (("a", "b"), ("c", "d"))]
    assert collision_note(only_way) is None and ring_collisions({"hops": only_way}) == 0
    # chosen by ECMP, but an 800G uplink carries two 400G hops
    two = [hop(x, y, ["leaf1:spine1"], ["leaf1:spine1"], 800) for x, y in (("a", "b"), ("c", "d"))]
    assert collision_note(two) is None and busiest(two) == 1.0
    # three on it ask 1.5 times its rate
    three = two + [hop("e", "f", ["leaf1:spine1"], ["leaf1:spine1"], 800)]
    note = collision_note(three)
    assert "a -> b and c -> d and e -> f on leaf1:spine1" in note and "about 1.5x its bound" in note, note
    assert busiest(three) == 1.5 and ring_collisions({"hops": three}) == 3
    # and the slow run's account charges ECMP what the busiest port's 1.5x explains, not 3x
    doc = {"results": [{"time_s": 3.0, "ideal_s": 1.0,
                        "bound": {"bandwidth_s": 1.0, "alpha_s": 0.0, "propagation_s": 0.0},
                        "per_rank": {"0": {"bytes_sent": 1}}}], "ranks": [0], "loss_ledger": {"total": 0},
           "ring_placement": {"hops": three, "note": note}}
    out = explain(doc, Path("/nonexistent.csv"))
    assert out["causes"][0].startswith("ECMP collision, about 0.50 s"), out


def _model_paths(plan, mode: str, qps: int) -> list[dict]:
    """fabric_paths as `labctl route` would trace them, from the model alone: the ring's pairs,
    each QP's destination QP hashed where the leaves run ecmp-qp, a fixed source port."""
    import dataclasses
    from labctl.traffic.pool import gpu_ranks, path_ports
    from labctl.traffic.sender import qpn
    ranks = gpu_ranks(plan)
    order = list(ranks)
    out = []
    for i, r in enumerate(order):
        p = order[(i + 1) % len(order)]
        ia, ib = path_ports(plan, ranks[r], ranks[p])
        leaf = plan.node(ia.peer_node)
        fh = dataclasses.replace(leaf.flow_hash, mode=mode)
        for k in range(qps):
            h = hash32(fh, addr(ia.address.split("/")[0]), addr(ib.address.split("/")[0]), 17, 0xC000, 4791,
                       qp=qpn(p, r, k))
            up = fh.group[select(h, fh.weights, [True] * len(fh.weights))]
            out.append({"src": r, "dst": p, "qp": k, "sport": 0xC000, "spine": leaf.iface(up).peer_node})
    return out


def test_the_hash_predicts_the_experiments_link_imbalance():
    """experiments/load-balancing.yml's lab and ring: the imbalance the hash itself predicts for
    ECMP (2.0: both hops of a leaf on one link), ecmp-qp with one QP (1.0: a lucky draw) and four
    (1.5: eight flows per leaf over two uplinks), which the ports' counters measured."""
    from labctl.experiment.metrics import predicted_imbalance
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    plan = compile_plan(load_topology(root / "topologies" / "leaf-spine.yml", ["scale_up=false", "lb=ecmp"], "t"))
    assert plan.node("leaf1").flow_hash.mode == "ecmp" and plan.node("leaf1").flow_hash.group == ["spine1", "spine2"]
    assert predicted_imbalance(plan, {"fabric_paths": _model_paths(plan, "ecmp", 1)}) == 2.0
    assert predicted_imbalance(plan, {"fabric_paths": _model_paths(plan, "ecmp-qp", 1)}) == 1.0
    assert predicted_imbalance(plan, {"fabric_paths": _model_paths(plan, "ecmp-qp", 4)}) == 1.5


def test_no_imbalance_is_predicted_where_a_path_leaves_its_leaf_spine():
    """Across two zones (wan-distance's lab) a pair's traced spine can be the far zone's: the
    leaf-spine model does not hold there, and the prediction says so with 0 instead of failing."""
    from labctl.experiment.metrics import predicted_imbalance
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    from labctl.traffic.pool import gpu_ranks, path_ports
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    plan = compile_plan(load_topology(root / "topologies" / "scale-across.yml", [], "t"))
    ranks = gpu_ranks(plan)
    first, last = list(ranks)[0], list(ranks)[-1]
    ia, _ = path_ports(plan, ranks[first], ranks[last])
    near = {i.peer_node for i in plan.node(ia.peer_node).interfaces}
    far = next(n.name for n in plan.nodes if n.forwarding and n.name not in near and n.name != ia.peer_node)
    paths = [{"src": first, "dst": last, "qp": 0, "sport": 0xC000, "spine": far}]
    assert predicted_imbalance(plan, {"fabric_paths": paths}) == 0.0


def test_a_run_reports_its_reordering_naks_and_resent_bytes():
    from labctl.traffic.report import reordering, reordering_line
    counters = {"0": {"rx": [{"packets": 900, "reordered": 90, "early": 0, "dropped": 40, "naks_sent": 7}],
                      "tx": [{"retransmitted": 50, "retransmitted_bytes": 210_000}]},
                "1": {"rx": [{"packets": 100, "reordered": 10, "early": 0, "dropped": 0, "naks_sent": 0}], "tx": []}}
    r = reordering(counters, {"reliable": True, "ooo": "drop"})
    # 1,000 arrivals of which 50 were resends: the share is of the 950 first transmissions
    assert (r["data_packets"], r["naks"], r["retransmitted_bytes"], r["receivers"]) == (950, 7, 210_000, "drop")
    assert abs(r["reordered_share"] - 100 / 950) < 1e-12
    assert reordering_line(r) == ("# reordering: 10.53% of 950 data packets (first transmissions) arrived after a "
                                  "later one (100); go-back-N receivers (ooo: drop): 7 NAKs, 50 packets (210,000 "
                                  "bytes) resent")
    assert reordering(counters, {"reliable": False})["receivers"] == "unreliable"
    # user trial: a single-path WAN that dropped 30 packets read 30 reordered: each came again as a
    # resend the receiver never saw, behind later ones it had; the ledger's losses are taken off
    r = reordering(counters, {"reliable": True, "ooo": "drop"}, network_lost=30)
    assert (r["reordered"], r["resends_of_lost"]) == (70, 30)
    assert "(70, not counting 30 resends of packets the network lost)" in reordering_line(r)
    assert reordering(counters, {"reliable": True}, network_lost=500)["reordered"] == 50   # at most what was resent
    assert reordering(counters, {"reliable": False}, network_lost=30)["reordered"] == 100   # nothing is resent


def test_a_switch_whose_routes_the_plan_does_not_hold_is_taken_to_have_chosen():
    """On a BGP lab FRR learns the routes and the plan holds none: a port two ring hops share
    there still counts as ECMP's (it once read no collision at all on leaf-spine-bgp)."""
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    from labctl.traffic.placement import _multipath
    ROOT = Path(__file__).resolve().parents[1]
    bgp = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine-bgp.yml", []))
    leaf = bgp.node("leaf1")
    assert not leaf.routes and _multipath(leaf, "10.1.0.9")
    static = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml", []))
    far = next(i.address.split("/")[0] for n in static.nodes if n.kind == "gpu" for i in n.interfaces
               if i.peer_node == "leaf4")
    assert _multipath(static.node("leaf1"), far)           # two spines toward leaf4
    assert not _multipath(static.node("spine1"), far)      # one link down to leaf4


def _leaf_spine(sets: list[str]):
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    root = Path(__file__).resolve().parents[1]
    return compile_plan(load_topology(root / "topologies" / "leaf-spine.yml", sets))


def test_lb_on_a_lab_without_lb_or_a_tier_without_routers_is_an_error_with_the_fix():
    """`labctl lb leaf=spray` on a lab that names no lb: changed nothing and said "no router"."""
    from labctl.errors import LabError
    from labctl.lifecycle.balance import checked, routers_for
    with pytest.raises(LabError) as err:
        routers_for(_leaf_spine([]), "leaf")
    assert "names no lb" in str(err.value) and "lb: ecmp" in err.value.fix
    plan = _leaf_spine(["lb=ecmp"])
    assert {"leaf1", "leaf4"} <= {n.name for n in routers_for(plan, "leaf")}
    assert {n.name for n in routers_for(plan, "spine")} == {"spine1", "spine2"}
    with pytest.raises(LabError):                # every setting is checked before any is made
        checked(plan, "spine", "bogus")


def _with_lb(tmp_path, lb: str):
    """The bundled leaf-spine, rendered, with `routing.lb` as given."""
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    root = Path(__file__).resolve().parents[1]
    rendered = (root / "tests" / "golden" / "leaf-spine-2x2.rendered.yml").read_text()
    line = next(x for x in rendered.splitlines() if x.startswith("routing:"))
    f = tmp_path / "lab.yml"
    f.write_text(rendered.replace(line, "routing: {hash_policy: 1, hash_seed: 1, lb: %s}" % lb))
    return compile_plan(load_topology(f, [])), f


def test_a_tier_with_no_choice_to_make_gets_a_located_note(tmp_path):
    """A spine has one next hop towards every GPU: `lb: {spine: adaptive}` was accepted silently."""
    plan, f = _with_lb(tmp_path, "{leaf: spray, spine: adaptive}")
    spine_notes = [n for n in plan.notes if "routing.lb.spine" in n]
    assert len(spine_notes) == 1, plan.notes
    assert spine_notes[0].startswith(f"{f}:") and "spine1, spine2" in spine_notes[0]
    assert "one next hop towards every end host" in spine_notes[0]
    assert not [n for n in plan.notes if "routing.lb.leaf" in n]   # the leaves choose among uplinks
    plan, _ = _with_lb(tmp_path, "{leaf: spray}")
    assert not [n for n in plan.notes if "next hop" in n]
