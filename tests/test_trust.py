"""The trust model of a lab file, without building anything: which lines are powerful, when the
lab's own files are trusted, and what up is told when they are not."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from labctl.cli import cli
from labctl.errors import InputError, LabError
from labctl.experiment.spec import load_experiment
from labctl.plan.compile import compile_plan
from labctl.plan import trust
from labctl.topology.load import load_topology

ROOT = Path(__file__).resolve().parents[1]
LAB = """name: tt
nodes:
  a: {kind: host, exec: ["ip link set lo up"]}
  b: {kind: host, image: alpine, binds: ["./data:/data:ro"], exec: ["echo in the container"]}
  c: {kind: host, image: labctl/host}
links:
  - endpoints: [a, b]
  - endpoints: [b, c]
"""


def lab(tmp_path: Path, text: str = LAB, mode: int = 0o644) -> Path:
    (tmp_path / "data").write_text("x")
    f = tmp_path / "lab.yml"
    f.write_text(text)
    f.chmod(mode)
    tmp_path.chmod(0o755)
    return f


def test_exec_on_the_host_foreign_images_and_binds_are_powerful(tmp_path):
    lines = trust.powerful(load_topology(lab(tmp_path)))
    assert [(p.what, p.text) for p in lines] == [("exec on the host", "ip link set lo up"), ("image", "alpine"),
                                                 ("bind", "./data:/data:ro")]
    assert lines[0].where.endswith("lab.yml:3: nodes.a.exec[0]"), lines[0].where
    # an exec line in a container and labctl's own images run nothing on the host


def test_a_file_others_may_write_is_refused_with_every_line_and_both_ways_on(tmp_path):
    loaded = load_topology(lab(tmp_path, mode=0o666))
    assert any("writable by others" in r for r in trust.untrusted(loaded))
    with pytest.raises(InputError) as exc:
        trust.require(loaded, trusted_by_flag=False)
    msg = str(exc.value)
    for text in ("ip link set lo up", "image: alpine", "./data:/data:ro", "chmod go-w", "--trust", "lab.yml:3"):
        assert text in msg, text
    assert len(trust.require(loaded, trusted_by_flag=True)) == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="labctl checks templates only as root; CI runs as root")
def test_a_writable_directory_or_template_makes_the_lab_untrusted(tmp_path):
    f = lab(tmp_path)
    tmp_path.chmod(0o775)
    assert any("writable by its group" in r for r in trust.untrusted(load_topology(f)))
    tmp_path.chmod(0o755)
    tree = tmp_path / "tpl"
    shutil.copytree(ROOT / "templates", tree)
    (tree / "frontend" / "vars.yml").chmod(0o646)      # another template's file, which leaf-spine may include
    t = tmp_path / "t.yml"
    t.write_text("template: leaf-spine\nvars: {servers: 2, gpus_per_server: 2, leaves: 2}\n")
    with pytest.raises(InputError, match="frontend/vars.yml can be written by group or others"):
        load_topology(t, template_dirs=[str(tree)])
    (tree / "frontend" / "vars.yml").chmod(0o644)
    os.symlink("/tmp", tree / "lib" / "elsewhere")
    os.lchown(tree / "lib" / "elsewhere", 65534, 65534)
    with pytest.raises(InputError, match="elsewhere is owned by uid 65534"):
        load_topology(t, template_dirs=[str(tree)])


def test_a_lab_without_powerful_lines_needs_no_trust(tmp_path):
    f = lab(tmp_path, "name: q\nnodes:\n  a: {kind: host}\n  b: {kind: host}\nlinks:\n  - endpoints: [a, b]\n", 0o666)
    assert trust.require(load_topology(f), trusted_by_flag=False) == []


PRIV_LAB = """name: pv
nodes:
  a: {kind: host, image: labctl/host, privileged: true}
  b:
    kind: host
    image: labctl/host
    cap_add: [SYS_PTRACE, NET_RAW]
  c: {kind: host, image: labctl/host}
links:
  - endpoints: [a, b]
  - endpoints: [b, c]
"""


def test_privileged_and_each_added_capability_are_powerful_lines_with_their_place(tmp_path):
    lines = trust.powerful(load_topology(lab(tmp_path, PRIV_LAB)))
    assert [(p.what, p.text) for p in lines] == [("privileged", "true"), ("capability", "SYS_PTRACE"),
                                                 ("capability", "NET_RAW")]
    assert lines[0].where.endswith("lab.yml:3: nodes.a.privileged"), lines[0].where
    assert lines[1].where.endswith("lab.yml:7: nodes.b.cap_add[0]"), lines[1].where
    assert "root in it is root on this machine" in lines[0].why


def test_an_untrusted_privileged_lab_is_refused_listing_each_line_and_trust_lets_it_through(tmp_path):
    loaded = load_topology(lab(tmp_path, PRIV_LAB, mode=0o666))
    with pytest.raises(InputError) as exc:
        trust.require(loaded, trusted_by_flag=False)
    msg = str(exc.value)
    for text in ("nodes.a.privileged: privileged: true", "nodes.b.cap_add[0]: capability: SYS_PTRACE",
                 "nodes.b.cap_add[1]: capability: NET_RAW", "chmod go-w", "--trust"):
        assert text in msg, text
    assert len(trust.require(loaded, trusted_by_flag=True)) == 3


def test_the_plan_carries_privileged_and_cap_add_only_for_the_nodes_that_ask(tmp_path):
    plan = compile_plan(load_topology(lab(tmp_path, PRIV_LAB)))
    got = {n.name: (n.container.privileged, n.container.cap_add) for n in plan.nodes}
    assert got == {"a": (True, []), "b": (False, ["SYS_PTRACE", "NET_RAW"]), "c": (False, [])}


@pytest.mark.parametrize("key, message", [
    ("privileged: true", "has privileged: but no image:"),
    ("cap_add: [NET_RAW]", "has cap_add: but no image:"),
])
def test_privileged_and_cap_add_need_an_image(tmp_path, key, message):
    f = lab(tmp_path, f"name: q\nnodes:\n  a: {{kind: host, {key}}}\n  b: {{kind: host}}\nlinks:\n  - endpoints: [a, b]\n")
    with pytest.raises(InputError, match=message) as exc:
        compile_plan(load_topology(f))
    assert exc.value.where.line == 3


@pytest.mark.parametrize("caps, message", [
    ("[NET_SNIFF]", "not a capability labctl knows"), ("[net_raw]", "write NET_RAW"),
    ("[CAP_NET_RAW]", "write NET_RAW"), ("[ALL]", "privileged: true"), ("NET_RAW", "valid list"),
])
def test_capability_names_are_checked(tmp_path, caps, message):
    f = lab(tmp_path, f"name: q\nnodes:\n  a: {{kind: host, image: labctl/host, cap_add: {caps}}}\n"
                      "  b: {kind: host}\nlinks:\n  - endpoints: [a, b]\n")
    with pytest.raises(InputError, match=message):
        load_topology(f)


def test_host_network_cannot_be_written(tmp_path):
    f = lab(tmp_path, "name: q\nnodes:\n  a: {kind: host, image: labctl/host, network_mode: host}\n"
                      "  b: {kind: host}\nlinks:\n  - endpoints: [a, b]\n")
    with pytest.raises(InputError, match="unknown key"):
        load_topology(f)


def test_the_containers_settings_follow_the_plan(monkeypatch):
    """What start() hands Docker, read from the SDK's own host-config builder (no engine needed):
    privileged only where asked, the extra capabilities on top of the node set, no_new_privs on the
    rest."""
    from labctl.containers import nodes
    held = list(nodes.CAPABILITIES)
    monkeypatch.setattr(nodes, "held", lambda: held)
    assert nodes.node_capabilities("labctl/host", ["SYS_PTRACE", "NET_RAW"]) == \
        list(nodes.NODE_CAPABILITIES) + ["SYS_PTRACE"]
    assert "SYS_PTRACE" not in nodes.node_capabilities("labctl/host")
    import docker
    from labctl.plan.model import Container, Node
    api = docker.APIClient(base_url="unix:///nonexistent.sock", version="1.41")    # builds, never connects
    asked = nodes.host_config(api, Container("n", "labctl/host", None, {}, [], privileged=True), [])
    assert asked["Privileged"] is True and "CapAdd" not in asked and "SecurityOpt" not in asked, asked
    plain = nodes.host_config(api, Container("n", "labctl/host", None, {}, [], cap_add=["SYS_PTRACE"]), [])
    assert not plain.get("Privileged") and plain["CapDrop"] == ["ALL"] and plain["SecurityOpt"] == ["no-new-privileges"]
    assert plain["CapAdd"] == list(nodes.NODE_CAPABILITIES) + ["SYS_PTRACE"]
    assert "SYS_PTRACE" not in nodes.host_config(api, Container("n", "labctl/host", None, {}, []), [])["CapAdd"]
    held = [c for c in held if c != "SYS_PTRACE"]
    node = Node("b", "host", "x-b", 0, False, None, None, None, None, {},
                container=Container("labctl-x-b", "labctl/host", None, {}, [], cap_add=["SYS_PTRACE"]))
    with pytest.raises(LabError, match="SYS_PTRACE, which labctl's root here does not hold"):
        nodes.can_grant(node)
    node.container = Container("labctl-x-b", "labctl/host", None, {}, [], privileged=True)
    monkeypatch.setattr(nodes, "lacking", lambda: ["SYS_RESOURCE"])
    with pytest.raises(LabError, match="lacks SYS_RESOURCE"):
        nodes.can_grant(node)


def wide_console(monkeypatch):
    """The CLI's console takes its width from COLUMNS when it is made, at import: a test worker
    that had COLUMNS=80 then would wrap the titles these tests read."""
    from labctl.cli import base
    monkeypatch.setattr(base.out, "width", 200)


def test_plan_lists_the_powerful_lines_and_whether_up_trusts_them(tmp_path, monkeypatch):
    wide_console(monkeypatch)
    f = lab(tmp_path, mode=0o666)
    r = CliRunner().invoke(cli, ["plan", str(f), "--json"])
    assert r.exit_code == 0, r.output
    import json
    doc = json.loads(r.output)
    assert [p["what"] for p in doc["powerful"]] == ["exec on the host", "image", "bind"]
    assert doc["trusted"] is False and any("writable by others" in w for w in doc["untrusted_because"])
    r = CliRunner().invoke(cli, ["plan", str(f)])
    assert "NOT TRUSTED" in r.output and "ip link set lo up" in r.output


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's files can be trusted; CI runs as root")
def test_root_owned_files_writable_by_no_one_else_are_trusted(tmp_path):
    f = lab(tmp_path)
    assert trust.untrusted(load_topology(f)) == []
    for bundled in sorted((ROOT / "topologies").glob("*.yml")):
        assert trust.untrusted(load_topology(bundled)) == [], bundled


def test_plan_json_is_replaced_whole(tmp_path):
    """A reader of plan.json sees the old plan or the new one, never half of one (state.write_plan)."""
    import json
    from labctl.state import LabDir
    d = LabDir("x", tmp_path)
    d.write_plan({"lab": "x", "nodes": list(range(1000))})
    before = os.stat(d.plan_file).st_ino
    d.write_plan({"lab": "x", "nodes": []})
    assert json.loads(d.plan_file.read_text()) == {"lab": "x", "nodes": []}
    assert os.stat(d.plan_file).st_ino != before, "a new file renamed over the old, not the old rewritten"
    assert not list(tmp_path.glob("*.tmp"))


def test_plan_lists_privileged_and_added_capabilities(tmp_path, monkeypatch):
    wide_console(monkeypatch)
    import json
    r = CliRunner().invoke(cli, ["plan", str(lab(tmp_path, PRIV_LAB, mode=0o666)), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [(p["what"], p["text"]) for p in doc["powerful"]] == [("privileged", "true"), ("capability", "SYS_PTRACE"),
                                                                 ("capability", "NET_RAW")]
    assert {n["name"]: n["container"]["privileged"] for n in doc["nodes"]} == {"a": True, "b": False, "c": False}
    r = CliRunner().invoke(cli, ["plan", str(tmp_path / "lab.yml")])
    assert "privileged" in r.output and "SYS_PTRACE" in r.output and "NOT TRUSTED" in r.output, r.output


def test_an_frr_image_s_sys_admin_is_a_powerful_line_unless_cap_add_names_it(tmp_path):
    """zebra is given SYS_ADMIN, with which a container mounts a /proc of its own and writes the
    host's kernel sysctls: the lab must say so, at the node's image, and be trusted."""
    text = ("name: frr\nnodes:\n  r1:\n    kind: router\n    image: labctl/frr\n  r2:\n    kind: router\n"
            "    image: frrouting/frr:10.5.1\n    cap_add: [SYS_ADMIN]\n  h1:\n    kind: host\n    image: labctl/host\n"
            "links: [{endpoints: [r1, h1]}, {endpoints: [r2, h1]}]\n")
    lines = trust.powerful(load_topology(lab(tmp_path, text)))
    assert [(p.what, p.text) for p in lines] == [("capability", "SYS_ADMIN (FRR)"), ("image", "frrouting/frr:10.5.1"),
                                                 ("capability", "SYS_ADMIN")], lines
    assert lines[0].where.endswith("lab.yml:5: nodes.r1.image") and "kernel sysctls" in lines[0].why, lines[0]


def test_an_experiment_whose_set_changes_a_trusted_lab_is_judged_as_the_lab(tmp_path):
    """An experiment's `set:` can write any key of its lab (nodes.h1.exec=...): the experiment file
    is trusted or not as the lab file is, so a root-owned lab changed by someone else's experiment
    is refused, and one changed by a trusted experiment is not."""
    loaded = load_topology(lab(tmp_path))
    assert trust.untrusted(loaded) == [] and trust.require(loaded, trusted_by_flag=False)
    exp = tmp_path / "exp" / "e.yml"
    exp.parent.mkdir(mode=0o755)
    exp.write_text("name: e\ntopology: ../lab.yml\nset: [x=1]\nsteps:\n  - wait: 1ms\n")
    exp.chmod(0o666)
    read_as: dict = {}
    load_experiment(exp, read_as)
    loaded.set_by = (read_as,)
    assert read_as["path"] == str(exp.resolve())
    assert any("writable by others" in r for r in trust.untrusted(loaded))
    with pytest.raises(InputError) as err:
        trust.require(loaded, trusted_by_flag=False)
    assert "nodes.a.exec[0]" in str(err.value)
    exp.chmod(0o644)
    # judged by what was read: the file read was writable by others, whatever its name says now
    assert any("writable by others" in r for r in trust.untrusted(loaded))
    read_as.clear()
    load_experiment(exp, read_as)
    assert trust.untrusted(loaded) == []


def test_the_lab_file_is_judged_by_what_was_read_not_by_its_name_later(tmp_path):
    """A link flipped between the read and the check (someone else's file read, root's checked)
    ran an untrusted exec line: the file is judged by the fstat of what was read, and every
    directory above its real path."""
    f = lab(tmp_path, mode=0o666)
    loaded = load_topology(f)
    assert loaded.read_as and loaded.read_as["path"] == str(f.resolve())
    f.chmod(0o644)                           # by name, it is root's alone now; what was read was not
    assert any("writable by others" in r for r in trust.untrusted(loaded))
    with pytest.raises(InputError):
        trust.require(loaded, trusted_by_flag=False)
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    inner = loose / "in"
    inner.mkdir(mode=0o755)
    loaded = load_topology(lab(inner))
    assert any(str(loose) in r for r in trust.untrusted(loaded)), trust.untrusted(loaded)
