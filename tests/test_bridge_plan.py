"""The bridge kind in the plan (no root): one subnet per L2 segment, no address on a bridge's ports,
routes through the segment's router, and the loops and double ports labctl refuses."""
from __future__ import annotations

import ipaddress
from pathlib import Path

from labctl.plan.compile import compile_plan
from labctl.plan.feeders import feeders
from labctl.topology.load import load_topology

BRIDGED = Path(__file__).resolve().parent / "topologies" / "bridged.yml"


def test_a_segment_is_one_subnet_and_its_bridges_hold_no_address():
    plan = compile_plan(load_topology(BRIDGED))
    (seg,) = plan.segments
    assert seg.bridges == ["s1", "s2"] and len(seg.links) == 5
    net = ipaddress.ip_network(seg.subnet)
    members = {n.name: i for n in plan.nodes for i in n.interfaces if i.link in seg.links and not n.bridged}
    assert set(members) == {"g1", "g2", "g3", "r1"}
    assert all(ipaddress.ip_interface(i.address).network == net for i in members.values())
    assert len({i.address for i in members.values()}) == 4 and net.prefixlen == 29
    assert all(i.address == "" for n in plan.nodes if n.bridged for i in n.interfaces)
    assert plan.node("s1").bridged and not plan.node("s1").forwarding and plan.node("s1").routes == []


def test_hosts_on_a_segment_route_through_its_router_and_the_router_reaches_them_directly():
    plan = compile_plan(load_topology(BRIDGED))
    r1 = plan.node("r1")
    gw = r1.iface("s1").address.split("/")[0]
    assert {h.via for r in plan.node("g2").routes for h in r.nexthops} == {gw}
    assert r1.routes == []                         # both of its subnets are connected
    h4_route = {r.dst: r for r in plan.node("h4").routes}
    assert {h.via for r in h4_route.values() for h in r.nexthops} == {r1.iface("h4").address.split("/")[0]}


def test_a_bridge_lets_every_port_feed_every_other():
    plan = compile_plan(load_topology(BRIDGED))
    s2 = plan.node("s2")
    assert feeders(plan, s2) == {"s1": {"g2", "g3"}, "g2": {"s1", "g3"}, "g3": {"s1", "g2"}}
