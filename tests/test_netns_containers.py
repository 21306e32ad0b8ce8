"""Container nodes on a real Docker engine, started by this module's setup (and stopped again if it
started it): a lab mixing containers and namespaces pings, runs the bundled all-reduce and is
captured as RoCE on a container's port; the containerlab corpus comes up and pings after its exec
lines; every network-OS file is refused having made nothing; a containerlab export of the
leaf-spine reaches what the leaf-spine reaches; a SIGKILLed container `up` is cleaned from its
record, and a bystander lab is untouched. `down` leaves no container, netns or process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import lab_namespaces
from netutil import wait_for
from labctl import exports, procs, state
from labctl import lifecycle as labmod
from labctl.errors import InputError
from labctl.lifecycle.capture import Capture
from labctl.lifecycle.reach import ping_pairs
from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
LEAF_SPINE = ROOT / "topologies" / "leaf-spine.yml"
CLAB = ROOT / "tests" / "clab"
pytestmark = pytest.mark.netns
CONVERGE_S = 40           # OSPF in the frr corpus file: hello 1 s, dead 4 s


def lab_containers(client, lab: str) -> list[str]:
    # a container the engine removes while it is listed (a create cut off by SIGKILL) is not an error
    return [c.name for c in client.containers.list(all=True, filters={"label": f"labctl.lab={lab}"},
                                                   ignore_removed=True)]


def assert_nothing_left(client, lab: str, journal_pids: list[str]) -> None:
    assert lab_containers(client, lab) == []
    assert lab_namespaces(lab + "-") == []
    assert not any(procs.verified(e) for e in journal_pids), journal_pids
    assert not state.lab_dir(lab).path.exists()


def pingall_until(plan, timeout: float) -> tuple[int, list]:
    deadline = time.monotonic() + timeout
    while True:
        tried, failed = labmod.pingall(plan)
        if (tried and not failed) or time.monotonic() > deadline:
            return tried, failed
        time.sleep(1)


def test_mixed_lab_pings_runs_the_allreduce_and_captures_roce_on_a_container(docker_engine, state_dir, lab_name,
                                                                             tmp_path):
    plan, lab, _ = labmod.up(str(LEAF_SPINE), ["gpu_image=labctl/host"], lab_name)
    pids = []
    try:
        gpus = [n for n in plan.nodes if n.kind == "gpu"]
        assert all(n.container for n in gpus) and not any(n.container for n in plan.nodes if n.kind != "gpu")
        assert sorted(lab_containers(docker_engine, lab_name)) == sorted(n.container.name for n in gpus)
        ctr = docker_engine.containers.get(gpus[0].container.name)
        assert os.stat(f"/proc/{ctr.attrs['State']['Pid']}/ns/net").st_ino == os.stat(
            f"/var/run/netns/{gpus[0].namespace}").st_ino, "the node's netns is the container's"
        tried, failed = labmod.pingall(plan)
        assert (tried, failed) == (80, [])
        images = {n["name"]: n["image"] for n in labmod.status(lab)["nodes"]}
        assert all(images[n.name] == "labctl/host" for n in gpus) and images["leaf1"] is None, images
        listing = subprocess.run([sys.executable, "-m", "labctl", "status", lab_name], capture_output=True,
                                 text=True, env={**os.environ, "COLUMNS": "200"}).stdout
        assert "gpu (labctl/host)" in listing, listing[:400]
        r = subprocess.run(labmod.backend_of(lab).exec_argv(gpus[0], ["cat", "/etc/os-release"]),
                           capture_output=True, text=True)
        assert "bookworm" in r.stdout, "exec runs inside the container's own filesystem"

        pcap = tmp_path / "gpu0.pcapng"
        cap = Capture(plan, f"{gpus[0].name}:leaf1", pcap, journal=lab.journal)
        # the bundled all-reduce to 8 MB: the agents in containers move RoCE as they do in namespaces
        # (the timed tests run the whole sweep to 64 MB on namespaces, and across machines on containers)
        workload = tmp_path / "allreduce.yml"
        workload.write_text((ROOT / "workloads" / "allreduce.yml").read_text().replace("end: 64MB", "end: 8MB"))
        try:
            doc = run_workload(plan, lab, load_workload(workload), tmp_path / "run")
        finally:
            cap.stop()
        assert [r["size"] for r in doc["results"]] == [1_000_000, 2_000_000, 4_000_000, 8_000_000]
        bad = [(r["label"], r["wrong"], r["timed_out"], round(r["time_s"], 2), round(r["ideal_s"], 2))
               for r in doc["results"] if r["wrong"] or r["timed_out"]]
        assert doc["results"] and bad == [], (f"(size, wrong, timed out, time s, bound s): {bad}",
                                              doc.get("loss_ledger"), doc.get("controller_reaction"))
        rx = [q for c in doc["counters"].values() for q in c["rx"]]
        assert sum(q["gaps"] for q in rx) == 0
        rows = subprocess.run(["tshark", "-r", str(pcap), "--disable-protocol", "rpcordma", "-d",
                               "udp.port==4791,infiniband", "-T", "fields", "-e", "frame.protocols"],
                              capture_output=True, text=True, check=True).stdout.splitlines()
        assert sum("infiniband" in r for r in rows) > 100, rows[:5]
        pids = lab.journaled("pid")
    finally:
        pids = pids or lab.journaled("pid")
        labmod.down(lab_name)
    assert_nothing_left(docker_engine, lab_name, pids)


@pytest.mark.parametrize("path", sorted(CLAB.glob("*.clab.yml")), ids=lambda p: p.stem)
def test_containerlab_corpus_comes_up_and_pings_after_its_exec_lines(docker_engine, state_dir, lab_name, path):
    plan, lab, _ = labmod.up(str(path), name=lab_name)
    pids = lab.journaled("pid")
    try:
        addressed = [i.address for n in plan.nodes for i in n.interfaces if i.address]
        assert addressed, "the exec lines' addresses are read back into the plan"
        assert labmod.load_plan(lab).to_dict() == plan.to_dict()
        tried, failed = pingall_until(plan, CONVERGE_S)
        hosts = [n for n in plan.nodes if not n.bridged]
        assert tried >= len(hosts) * (len(hosts) - 1) and failed == [], failed
        if path.stem == "routed":
            h1 = plan.node("h1")
            r = subprocess.run(labmod.backend_of(lab).exec_argv(h1, ["sh", "-c", "echo $LAB $HOSTNAME $PATH"]),
                               capture_output=True, text=True, check=True)
            lab_env, hostname, path_env = r.stdout.split()
            assert (lab_env, hostname) == ("routed", "h1"), "exec gets the node's env: and hostname, as docker exec"
            assert "/usr/bin" in path_env.split(":")
    finally:
        labmod.down(lab_name)
    assert_nothing_left(docker_engine, lab_name, pids)


@pytest.mark.parametrize("path", sorted((CLAB / "nos").glob("*.clab.yml")), ids=lambda p: p.stem)
def test_network_os_file_is_refused_and_creates_nothing(docker_engine, state_dir, lab_name, path):
    before = {c.name for c in docker_engine.containers.list(all=True, ignore_removed=True)}
    with pytest.raises(InputError, match="a network OS labctl cannot run"):
        labmod.up(str(path), name=lab_name)
    assert {c.name for c in docker_engine.containers.list(all=True, ignore_removed=True)} == before
    assert lab_namespaces(lab_name + "-") == [] and not state.lab_dir(lab_name).path.exists()


def test_containerlab_export_imported_back_reaches_what_the_lab_reaches(docker_engine, state_dir, lab_name, tmp_path):
    original = compile_plan(load_topology(LEAF_SPINE))
    f = tmp_path / "ls.clab.yml"
    f.write_text(exports.export(original, "clab"))
    plan, lab, _ = labmod.up(str(f), name=lab_name)
    pids = lab.journaled("pid")
    try:
        pairs = ping_pairs(original)
        procs_ = [subprocess.Popen(["ip", "netns", "exec", f"{lab_name}-{a.name}", "ping", "-n", "-q", "-c", "1",
                                    "-W", "2", bi.address.split("/")[0]], stdout=subprocess.DEVNULL)
                  for a, _, bi in pairs]
        assert len(pairs) == 80 and [p.wait() for p in procs_] == [0] * 80
        tried, failed = labmod.pingall(plan)
        assert tried >= 80 and failed == []
        routes = subprocess.run(["ip", "-n", f"{lab_name}-leaf1", "route"], capture_output=True, text=True).stdout
        assert routes.count("nexthop via") >= 2, "ECMP routes came in through the exec lines"
    finally:
        labmod.down(lab_name)
    assert_nothing_left(docker_engine, lab_name, pids)


def test_sigkill_during_a_container_up_then_clean_leaves_nothing_and_spares_a_bystander(docker_engine, state_dir,
                                                                                      lab_name):
    bystander = lab_name[:-1] + ("b" if lab_name[-1] != "b" else "c")
    labmod.up(str(CLAB / "hosts.clab.yml"), name=bystander)
    env = {**os.environ, "LABCTL_STATE_DIR": str(state_dir)}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "labctl", "up", str(LEAF_SPINE), "--name", lab_name,
                                 "--set", "gpu_image=labctl/host"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        journal = state_dir / lab_name / "journal"
        assert wait_for(lambda: journal.exists() and journal.read_text().count("container ") >= 3, timeout=60)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert json.loads((state_dir / lab_name / "state.json").read_text())["status"] == "building"
        assert lab_containers(docker_engine, lab_name), "killed while its containers existed"
        cleaned = {r.lab for r in labmod.clean()}
        assert cleaned == {lab_name}
        assert_nothing_left(docker_engine, lab_name, [])
        by_plan = labmod.load_plan(state.lab_dir(bystander))
        assert len(lab_containers(docker_engine, bystander)) == 2
        assert labmod.pingall(by_plan) == (2, [])
    finally:
        for name in (lab_name, bystander):
            if state.lab_dir(name).path.exists():
                labmod.down(name)


def test_a_failing_exec_line_rolls_the_containers_back(docker_engine, state_dir, lab_name, tmp_path):
    f = tmp_path / "fails.clab.yml"
    f.write_text("name: fails\ntopology:\n  nodes:\n"
                 "    a: {kind: linux, image: labctl/host, exec: ['ip address add 10.9.0.1/24 dev eth1']}\n"
                 "    b: {kind: linux, image: labctl/host, exec: ['ip link set dev nosuchport up']}\n"
                 "  links:\n    - endpoints: ['a:eth1', 'b:eth1']\n")
    from labctl.errors import LabError
    with pytest.raises(LabError, match="node b: exec line `ip link set dev nosuchport up` exited with status"):
        labmod.up(str(f), name=lab_name)
    assert_nothing_left(docker_engine, lab_name, [])
