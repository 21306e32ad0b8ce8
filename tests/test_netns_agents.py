"""Switch agents inside the nodes (LABCTL_SWITCH_AGENTS=node): each served node runs its own agent
in its own namespace, from its share of the plan alone, and the lab behaves as with one agent for
the whole lab: the incast loses nothing, both ends of every paused link count the same frames,
`tc set` reaches every agent, and `down` leaves nothing."""
from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest

from conftest import require_root
from labctl import lifecycle as labmod
from labctl import procs, state
from labctl.dataplane import agents, control
from labctl.kernel import ecnpath, nsutil
from labctl.plan import share
from labctl.telemetry import agentreport
from labctl.telemetry.queues import lab_queues
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
LEAF_SPINE = ROOT / "topologies" / "leaf-spine.yml"
INCAST = ROOT / "workloads" / "incast.yml"
pytestmark = pytest.mark.netns


def test_agents_in_the_nodes_keep_the_incast_lossless_and_leave_nothing(built_lab, tmp_path, monkeypatch):
    require_root()
    monkeypatch.setenv(agents.ENV, "node")
    plan = built_lab(LEAF_SPINE, sets=["scale_up=false"])
    lab = state.lab_dir(plan.lab)
    st = lab.read_state()
    served = {n.name for n in share.served(plan)}
    assert "controller_pid" not in st and set(st["agent_pids"]) == served
    assert {"leaf1", "spine1", "srv1-gpu0"} <= served and "srv1-nvs" not in served
    for name, pid in st["agent_pids"].items():
        # inside its node: the agent's network namespace is the node's
        node = plan.node(name)
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(nsutil.path(node.namespace)).st_ino, name
        assert os.sched_getscheduler(pid) == os.SCHED_FIFO
        # and what it was given is its share, not the plan
        given = share.read(agentreport.directory(lab.path, name) / share.SHARE_FILE, plan.lab)
        assert given.node.name == name and given.node.interfaces == node.interfaces

    from labctl import doctor
    (mine,) = [d for d in doctor.lab_paths() if d["lab"] == plan.lab]
    assert mine["agents_in_nodes"] == sorted(served)
    from labctl.lifecycle.inspect import helpers
    shown = {h["helper"]: h for h in helpers(lab)}
    assert set(shown) == {f"switch agent {n}" for n in served} and all(h["running"] for h in shown.values())

    doc = run_workload(plan, lab, load_workload(INCAST), tmp_path / "run")
    (r,) = doc["results"]
    rx = [q for c in doc["counters"].values() for q in c["rx"]]
    assert r["wrong"] == 0 and sum(q["gaps"] for q in rx) == 0
    assert doc["loss_ledger"]["total"] == 0 and doc["loss_ledger"]["lossless_drops"] == 0
    assert sum(q["drops"] for q in lab_queues(plan) if q["lossless"]) == 0
    react = doc["controller_reaction"]
    assert react["reads"] > 100 and react["controller_within_headroom"], react
    assert sum(q["ce"] for q in rx) > 0          # marked in the data path, with profiles the agents wrote

    time.sleep(0.3)                   # the agents publish within 10 ms of a change
    report = agentreport.load(lab.path)
    assert report["agents"] == len(served)
    counters = {(p["node"], p["port"]): p for p in report["ports"]}
    sent = {k: v for k, v in counters.items() if v["pfc_tx"]}
    assert sent, "the incast never paused anyone"
    for (node, port), c in sent.items():
        # sender and receiver are two agents in two namespaces: they count the same frames
        iface = plan.node(node).iface(port)
        peer = counters[(iface.peer_node, iface.peer_iface)]
        assert peer["pfc_rx"] == c["pfc_tx"] and peer["paused_s"] > 0, (node, port, c, peer)

    # a runtime change is live only once every agent applied it
    from labctl.lifecycle.runtime import tc_set
    leaf1 = plan.node("leaf1")
    port = leaf1.iface("srv1-gpu0")
    roce = next(c for c in port.shaping.classes if c.ecn)
    with nsutil.netlink_socket(leaf1.namespace) as sock:
        queues = ecnpath.open_queues(sock, leaf1)

    def kmin_in_force() -> int:
        at = queues.row(port.index, roce.tc) * ecnpath.VALUE
        return struct.unpack_from("=I", queues.mem, at + ecnpath.KMIN)[0]

    assert kmin_in_force() == (roce.kmin_bytes or plan.ecn.kmin) != 100_000
    tc_set(lab, plan, leaf1, "srv1-gpu0", kmin="100KB", kmax="300KB")
    assert agentreport.load(lab.path)["generation"] == control.load(lab.path)["generation"] >= 1
    assert kmin_in_force() == 100_000          # leaf1's own agent wrote it into leaf1's data path

    pids = dict(st["agent_pids"])
    labmod.down(plan.lab)
    time.sleep(0.2)
    assert not [n for n, pid in pids.items() if procs.start_time(pid) is not None]
    assert not lab.path.exists()


def test_a_container_switch_runs_its_agent_inside_its_container(docker_engine, built_lab, tmp_path, monkeypatch):
    """The BGP leaf-spine: every switch is an FRR container. Its agent is started as `docker exec`
    would start it (the container's namespaces, root and capabilities), reads the share bound into
    it, and keeps the incast lossless with the agents of the GPU namespaces."""
    require_root()
    from labctl.containers import nodes
    monkeypatch.setenv(agents.ENV, "node")
    plan = built_lab(ROOT / "topologies" / "leaf-spine-bgp.yml")
    lab = state.lab_dir(plan.lab)
    pids = lab.read_state()["agent_pids"]
    switches = [n for n in plan.nodes if n.container and n.kind == "switch"]
    assert len(switches) == 6 and all(nodes.agent_inside(n) for n in switches)
    for n in switches:
        pid = pids[n.name]
        init = docker_engine.containers.get(n.container.name).attrs["State"]["Pid"]
        for ns in ("mnt", "pid", "net"):
            assert os.readlink(f"/proc/{pid}/ns/{ns}") == os.readlink(f"/proc/{init}/ns/{ns}"), (n.name, ns)
        status = Path(f"/proc/{pid}/status").read_text()
        eff = next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff"))
        init_eff = next(line.split()[1] for line in Path(f"/proc/{init}/status").read_text().splitlines()
                        if line.startswith("CapEff"))
        assert eff == init_eff, n.name              # no capability the container lacks
        assert os.sched_getscheduler(pid) == os.SCHED_FIFO
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert cmd[:2] == [b"python3", b"-P"] and nodes.AGENT_HOME.encode() in cmd
    # a GPU namespace has no container: its agent is started from the host, moved into it
    gpu = plan.node("srv1-gpu0")
    assert not gpu.container and os.stat(f"/proc/{pids[gpu.name]}/ns/net").st_ino == \
        os.stat(nsutil.path(gpu.namespace)).st_ino

    doc = run_workload(plan, lab, load_workload(INCAST), tmp_path / "run")
    rx = [q for c in doc["counters"].values() for q in c["rx"]]
    assert doc["results"][0]["wrong"] == 0 and sum(q["gaps"] for q in rx) == 0
    assert doc["loss_ledger"]["total"] == 0, doc["loss_ledger"]
    assert doc["controller_reaction"]["controller_within_headroom"], doc["controller_reaction"]
    time.sleep(0.3)
    counters = {(p["node"], p["port"]): p for p in agentreport.load(lab.path)["ports"]}
    from_switches = {k: v for k, v in counters.items() if v["pfc_tx"] and k[0] in {n.name for n in switches}}
    assert from_switches, "no switch paused anyone"
    for (node, port), c in from_switches.items():
        iface = plan.node(node).iface(port)
        assert counters[(iface.peer_node, iface.peer_iface)]["pfc_rx"] == c["pfc_tx"]

    labmod.down(plan.lab)
    time.sleep(0.2)
    assert not [n for n, pid in pids.items() if procs.start_time(pid) is not None]
    assert not docker_engine.containers.list(all=True, filters={"label": f"labctl.lab={plan.lab}"})


def _wait_ready(out: Path, names: list[str], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    waiting = list(names)
    while waiting and time.monotonic() < deadline:
        waiting = [n for n in waiting if "ready" not in _text(out / "agents" / n / "agent.out")]
        time.sleep(0.1)
    assert not waiting, {n: _text(out / "agents" / n / "agent.log")[-400:] for n in waiting}


def _text(f: Path) -> str:
    try:
        return f.read_text()
    except OSError:
        return ""


def test_an_exported_lab_keeps_pfc_with_only_the_agents_it_carries(docker_engine, state_dir, lab_name, tmp_path):
    """`labctl export --format clab --out DIR`, brought up as containerlab would run it (labctl
    reads the file and runs its exec lines; it starts no agent or controller of its own): each
    served node's last exec line starts the agent it carries, which builds its classes from its
    share. Seven hosts blast the lossless class at one: the agents pause hop by hop, every
    datagram arrives, and no queue anywhere drops one."""
    require_root()
    import socket
    import threading
    from labctl.exports import clab
    from labctl.plan import qos
    from labctl.plan.compile import compile_plan
    from labctl.telemetry import qdepth
    from labctl.topology.load import load_topology
    plan = compile_plan(load_topology(LEAF_SPINE, sets=["scale_up=false"]))
    out = tmp_path / "exported"
    clab.export_dir(plan, out)
    served = [n.name for n in share.served(plan)]
    lab_plan, lab, _ = labmod.up(str(out / f"{plan.lab}.clab.yml"), (), lab_name, trust=True)
    try:
        st = lab.read_state()
        assert not st.get("controller_pid") and not st.get("agent_pids")      # labctl runs none of its own
        _wait_ready(out, served)
        # the carried agents run as labctl's own would: real-time, out of their container's CPU group
        # (which has no real-time budget; the engine's exec puts them there)
        from labctl.cluster.engines import Engines
        from labctl.containers import nodes as container_nodes
        engines = Engines()
        try:
            for name in served:
                pid = container_nodes.exec_pid(engines.container(lab_plan.node(name)), agents.MODULE)
                assert pid and os.sched_getscheduler(pid) == os.SCHED_FIFO, (name, pid)
        finally:
            engines.close()
        receiver, senders = plan.node("srv1-gpu0"), [n for n in plan.nodes if n.kind == "gpu" and n.name != "srv1-gpu0"]
        roce = next(c for c in receiver.interfaces[0].shaping.classes if c.lossless)
        dst = (receiver.iface("leaf1").address.split("/")[0], 4791)
        with nsutil.entered(lab_plan.node("srv1-gpu0").namespace):
            rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        rx.bind(dst)
        rx.settimeout(3.0)
        count, size = 600, 4000
        got = []

        def receive():
            try:
                while True:
                    rx.recv(65536)
                    got.append(1)
            except OSError:
                pass

        def send(node):
            with nsutil.entered(lab_plan.node(node.name).namespace):
                tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            # a small send buffer: a paused class holds the sender in sendto, as a NIC's would
            tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
            tx.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, qos.class_handle(roce.tc))
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, roce.dscp[0] << 2 | 1)
            for _ in range(count):
                tx.sendto(bytes(size), dst)
            tx.close()

        listener = threading.Thread(target=receive)
        listener.start()
        threads = [threading.Thread(target=send, args=(n,)) for n in senders]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        listener.join(timeout=30)
        rx.close()
        drops, lossless_leaves = {}, {}
        for n in lab_plan.nodes:
            with nsutil.netlink_socket(n.namespace) as sock:
                for q in qdepth.dump(sock):
                    if q.drops:
                        drops[(n.name, q.ifindex, hex(q.handle))] = q.drops
                    if q.kind == "tbf" and q.handle == qos.leaf_handle(roce.tc):
                        lossless_leaves[n.name] = lossless_leaves.get(n.name, 0) + 1
        # the classes are the agents': the importer's own have no lossless leaf (its fabric is not
        # lossless), so every served node's ports have the TBF that a pause holds only if its agent built it
        assert lossless_leaves == {n.name: len(n.interfaces) for n in share.served(plan)}, lossless_leaves
        assert len(got) == count * len(senders) and not drops, (len(got), drops)
        time.sleep(0.3)
        report = agentreport.load(out)
        assert report["agents"] == len(served)
        counters = {(p["node"], p["port"]): p for p in report["ports"]}
        print(f"{len(got)} datagrams; pauses sent {sum(c['pfc_tx'] for c in counters.values())}, by node "
              f"{ {n: sum(c['pfc_tx'] for (m, _), c in counters.items() if m == n) for n in served} }")
        # where the queue builds first (leaf1's port to the receiver, or a spine's port to leaf1)
        # depends on how ECMP hashed the senders' ephemeral ports and on their pace: once only spine2
        # paused. Either way a switch paused, and (below) its peer saw every pause it sent. A port
        # that never paused is not in the report (its counters are all zero).
        paused = {node for (node, _), c in counters.items() if c["pfc_tx"]}
        assert paused and all(plan.node(n).kind == "switch" for n in paused), report["ports"]
        for (node, port), c in counters.items():
            if c["pfc_tx"]:
                iface = plan.node(node).iface(port)
                assert counters[(iface.peer_node, iface.peer_iface)]["pfc_rx"] == c["pfc_tx"], (node, port)
        # the bundled incast, by labctl's own agents on the import: the GPUs came back with their
        # ranks (the export's labels), and the carried agents' reports are the lab's
        assert sorted(agentreport.agent_nodes(lab.path)) == sorted(served)
        doc = run_workload(lab_plan, lab, load_workload(INCAST), tmp_path / "run")
        rx = [q for c in doc["counters"].values() for q in c["rx"]]
        assert doc["results"][0]["wrong"] == 0 and sum(q["gaps"] for q in rx) == 0, doc["results"][0]
        assert doc["loss_ledger"]["total"] == 0, doc["loss_ledger"]
        before = sum(c["pfc_tx"] for c in counters.values())
        time.sleep(0.3)
        assert sum(p["pfc_tx"] for p in agentreport.load(lab.path)["ports"]) > before     # it paused again
    finally:
        labmod.down(lab_name)
    assert not docker_engine.containers.list(all=True, filters={"label": f"labctl.lab={lab_name}"})
