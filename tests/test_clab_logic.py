"""containerlab files in and out, without root: the corpus in tests/clab/ reads as labctl labs
(kinds and defaults inherited, exec lines kept, nothing numbered by labctl), every network-OS
kind is refused with its node, kind and alternative, and the export is valid containerlab (a
schema of its documented format) that reads back as the same nodes, links and addresses."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from labctl import exports
from labctl.errors import InputError, LabError
from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology, load_topology_text, render_topology

ROOT = Path(__file__).resolve().parents[1]
CLAB = ROOT / "tests" / "clab"
CORPUS = sorted(CLAB.glob("*.clab.yml"))
NOS = sorted((CLAB / "nos").glob("*.clab.yml"))
SCHEMA = json.loads((CLAB / "clab-subset.schema.json").read_text())


def plan_of(path):
    return compile_plan(load_topology(path))


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_corpus_reads_with_exec_lines_and_no_planned_addresses(path):
    plan = plan_of(path)
    hosts = [n for n in plan.nodes if not n.bridged]
    assert hosts and all(not n.numbered and not n.routes for n in hosts)
    assert all(i.address == "" for n in plan.nodes for i in n.interfaces)
    assert all(n.exec for n in hosts), [n.name for n in hosts if not n.exec]
    raw = yaml.safe_load(path.read_text())
    assert len(plan.links) == len(raw["topology"]["links"])


def test_kinds_and_defaults_are_inherited_and_the_node_wins():
    plan = plan_of(CLAB / "routed.clab.yml")
    h1, r1, h2 = (plan.node(n) for n in ("h1", "r1", "h2"))
    assert h1.container.image == "labctl/host" and h1.container.env == {"LAB": "routed"}
    assert r1.container is None, "image: '' on the node overrides the kind's image: a plain namespace"
    assert r1.exec[0] == ["sysctl", "-w", "net.ipv4.ip_forward=1"]
    assert {i.name for i in r1.interfaces} == {"eth1", "eth2"}         # the extended link form too
    assert h2.container.name == f"labctl-{plan.lab}-h2"
    text, _, _ = render_topology(CLAB / "routed.clab.yml")
    assert "# note: mgmt: ignored" in text and "mgmt-ipv4: ignored" in text


def test_binds_are_taken_from_the_lab_files_directory():
    plan = plan_of(CLAB / "frr.clab.yml")
    assert plan.node("r1").container.binds[1] == f"{CLAB / 'frr' / 'r1.conf'}:/etc/frr/frr.conf:ro"
    assert plan.node("h1").container.image == "labctl/host"        # from kinds.linux


def test_bridge_kind_becomes_labctls_bridge_with_an_unnumbered_segment():
    plan = plan_of(CLAB / "bridged.clab.yml")
    assert plan.node("br1").bridged and [s.subnet for s in plan.segments] == [""]


@pytest.mark.parametrize("path", NOS, ids=[p.stem for p in NOS])
def test_a_network_os_kind_is_refused_with_its_node_kind_and_alternative(path):
    expected = path.read_text().splitlines()[0].removeprefix("# error: ")
    with pytest.raises(InputError) as exc:
        load_topology(path)
    msg = str(exc.value)
    assert expected in msg and f"{path}:5" in msg, msg
    assert "labctl/frr" in msg and "kind: linux" in msg


@pytest.mark.parametrize("text, message", [
    ("name: x\ntopology:\n  nodes:\n    a: {kind: linux, startup-config: x.cfg, bogus: 1}\n",
     "unknown containerlab node key 'bogus'"),
    ("name: x\ntopology:\n  nodes:\n    a: {kind: host}\n", "containerlab's host kind"),
    ("name: x\ntopology:\n  nodes:\n    a: {kind: linux}\n  links:\n    - {type: macvlan, endpoints: [a:eth1, macvlan:enp0s3]}\n",
     "link type 'macvlan'"),
    ("name: x\ntopology:\n  nodes:\n    a.b: {kind: linux}\n", "node name 'a.b'"),
    ("name: x\ntopology:\n  nodes:\n    a: {}\n", "node 'a' has no kind"),
    ("name: x\ntopology:\n  nodes:\n    a: {kind: linux}\n    b: {kind: linux}\n  links:\n    - endpoints: [a, b]\n",
     "names no interface"),
    ("name: x\ntopology:\n  nodes:\n    a: {kind: linux, labels: {labctl.kind: gpu, labctl.rank: first}}\n",
     "labctl.rank must be a rank"),
    ("name: x\ntopology:\n  nodes:\n    a: {kind: linux, labels: [x]}\n", "labels must be a mapping"),
])
def test_bad_containerlab_input_names_the_line_and_key(tmp_path, text, message):
    f = tmp_path / "bad.clab.yml"
    f.write_text(text)
    with pytest.raises(InputError) as exc:
        load_topology(f)
    assert message in str(exc.value) and str(f) in str(exc.value), str(exc.value)


@pytest.mark.parametrize("topology", ["leaf-spine.yml", "leaf-spine-bgp.yml", "scale-across.yml", "ai-cluster.yml",
                                      "frontend.yml"])
def test_export_is_valid_containerlab_and_says_what_it_leaves_out(topology):
    plan = plan_of(ROOT / "topologies" / topology)
    text = exports.export(plan, "clab")
    doc = yaml.safe_load(text)
    jsonschema.validate(doc, SCHEMA)
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert any("PFC/ECN controller" in line for line in header)
    assert any(f"time dilation {plan.dilation:g}" in line for line in header)
    assert any("WAN line" in line for line in header) == any(lk.wire for lk in plan.links)
    with pytest.raises(LabError, match="containerlab cannot express"):
        exports.export(plan, "clab", strict=True)


def strict_export(name: str, nodes_and_links: str) -> dict:
    """A one-class lab at dilation 1 exported strictly, checked against containerlab's schema."""
    text = (f"name: {name}\ndilation: 1\ndefaults: {{rate: 1G}}\nqos: {{classes: [{{name: default, tc: 0}}]}}\n"
            + nodes_and_links)
    doc = yaml.safe_load(exports.export(compile_plan(load_topology_text(text, f"{name}.yml")), "clab", strict=True))
    jsonschema.validate(doc, SCHEMA)
    return doc


def test_strict_export_of_a_lab_containerlab_can_express():
    strict_export("plain", "nodes: {a: {kind: host}, s: {kind: switch}, b: {kind: host}}\n"
                           "links: [{endpoints: [a, s]}, {endpoints: [s, b]}]\n")


def test_export_reads_back_as_the_same_lab(tmp_path):
    plan = plan_of(ROOT / "topologies" / "leaf-spine.yml")
    f = tmp_path / "ls.clab.yml"
    f.write_text(exports.export(plan, "clab"))
    back = plan_of(f)
    assert [n.name for n in back.nodes] == [n.name for n in plan.nodes]
    assert [(lk.a, lk.b) for lk in back.links] == [(lk.a, lk.b) for lk in plan.links]
    for n in plan.nodes:
        lines = [" ".join(a) for a in back.node(n.name).exec]
        for i in n.interfaces:
            if i.address:
                assert f"ip address add {i.address} dev {i.name}" in lines
        assert len([x for x in lines if x.startswith("ip route add")]) == len(n.routes)
        assert back.node(n.name).container.image == "labctl/host"


def test_bgp_leaf_spine_plans_frr_on_every_switch_with_rfc7938_asns():
    plan = plan_of(ROOT / "topologies" / "leaf-spine-bgp.yml")
    switches = [n for n in plan.nodes if n.kind == "switch"]
    assert switches and all(n.container.image == "labctl/frr" and not n.routes and not n.static_routes
                            for n in switches)
    gpus = [n for n in plan.nodes if n.kind == "gpu"]
    assert all(n.routes and n.container is None for n in gpus), "hosts keep labctl's routes to the fabric"
    for n in switches:
        files = {f["path"]: f["text"] for f in n.container.files}
        conf = files["/etc/frr/frr.conf"]
        asn = 65000 if n.name.startswith("spine") else 65000 + int(n.name.removeprefix("leaf"))
        assert f"router bgp {asn}\n" in conf and "maximum-paths 64" in conf and "neighbor fabric bfd" in conf
        peers = {line.split()[1] for line in conf.splitlines() if line.endswith(" peer-group fabric")}
        assert peers == {i.peer_address for i in n.interfaces if plan.node(i.peer_node).kind == "switch"}
        assert "bgpd=yes" in files["/etc/frr/daemons"] and "bfdd=yes" in files["/etc/frr/daemons"]
    static = plan_of(ROOT / "topologies" / "leaf-spine.yml")
    assert [n.sysctls for n in static.nodes] == [n.sysctls for n in plan.nodes], "the same ECMP hash settings"


def test_node_files_are_refused_without_an_image_and_outside_the_tree(tmp_path):
    f = tmp_path / "lab.yml"
    f.write_text("name: x\nnodes:\n  a: {kind: host, files: {/etc/x: hello}}\n  b: {kind: host}\n"
                 "links: [{endpoints: [a, b]}]\n")
    with pytest.raises(InputError, match="has files: but no image"):
        plan_of(f)
    f.write_text("name: x\nnodes:\n  a: {kind: host, image: labctl/host, files: {/etc/x: {template: ../../etc/passwd}}}\n"
                 "  b: {kind: host}\nlinks: [{endpoints: [a, b]}]\n")
    with pytest.raises(InputError, match="not a path inside the template tree"):
        plan_of(f)


def test_cap_add_becomes_cap_add_a_powerful_line_and_network_mode_is_refused_with_why(tmp_path):
    from labctl.plan import trust
    f = tmp_path / "caps.clab.yml"
    f.write_text("name: caps\ntopology:\n  kinds:\n    linux: {cap-add: [NET_ADMIN]}\n  nodes:\n"
                 "    a: {kind: linux, image: alpine, cap-add: [SYS_PTRACE]}\n    b: {kind: linux}\n"
                 "  links:\n    - endpoints: [a:eth1, b:eth1]\n")
    loaded = load_topology(f)
    assert loaded.topology.nodes["a"].cap_add == ["NET_ADMIN", "SYS_PTRACE"]
    assert loaded.topology.nodes["b"].cap_add == [], "an image-less node is a namespace: cap-add is noted, not kept"
    assert [(p.what, p.text) for p in trust.powerful(loaded) if p.what == "capability"] == \
        [("capability", "NET_ADMIN"), ("capability", "SYS_PTRACE")]
    # exported, the capabilities come back as cap-add and read back the same, still powerful
    plan = plan_of(f)
    out = yaml.safe_load(exports.export(plan, "clab"))
    assert out["topology"]["nodes"]["a"]["cap-add"] == ["NET_ADMIN", "SYS_PTRACE"]
    assert "cap-add" not in out["topology"]["nodes"]["b"]
    again = tmp_path / "again.clab.yml"
    again.write_text(exports.export(plan, "clab"))
    back = load_topology(again)
    assert back.topology.nodes["a"].cap_add == ["NET_ADMIN", "SYS_PTRACE"]
    assert [p.text for p in trust.powerful(back) if p.what == "capability"] == ["NET_ADMIN", "SYS_PTRACE"]
    f.write_text("name: h\ntopology:\n  nodes:\n    a: {kind: linux, image: alpine, network-mode: host}\n")
    with pytest.raises(InputError) as exc:
        load_topology(f)
    assert f"{f}:4" in str(exc.value) and "a node in the host's" in str(exc.value), str(exc.value)


def test_export_writes_cap_add_as_containerlabs_cap_add():
    doc = strict_export("caps", "nodes:\n  a: {kind: host, image: labctl/host, cap_add: [NET_ADMIN, SYS_PTRACE]}\n"
                                "  b: {kind: host, image: labctl/host}\nlinks: [{endpoints: [a, b]}]\n")
    nodes = doc["topology"]["nodes"]
    assert nodes["a"]["cap-add"] == ["NET_ADMIN", "SYS_PTRACE"]
    assert "cap-add" not in nodes["b"] and not any("cap_add" in n for n in nodes.values())


def test_container_keys_survive_import_export_import(tmp_path):
    """cap-add from two levels, a cmd whose argument holds a space, env and binds: the plan of the
    exported file has each node's container as the first import planned it."""
    f = tmp_path / "caps.clab.yml"
    f.write_text("name: caps\ntopology:\n  kinds:\n    linux: {cap-add: [NET_ADMIN]}\n  nodes:\n"
                 "    a:\n      kind: linux\n      image: alpine\n      cap-add: [SYS_PTRACE]\n"
                 "      cmd: sh -c 'sleep infinity'\n      env: {GREETING: hello there}\n"
                 f"      binds: [{tmp_path}:/mnt:ro]\n      exec: [echo 'a b']\n"
                 "    b: {kind: linux, image: alpine}\n  links:\n    - endpoints: [a:eth1, b:eth1]\n")
    first = plan_of(f)
    a = first.node("a").container
    assert a.cap_add == ["NET_ADMIN", "SYS_PTRACE"] and a.cmd == ["sh", "-c", "sleep infinity"]
    out = tmp_path / "back.clab.yml"
    out.write_text(exports.export(first, "clab"))
    jsonschema.validate(yaml.safe_load(out.read_text()), SCHEMA)
    again = plan_of(out)
    for name in ("a", "b"):
        was, now = first.node(name).container, again.node(name).container
        assert (now.image, now.cmd, now.env, now.binds, now.cap_add) == \
            (was.image, was.cmd, was.env, was.binds, was.cap_add), name
    assert again.node("b").container.cap_add == ["NET_ADMIN"], "the kind's cap-add, written on the node"
    assert again.node("a").exec[-1] == ["echo", "a b"]


def test_an_export_directory_carries_the_fabric_in_each_nodes_agent(tmp_path):
    """--out DIR: every node that needs PFC or ECN binds its share and labctl's code and starts its
    agent, which builds its classes; the header no longer says PFC/ECN are left out."""
    from labctl.exports import clab
    from labctl.plan import share
    plan = plan_of(ROOT / "topologies" / "leaf-spine.yml")
    written = clab.export_dir(plan, tmp_path / "out")
    topo = tmp_path / "out" / f"{plan.lab}.clab.yml"
    assert written[0] == topo
    text = topo.read_text()
    doc = yaml.safe_load(text)
    jsonschema.validate(doc, SCHEMA)
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert not any("PFC/ECN controller" in line for line in header)
    assert any("switch agent" in line for line in header)
    served = {n.name for n in share.served(plan)}
    for name, node in doc["topology"]["nodes"].items():
        has_agent = clab.AGENT_LINE in node["exec"]
        assert has_agent == (name in served), name
        if has_agent:
            assert node["exec"][-1] == clab.AGENT_LINE and not any(line.startswith("sh -c 'tc ") for line in node["exec"])
            assert f"./agents/{name}:{clab.AGENT_HOME}" in node["binds"]
            got = share.read(tmp_path / "out" / "agents" / name / share.SHARE_FILE, plan.lab)
            assert got.node == plan.node(name) and got.queue_reads == "poll"
    # the code the agents run is labctl's own package, without byte code
    code = tmp_path / "out" / clab.CODE / "labctl"
    assert (code / "dataplane" / "controller.py").read_text() == (ROOT / "labctl" / "dataplane" / "controller.py").read_text()
    assert not list(code.rglob("__pycache__"))
    # and it reads back in labctl as the same lab, the agents' binds relative to the file
    back = plan_of(topo)
    assert [n.name for n in back.nodes] == [n.name for n in plan.nodes]
    # the GPUs come back as GPUs, with their ranks and servers: `labctl run` works on the import
    assert [(n.name, n.rank, n.server) for n in back.nodes if n.kind == "gpu"] == \
        [(n.name, n.rank, n.server) for n in plan.nodes if n.kind == "gpu"]
    leaf1 = back.node("leaf1").container
    assert f"{tmp_path / 'out' / 'agents' / 'leaf1'}:{clab.AGENT_HOME}" in leaf1.binds


def test_a_label_key_with_a_newline_stays_inside_its_comment(tmp_path):
    """A label's key is written into a note, a comment line of the lab labctl reads back: a newline
    in it added a top-level key (routing:) past the importer's list of allowed keys."""
    text = ('name: l\ntopology:\n  nodes:\n    a: {kind: linux, labels: {"x\\nrouting: {hash_seed: 7}\\n#": 1}}\n'
            "    b: {kind: linux}\n  links: [{endpoints: [a:eth1, b:eth1]}]\n")
    f = tmp_path / "l.clab.yml"
    f.write_text(text)
    out, _, _ = render_topology(f)
    assert "# note:" in out and not any(line.startswith("routing") for line in out.splitlines()), out


def test_an_export_of_a_running_import_adds_each_address_once():
    """containerlab trial: a running containerlab lab, exported, added every address twice (the one
    learned back from the kernel, and the node's own exec line), and came up nowhere again."""
    plan = plan_of(CLAB / "routed.clab.yml")
    learned = {("h1", "eth1"): "10.10.1.2/24", ("r1", "eth1"): "10.10.1.1/24", ("r1", "eth2"): "10.10.2.1/24",
               ("h2", "eth1"): "10.10.2.2/24"}
    for n in plan.nodes:                      # as software.learn_addresses fills them in after up
        for i in n.interfaces:
            i.address = learned.get((n.name, i.name), i.address)
    from labctl.exports import clab
    text = clab.export(plan)
    for address in learned.values():
        assert text.count(f"add {address} ") == 1, (address, text)


def test_gpus_behind_routers_labctl_does_not_route_get_a_located_fix_not_a_traceback(tmp_path):
    """containerlab trial: GPUs labelled in a file whose routers forward by their own exec lines
    (or FRR) ended `labctl run` in `ValueError: no path from h1:eth1 to h2`."""
    from labctl.traffic.fabricmap import FabricMap
    text = (CLAB / "routed.clab.yml").read_text()
    text = text.replace("    h1:\n", "    h1:\n      labels: {labctl.kind: gpu, labctl.rank: '0'}\n")
    text = text.replace("    h2:\n", "    h2:\n      labels: {labctl.kind: gpu, labctl.rank: '1'}\n")
    f = tmp_path / "gpus.clab.yml"
    f.write_text(text)
    plan = plan_of(f)
    h1, h2 = plan.node("h1"), plan.node("h2")
    with pytest.raises(LabError) as err:
        FabricMap(plan).hops(h1, h2)
    assert "r1 is not a switch or router to labctl" in str(err.value) and "labctl.kind: switch" in err.value.fix
    labelled = text.replace("    r1:\n", "    r1:\n      labels: {labctl.kind: switch}\n")
    f.write_text(labelled)
    plan = plan_of(f)
    assert sum(FabricMap(plan).hops(plan.node("h1"), plan.node("h2")).values()) == 2


def test_pingall_says_why_it_found_nothing_to_ping():
    """A containerlab file whose exec lines number nothing has pairs but no address to ping: the
    message says that, and how to add one, not that no hosts share a fabric."""
    from labctl.lifecycle.reach import ping_pairs, why_none
    plan = plan_of(CLAB / "routed.clab.yml")          # as `up` learns it from the kernel: no exec line ran
    assert ping_pairs(plan)
    assert why_none(plan).startswith("no end host's port has an address (its exec lines set none)")
    assert "exec: [ip addr add" in why_none(plan)
    fabric = next(iter(plan.fabrics))
    assert why_none(plan, "storage") == "no two end hosts are on fabric storage, so nothing was checked"
    for n in plan.nodes:
        for k, i in enumerate(n.interfaces):
            i.address = f"10.9.{k}.{len(n.name)}/24"
    assert why_none(plan, fabric).startswith(f"its own routing connects no two end hosts on fabric {fabric}")
