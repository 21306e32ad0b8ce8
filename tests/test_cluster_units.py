"""The cluster's pieces that need neither root nor an engine: a machine's checks, the cluster record
(cluster.json) read back as written, the emulation's argument checks and per-machine names, the
cluster record pruned at stop, and `labctl cluster` help that renders with its examples."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from labctl.cli import cli
from labctl.cluster import emulate, teardown
from labctl.cluster import machines as mrec
from labctl.cluster.machines import Machine
from labctl.errors import LabError


@pytest.mark.parametrize("fields, says", [
    (("M1", "unix:///run/x.sock", "192.168.1.1"), "is not a machine name"),
    (("a" * 17, "unix:///run/x.sock", "192.168.1.1"), "is not a machine name"),
    (("../x", "unix:///run/x.sock", "192.168.1.1"), "is not a machine name"),
    (("m1", "http://host:2375", "192.168.1.1"), "is not a Docker engine URL"),
    (("m1", "/run/docker.sock", "192.168.1.1"), "is not a Docker engine URL"),
    (("m1", "tcp://h:2376", "192.168.1.300"), "is not an IPv4 address"),
    (("m1", "ssh://root@h", "fe80::1"), "is not an IPv4 address"),
])
def test_a_machine_that_cannot_be_is_refused_with_a_fix(fields, says):
    with pytest.raises(LabError) as e:
        Machine(*fields).check()
    assert says in e.value.message and e.value.fix


def test_a_good_machine_passes_its_checks():
    for engine in ("unix:///run/lcm-m1.sock", "tcp://10.1.0.1:2376", "ssh://root@hosta"):
        m = Machine("m1", engine, "192.168.77.1")
        assert m.check() is m


def test_the_cluster_record_reads_back_as_written(tmp_path, monkeypatch):
    monkeypatch.setenv("LABCTL_STATE_DIR", str(tmp_path / "state"))
    assert mrec.load() == {}
    with pytest.raises(LabError, match="no Swarm manager"):
        mrec.manager()
    ms = {"a": Machine("a", "ssh://root@hosta", "192.168.1.1", manager=True),
          "m2": Machine("m2", "unix:///run/lcm-m2.sock", "192.168.77.2", netns="lcm-m2")}
    mrec.save(ms)
    assert mrec.record_path() == tmp_path / "state" / "cluster.json"
    assert mrec.record_path().stat().st_mode & 0o077 == 0
    assert mrec.load() == ms
    assert mrec.manager().name == "a"
    mrec.record_path().write_text("{not json")
    with pytest.raises(LabError, match="cannot be read") as e:
        mrec.load()
    assert "reset" in e.value.fix


def test_emulation_arguments_are_checked_before_anything_is_made():
    for count in (0, emulate.MAX_MACHINES + 1):
        with pytest.raises(LabError, match="cannot emulate"):
            emulate._check(count, "192.168.77.0/24")
    with pytest.raises(LabError, match="not an IPv4 subnet"):
        emulate._check(3, "192.168.77.1/24")          # host bits set
    with pytest.raises(LabError, match="no room"):
        emulate._check(3, "192.168.77.0/30")
    with pytest.raises(LabError, match="Swarm's address pool"):
        emulate._check(3, "10.200.5.0/24")
    assert str(emulate._check(3, "192.168.77.0/24")) == "192.168.77.0/24"


def test_each_emulated_engine_has_its_own_paths_and_label():
    a, b = emulate.dockerd_args("m1"), emulate.dockerd_args("m2")
    for flag in ("--config-file", "--data-root", "--exec-root", "-H", "--pidfile", "--containerd-namespace",
                 "--containerd-plugins-namespace", "--label"):
        assert a[a.index(flag) + 1] != b[b.index(flag) + 1], flag
    assert a[a.index("-H") + 1] == "unix:///run/lcm-m1.sock"
    assert a[a.index("--label") + 1] == "labctl.machine=m1"
    for off in ("--bridge=none", "--iptables=false", "--ip-masq=false", "--ip-forward=false"):
        assert off in a


def test_stop_forgets_only_the_emulated_machines(tmp_path):
    record = tmp_path / "cluster.json"
    record.write_text(json.dumps({"machines": [
        {"name": "m1", "engine": "unix:///run/lcm-m1.sock", "address": "192.168.77.1", "netns": "lcm-m1",
         "manager": True},
        {"name": "b", "engine": "ssh://root@b", "address": "192.168.1.2", "netns": None, "manager": False}]}))
    failures = []
    teardown.forget_machines(str(record), {"lcm-m1"}, failures)
    assert failures == [] and [m["name"] for m in json.loads(record.read_text())["machines"]] == ["b"]
    teardown.forget_machines(str(record), {"lcm-m1", None}, failures)
    assert failures == [] and not record.exists()
    teardown.forget_machines(str(record), {"lcm-m1"}, failures)     # gone already: nothing to do
    assert failures == []


@pytest.mark.parametrize("args, says", [
    (["cluster", "--help"], "sudo labctl cluster emulate 3"),
    (["cluster", "emulate", "--help"], "--stop"),
    (["cluster", "init", "--help"], "--address"),
    (["cluster", "join", "--help"], "--engine"),
    (["cluster", "status", "--help"], "--json"),
    (["cluster", "leave", "--help"], "NAME"),
    (["cluster", "reset", "--help"], "forgets"),
])
def test_the_cluster_commands_help_renders(args, says):
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert says in r.output


def test_status_with_no_machines_says_how_to_get_some(tmp_path, monkeypatch):
    monkeypatch.setenv("LABCTL_STATE_DIR", str(tmp_path / "state"))
    r = CliRunner().invoke(cli, ["cluster", "status"])
    assert r.exit_code == 0 and "cluster init" in r.output and "emulate" in r.output
    r = CliRunner().invoke(cli, ["cluster", "status", "--json"])
    assert r.exit_code == 0 and json.loads(r.output) == []


HOSTILE = "[/x]\x1b[2K\x1b]0;owned\x07"       # rich's closing tag with no opening one; erase line; set title


def test_an_engines_words_never_reach_the_terminal_as_markup_or_control_codes(tmp_path, monkeypatch):
    """A Swarm node's state and an engine's error are shown as text: rich once raised MarkupError on
    '[/x]' in `cluster reset` before the record was forgotten, and ESC went to the terminal."""
    from labctl.cli import cluster as cli_cluster
    from labctl.cluster import services, swarm
    monkeypatch.setenv("LABCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(cli_cluster, "out", cli_cluster.out.__class__(width=200, force_terminal=False))
    mrec.save({"m2": Machine("m2", "unix:///run/lcm-m2.sock", "192.168.77.2", manager=True)})

    def leave(machine):
        raise LabError(f"the engine says: {HOSTILE}")

    monkeypatch.setattr(swarm, "leave", leave)
    monkeypatch.setattr(services, "refuse_while_placed", lambda what: None)
    monkeypatch.setattr("labctl.lifecycle.labs.require_root", lambda what: None)
    monkeypatch.setattr(emulate, "status", lambda: [])
    with cli_cluster.out.capture() as seen:
        r = CliRunner().invoke(cli, ["cluster", "reset"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert not mrec.record_path().exists()
    text = seen.get()
    assert "[/x]" in text and "\x1b" not in text and "\\x1b[2K" in text and "\\x07" in text
    # the status table: a manager that names its node's state with the same words
    mrec.save({"m2": Machine("m2", "unix:///run/lcm-m2.sock", "192.168.77.2", manager=True)})
    monkeypatch.setattr(cli_cluster, "_rows", lambda: [{"machine": "m2", "engine": "unix:///x", "address": "a",
                                                         "netns": None, "role": HOSTILE, "swarm": HOSTILE,
                                                         "availability": "active", "lab_containers": 0}])
    with cli_cluster.out.capture() as seen:
        r = CliRunner().invoke(cli, ["cluster", "status"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert "\x1b" not in seen.get() and "[/x]" in seen.get()


def test_an_error_printed_by_any_command_writes_control_characters_out():
    from labctl.cli.base import LabctlGroup
    import click

    @click.group(cls=LabctlGroup)
    def group():
        pass

    @group.command()
    def fail():
        raise LabError(f"engine said {HOSTILE}", "fix it")

    r = CliRunner().invoke(group, ["fail"])
    assert r.exit_code != 0 and "\x1b" not in r.output and "\x07" not in r.output
    assert "engine said [/x]\\x1b[2K" in r.output and "fix: fix it" in r.output


class FakeNode:
    def __init__(self, addr, labels=None):
        self.attrs = {"Status": {"Addr": addr}, "Spec": {"Labels": labels or {}, "Role": "worker"}}
        self.updated, self.removed = None, False

    def update(self, spec):
        self.updated = spec

    def remove(self, force=False):
        self.removed = True


def fake_clients(monkeypatch, claimed_id: str, swarm_nodes: dict):
    """Every machine's engine claims Swarm node `claimed_id`; the manager knows `swarm_nodes`."""
    from types import SimpleNamespace
    from labctl.cluster import swarm
    c = SimpleNamespace(info=lambda: {"Swarm": {"NodeID": claimed_id, "LocalNodeState": "active"}},
                        nodes=SimpleNamespace(get=lambda nid: swarm_nodes[nid]), close=lambda: None)
    monkeypatch.setattr(swarm, "client", lambda machine, timeout=None: c)


def test_a_machines_engine_cannot_name_another_machines_swarm_node():
    """`join --name evil` answered with the NodeID of machine local's node: that node was relabelled
    evil (local's lab nodes then never scheduled), and `cluster leave evil` force-removed it."""
    from labctl.cluster import swarm
    mgr = Machine("local", "unix:///var/run/docker.sock", "192.168.77.1", manager=True)
    evil = Machine("evil", "ssh://root@evil", "192.168.77.9")
    theirs = FakeNode("192.168.77.1", {"labctl.machine": "local"})
    mp = pytest.MonkeyPatch()
    try:
        fake_clients(mp, "n-local", {"n-local": theirs})
        with pytest.raises(LabError, match="sees that node at 192.168.77.1, labelled as machine local"):
            swarm.label(mgr, evil)
        with pytest.raises(LabError, match="sees that node at"):
            swarm.remove_node(mgr, "n-local", evil)
        assert theirs.updated is None and not theirs.removed
        # its own node, at its address: labelled, and later removed
        own = FakeNode("192.168.77.9")
        fake_clients(mp, "n-evil", {"n-evil": own})
        swarm.label(mgr, evil)
        assert own.updated["Labels"] == {"labctl.machine": "evil"}
        own.attrs["Spec"] = own.updated
        swarm.remove_node(mgr, "n-evil", evil)
        assert own.removed
    finally:
        mp.undo()


def test_copying_images_to_the_machines_reports_each_copy(monkeypatch):
    """`cluster emulate`'s image copy: its stage lines and a line per image copied (a local name
    once hid the line printer, and the first copy raised TypeError)."""
    from types import SimpleNamespace
    from labctl.cli import cluster as cli_cluster
    from labctl.cluster import images
    monkeypatch.setattr(cli_cluster, "out", cli_cluster.out.__class__(width=200, force_terminal=False))

    def ensure(machine, wanted, src, progress=None):
        progress(f"copy {wanted[0]} to {machine.name}", 0, 1)
        progress(f"copy {wanted[0]} to {machine.name}", 1, 1)
        return {wanted[0]: 1.5}

    monkeypatch.setattr(images, "default_images_client",
                        lambda wanted, progress=None: (SimpleNamespace(close=lambda: None), False))
    monkeypatch.setattr(images, "ensure_images", ensure)
    monkeypatch.setattr(images, "release_default", lambda started: None)
    with cli_cluster.out.capture() as seen:
        cli_cluster._copy_images([Machine("m2", "unix:///run/lcm-m2.sock", "192.168.77.2")], ["labctl/host"])
    text = seen.get()
    assert "copy labctl/host to m2 ..." in text and "labctl/host copied to m2 in 1.5 s" in text
