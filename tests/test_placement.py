"""Placement over machines (no root): resolution, spread rules, the compiled plan, the VXLAN request."""
from __future__ import annotations

from pathlib import Path

import pytest

from labctl.errors import InputError
from labctl.plan.compile import compile_plan
from labctl.plan.model import LabPlan
from labctl.topology.load import load_topology, load_topology_text
from labctl.topology.placement import apply_hosts, machine_of, spread

LSB = Path(__file__).parent.parent / "topologies" / "leaf-spine-bgp.yml"

LAB = """
name: pl
nodes:
  h1: {kind: gpu, server: s1}
  h2: {kind: gpu, server: s2}
  nvs1: {kind: nvswitch, fabric: nvlink, server: s1}
  r1: {kind: switch, fabric: backend}
fabrics:
  backend: {kind: scale-out}
  nvlink: {kind: scale-up}
links:
  - endpoints: [h1, r1]
  - endpoints: [h2, r1]
  - endpoints: [h1, nvs1]
placement:
  '*': m1
  s1: m2
  h2: m3
"""


def test_most_specific_name_wins():
    topo = load_topology_text(LAB, "pl.yml").topology
    assert [machine_of(topo, n) for n in ("h1", "h2", "nvs1", "r1")] == ["m2", "m3", "m2", "m1"]


def test_spread_by_server_keeps_the_fabric_on_the_first_machine():
    loaded = load_topology(LSB)
    apply_hosts(loaded, ["m1", "m2", "m3"], "server")
    topo = loaded.topology
    assert {machine_of(topo, n) for n in ("spine1", "leaf4")} == {"m1"}
    assert {machine_of(topo, n) for n in topo.nodes if n.startswith("srv1")} == {"m2"}
    assert {machine_of(topo, n) for n in topo.nodes if n.startswith("srv2")} == {"m3"}


def test_spread_by_node_and_one_host():
    topo = load_topology(LSB).topology
    by_node = spread(topo, ["a", "b"], "node")
    assert list(by_node.values())[:4] == ["a", "b", "a", "b"]
    assert set(spread(topo, ["solo"], "server").values()) == {"solo"}
    with pytest.raises(ValueError):
        spread(topo, ["a"], "rack")


def test_hosts_with_a_bad_name_is_located():
    with pytest.raises(InputError) as info:
        apply_hosts(load_topology(LSB), ["m1", "Bad Name"])
    assert "--hosts" in str(info.value)


def test_placed_plan_has_containers_machines_and_tunnels():
    plan = compile_plan(load_topology_text(LAB, "pl.yml"))
    by = {n.name: n for n in plan.nodes}
    assert by["h1"].machine == "m2" and by["r1"].machine == "m1"
    # a node the file runs in no container runs labctl's image; a switch's gets SYS_ADMIN for its agent's BPF
    assert by["h1"].container.image == "labctl/host" and by["h1"].container.chosen
    assert by["h1"].container.cap_add == [] and by["nvs1"].container.cap_add == ["SYS_ADMIN"]
    assert [lk.machines for lk in plan.links] == [["m2", "m1"], ["m3", "m1"], None]
    again = LabPlan.from_dict(plan.to_dict())
    assert [lk.machines for lk in again.links] == [["m2", "m1"], ["m3", "m1"], None]
    assert again.node("h2").machine == "m3"


def test_unplaced_plan_is_unchanged():
    plan = compile_plan(load_topology_text(LAB.split("placement:")[0], "pl.yml"))
    assert all(n.machine is None and n.container is None for n in plan.nodes)
    assert all(lk.machines is None for lk in plan.links)


def test_vxlan_request_decodes_as_the_kernel_reads_it():
    """Our hand-packed RTM_NEWLINK for a VXLAN port, read back by pyroute2's own decoder."""
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
    from labctl.kernel import rtnl
    from labctl.kernel.netlink import message
    kind, flags, body = rtnl.vxlan("leaf1", 42, "02:00:00:00:01:02", 9000, 7, 10005, "192.168.77.1",
                                   "192.168.77.2", 3, 14789)
    msg = ifinfmsg(message(kind, flags, body, 1))
    msg.decode()
    assert msg["index"] == 42
    assert msg.get_attr("IFLA_IFNAME") == "leaf1" and msg.get_attr("IFLA_MTU") == 9000
    assert msg.get_attr("IFLA_ADDRESS") == "02:00:00:00:01:02" and msg.get_attr("IFLA_NET_NS_FD") == 7
    info = msg.get_attr("IFLA_LINKINFO")
    assert info.get_attr("IFLA_INFO_KIND") == "vxlan"
    data = info.get_attr("IFLA_INFO_DATA")
    assert data.get_attr("IFLA_VXLAN_ID") == 10005
    assert data.get_attr("IFLA_VXLAN_GROUP") == "192.168.77.2" and data.get_attr("IFLA_VXLAN_LOCAL") == "192.168.77.1"
    assert data.get_attr("IFLA_VXLAN_LINK") == 3 and data.get_attr("IFLA_VXLAN_PORT") == 14789
    assert data.get_attr("IFLA_VXLAN_LEARNING") == 0


def test_a_lab_is_refused_on_machines_it_cannot_reach(state_dir):
    """Placement names machines of labctl's cluster record, on this host's kernel: a machine it
    does not know, or one on another host, is a located error before anything is made."""
    from labctl.cluster.machines import Machine, save
    from labctl.lifecycle.build import plan_for
    save({"m1": Machine("m1", "unix:///run/lcm-m1.sock", "192.168.77.1", "lcm-m1", True),
          "far": Machine("far", "ssh://root@far", "192.168.1.9")})
    loaded = load_topology(LSB)
    apply_hosts(loaded, ["m1", "m2"])
    with pytest.raises(InputError) as info:
        plan_for(loaded)
    assert "machine 'm2' is not in labctl's cluster (it knows m1, far)" in str(info.value)
    assert info.value.where.key == "placement"
    loaded = load_topology(LSB)
    apply_hosts(loaded, ["m1", "far"])
    with pytest.raises(InputError) as info:
        plan_for(loaded)
    assert "machine 'far' is another host (ssh://root@far)" in str(info.value)


def test_a_default_delay_on_a_link_between_machines_is_refused_at_the_link():
    text = LAB.replace("name: pl\n", "name: pl\ndefaults: {latency: 1ms}\n")
    with pytest.raises(InputError) as info:
        compile_plan(load_topology_text(text, "pl.yml"))
    assert "runs between machines m2 and m1" in str(info.value) and info.value.where.key == "links[0]"


def test_tunnel_ports_get_indexes_no_host_hands_out():
    plan = compile_plan(load_topology_text(LAB, "pl.yml"))
    by = {n.name: n for n in plan.nodes}
    assert by["h1"].iface("r1").index == (1 << 30) + 0 and by["r1"].iface("h1").index == (1 << 30) + 1
    assert by["h1"].iface("nvs1").index < 100            # a link on one machine keeps its veth index
    indexes = [i.index for n in plan.nodes for i in n.interfaces]
    assert len(indexes) == len(set(indexes))


def test_each_lab_takes_a_free_block_of_vnis(state_dir):
    from labctl.cluster.vxlan import VNI_FIRST, allocate
    from labctl.state import all_labs, claim
    a, b, c = (claim(n, {"lab": n}, None) for n in ("va", "vb", "vc"))
    assert allocate(a, all_labs(), 24) == VNI_FIRST
    assert allocate(b, all_labs(), 10) == VNI_FIRST + 24          # adjacent to a's block
    a.write_state(vni_base=None)                                  # a went: its block is free again
    assert allocate(c, all_labs(), 20) == VNI_FIRST                # fits in the gap a left
    assert allocate(a, all_labs(), 30) == VNI_FIRST + 34           # does not fit there any more
    b.write_state(vni_base="10000; rm -rf /")
    with pytest.raises(Exception) as info:
        allocate(c, all_labs(), 5)
    assert "VNI block labctl did not write" in str(info.value)


def test_the_cluster_record_is_checked_as_hostile_input(state_dir):
    import json
    from labctl.cluster import machines
    from labctl.errors import LabError
    state_dir.mkdir(parents=True, exist_ok=True)
    for bad in ({"machines": {"m1": 1}}, {"machines": [{"name": "m1", "engine": "unix:///x", "address": 5}]},
                {"machines": [{"name": "m1", "engine": "unix:///run/lcm-m1.sock", "address": "192.168.77.1",
                               "netns": "other-lab-leaf1"}]}, ["m1"]):
        machines.record_path().write_text(json.dumps(bad))
        with pytest.raises(LabError):
            machines.load()
    # an emulated machine is on this kernel; any other unix socket is not taken for it
    assert machines.Machine("m1", "unix:///run/lcm-m1.sock", "192.168.77.1", "lcm-m1").on_this_host
    assert not machines.Machine("x", "unix:///tmp/forwarded.sock", "192.168.1.2").on_this_host
    assert machines.Machine("h", "unix:///var/run/docker.sock", "192.168.1.1").on_this_host
