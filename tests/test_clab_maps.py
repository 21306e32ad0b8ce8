"""containerlab files as people write them, without root: groups with a group-level kind,
startup-config and bound FRR files, public images mapped to labctl's own, names in upper case,
and network-OS nodes run as FRR routers or plain namespaces by a kind map, every link kept."""
from __future__ import annotations

from pathlib import Path

import pytest

from labctl.errors import InputError
from labctl.plan.compile import compile_plan
from labctl.topology.clabmaps import ImportMaps, parse, repository
from labctl.topology.load import load_topology, render_topology

CLAB = Path(__file__).resolve().parent / "clab"
GROUPS = CLAB / "groups" / "groups.clab.yml"
CLOS = CLAB / "kindmap" / "clos.clab.yml"


def test_groups_inherit_between_kinds_and_the_node_and_may_set_the_kind():
    plan = compile_plan(load_topology(GROUPS))
    r1, pc2 = plan.node("r1"), plan.node("pc2")
    assert r1.container.image == "labctl/frr" and pc2.container.image == "labctl/host"
    assert r1.container.env == {"LAB": "groups"}                   # from topology.defaults
    assert r1.container.binds == [f"{CLAB / 'groups' / 'daemons'}:/etc/frr/daemons:ro",       # the group's
                                  f"{CLAB / 'groups' / 'r1.conf'}:/etc/frr/frr.conf:ro"]      # startup-config
    assert r1.exec == [["sysctl", "-w", "net.ipv4.ip_forward=1"], ["/usr/lib/frr/frrinit.sh", "start"]], \
        "a router forwards, as under Docker, and FRR is started as the image's entrypoint would"
    assert pc2.exec[0] == ["ip", "address", "add", "10.0.2.2/24", "dev", "eth1"]
    assert plan.lab == "groups-lab" and len(plan.links) == 3


def test_what_is_mapped_or_ignored_is_noted_in_the_rendered_file():
    text, _, _ = render_topology(GROUPS)
    for note in ("node 'R1' is 'r1' here", "image quay.io/frrouting/frr:10.5.1 runs as labctl/frr",
                 "image ghcr.io/hellt/network-multitool runs as labctl/host", "PC1: labels kept as notes, not read: role",
                 "PC2.env-files: ignored", "FRR started by an exec line"):
        assert "# note: " in text and note in text, note


def test_an_explicit_image_map_wins_and_an_identity_map_keeps_the_image():
    keep = compile_plan(load_topology(GROUPS, maps=parse(image_map=["network-multitool=network-multitool"])))
    assert keep.node("pc1").container.image == "ghcr.io/hellt/network-multitool"
    other = compile_plan(load_topology(GROUPS, maps=parse(image_map=["quay.io/frrouting/frr:9=labctl/frr:custom"])))
    assert other.node("r1").container.image == "labctl/frr:custom"


@pytest.mark.parametrize("image, repo", [("quay.io/frrouting/frr:10.5.1", "frrouting/frr"), ("alpine", "alpine"),
                                         ("alpine@sha256:abc", "alpine"), ("localhost:5000/x/y:1", "x/y"),
                                         ("ghcr.io/hellt/network-multitool", "hellt/network-multitool")])
def test_an_image_is_matched_by_its_repository(image, repo):
    assert repository(image) == repo


def test_a_network_os_is_refused_with_the_kind_map_that_runs_its_shape():
    with pytest.raises(InputError) as exc:
        load_topology(CLOS)
    assert f"{CLOS}:13" in str(exc.value) and "--kind-map nokia_srlinux=frr" in exc.value.fix


@pytest.mark.parametrize("target", ["frr", "linux"])
def test_a_kind_map_keeps_every_node_and_link(target):
    plan = compile_plan(load_topology(CLOS, maps=parse([f"nokia_srlinux={target}"])))
    assert sorted(n.name for n in plan.nodes) == ["client1", "client2", "leaf1", "leaf2", "mgmt", "spine1", "spine2"]
    assert len(plan.links) == 6, "the link to containerlab's host is dropped, the six fabric links kept"
    leaf1 = plan.node("leaf1")
    assert {i.name for i in leaf1.interfaces} == {"e1-49", "e1-50", "e1-1"}     # ethernet-1/N, as containerlab maps
    assert (leaf1.container.image if target == "frr" else leaf1.container) == ("labctl/frr" if target == "frr" else None)
    assert not plan.node("mgmt").interfaces, "a lone node stands alone, as in containerlab"
    text, _, _ = render_topology(CLOS, maps=parse([f"nokia_srlinux={target}"]))
    assert "its NOS configuration (startup-config, type, binds, exec) is not translated" in text
    assert "host:spine1-e10 dropped" in text


CHASSIS = Path(__file__).resolve().parent / "clab" / "kindmap" / "chassis.clab.yml"


def test_line_cards_in_their_control_cards_netns_fold_into_one_node_with_a_loop_cable():
    """containerlab's distributed SR-SIM: each card is a node with `network-mode: container:CPM`.
    Mapped, each chassis is one node holding every card's ports (a chain of shares is followed),
    and a cable between two cards of one chassis is a loop cable on that node."""
    with pytest.raises(InputError, match="--kind-map nokia_srsim=frr"):
        load_topology(CHASSIS)
    plan = compile_plan(load_topology(CHASSIS, maps=parse(["nokia_srsim=linux"])))
    assert sorted(n.name for n in plan.nodes) == ["ch1-a", "ch2-a"]
    assert {i.name for i in plan.node("ch1-a").interfaces} == {"1-1-c1-1", "2-1-c1-1", "1-1-c2-1", "2-1-c2-1"}
    assert {i.name for i in plan.node("ch2-a").interfaces} == {"1-1-c1-1", "2-1-c1-1"}
    ends = sorted(tuple(sorted((lk.a.split(":")[0], lk.b.split(":")[0]))) for lk in plan.links)
    assert ends == [("ch1-a", "ch1-a"), ("ch1-a", "ch2-a"), ("ch1-a", "ch2-a")]
    text, _, _ = render_topology(CHASSIS, maps=parse(["nokia_srsim=linux"]))
    assert "ch1-2: shares ch1-a's network namespace (network-mode: container:ch1-1)" in text


def test_a_loop_cable_on_a_node_labctl_numbers_is_refused(tmp_path):
    f = tmp_path / "loop.yml"
    f.write_text("name: loop\nnodes:\n  a: {kind: host, addresses: none}\n  b: {kind: host}\n"
                 "links:\n  - endpoints: [a:x, a:y]\n  - endpoints: [a:z, b]\n")
    plan = compile_plan(load_topology(f))
    assert sorted(i.name for i in plan.node("a").interfaces) == ["x", "y", "z"]
    f.write_text(f.read_text().replace("a: {kind: host, addresses: none}", "a: {kind: host}"))
    with pytest.raises(InputError, match="link 0 connects 'a' to itself") as exc:
        load_topology(f)
    assert "addresses: none" in exc.value.fix


def test_plan_shows_how_the_file_was_read():
    from click.testing import CliRunner
    from labctl.cli import cli
    result = CliRunner().invoke(cli, ["plan", str(CLAB / "forwarding.clab.yml")], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "how the containerlab file was read" in result.output
    assert "r1: image frrouting/frr:v8.4.1 runs as labctl/frr" in result.output
    assert "r1: IPv4 forwarding turned on by an exec line" in result.output


def test_a_folded_card_keeps_its_name_and_its_port_names(tmp_path):
    """A folded node's name is still taken (a node of the same name, in any case, is refused rather
    than losing its links to the card's holder), and its NOS port names are translated even when it
    shares the netns of a plain Linux node."""
    f = tmp_path / "cards.clab.yml"
    f.write_text("name: c\ntopology:\n  nodes:\n    cp: {kind: srl}\n    LC1: {kind: srl, network-mode: 'container:cp'}\n"
                 "    lc1: {kind: linux}\n    peer: {kind: linux}\n  links:\n    - endpoints: [lc1:eth1, peer:eth1]\n"
                 "    - endpoints: [LC1:e1, peer:eth2]\n")
    with pytest.raises(InputError, match="node 'lc1' is 'lc1' in labctl, as node 'LC1' is") as exc:
        load_topology(f, maps=parse(["srl=linux"]))
    assert f"{f}:6" in str(exc.value)
    f.write_text("name: c\ntopology:\n  nodes:\n    box: {kind: linux, image: labctl/host}\n"
                 "    card: {kind: srl, network-mode: 'container:box'}\n    peer: {kind: linux}\n"
                 "  links:\n    - endpoints: [card:ethernet-1/1, peer:eth1]\n")
    plan = compile_plan(load_topology(f, maps=parse(["srl=frr"])))
    assert [i.name for i in plan.node("box").interfaces] == ["e1-1"]


def test_a_circle_of_shared_netns_is_refused_where_it_starts(tmp_path):
    f = tmp_path / "circle.clab.yml"
    f.write_text("name: c\ntopology:\n  nodes:\n    a: {kind: srl, network-mode: 'container:b'}\n"
                 "    b: {kind: srl, network-mode: 'container:a'}\n  links:\n    - endpoints: [a:e1, b:e2]\n")
    with pytest.raises(InputError, match="a circle of network-mode") as exc:
        load_topology(f, maps=parse(["srl=frr"]))
    assert f"{f}:4" in str(exc.value)


@pytest.mark.parametrize("kinds, images, message", [
    (["nokia_srlinux"], [], "not KIND=TARGET"),
    (["nokia_srlinux=srl"], [], "not KIND=TARGET"),
    (["Bad Kind=frr"], [], "not KIND=TARGET"),
    ([], ["frr"], "not IMAGE=IMAGE"),
    ([], ["a=b;rm -rf /"], "not IMAGE=IMAGE"),
])
def test_bad_maps_are_refused_before_anything_is_read(kinds, images, message):
    with pytest.raises(InputError) as exc:
        parse(kinds, images)
    assert message in str(exc.value) and exc.value.fix


def test_a_planned_node_without_links_is_still_a_mistake(tmp_path):
    f = tmp_path / "lone.yml"
    f.write_text("name: lone\nnodes:\n  a: {kind: host}\n  b: {kind: host}\n  c: {kind: host}\n"
                 "links:\n  - endpoints: [a, b]\n")
    with pytest.raises(InputError, match="node 'c' has no links"):
        load_topology(f)


def test_default_maps_are_empty():
    assert ImportMaps().image("labctl/host") == ("labctl/host", False)
