"""containerlab files as people write them, brought up on a real Docker engine: an FRR lab with
groups, a group-level kind, public images (mapped to labctl's own) and FRR configured by
startup-config plus a bound daemons file reaches BGP Established and pings end to end; a Clos of
SR Linux nodes comes up on FRR with --kind-map, every planned link present and up in its
namespaces; distributed chassis whose cards share a netns come up as one namespace each, with
their loop cable. `down` leaves nothing."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import lab_namespaces
from labctl import lifecycle as labmod
from labctl.topology.clabmaps import parse

CLAB = Path(__file__).resolve().parent / "clab"
pytestmark = pytest.mark.netns
ESTABLISH_S = 60          # eBGP with FRR's datacenter defaults: connect retry 10 s, hold 9 s


def vtysh_json(plan, lab, node: str, command: str) -> dict:
    argv = labmod.backend_of(lab).exec_argv(plan.node(node), ["vtysh", "-c", command])
    return json.loads(subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout or "{}")


def established(plan, lab, node: str) -> bool:
    peers = vtysh_json(plan, lab, node, "show bgp summary json").get("ipv4Unicast", {}).get("peers", {})
    return bool(peers) and all(p.get("state") == "Established" for p in peers.values())


def ping(plan, lab, src: str, dst: str) -> bool:
    argv = labmod.backend_of(lab).netns_argv(plan.node(src), ["ping", "-c1", "-W1", "-q", dst])
    return subprocess.run(argv, capture_output=True).returncode == 0


def test_frr_lab_with_groups_and_startup_config_reaches_bgp_established(docker_engine, state_dir, lab_name):
    maps = parse(image_map=["frrouting/frr=labctl/frr"])
    plan, lab, _ = labmod.up(str(CLAB / "groups" / "groups.clab.yml"), name=lab_name, maps=maps)
    try:
        assert plan.node("r1").container.image == "labctl/frr"
        deadline = time.monotonic() + ESTABLISH_S
        while not (established(plan, lab, "r1") and established(plan, lab, "r2")):
            assert time.monotonic() < deadline, (vtysh_json(plan, lab, "r1", "show bgp summary json"),
                                                 vtysh_json(plan, lab, "r2", "show bgp summary json"))
            time.sleep(1)
        # pc1 reaches pc2 only through the routes the two routers learnt from each other over BGP
        while not ping(plan, lab, "pc1", "10.0.2.2"):
            assert time.monotonic() < deadline + 20, "pc1 cannot reach pc2 with BGP Established"
            time.sleep(1)
        routes = vtysh_json(plan, lab, "r1", "show ip route bgp json")
        assert "10.0.2.0/24" in routes, routes
    finally:
        labmod.down(lab_name)
    assert lab_namespaces(lab_name + "-") == []
    assert not docker_engine.containers.list(all=True, filters={"label": f"labctl.lab={lab_name}"})


def test_sr_linux_clos_comes_up_on_frr_with_every_link_in_place(docker_engine, state_dir, lab_name):
    plan, lab, _ = labmod.up(str(CLAB / "kindmap" / "clos.clab.yml"), name=lab_name,
                             maps=parse(["nokia_srlinux=frr"]))
    try:
        assert len(plan.links) == 6
        for node in plan.nodes:
            argv = labmod.backend_of(lab).netns_argv(node, ["ip", "-j", "link", "show"])
            links = {x["ifname"]: x for x in json.loads(subprocess.run(argv, capture_output=True, text=True,
                                                                       check=True).stdout)}
            for iface in node.interfaces:
                assert iface.name in links, (node.name, iface.name, sorted(links))
                assert "UP" in links[iface.name]["flags"] and "LOWER_UP" in links[iface.name]["flags"], \
                    (node.name, iface.name, links[iface.name]["flags"])
        leaf1 = plan.node("leaf1")
        argv = labmod.backend_of(lab).exec_argv(leaf1, ["sh", "-c", "pgrep -x zebra >/dev/null && echo zebra"])
        assert subprocess.run(argv, capture_output=True, text=True).stdout.strip() == "zebra", \
            "the mapped node runs FRR"
    finally:
        labmod.down(lab_name)
    assert lab_namespaces(lab_name + "-") == []


def test_a_missing_image_is_refused_where_it_is_named_before_any_container_and_the_engine_goes(
        state_dir, lab_name, tmp_path):
    """No registry is used: a node whose image this engine lacks is refused with the file and key
    and the ways to get it, before any container exists; an engine started for this lab stops again
    (one that ran before is left running)."""
    from labctl import state
    from labctl.containers import engine
    from labctl.errors import InputError
    ran_before = engine.answering()
    f = tmp_path / "absent.clab.yml"
    f.write_text("name: absent\ntopology:\n  nodes:\n    a: {kind: linux, image: example.org/absent/thing:1.0}\n"
                 "    b: {kind: linux}\n  links:\n    - endpoints: [a:eth1, b:eth1]\n")
    with pytest.raises(InputError) as exc:
        labmod.up(str(f), name=lab_name, trust=True)
    assert str(exc.value.where) == f"{f}: nodes.a.image", exc.value.where
    assert "'example.org/absent/thing:1.0' is not in this machine's Docker engine" in str(exc.value)
    assert "--image-map absent/thing=labctl/host" in exc.value.fix and "docker load" in exc.value.fix
    assert lab_namespaces(lab_name + "-") == [] and not state.lab_dir(lab_name).path.exists()
    assert engine.answering() == ran_before, "an engine started for this lab alone is stopped again"


def test_a_router_on_the_frr_image_forwards_as_under_docker(docker_engine, state_dir, lab_name):
    plan, lab, _ = labmod.up(str(CLAB / "forwarding.clab.yml"), name=lab_name)
    try:
        assert plan.node("r1").container.image == "labctl/frr", "the public FRR image runs as labctl's"
        assert ping(plan, lab, "h1", "10.0.2.2"), "h1 reaches h2 through r1"
    finally:
        labmod.down(lab_name)
    assert lab_namespaces(lab_name + "-") == []


def test_distributed_chassis_comes_up_as_one_node_each_with_its_loop_cable(state_dir, lab_name):
    """containerlab's SR-SIM line cards share their control card's netns; mapped, each chassis is
    one namespace with every card's ports, and the cable between two cards of one chassis is a veth
    whose two ends are both in it."""
    plan, lab, _ = labmod.up(str(CLAB / "kindmap" / "chassis.clab.yml"), name=lab_name,
                             maps=parse(["nokia_srsim=linux"]))
    try:
        assert sorted(lab_namespaces(lab_name + "-")) == [f"{lab_name}-ch1-a", f"{lab_name}-ch2-a"]
        seen = {}
        for node in plan.nodes:
            argv = labmod.backend_of(lab).netns_argv(node, ["ip", "-j", "link", "show", "type", "veth"])
            seen[node.name] = {x["ifname"]: x for x in json.loads(
                subprocess.run(argv, capture_output=True, text=True, check=True).stdout)}
        ch1, ch2 = seen["ch1-a"], seen["ch2-a"]
        assert sorted(ch1) == ["1-1-c1-1", "1-1-c2-1", "2-1-c1-1", "2-1-c2-1"] and sorted(ch2) == ["1-1-c1-1", "2-1-c1-1"]
        # the loop cable: each end names the other as its peer, in the same namespace
        assert ch1["1-1-c2-1"].get("link") == "2-1-c2-1" and ch1["2-1-c2-1"].get("link") == "1-1-c2-1", ch1
        # the cables between the chassis: peers in the other namespace, every end up
        for port in ("1-1-c1-1", "2-1-c1-1"):
            assert "link_netnsid" in ch1[port] and "link_netnsid" in ch2[port], (ch1[port], ch2[port])
        for ports in seen.values():
            assert all("LOWER_UP" in x["flags"] for x in ports.values()), ports
    finally:
        labmod.down(lab_name)
    assert lab_namespaces(lab_name + "-") == []


def test_up_makes_a_missing_labctl_image_and_no_build_refuses_naming_the_command(docker_engine, state_dir, lab_name,
                                                                              tmp_path):
    from labctl import state
    from labctl.containers import images
    from labctl.errors import LabError
    f = tmp_path / "two.clab.yml"
    f.write_text("name: two\ntopology:\n  nodes:\n    a: {kind: linux, image: labctl/host}\n"
                 "    b: {kind: linux, image: labctl/host}\n  links:\n    - endpoints: [a:eth1, b:eth1]\n")
    keyed = images.tag(images.recipe("host"))
    docker_engine.images.get(keyed)                      # the fixture built it: only the `latest` name goes
    docker_engine.api.remove_image("labctl/host:latest")
    try:
        with pytest.raises(LabError) as exc:
            labmod.up(str(f), name=lab_name, build_images=False)
        assert "labctl image build host" in exc.value.fix
        assert lab_namespaces(lab_name + "-") == [] and not state.lab_dir(lab_name).path.exists()
        assert not docker_engine.containers.list(all=True, filters={"label": f"labctl.lab={lab_name}"})
        plan, lab, _ = labmod.up(str(f), name=lab_name)
        try:
            assert docker_engine.images.get("labctl/host:latest").id == docker_engine.images.get(keyed).id
        finally:
            labmod.down(lab_name)
    finally:
        docker_engine.images.get(keyed).tag("labctl/host", "latest")
    assert lab_namespaces(lab_name + "-") == []


def test_a_container_node_gets_the_least_it_needs(docker_engine, state_dir, lab_name):
    """NET_ADMIN and Docker's defaults, not SYS_ADMIN; Docker's seccomp filter; its own netns's
    sysctls writable, the host's (kernel.*) read-only."""
    from labctl.containers.nodes import CAPABILITIES
    plan, lab, _ = labmod.up(str(CLAB / "hosts.clab.yml"), name=lab_name)
    try:
        node = next(n for n in plan.nodes if n.container)

        def inside(script: str) -> subprocess.CompletedProcess:
            return subprocess.run(labmod.backend_of(lab).exec_argv(node, ["sh", "-c", script]), capture_output=True,
                                  text=True, timeout=30)
        status = dict(line.split(":", 1) for line in inside("cat /proc/self/status").stdout.splitlines() if ":" in line)
        eff = int(status["CapEff"].strip(), 16)
        held = {name for bit, name in enumerate(CAPABILITIES) if eff >> bit & 1}
        assert "NET_ADMIN" in held and "NET_RAW" in held, held
        assert not held & {"SYS_ADMIN", "SYS_MODULE", "SYS_PTRACE", "SYS_RAWIO", "DAC_READ_SEARCH"}, held
        init = dict(x.split(":", 1) for x in inside("cat /proc/1/status").stdout.splitlines() if ":" in x)
        assert init["Seccomp"].strip() == "2", "the container runs under Docker's default seccomp filter"
        assert inside("echo 1 > /proc/sys/net/ipv4/ip_forward").returncode == 0, "the node's own netns is its own"
        assert inside("cat /proc/sys/net/ipv4/ip_forward").stdout.strip() == "1"
        assert inside("echo core > /proc/sys/kernel/core_pattern").returncode != 0, "the host's sysctls are not"
        # what labctl runs in it is entered by the engine, under the same filter and flags, and no
        # file of the container's runs before (an image's setpriv, run by nsenter with every
        # capability of the host's root, was the author's code run as root on the host)
        assert status["Seccomp"].strip() == "2" and status["NoNewPrivs"].strip() == "1", status
        planted = "printf '#!/bin/sh\\ntouch /planted-ran\\nexec /usr/bin/setpriv \"$@\"\\n' > /usr/local/sbin/setpriv"
        assert inside(planted + " && chmod 755 /usr/local/sbin/setpriv").returncode == 0
        assert inside("true").returncode == 0
        assert inside("test -e /planted-ran").returncode == 1, "a file of the container's ran before labctl's own"
    finally:
        labmod.down(lab_name)
    assert lab_namespaces(lab_name + "-") == []
