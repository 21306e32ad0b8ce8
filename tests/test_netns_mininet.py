"""Mininet, both ways and underneath: the same bundled lab built by Mininet behaves as the netns one
(reachability, ECMP paths, all-reduce time, a lossless incast) and leaves nothing behind; an exported
script builds every bundled topology under Mininet alone; Mininet's topologies come in through the
import and answer every ping. Everything here is real: Debian's mininet, real namespaces, packets."""
from __future__ import annotations

import ipaddress
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import RING_SEED, lab_namespaces, module_state_dir, require_root, take_down
from labctl import exports, procs, state
from labctl import lifecycle as labmod
from labctl.backends import mininet as mininet_backend
from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yml"))
pytestmark = pytest.mark.netns
SPORTS = range(49152, 49160)
ALLREDUCE_TOLERANCE = 0.05


def mininet_shells() -> set[int]:
    """PIDs of Mininet's per-node shells (`bash ... -is mininet:NODE`)."""
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if b"mininet:" in (d / "cmdline").read_bytes():
                    out.add(int(d.name))
            except OSError:
                pass
    return out


def netns_mounts(prefix: str) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if f"/netns/{prefix}" in line]


def assert_nothing_left(name: str, lab: state.LabDir, pids: list[str], shells_before: set[int]) -> None:
    assert lab_namespaces(name + "-") == []
    assert netns_mounts(name + "-") == []
    assert not any(procs.verified(e) for e in pids), pids
    assert mininet_shells() - shells_before == set()
    assert not lab.path.exists()


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """The bundled leaf-spine twice: by the netns backend and by the mininet backend.

    Both with the ECMP draw that puts the ring's two fabric hops on two spines (conftest.RING_SEED, as in
    test_netns_traffic.py): with the default draw both rings run at half rate behind one shared
    spine link, which hides what each backend costs the agents and takes twice as long."""
    require_root()
    assert mininet_backend.available() is None, mininet_backend.available()
    names = {b: f"lt{uuid.uuid4().hex[:6]}" for b in ("netns", "mininet")}
    made = {}
    with module_state_dir(tmp_path_factory):
        try:
            for backend, name in names.items():
                made[backend] = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"), [RING_SEED], name=name,
                                          backend=backend)[:2]
            yield made
        finally:
            take_down(names.values())


def test_mininet_builds_the_lab_with_its_own_nodes_and_links(twins):
    plan, lab = twins["mininet"]
    helper = lab.read_state()["mininet_pid"]
    assert "mininet_net.py" in Path(f"/proc/{helper}/cmdline").read_text()
    # every node's namespace is the one a Mininet shell lives in, exposed under the lab's name
    shells = mininet_shells()
    for node in plan.nodes:
        inode = os.stat(f"/run/netns/{node.namespace}").st_ino
        assert any(os.stat(f"/proc/{p}/ns/net").st_ino == inode for p in shells), node.name


def test_pingall_reaches_every_pair_on_both(twins):
    for backend, (plan, _) in twins.items():
        tried, failed = labmod.pingall(plan, backend=labmod.backend_of(twins[backend][1]))
        assert tried == 80 and failed == [], (backend, failed)


def test_ecmp_paths_are_identical_on_both(twins):
    def paths(plan):
        return [[(h["node"], h["out"]) for h in labmod.trace_path(plan, "srv1-gpu0", "srv2-gpu1", sport, 4791)]
                for sport in SPORTS]
    a, b = paths(twins["netns"][0]), paths(twins["mininet"][0])
    assert a == b
    assert len({tuple(p) for p in a}) > 1, "8 source ports all hashed to one spine: the comparison saw one path"


def test_bundled_allreduce_takes_the_same_time_on_both(twins, tmp_path):
    """The bundled all-reduce sweep (1-64 MB) takes the same total time on both backends, within 5%.

    Sizes interleave, netns then Mininet, so a stretch in which a shared host loses CPU slows both
    twins alike (CI once measured the two whole sweeps, run one after the other, 26% apart). A size
    whose pair is further apart than the tolerance is timed again, up to twice, and each twin keeps
    its fastest: a stall only ever slows a run, and a real difference between the backends stays."""
    sweep = load_workload(ROOT / "workloads" / "allreduce.yml").workload
    times: dict[str, list[float]] = {"netns": [], "mininet": []}
    for size in sweep.size_list():
        wf = tmp_path / f"ar-{size}.yml"
        wf.write_text(f"name: ar\ncollective: all_reduce\nsizes: [{size}]\niterations: {sweep.iterations}\n"
                      "participants: all\n")
        best: dict[str, float] = {}
        for attempt in range(3):
            for backend, (plan, lab) in twins.items():
                doc = run_workload(plan, lab, load_workload(wf), tmp_path / f"{backend}-{size}-{attempt}")
                (r,) = doc["results"]
                assert r["wrong"] == 0 and not r["timed_out"], (backend, size, r)
                best[backend] = min(best.get(backend, r["time_s"]), r["time_s"])
            if abs(best["mininet"] / best["netns"] - 1) <= ALLREDUCE_TOLERANCE:
                break
        for backend in times:
            times[backend].append(best[backend])
        print(f"{size}: {attempt + 1} attempt(s), best {best}")
    ratio = sum(times["mininet"]) / sum(times["netns"])
    assert abs(ratio - 1) <= ALLREDUCE_TOLERANCE, times


def test_bundled_lossless_incast_loses_nothing_on_mininet(twins, tmp_path):
    plan, lab = twins["mininet"]
    for k in range(3):
        doc = run_workload(plan, lab, load_workload(ROOT / "workloads" / "incast.yml"), tmp_path / f"run{k}")
        assert all(r["wrong"] == 0 and not r["timed_out"] for r in doc["results"]), doc["results"]
        rx = [q for c in doc["counters"].values() for q in c["rx"]]
        assert sum(q["gaps"] for q in rx) == 0
        assert doc["loss_ledger"]["lossless_drops"] == 0, doc["loss_ledger"]


@pytest.mark.untimed
def test_down_leaves_no_mininet_process_mount_namespace_or_link(state_dir, lab_name):
    require_root()
    shells, links = mininet_shells(), _root_links()
    plan, lab, _ = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"), name=lab_name, backend="mininet")
    pids = list(lab.journaled("pid"))
    try:
        assert len(mininet_shells() - shells) == len(plan.nodes)
    finally:
        labmod.down(lab_name)
    assert_nothing_left(lab_name, lab, pids, shells)
    assert _root_links() == links


@pytest.mark.untimed
def test_down_cleans_up_after_a_mininet_that_died(state_dir, lab_name):
    """Mininet killed outright (no net.stop()): its shells and namespaces still go with `down`."""
    require_root()
    shells = mininet_shells()
    _, lab, _ = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"), name=lab_name, backend="mininet")
    pids = list(lab.journaled("pid"))
    try:
        os.kill(lab.read_state()["mininet_pid"], 9)
    finally:
        labmod.down(lab_name)
    assert_nothing_left(lab_name, lab, pids, shells)


def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip() for line in out.splitlines()}


@pytest.mark.untimed
@pytest.mark.parametrize("topology", TOPOLOGIES, ids=[t.stem for t in TOPOLOGIES])
def test_exported_script_builds_and_reaches_every_pair(topology, tmp_path):
    require_root()
    plan = compile_plan(load_topology(topology))
    script = tmp_path / f"{plan.lab}_mininet.py"
    script.write_text(exports.export(plan, "mininet"))
    shells = mininet_shells()
    r = subprocess.run(["/usr/bin/python3", str(script), "--test"], capture_output=True, text=True, timeout=600,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "pairs reachable" in r.stdout
    assert mininet_shells() - shells == set()


@pytest.mark.untimed
def test_exported_script_fails_when_a_pair_cannot_reach(tmp_path):
    """--test is a real check: a script whose leaf1 has lost its route to srv2-gpu1 must exit 1 and
    name the pairs (one route, not all: each pair that fails costs the script's 2 s ping timeout)."""
    require_root()
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml"))
    target = ipaddress.ip_address(plan.node("srv2-gpu1").iface("leaf2").address.split("/")[0])
    leaf1 = plan.node("leaf1")
    kept = [r for r in leaf1.routes if target not in ipaddress.ip_network(r.dst)]
    assert len(kept) == len(leaf1.routes) - 1
    leaf1.routes = kept
    script = tmp_path / "broken.py"
    script.write_text(exports.export(plan, "mininet"))
    r = subprocess.run(["/usr/bin/python3", str(script), "--test"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1 and f"srv1-gpu0 -> {target}: no reply" in r.stdout, r.stdout[-1000:]
    reached = int(r.stdout.split("*** Results: ")[1].split("/")[0])
    assert r.stdout.count(": no reply") == 80 - reached > 0, r.stdout[-1000:]   # each failed pair, named


MININET_TOPOS = [(ROOT / "tests" / "topologies" / "mininet" / "topo-2sw-2host.py", "mytopo", 2),
                 (None, "single,3", 6), (None, "linear,3", 6), (None, "tree,depth=2,fanout=2", 12),
                 (Path("/usr/share/doc/mininet/examples/simpleperf.py"), "SingleSwitchTopo,3,lossy=0", 6)]


@pytest.mark.untimed
@pytest.mark.parametrize("file,topo,pairs", MININET_TOPOS, ids=[t for _, t, _ in MININET_TOPOS])
def test_mininet_topologies_come_up_and_reach_every_pair(file, topo, pairs, state_dir, lab_name):
    require_root()
    plan, lab, _ = labmod.up(str(file) if file else None, name=lab_name, topo=topo)
    try:
        assert {n.kind for n in plan.nodes} == {"host", "bridge"}
        tried, failed = labmod.pingall(plan)
        assert (tried, failed) == (pairs, [])
    finally:
        # by its file, as `labctl down FILE` (found from the lab's record: the .py is not run again)
        labmod.down(str(file) if file else lab_name)
    assert lab_namespaces(lab_name + "-") == []


def test_mininet_link_delay_and_loss_reach_the_wire(state_dir, lab_name):
    """simpleperf's links: 5 ms and 10 % loss each. A ping crosses four of them per round trip."""
    require_root()
    plan, lab, _ = labmod.up("/usr/share/doc/mininet/examples/simpleperf.py", name=lab_name,
                             topo="SingleSwitchTopo,2")
    try:
        h1 = plan.node("h1")
        dst = labmod.node_address(plan, "h2")
        r = subprocess.run(labmod.backend_of(lab).exec_argv(h1, ["ping", "-c", "200", "-i", "0.01", "-q", dst]),
                           capture_output=True, text=True)
        stats = r.stdout.splitlines()
        received = int(next(s for s in stats if "received" in s).split(",")[1].split()[0])
        rtt_min = float(next(s for s in stats if s.startswith("rtt")).split("=")[1].split("/")[0])
    finally:
        labmod.down(lab_name)
    # 1 - 0.9^4 = 34 % lost; binomial sd for 200 pings is 3.4 %: 4 sd either side
    assert 200 * (0.344 - 0.136) <= 200 - received <= 200 * (0.344 + 0.136), received
    assert 20.0 <= rtt_min <= 30.0, rtt_min


def test_the_api_builds_a_mininet_topology(state_dir, lab_name):
    """Lab(topo=...) as `mn --topo`, and Lab(FILE, topo=NAME) as `mn --custom FILE --topo NAME`."""
    require_root()
    from labctl.api import Lab
    with Lab(topo="linear,2", name=lab_name) as lab:
        assert sorted(n.name for n in lab.plan.nodes) == ["h1", "h2", "s1", "s2"]
        assert lab.pingall() == 0
    with Lab(ROOT / "tests" / "topologies" / "mininet" / "topo-2sw-2host.py", name=lab_name, topo="mytopo") as lab:
        assert lab.pingall() == 0
    assert lab_namespaces(lab_name + "-") == []
