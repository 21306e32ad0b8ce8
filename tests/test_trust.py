"""The trust model of a lab file, without building anything: which lines are powerful, when the
lab's own files are trusted, and what up is told when they are not."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from labctl.cli import cli
from labctl.errors import InputError
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


def test_privileged_capabilities_and_host_network_cannot_be_written(tmp_path):
    for key in ("privileged: true", "cap_add: [SYS_ADMIN]", "network_mode: host"):
        f = lab(tmp_path, f"name: q\nnodes:\n  a: {{kind: host, image: labctl/host, {key}}}\n  b: {{kind: host}}\n"
                          "links:\n  - endpoints: [a, b]\n")
        with pytest.raises(InputError, match="unknown key"):
            load_topology(f)


def test_plan_lists_the_powerful_lines_and_whether_up_trusts_them(tmp_path):
    f = lab(tmp_path, mode=0o666)
    r = CliRunner().invoke(cli, ["plan", str(f), "--json"])
    assert r.exit_code == 0, r.output
    import json
    doc = json.loads(r.output)
    assert [p["what"] for p in doc["powerful"]] == ["exec on the host", "image", "bind"]
    assert doc["trusted"] is False and any("writable by others" in w for w in doc["untrusted_because"])
    r = CliRunner().invoke(cli, ["plan", str(f)], env={"COLUMNS": "200"})
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
