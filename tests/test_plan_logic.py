"""Planner properties on the bundled leaf-spine, checked against what the topology implies."""
from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from labctl.plan.compile import compile_plan
from labctl.names import NamingError, assign_ifnames
from labctl.topology.load import load_topology

ROOT = Path(__file__).resolve().parents[1]
LEAF_SPINE = ROOT / "topologies" / "leaf-spine.yml"


@pytest.fixture(scope="module")
def plan():
    return compile_plan(load_topology(LEAF_SPINE))


def test_default_leaf_spine_shape(plan):
    kinds = [n.kind for n in plan.nodes]
    assert kinds.count("switch") == 6 and kinds.count("gpu") == 8 and kinds.count("nvswitch") == 2
    assert sorted(n.rank for n in plan.nodes if n.kind == "gpu") == list(range(8))


def test_rail_optimised_gpu_i_on_leaf_of_rail_i(plan):
    for n in plan.nodes:
        if n.kind == "gpu":
            g = int(n.name.split("gpu")[1])
            leaf = [i.peer_node for i in n.interfaces if i.fabric == "backend"]
            assert leaf == [f"leaf{g + 1}"]


def test_scale_up_never_touches_backend(plan):
    for lk in plan.links:
        ends = [plan.node(e.split(":")[0]).kind for e in (lk.a, lk.b)]
        if "nvswitch" in ends:
            assert lk.fabric == "nvlink" and "switch" not in ends


def test_ifnames_fit_and_are_unique(plan):
    for n in plan.nodes:
        names = [i.name for i in n.interfaces]
        assert len(set(names)) == len(names)
        assert all(len(x) <= 15 for x in names)
        for i in n.interfaces:  # never the peer's ifindex: the kernel would delay carrier by up to 1 s
            assert i.index != plan.node(i.peer_node).iface(i.peer_iface).index


def test_addresses_unique_and_p2p(plan):
    addrs = [i.address for n in plan.nodes for i in n.interfaces] + [n.loopback for n in plan.nodes if n.loopback]
    assert len(set(addrs)) == len(addrs)
    for n in plan.nodes:
        for i in n.interfaces:
            mine = ipaddress.ip_interface(i.address)
            assert mine.network.prefixlen == 31
            assert ipaddress.ip_address(i.peer_address) in mine.network


def test_leaf_reaches_remote_hosts_over_every_spine(plan):
    leaf1 = plan.node("leaf1")
    remote = plan.node("srv2-gpu1").iface("leaf2").address
    net = str(ipaddress.ip_interface(remote).network)
    route = next(r for r in leaf1.routes if r.dst == net)
    assert sorted(h.dev for h in route.nexthops) == ["spine1", "spine2"]


def test_spine_reaches_host_subnet_through_its_leaf_only(plan):
    spine = plan.node("spine1")
    net = str(ipaddress.ip_interface(plan.node("srv1-gpu2").iface("leaf3").address).network)
    route = next(r for r in spine.routes if r.dst == net)
    assert [h.dev for h in route.nexthops] == ["leaf3"]


def test_every_backend_router_reaches_every_backend_prefix(plan):
    for n in plan.nodes:
        if not n.forwarding or n.fabric != "backend":
            continue
        covered = {r.dst for r in n.routes} | {str(ipaddress.ip_interface(i.address).network)
                                               for i in n.interfaces} | {n.loopback}
        want = {lk.subnet for lk in plan.links if lk.fabric == n.fabric}
        want |= {m.loopback for m in plan.nodes if m.loopback and m.fabric == n.fabric}
        assert want <= covered, (n.name, want - covered)


def test_shaping_is_dilated_rate_with_1ms_burst(plan):
    port = plan.node("srv1-gpu0").iface("leaf1")
    assert port.shaping.rate_bps == 100_000_000  # 400G / 4000
    assert port.shaping.burst_bytes == 2 * 9014  # 1 ms at 100 Mbit/s is 12.5 kB, less than two frames


def test_a_port_reshaped_to_a_new_rate_keeps_its_class_shares_and_a_1ms_burst(plan):
    """What `tc set --rate` writes into the kernel and the lab's record (qos.reshaped)."""
    from labctl.plan import qos
    from labctl.traffic.pool import quiet_floor
    port = plan.node("leaf1").iface("spine1")
    old = port.shaping
    new = qos.reshaped(old, 4_000_000_000)
    assert new.rate_bps == 4_000_000_000 and new.burst_bytes == 500_000      # 1 ms at 4 Gbit/s
    assert [c.name for c in new.classes] == [c.name for c in old.classes] and len(new.classes) >= 2
    for before, after in zip(old.classes, new.classes):
        assert after.rate_bps / new.rate_bps == pytest.approx(before.rate_bps / old.rate_bps, rel=1e-3)
        assert (after.buffer_bytes, after.xoff_bytes, after.prio) == (before.buffer_bytes, before.xoff_bytes, before.prio)
    assert old.rate_bps == 100_000_000, "the given shaping is left as it was"
    # slowed to a trickle and set back: the classes' proportions come back (the record's shares are
    # exact; only the kernel is given MIN_CLASS_BPS at least)
    back = qos.reshaped(qos.reshaped(old, 20_000), old.rate_bps)
    for before, after in zip(old.classes, back.classes):
        assert after.rate_bps == pytest.approx(before.rate_bps, rel=1e-3)
    # a slower port drains its queue later: the silence an agent allows grows with it
    import copy
    slow = copy.deepcopy(plan)
    slow_port = slow.node("leaf1").iface("spine1")
    slow_port.shaping = qos.reshaped(slow_port.shaping, old.rate_bps // 10)
    assert quiet_floor(slow) > quiet_floor(plan)


def test_tc_set_refuses_a_rate_below_what_a_port_is_shaped_to_before_touching_the_lab(plan):
    from labctl import lifecycle
    from labctl.errors import LabError
    with pytest.raises(LabError) as info:
        lifecycle.tc_set(None, plan, plan.node("leaf1"), "spine1", rate="0")     # no lab: nothing is touched
    assert "8 kbit/s at least" in str(info.value) and "link down" in info.value.fix


def test_oversubscription_sets_uplink_rate():
    plan = compile_plan(load_topology(LEAF_SPINE, sets=["oversubscription=2"]))
    uplink = next(lk for lk in plan.links if lk.a.startswith("leaf1:spine1"))
    down = sum(lk.rate_bps for lk in plan.links if lk.b.startswith("leaf1:") and "gpu" in lk.a)
    ups = sum(lk.rate_bps for lk in plan.links if lk.a.startswith("leaf1:spine"))
    assert down / ups == pytest.approx(2.0)
    assert uplink.rate_bps == 200_000_000_000


def test_top_of_rack_puts_a_server_on_one_leaf():
    plan = compile_plan(load_topology(LEAF_SPINE, sets=["rail_optimised=false"]))
    for s in ("srv1", "srv2"):
        leaves = {i.peer_node for n in plan.nodes if n.server == s and n.kind == "gpu"
                  for i in n.interfaces if i.fabric == "backend"}
        assert len(leaves) == 1


def test_parallel_links_get_suffixes():
    names = assign_ifnames([("a", None, "b", None), ("a", None, "b", None), ("a", "b-2", "c", None)])
    assert names[0] == ("b", "a") and names[1] == ("b-3", "a-2") and names[2] == ("b-2", "a")


def test_long_peer_name_is_an_error():
    with pytest.raises(NamingError, match="at most 15"):
        assign_ifnames([("a", None, "x" * 16, None)])


def test_scale_up_domains_are_separate_islands(plan):
    nvs1 = plan.node("srv1-nvs")
    srv2_nvlink = {lk.subnet for lk in plan.links if "srv2-nvs" in lk.b}
    assert srv2_nvlink and not srv2_nvlink & {r.dst for r in nvs1.routes}


def test_zones_route_through_the_wan_with_ecmp_over_parallel_links_and_weights(tmp_path):
    """Scale-across: a zone's own prefixes never leave it; the other zone is reached through the
    DCI router, which spreads over both parallel WAN links, in proportion to their weights."""
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    root = Path(__file__).resolve().parents[1]
    plan = compile_plan(load_topology(root / "topologies" / "scale-across.yml", ["wan_links=2"]))
    dci = plan.node("z1-dci1")
    wan_ports = [i.name for i in dci.interfaces if plan.fabrics[i.fabric].kind == "scale-across"]
    assert len(wan_ports) == 2
    far = plan.node("z2-srv1-gpu0").interfaces[0]
    route = next(r for r in dci.routes if r.dst == plan.links[far.link].subnet)
    assert sorted(h.dev for h in route.nexthops) == sorted(wan_ports)
    leaf = plan.node("z1-leaf1")
    near = plan.node("z1-srv2-gpu1").interfaces[0]
    inside = next(r for r in leaf.routes if r.dst == plan.links[near.link].subnet)
    assert all(plan.node(leaf.iface(h.dev).peer_node).zone == "z1" for h in inside.nexthops)
    # weights: a copy of the rendered lab with one WAN link weighted 3
    text = load_topology(root / "topologies" / "scale-across.yml", ["wan_links=2"]).text
    lines = text.splitlines()
    k = next(i for i, line in enumerate(lines) if "z2-dci1]" in line and "distance" in line)
    lines[k] = lines[k].replace("distance:", "weight: 3, distance:")
    f = tmp_path / "w.yml"
    f.write_text("\n".join(lines) + "\n")
    weighted = compile_plan(load_topology(f)).node("z1-dci1")
    route = next(r for r in weighted.routes if r.dst == plan.links[far.link].subnet)
    assert sorted(h.weight for h in route.nexthops) == [1, 3]


def test_l4_ecmp_hashes_the_five_tuple_like_a_switch_and_l3_only_addresses():
    from labctl.plan.sysctls import multipath_hash_sysctls
    assert multipath_hash_sysctls(1, 7) == {"net.ipv4.fib_multipath_hash_policy": "3",
                                            "net.ipv4.fib_multipath_hash_fields": "55",   # 0x37
                                            "net.ipv4.fib_multipath_hash_seed": "7"}
    assert multipath_hash_sysctls(0, 7)["net.ipv4.fib_multipath_hash_policy"] == "0"


def test_sysctls_an_older_kernel_lacks_fall_back_and_others_still_fail(monkeypatch):
    from labctl.kernel import nsutil
    monkeypatch.setitem(nsutil.SYSCTL_FALLBACKS, "net.ipv4.labctl_not_in_any_kernel", None)
    nsutil.write_sysctls({"net.ipv4.labctl_not_in_any_kernel": "1"})        # skipped: the kernel default stays
    with pytest.raises(OSError):
        nsutil.write_sysctls({"net.ipv4.labctl_not_in_this_kernel_either": "1"})
