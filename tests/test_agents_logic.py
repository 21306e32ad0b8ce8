"""Switch agents without root: a node's share of the plan, and the agents' reports read as one."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from labctl.dataplane import agents, control
from labctl.errors import InputError, LabError
from labctl.plan import feeders, share
from labctl.plan.compile import compile_plan
from labctl.telemetry import agentreport, reaction
from labctl.topology.load import load_topology

LEAF_SPINE = Path(__file__).resolve().parents[1] / "topologies" / "leaf-spine.yml"


@pytest.fixture(scope="module")
def plan():
    return compile_plan(load_topology(LEAF_SPINE, sets=["scale_up=false"]), queue_reads="arrivals")


def test_a_share_holds_what_the_agent_needs_and_reads_back_whole(plan):
    served = {s.node.name: s for s in share.shares(plan)}
    # every switch marks, every GPU host obeys pauses: each needs an agent, and nothing else does
    assert set(served) == {n.name for n in plan.nodes
                           if any(c.lossless or (c.ecn and n.switching) for i in n.interfaces for c in i.shaping.classes)}
    assert {"leaf1", "spine1", "srv1-gpu0"} <= set(served)
    leaf1 = served["leaf1"]
    # what it needs of the rest of the lab, computed from the whole plan before it leaves
    assert leaf1.feeders == {e: sorted(f) for e, f in feeders.feeders(plan, plan.node("leaf1")).items()}
    assert leaf1.feeders["srv1-gpu0"] and "srv1-gpu0" not in leaf1.feeders["srv1-gpu0"]
    for i in plan.node("leaf1").interfaces:
        assert leaf1.peer_macs[i.name] == plan.node(i.peer_node).iface(i.peer_iface).mac
    assert leaf1.marking and leaf1.lossless and served["srv1-gpu0"].marking == []
    text = json.dumps(leaf1.to_dict())
    back = share.NodeShare.from_dict(json.loads(text), plan.lab)
    assert back == leaf1
    assert len(text) < 0.2 * len(json.dumps(plan.to_dict()))     # a share, not the plan
    # the agent falls back on the lab's ECN profile through its share, as the lab's controller did
    node, iface = leaf1.node, leaf1.node.interfaces[0]
    cls = next(c for c in iface.shaping.classes if c.ecn)
    assert control.settings_for(back, node, iface, cls, {}) == control.settings_for(plan, node, iface, cls, {})


def test_a_share_naming_another_labs_namespace_is_refused(plan):
    doc = share.shares(plan)[0].to_dict()
    with pytest.raises(ValueError, match="not one of lab"):
        share.NodeShare.from_dict(doc, "otherlab")
    doc["node"]["namespace"] = "/run/netns/../../etc"
    with pytest.raises(ValueError, match="namespace"):
        share.NodeShare.from_dict(doc, plan.lab)


@pytest.mark.parametrize("name", ["../x", "a/b", "", "UPPER", ".", "x" * 41])
def test_an_agent_directory_is_only_made_from_a_node_name(tmp_path, name):
    with pytest.raises(ValueError, match="not a node name"):
        agentreport.directory(tmp_path, name)


def test_the_placement_comes_from_the_environment_with_a_located_error(monkeypatch):
    monkeypatch.delenv(agents.ENV, raising=False)
    assert agents.mode() == "lab"
    monkeypatch.setenv(agents.ENV, "node")
    assert agents.mode() == "node"
    monkeypatch.setenv(agents.ENV, "nodes")
    with pytest.raises(InputError) as err:
        agents.mode()
    assert agents.ENV in str(err.value) and "'node'" in str(err.value)


def _agent_report(lab: Path, node: str, doc: dict, mtime: float) -> None:
    d = agentreport.directory(lab, node)
    d.mkdir(parents=True, exist_ok=True)
    (d / agentreport.FILE).write_text(json.dumps(doc))
    os.utime(d / agentreport.FILE, (mtime, mtime))


def _hist(*seconds) -> list[int]:
    h = reaction.Histogram()
    for s in seconds:
        h.add(s)
    return h.to_list()


def test_agents_reports_merge_into_what_one_agent_would_have_written(tmp_path):
    assert agentreport.load(tmp_path) is None
    _agent_report(tmp_path, "leaf1", {"time": 5.0, "generation": 3, "reaction_hist": _hist(0.001, 0.002),
                                      "long_reads": [[4.0, 0.006]], "errors": [],
                                      "ports": [{"node": "leaf1", "port": "spine1", "tc": 3, "pfc_tx": 4}]}, 1)
    _agent_report(tmp_path, "spine1", {"time": 6.0, "generation": 2, "reaction_hist": _hist(0.009),
                                       "long_reads": [[3.0, 0.02]], "errors": ["control.json ignored: x"],
                                       "ports": [{"node": "spine1", "port": "leaf1", "tc": 3, "pfc_rx": 4}]}, 1)
    doc = agentreport.load(tmp_path)
    assert doc["agents"] == 2 and doc["time"] == 6.0
    assert doc["generation"] == 2          # live only once every agent applied it
    assert [p["node"] for p in doc["ports"]] == ["leaf1", "spine1"]
    assert doc["long_reads"] == [[3.0, 0.02], [4.0, 0.006]]
    h = reaction.Histogram.from_list(doc["reaction_hist"])
    assert h.samples == 3 and h.worst() == pytest.approx(0.0095)
    assert doc["errors"] == ["control.json ignored: x"]
    # the waiting side of `tc set` sees the oldest generation
    assert not control.wait_applied(tmp_path, 3, timeout=0.05)
    _agent_report(tmp_path, "spine1", {"time": 7.0, "generation": 3, "ports": []}, 2)
    assert control.wait_applied(tmp_path, 3, timeout=0.5)


def test_a_sampler_keeps_every_agents_slow_reads_whatever_order_they_arrive_in(tmp_path):
    from labctl.telemetry.sampler import PfcFile
    _agent_report(tmp_path, "leaf1", {"ports": [], "long_reads": [[10.0, 0.01]]}, 1)
    _agent_report(tmp_path, "spine1", {"ports": [], "long_reads": []}, 1)
    watch = PfcFile(tmp_path)
    watch.get()
    # spine1 reports an older read after leaf1's newer one was seen: it is kept all the same
    _agent_report(tmp_path, "spine1", {"ports": [{"node": "spine1", "port": "leaf1", "tc": 3}],
                                       "long_reads": [[9.0, 0.02]]}, 2)
    assert watch.get() == {("spine1", "leaf1", 3): {"node": "spine1", "port": "leaf1", "tc": 3}}
    assert watch.long_reads == {9.0: (0.02, ()), 10.0: (0.01, ())}
    assert reaction.read_long(tmp_path, 0.0) == [(9.0, 0.02, ()), (10.0, 0.01, ())]


def test_a_switch_agent_needs_only_what_a_node_image_has():
    """The agent's imports, in a fresh interpreter as `python -P` starts it: the standard library,
    labctl and numpy (python3-numpy in Debian). No scapy, pyroute2 or cryptography: each would have
    to be in every node image, and scapy alone cost 0.17 s of CPU and 30 MB per agent."""
    import subprocess
    import sys
    probe = ("import sys, labctl.dataplane.controller, labctl.dataplane.agents; "
             "print(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)))")
    import ast
    out = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True,
                         cwd="/").stdout
    third_party = {m for m in ast.literal_eval(out) if not m.startswith("_") and m != "labctl"}
    assert third_party == {"numpy"}, third_party


def test_every_thread_of_an_agent_is_scheduled(tmp_path):
    """A policy set on a PID reaches one thread, so prioritise_all sets every thread's."""
    import subprocess
    import sys
    from labctl import procs
    child = subprocess.Popen([sys.executable, "-c", "import threading, time; "
                              "threading.Thread(target=time.sleep, args=(30,)).start(); time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{child.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        said = procs.prioritise_all(child.pid)
        tasks = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(tasks) == 2
        if os.geteuid() == 0:
            assert said.startswith("SCHED_FIFO") and all(os.sched_getscheduler(t) == os.SCHED_FIFO for t in tasks)
        else:
            assert said.startswith("nice")
    finally:
        child.kill()
        child.wait()


def test_plan_shows_where_each_agent_runs_and_what_a_container_is_given(monkeypatch):
    """An agent inside a container widens what the container holds (labctl's code, its directory):
    `labctl plan` shows it, per node, before anything is built."""
    import subprocess
    import sys
    bgp = Path(__file__).resolve().parents[1] / "topologies" / "leaf-spine-bgp.yml"
    env = {**os.environ, agents.ENV: "node"}
    out = subprocess.run([sys.executable, "-m", "labctl", "plan", str(bgp), "--json"], capture_output=True,
                         text=True, check=True, env=env).stdout
    places = json.loads(out)["switch_agents"]
    assert places["leaf1"] == places["spine1"] == "container"          # FRR switches: SYS_ADMIN, BPF inside
    assert places["srv1-gpu0"] == places["srv1-nvs"] == "namespace"    # namespaces have no container
    env.pop(agents.ENV)
    out = subprocess.run([sys.executable, "-m", "labctl", "plan", str(bgp), "--json"], capture_output=True,
                         text=True, check=True, env=env).stdout
    assert json.loads(out)["switch_agents"] == {}
    text = subprocess.run([sys.executable, "-m", "labctl", "plan", str(bgp)], capture_output=True, text=True,
                          check=True, env={**env, agents.ENV: "node", "COLUMNS": "200"}).stdout
    assert "inside its container" in text and "read-only at /opt/labctl" in text



def test_links_a_container_plants_in_its_agent_directory_are_never_followed(tmp_path, plan):
    """A node agent's directory is bound read-write into its container, which starts first: a
    hostile image can put links there before labctl writes or reads. None is followed."""
    from labctl import helpers
    target = tmp_path / "victim"
    target.write_text("root's file")
    own = agentreport.directory(tmp_path, "leaf1")
    own.mkdir(parents=True)
    (own / share.SHARE_FILE).symlink_to(target)
    (own / agentreport.FILE).symlink_to("/dev/zero")
    (own / "agent.log").symlink_to(target)
    share.write(share.shares(plan, [plan.node("leaf1")])[0], own)      # replaces the link
    assert target.read_text() == "root's file" and not (own / share.SHARE_FILE).is_symlink()
    assert share.read(own / share.SHARE_FILE, plan.lab).node.name == "leaf1"
    assert agentreport.load(tmp_path) is None                           # /dev/zero is not read
    lab = type("Lab", (), {"path": tmp_path, "journal": lambda self, *a: None})()
    with pytest.raises(LabError, match="not a plain file"):
        helpers.launch_argv(lab, ["true"], "agents/leaf1/agent")
    assert target.read_text() == "root's file"
    # red team: a FIFO there blocked `up` in open() for good, holding the state lock; a link there
    # had an agent that failed at once show root's /etc/shadow, or read /dev/zero until memory ran out
    (own / "agent.log").unlink()
    os.mkfifo(own / "agent.log")
    with pytest.raises(LabError, match="not a plain file"):
        helpers.launch_argv(lab, ["true"], "agents/leaf1/agent")
    (own / "agent.log").unlink()
    (own / "agent.log").symlink_to("/dev/zero")
    p = subprocess.Popen(["sh", "-c", "exit 3"], stdout=subprocess.PIPE, text=True)
    with pytest.raises(LabError) as err:
        helpers.await_ready(p, "the switch agent of leaf1", own / "agent.log")
    assert str(err.value) == "the switch agent of leaf1 did not start: exit status 3"
    (own / "agent.log").unlink()
    (own / "agent.log").write_bytes(b"x" * 10_000 + b"boom\x1b[2K\n")
    p = subprocess.Popen(["sh", "-c", "exit 1"], stdout=subprocess.PIPE, text=True)
    with pytest.raises(LabError) as err:
        helpers.await_ready(p, "agent", own / "agent.log", tail=20)
    assert str(err.value) == "agent did not start: " + "x" * 11 + "boom?[2K\n", str(err.value)


def test_a_port_s_rate_reaches_its_lossless_classes_through_the_control_file(plan, tmp_path):
    """`tc set --rate` tells the controller a port's new rate: a pause's quanta last 512 bit times
    at it (pfc.pause_seconds), and the class's gate opens above it. Until then, the plan's rate."""
    from labctl.dataplane import pfc
    node = plan.node("leaf1")
    iface = node.interfaces[0]
    cls = next(c for c in iface.shaping.classes if c.lossless)
    assert control.settings_for(plan, node, iface, cls, {}).rate == iface.shaping.rate_bps
    k = control.key(node.name, iface.name, cls.tc)
    control.merge(tmp_path, {k: {"rate": iface.shaping.rate_bps // 2}})
    overrides = control.load(tmp_path, strict=True)["ports"]
    halved = control.settings_for(plan, node, iface, cls, overrides)
    assert halved.rate == iface.shaping.rate_bps // 2 and halved.xoff == cls.xoff_bytes
    assert pfc.pause_seconds(0xFFFF, halved.rate) == pytest.approx(2 * pfc.pause_seconds(0xFFFF, iface.shaping.rate_bps))
    with pytest.raises(ValueError, match=r"rate = -1 is not a valid int bit/s"):
        control.check_value(k, "rate", -1)
