"""The forwarding fast path in the kernel (kernel/fastpath.py): the bundled lab's traffic crosses its
routers in their tc programs (all but the multipath hop up to a spine), and the slow path, run on
the same workload, counts the same bytes, ECN marks and pause frames at the same ports, with
nothing lost.

Every other test runs on the fast path too (it is the default), and on the slow path with
`LABCTL_FORWARDING=slow ./test.sh`; this module holds both paths to one another in every run."""
from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest

from conftest import require_root
from labctl import state
from labctl.kernel import fastmaps, fastpath, nsutil, rtnl
from labctl.telemetry import agentreport
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
LEAF_SPINE = ROOT / "topologies" / "leaf-spine.yml"
INCAST = ROOT / "workloads" / "incast.yml"
RUNS = 5                     # incast runs summed per path: marks and pauses are counts of a race
TOLERANCE = 0.05
pytestmark = pytest.mark.netns


def kernel_forwarded(namespace: str) -> int:
    """The IP stack's ForwDatagrams in a namespace (/proc/net/snmp as its own threads see it)."""
    with nsutil.entered(namespace):
        with open("/proc/thread-self/net/snmp") as f:
            head, values = [line.split() for line in f if line.startswith("Ip:")][:2]
    return int(values[head.index("ForwDatagrams")])


def routers(plan):
    return [n for n in plan.nodes if fastpath.eligible(n)]


def port_tx_packets(node) -> int:
    """Packets the node's ports sent, from the kernel's link counters."""
    with nsutil.netlink_socket(node.namespace) as sock:
        links = rtnl.link_dump(sock)
    return sum(links[i.name]["tx_packets"] for i in node.interfaces)


def test_the_bundled_all_reduce_crosses_two_of_three_router_hops_in_their_programs(built_lab, tmp_path,
                                                                                 monkeypatch):
    require_root()
    monkeypatch.delenv(fastpath.ENV, raising=False)     # the default path, also in the slow-path tier
    plan = built_lab(LEAF_SPINE)
    assert routers(plan), "the bundled lab has routers"
    def paused(name):
        report = agentreport.load(state.lab_dir(plan.lab).path) or {"ports": []}
        return sum(p["pfc_tx"] for p in report["ports"] if p["node"] == name)
    before = {n.name: (kernel_forwarded(n.namespace), port_tx_packets(n), paused(n.name)) for n in routers(plan)}
    spec = tmp_path / "allreduce.yml"
    spec.write_text("name: allreduce\ncollective: all_reduce\nsizes: [4MB]\nparticipants: all\n")
    doc = run_workload(plan, state.lab_dir(plan.lab), load_workload(spec), tmp_path / "run")
    (r,) = doc["results"]
    assert r["wrong"] == 0 and doc["loss_ledger"]["total"] == 0, (r, doc["loss_ledger"])
    fast = {n.name: fastmaps.forwarded(n) for n in routers(plan)}
    slow = {n.name: kernel_forwarded(n.namespace) - before[n.name][0] for n in routers(plan)}
    sent = {n.name: port_tx_packets(n) - before[n.name][1] for n in routers(plan)}
    assert all(v is not None for v in fast.values()), fast
    # what each router's ports sent is what its program and its IP stack forwarded and the pause
    # frames the controller sent from them (pfc.json), give or take the odd ARP
    time.sleep(0.5)                                 # the agents rewrite their reports within 10 ms
    ports = agentreport.load(state.lab_dir(plan.lab).path)["ports"]
    pauses = {name: sum(p["pfc_tx"] for p in ports if p["node"] == name) for name in fast}
    for name in fast:
        both = fast[name] + slow[name] + pauses[name] - before[name][2]
        assert both <= sent[name] <= both + 20, (name, fast[name], slow[name], pauses[name], sent[name])
    # each fabric crossing is three router hops: up from a leaf to a spine (a multipath destination:
    # the IP stack, whose hash picks the spine), down from the spine and from the leaf to the host
    # (the programs). The spines' routes have one next hop each: everything crosses them fast
    spines = [n for n in fast if n.startswith("spine")]
    # (the ring crosses the fabric twice: 2 x 7/8 x 4 MB in 4 KB frames, about 3,400 packets)
    assert sum(fast[n] for n in spines) > 3000 and sum(slow[n] for n in spines) <= 10, (fast, slow)
    fabric = [n.name for n in routers(plan) if n.fabric == "backend"]
    share = sum(fast[n] for n in fabric) / sum(fast[n] + slow[n] for n in fabric)
    assert 0.64 < share < 0.70, (share, fast, slow)
    # the NVLink switches' routes have one next hop each too
    scaleup = [n.name for n in routers(plan) if n.fabric == "nvlink"]
    assert scaleup and sum(fast[n] for n in scaleup) > 3000 and sum(slow[n] for n in scaleup) <= 10, (fast, slow)
    from labctl import doctor
    (entry,) = [e for e in doctor.lab_paths() if e["lab"] == plan.lab]
    assert sorted(entry["fast_path"]) == sorted(fast) and entry["slow_path"] == [], entry
    measured, expected = doc["fabric_bytes"]["scaleout"], doc["fabric_bytes_expected"]["scaleout"]
    assert abs(measured / expected - 1) < 0.01, (measured, expected)


def totals(queues_csv: Path, plan) -> dict[str, dict[str, int]]:
    """What the run added on each fabric's ports (all classes): bytes sent, ECN marks, pause
    frames, drops (queues.csv holds the counters as read from the kernel, first and last row)."""
    first: dict[tuple, dict] = {}
    last: dict[tuple, dict] = {}
    with open(queues_csv) as f:
        for row in csv.DictReader(f):
            key = (row["node"], row["port"], row["tc"])
            first.setdefault(key, row)
            last[key] = row
    out: dict[str, dict[str, int]] = {}
    for key, row in last.items():
        fabric = out.setdefault(plan.node(key[0]).iface(key[1]).fabric,
                                {"sent_bytes": 0, "ecn_marked": 0, "pfc_tx": 0, "drops": 0})
        for field in fabric:
            fabric[field] += int(row[field]) - int(first[key][field])
    return out


def build_on(built_lab, monkeypatch, path: str):
    """The bundled lab built with LABCTL_FORWARDING=`path`, its routers checked to be on that path."""
    monkeypatch.setenv(fastpath.ENV, path)
    plan = built_lab(LEAF_SPINE, name=f"fp{path}")
    on_fast_path = [fastmaps.forwarded(n) is not None for n in routers(plan)]
    assert all(on_fast_path) if path == "fast" else not any(on_fast_path)
    from labctl import doctor
    (entry,) = [e for e in doctor.lab_paths() if e["lab"] == plan.lab]
    assert len(entry["fast_path" if path == "fast" else "slow_path"]) == len(routers(plan)), entry
    return plan


def test_fast_and_slow_paths_count_the_same_bytes_marks_and_pauses_on_the_incast(built_lab, tmp_path,
                                                                                 monkeypatch):
    """Both labs up side by side and their runs interleaved, so that whatever else the machine does
    falls on both alike; the counts are summed over RUNS runs each, per fabric.

    On the scale-out fabric the incast's queues are set by the link rates: per run, on either
    path, its marks vary by under 1% and its pause frames by about 3%, and both paths must agree
    within 5%. The NVLink queue into the root is different: three senders at up to 1.8 Gbit/s each
    (NVLink's lab rate) into one port, so it builds only when the agents' bursts happen to meet on
    the two CPUs. Its marks are a race between CPU-bound senders, not a property of the path:
    1,267 to 2,345 in successive runs on one path, once 36. Both paths must carry the same NVLink
    bytes, with nothing dropped; its marks are printed, not compared."""
    require_root()
    plans = {path: build_on(built_lab, monkeypatch, path) for path in ("fast", "slow")}
    sums: dict[str, dict[str, dict[str, int]]] = {path: {} for path in plans}
    for k in range(RUNS):
        for path, plan in plans.items():
            out = tmp_path / f"{path}{k}"
            doc = run_workload(plan, state.lab_dir(plan.lab), load_workload(INCAST), out)
            (r,) = doc["results"]
            assert r["wrong"] == 0 and doc["loss_ledger"]["lossless_drops"] == 0, (path, k, doc["loss_ledger"])
            for fabric, counts in totals(out / "queues.csv", plan).items():
                into = sums[path].setdefault(fabric, dict.fromkeys(counts, 0))
                for field, value in counts.items():
                    into[field] += value
    fast, slow = sums["fast"], sums["slow"]
    print(f"fast {fast}\nslow {slow}")
    assert set(fast) == set(slow) == {"backend", "nvlink"}, (fast, slow)
    for fabric, fields in (("backend", ("sent_bytes", "ecn_marked", "pfc_tx")), ("nvlink", ("sent_bytes",))):
        assert fast[fabric]["drops"] == slow[fabric]["drops"] == 0, (fabric, fast, slow)
        for field in fields:
            assert slow[fabric][field] > 0, (fabric, field, slow)
            assert abs(fast[fabric][field] / slow[fabric][field] - 1) <= TOLERANCE, (fabric, field, fast, slow)
