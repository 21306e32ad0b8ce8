"""Three machines emulated on this host (a namespace and a dockerd each) form one real Docker Swarm:
the manager sees three Ready nodes labelled m1..m3, a service pinned to m2 runs on m2's engine in
a namespace of its own with only `lo`; the bundled BGP leaf-spine runs across the three (pingall,
all-reduce, the lossless incast, pauses across machines) and `down` leaves nothing on any of them;
and stop() leaves no dockerd, containerd, namespace, link or mount behind (and a second stop()
finds nothing to do)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from conftest import RING_SEED, module_state_dir, require_root
from labctl.cluster import emulate, images, swarm
from labctl.cluster import machines as mrec

pytestmark = pytest.mark.netns
IMAGE = "labctl/host"


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    require_root()
    assert emulate.status() == {}, "machines are emulated on this host already: this test would remove them"
    with module_state_dir(tmp_path_factory):
        t0 = time.monotonic()
        try:
            ms = emulate.start(3)
            print(f"3 engines and their Swarm in {time.monotonic() - t0:.1f} s")
            src, started = images.default_images_client([IMAGE, "labctl/frr"])
            try:
                for m in ms.values():            # what the lab test needs, copied once into each engine
                    print("copied", images.ensure_images(m, [IMAGE, "labctl/frr"], src))
            finally:
                src.close()
                images.release_default(started)
            yield ms
        finally:
            emulate.stop()


def test_the_swarm_has_three_ready_nodes_labelled_by_machine(machines):
    nodes = swarm.nodes(machines["m1"])
    assert sorted(n["machine"] for n in nodes) == ["m1", "m2", "m3"]
    assert all(n["state"] == "ready" and n["availability"] == "active" for n in nodes), nodes
    assert {n["machine"]: n["role"] for n in nodes}["m1"] == "manager"
    assert {n["machine"]: n["addr"] for n in nodes} == {f"m{i}": f"192.168.77.{i}" for i in (1, 2, 3)}
    assert mrec.load() == machines and mrec.manager().name == "m1"
    # each machine's cable steers by flow hash at both ends, as a NIC's RSS keeps a flow on one CPU
    from labctl.kernel import nsutil, rps
    want = {int(rps.cpu_mask(), 16)}
    for m in machines:
        assert {int(x, 16) for x in rps.read_masks(str(nsutil.path(f"lcm-{m}")), ["eth0"])["eth0"]} == want
        assert {int(x, 16) for x in rps.read_masks("/proc/thread-self/ns/net", [f"lcm-{m}"])[f"lcm-{m}"]} == want


def test_a_service_pinned_to_m2_runs_there_with_only_lo(machines):
    from labctl.containers import engine
    docker = engine.sdk()
    manager = mrec.client(machines["m1"])
    clients = {m: mrec.client(machines[m]) for m in ("m1", "m2", "m3")}
    svc = manager.services.create(IMAGE, command=["sleep", "infinity"], name="lt-pinned",
                                  constraints=[f"node.labels.{mrec.MACHINE_LABEL}==m2"],
                                  mode=docker.types.ServiceMode("replicated", replicas=1),
                                  restart_policy=docker.types.RestartPolicy(condition="none"))
    try:
        flt = {"label": "com.docker.swarm.service.name=lt-pinned"}
        deadline = time.monotonic() + 60
        while not (found := clients["m2"].containers.list(filters=flt)):
            assert time.monotonic() < deadline, f"no task runs on m2: {svc.tasks()}"
            time.sleep(0.2)
        assert clients["m1"].containers.list(all=True, filters=flt) == []
        assert clients["m3"].containers.list(all=True, filters=flt) == []
        pid = found[0].attrs["State"]["Pid"]
        devices = [line.split(":")[0].strip() for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]]
        assert devices == ["lo"]
        # a namespace of its own: not the machine's (which holds eth0)
        assert os.stat(f"/proc/{pid}/ns/net").st_ino != os.stat("/run/netns/lcm-m2").st_ino
    finally:
        svc.remove()
        for c in (manager, *clients.values()):
            c.close()


ROOT = Path(__file__).resolve().parents[1]


def test_the_bgp_leaf_spine_runs_across_three_machines(machines, tmp_path):
    """Spread by server: the fabric's FRR switches on m1, server 1 (its GPUs and NVLink switch) on
    m2, server 2 on m3. Every GPU's uplink then crosses machines, as a VXLAN."""
    from pyroute2 import NetNS
    from labctl import lifecycle as labmod
    from labctl import state
    from labctl.lifecycle.reach import pingall
    from labctl.telemetry import agentreport
    from labctl.traffic.run import run_workload
    from labctl.traffic.workload import load_workload
    from labctl.errors import LabError
    name = "lt-swarm"
    t0 = time.monotonic()
    # the ECMP draw that puts the ring's two fabric hops on two spines, as the timed tests use: with
    # the default one both run at half rate behind one spine link, and the all-reduce takes 36 s, not 18
    plan, lab, _ = labmod.up(str(ROOT / "topologies" / "leaf-spine-bgp.yml"), [RING_SEED], name=name,
                             hosts=["m1", "m2", "m3"])
    print(f"up across 3 machines in {time.monotonic() - t0:.1f} s")
    clients = {m: mrec.client(machines[m]) for m in ("m1", "m2", "m3")}
    try:
        st = lab.read_state()
        assert st.get("routing_converged_s") is not None     # every BGP session Established (up checks it)
        # containers spread over the three engines, each node on the machine the spread gave it
        on = {m: sorted(c.labels["labctl.node"] for c in clients[m].containers.list(filters={"label": f"labctl.lab={name}"}))
              for m in clients}
        assert on == {m: sorted(n.name for n in plan.nodes if n.machine == m) for m in clients}, on
        assert len(on["m1"]) == 6 and len(on["m2"]) == len(on["m3"]) == 5
        # links between machines are point-to-point VXLAN devices in the nodes, one VNI each
        crossing = [lk for lk in plan.links if lk.machines]
        assert len(crossing) == 8
        for lk in crossing:
            for (node, port), there in zip(lk.ends, lk.machines[::-1]):
                with NetNS(plan.node(node).namespace) as ns:
                    (link,) = ns.get_links(ifname=port)
                info = link.get_attr("IFLA_LINKINFO")
                data = info.get_attr("IFLA_INFO_DATA")
                assert info.get_attr("IFLA_INFO_KIND") == "vxlan", (node, port)
                assert data.get_attr("IFLA_VXLAN_ID") == st["vni_base"] + lk.id
                assert data.get_attr("IFLA_VXLAN_GROUP") == machines[there].address
        # the switch agents run in the nodes: FRR's inside their containers (no agent for the lab)
        assert "controller_pid" not in st and len(st["agent_pids"]) == 16
        for n in plan.nodes:
            if n.kind == "switch":
                pid = st["agent_pids"][n.name]
                assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"), n.name

        pairs, failed = pingall(plan)
        assert pairs == 80 and not failed, failed[:3]
        doc = run_workload(plan, lab, load_workload(ROOT / "workloads" / "allreduce.yml"), tmp_path / "ar")
        assert all(r["wrong"] == 0 for r in doc["results"]) and doc["loss_ledger"]["total"] == 0, (
            [(r["size"], r["wrong"], r["timed_out"]) for r in doc["results"]], doc["loss_ledger"],
            {rank: c["rx"] for rank, c in doc["counters"].items()})
        assert doc["reordering"]["reordered"] == 0, doc["reordering"]   # the machines' cables keep flows in order
        # a capture on a sender's cross-machine port (srv2-gpu0 on m3 sends to srv1-gpu0 on m2 through
        # leaf1 on m1): the RoCE frames it sent and the pauses that crossed to it
        from labctl.lifecycle.capture import Capture
        tapped = ("srv2-gpu0", "leaf1")
        rx_before = {(p["node"], p["port"]): p["pfc_rx"] for p in agentreport.load(lab.path)["ports"]}.get(tapped, 0)
        cap = Capture(plan, ":".join(tapped), tmp_path / "gpu.pcapng")
        doc = run_workload(plan, lab, load_workload(ROOT / "workloads" / "incast.yml"), tmp_path / "incast")
        pcap = cap.stop()
        rx = [q for c in doc["counters"].values() for q in c["rx"]]
        assert doc["results"][0]["wrong"] == 0 and sum(q["gaps"] for q in rx) == 0
        assert doc["loss_ledger"]["total"] == 0 and doc["loss_ledger"]["lossless_drops"] == 0, doc["loss_ledger"]
        time.sleep(0.3)                  # the agents publish within 10 ms of a change
        counters = {(p["node"], p["port"]): p for p in agentreport.load(lab.path)["ports"]}
        across = {(n, port) for lk in crossing for n, port in lk.ends}
        paused = {k: c["pfc_tx"] for k, c in counters.items() if k in across and c["pfc_tx"]}
        assert paused, "no pause crossed a machine"
        for (node, port), sent in paused.items():
            iface = plan.node(node).iface(port)
            # sent by an agent on one machine, counted by an agent on another: the same frames
            assert counters[(iface.peer_node, iface.peer_iface)]["pfc_rx"] == sent, (node, port)
        print(f"pauses across machines: {paused}")
        import subprocess
        fields = subprocess.run(["tshark", "-r", str(pcap), "-T", "fields", "-e", "eth.type", "-e", "udp.dstport"],
                                capture_output=True, text=True, check=True).stdout.split("\n")
        roce = sum(1 for f in fields if f.endswith("\t4791"))
        pfc = sum(1 for f in fields if f.startswith("0x8808"))
        # dumpcap may miss a frame under load: 1% of what the GPU's agent counted is allowed
        rx = counters[tapped]["pfc_rx"] - rx_before
        assert roce > 100 and rx > 0 and 0.99 * rx <= pfc <= rx, (roce, pfc, rx)
        print(f"captured on {tapped} (VXLAN): {roce} RoCE frames, {pfc} of the {rx} pauses its agent counted")

        shown = {n["name"]: n for n in labmod.status(lab)["nodes"]}      # what `labctl status` prints
        assert shown["srv1-gpu0"]["machine"] == "m2"
        assert {p["name"]: p["vxlan_to"] for p in shown["srv1-gpu0"]["interfaces"]} == {"leaf1": "m1", "srv1-nvs": None}
        # each VXLAN's UDP socket is in its machine's namespace (m1 holds 8 ends, m2 and m3 4 each)
        assert {m: _vxlan_sockets(m) for m in machines} == {"m1": 1, "m2": 1, "m3": 1}

        # `down` while the manager does not answer: everything here goes, the record stays for a second `down`
        sock = Path("/run/lcm-m1.sock")
        sock.rename("/run/lcm-m1.sock.away")
        try:
            with pytest.raises(LabError) as info:
                labmod.down(name)
            assert "Swarm services are not" in str(info.value)
        finally:
            Path("/run/lcm-m1.sock.away").rename(sock)
        assert state.lab_dir(name).path.exists() and not [ns for ns in os.listdir("/run/netns")
                                                          if ns.startswith(name + "-")]
        assert len(clients["m1"].services.list(filters={"label": f"labctl.lab={name}"})) == 16
        t0 = time.monotonic()
        labmod.down(name)
        print(f"second down in {time.monotonic() - t0:.1f} s")
        for m, c in clients.items():
            assert not c.containers.list(all=True, filters={"label": f"labctl.lab={name}"}), m
        assert not clients["m1"].services.list(filters={"label": f"labctl.lab={name}"})
        assert not [ns for ns in os.listdir("/run/netns") if ns.startswith(name + "-")]
        assert {m: _vxlan_sockets(m) for m in machines} == {"m1": 0, "m2": 0, "m3": 0}
        assert not state.lab_dir(name).path.exists()
    finally:
        if state.lab_dir(name).path.exists():
            labmod.down(name)
        for c in clients.values():
            c.close()


def _vxlan_sockets(machine: str) -> int:
    """UDP sockets bound to VXLAN's port 14789 in the machine's namespace (the kernel shares one
    among the VXLAN devices of a namespace that listen on the same port)."""
    from labctl.kernel import nsutil
    with nsutil.entered(emulate.netns(machine)):
        rows = Path("/proc/thread-self/net/udp").read_text().splitlines()[1:]
    return sum(1 for r in rows if r.split()[1].endswith(f":{14789:04X}"))


def test_a_node_that_fails_on_its_machine_rolls_every_machine_back(machines):
    """A node whose container exits at once (on m3) fails `up` after the other services exist:
    nothing is left on any engine, and no namespace or record of the lab."""
    from labctl import lifecycle as labmod
    from labctl import state
    from labctl.errors import LabError
    from labctl.topology.load import load_topology_text
    name = "lt-swarmfail"
    text = """
name: lt-swarmfail
nodes:
  h1: {kind: host}
  r1: {kind: switch, fabric: backend}
  h2: {kind: host, image: labctl/host, cmd: /no/such/program}
links:
  - endpoints: [h1, r1]
  - endpoints: [r1, h2]
placement: {h1: m1, r1: m2, h2: m3}
"""
    with pytest.raises(LabError) as info:
        labmod.build(load_topology_text(text, "fail.yml"))
    assert "node h2: its container did not start on machine m3" in str(info.value), info.value
    for m in machines.values():
        c = mrec.client(m)
        try:
            assert not c.containers.list(all=True, filters={"label": f"labctl.lab={name}"}), m.name
            if m.manager:
                assert not c.services.list(filters={"label": f"labctl.lab={name}"})
        finally:
            c.close()
    assert not [ns for ns in os.listdir("/run/netns") if ns.startswith(name + "-")]
    assert not state.lab_dir(name).path.exists()


def test_a_machine_away_at_down_is_named_and_cleaned_when_it_comes_back(machines, capsys):
    """m3 goes down with a node of the lab on it; `down` removes the rest, names m3, and the record
    goes (the manager removed every service). When m3 comes back, its Swarm agent removes the
    container the manager no longer wants: nothing of the lab is left on any machine."""
    from labctl import lifecycle as labmod
    from labctl import state
    from labctl.topology.load import load_topology_text
    name = "lt-swarmaway"
    text = f"""
name: {name}
nodes:
  h1: {{kind: host}}
  r1: {{kind: switch, fabric: backend}}
  h2: {{kind: host}}
links:
  - endpoints: [h1, r1]
  - endpoints: [r1, h2]
placement: {{h1: m1, r1: m2, h2: m3}}
"""
    labmod.build(load_topology_text(text, "away.yml"))
    flt = {"label": f"labctl.lab={name}"}
    try:
        emulate.halt("m3")
        capsys.readouterr()
        labmod.down(name)
        assert "machine m3 does not answer" in capsys.readouterr().err
        assert not state.lab_dir(name).path.exists()
        assert not [ns for ns in os.listdir("/run/netns") if ns.startswith(name + "-")]
    finally:
        emulate.resume("m3")
    swarm.wait_ready(machines["m1"], 3)
    for m in machines.values():
        c = mrec.client(m)
        try:
            deadline = time.monotonic() + 60
            while c.api.containers(all=True, filters=flt):
                assert time.monotonic() < deadline, (m.name, c.api.containers(all=True, filters=flt))
                time.sleep(0.5)
        finally:
            c.close()


def _leftovers() -> dict[str, list[str]]:
    procs_left = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "/run/lcm-" in cmd and ("dockerd" in cmd or "containerd" in cmd):
                procs_left.append(f"{entry.name}: {cmd[:80]}")
    netns_dir = Path("/run/netns")
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if line.split()[4].startswith(("/run/lcm-", "/var/lib/labctl/machines/"))]
    cgroups = [str(p) for p in Path("/sys/fs/cgroup").glob("**/labctl-m*") if p.is_dir()]
    return {"processes": procs_left,
            "netns": [n for n in (os.listdir(netns_dir) if netns_dir.is_dir() else []) if n.startswith("lcm-")],
            "links": [n for n in os.listdir("/sys/class/net") if n.startswith("lcm-")],
            "mounts": mounts, "cgroups": cgroups, "run": [n for n in os.listdir("/run") if n.startswith("lcm-")]}


def test_stop_leaves_nothing_and_is_idempotent(machines):
    record = mrec.record_path()
    t0 = time.monotonic()
    assert emulate.stop() is True
    print(f"stop in {time.monotonic() - t0:.1f} s")
    assert _leftovers() == {"processes": [], "netns": [], "links": [], "mounts": [], "cgroups": [], "run": []}
    assert not record.exists() and not emulate.RECORD.exists()
    assert emulate.status() == {}
    assert emulate.stop() is False
