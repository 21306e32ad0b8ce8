"""PFC frames against scapy's dissector and the pause arithmetic (pure)."""
import pytest
from scapy.all import Ether
from scapy.contrib.mac_control import MACControlClassBasedFlowControl

from labctl.dataplane import pfc


def test_frame_is_802_1qbb_and_parses_back():
    f = pfc.frame("02:1a:00:00:00:01", 3, 0xFFFF)
    p = Ether(f)
    assert p.dst == pfc.PFC_DST and p.type == 0x8808
    m = p[MACControlClassBasedFlowControl]
    assert m.c3_enabled == 1 and m.c3_pause_time == 0xFFFF and m.c0_enabled == 0
    assert pfc.parse(f) == {3: 0xFFFF}
    assert pfc.parse(pfc.frame("02:1a:00:00:00:01", 3, 0)) == {3: 0}


@pytest.mark.parametrize("tc", range(8))
@pytest.mark.parametrize("quanta", [0, 1, 0x1234, 0xFFFF])
def test_frame_is_byte_for_byte_what_scapy_builds(tc, quanta):
    """Built with struct (an agent in a node image has no scapy): the same bytes as scapy's layer."""
    from scapy.compat import raw
    mac = "02:1a:00:07:00:03"
    fields = {f"c{tc}_enabled": 1, f"c{tc}_pause_time": quanta}
    assert pfc.frame(mac, tc, quanta) == raw(Ether(dst=pfc.PFC_DST, src=mac) / MACControlClassBasedFlowControl(**fields))


def test_other_frames_are_not_pfc():
    assert pfc.parse(bytes(60)) is None
    assert pfc.parse(b"\x01\x80\xc2\x00\x00\x01" + bytes(6) + b"\x88\x08\x00\x01" + bytes(44)) is None  # PAUSE


def test_pause_time_in_quanta_of_512_bit_times():
    assert pfc.pause_seconds(0xFFFF, 100_000_000) == pytest.approx(0.3355, rel=1e-3)
    assert pfc.pause_seconds(1, 400e9) == pytest.approx(1.28e-9)


def test_pause_refresh_and_release_on_a_simulated_clock():
    rate = 100_000_000
    half = pfc.pause_seconds(0xFFFF, rate) / 2
    s = pfc.PortPfc(3)
    assert s.decide(False, 0.0, rate) is None                 # nothing congested: silence
    assert s.decide(True, 0.0, rate) == 0xFFFF                # XOFF: pause the feeder
    s.last_sent = 0.0
    assert s.decide(True, half * 0.9, rate) is None           # still covered by that pause
    assert s.decide(True, half * 1.01, rate) == 0xFFFF        # refreshed before it runs out
    s.last_sent = half * 1.01
    assert s.decide(False, half * 1.2, rate) == 0             # below XON: release with quanta 0
    assert s.decide(False, half * 1.3, rate) is None


def test_received_pauses_start_extend_expire_and_resume():
    rate = 100_000_000
    s = pfc.PortPfc(3)
    assert s.on_frame(0xFFFF, 1.0, rate) == "pause"
    assert s.on_frame(0xFFFF, 1.1, rate) is None and s.rx_frames == 2      # a refresh only extends
    assert not s.expired(1.1 + pfc.pause_seconds(0xFFFF, rate) * 0.99)
    assert s.expired(1.1 + pfc.pause_seconds(0xFFFF, rate))
    assert s.on_frame(0, 1.2, rate) == "resume"
    s.ended(1.2)
    assert s.paused_total == pytest.approx(0.2) and s.counters(2.0)["paused_s"] == pytest.approx(0.2)
    assert s.on_frame(0, 1.3, rate) is None                                  # XON when not paused


def test_headroom_grows_with_feeders_rate_and_distance():
    from labctl.plan.qos import headroom
    from labctl.plan.qos import PFC_RESPONSE_S
    one = headroom(100_000_000, 1, 0, 9014)
    assert one == 12_500_000 * PFC_RESPONSE_S + 2 * 9014            # the reaction at line rate, two frames
    assert headroom(100_000_000, 3, 0, 9014) == 3 * 12_500_000 * PFC_RESPONSE_S + 2 * 9014
    # 10 ms of (dilated) propagation: the round trip of the link comes on top
    assert headroom(100_000_000, 1, 10_000_000, 9014) == 12_500_000 * (0.02 + PFC_RESPONSE_S) + 2 * 9014


def test_a_slower_controller_given_by_the_lab_gets_more_headroom_and_reports_against_it():
    from labctl.plan.compile import compile_plan
    from labctl.topology import sources

    def spine_port(sets):
        plan = compile_plan(sources.load("topologies/leaf-spine.yml", ["scale_up=false", "dilation=16000", *sets],
                                         (), None, None))
        return plan, next(c for c in plan.node("spine2").iface("leaf1").shaping.classes if c.lossless)

    plan, default = spine_port([])
    slow_plan, slow = spine_port(["pfc_response=200ms"])
    assert plan.pfc_response_s == pytest.approx(0.03) and slow_plan.pfc_response_s == pytest.approx(0.2)
    # three feeding leaves at 25 Mbit/s: 170 ms more of them sits above XOFF
    assert default.xoff_bytes - slow.xoff_bytes == pytest.approx(3 * 25e6 / 8 * 0.17, abs=2)


def test_a_shared_buffer_lowers_xoff_as_it_fills():
    # alpha 1, 2 MB shared: a lone queue pauses at half of it, a busier switch earlier, never past XOFF
    assert pfc.dynamic_xoff(2_600_000, 2_000_000, 1.0, used=0) == 2_000_000
    assert pfc.dynamic_xoff(2_600_000, 2_000_000, 1.0, used=1_000_000) == 1_000_000
    assert pfc.dynamic_xoff(2_600_000, 2_000_000, 1.0, used=2_500_000) == 0
    assert pfc.dynamic_xoff(500_000, 2_000_000, 8.0, used=1_000_000) == 500_000


def pause_graph(plan):
    """Wait-for edges between lossless queues: (node, egress) congested -> pauses the queue of the
    neighbour on each feeding port that sends into this node."""
    import networkx as nx
    from labctl.plan.feeders import feeders
    g = nx.DiGraph()
    for n in plan.nodes:
        if not n.forwarding:
            continue
        for egress, ingresses in feeders(plan, n).items():
            for i in ingresses:
                port = n.iface(i)
                g.add_edge((n.name, egress), (port.peer_node, port.peer_iface))
    return g


@pytest.mark.parametrize("topology,sets", [("leaf-spine.yml", []), ("leaf-spine.yml", ["rail_optimised=false"]),
                                           ("scale-across.yml", []), ("ai-cluster.yml", ["zones=2"])])
def test_pfc_pauses_only_feeders_so_no_wait_cycle_can_deadlock_the_fabric(topology, sets):
    import networkx as nx
    from pathlib import Path
    from labctl.plan.feeders import feeders
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    plan = compile_plan(load_topology(Path(__file__).parents[1] / "topologies" / topology, sets))
    first_leaf = next(n for n in plan.nodes if n.forwarding and "leaf" in n.name and "fe-" not in n.name)
    f = feeders(plan, first_leaf)
    uplinks = [i.name for i in first_leaf.interfaces if plan.node(i.peer_node).forwarding]
    hosts = [i.name for i in first_leaf.interfaces if not plan.node(i.peer_node).forwarding]
    assert all(f[u] <= set(hosts) and f[u] for u in uplinks)     # up only from hosts, never spine to spine
    assert all(set(uplinks) <= f[h] for h in hosts)               # down from every spine
    cycles = list(nx.simple_cycles(pause_graph(plan)))
    assert cycles == []
