"""The lossless promise, proven by repetition: the bundled incast on the bundled lab, twenty times in
a row, idle and with two CPU-burning processes beside it. Every run: 0 wrong, every PSN in order,
as many packets received as sent, a loss ledger of 0, and a controller whose own reaction (less
what the machine stalled every process for) stayed within the time the PFC headroom was sized for. And per hop, from captures: no flow is ever reordered."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import require_root
from labctl import state
from labctl.lifecycle.capture import Capture
from labctl.traffic.order import reordering
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
LEAF_SPINE = ROOT / "topologies" / "leaf-spine.yml"
INCAST = ROOT / "workloads" / "incast.yml"
RUNS = 20
pytestmark = pytest.mark.netns


class Spawned:
    """Processes of the test's own (`procs`), killed when the block ends."""
    procs: list = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


class Burners(Spawned):
    """Processes that only burn CPU in the root namespace (no traffic), as a busy laptop has."""

    def __init__(self, n: int):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


# Every CPU taken at once, above every process (the stall watchers included), as a hypervisor that
# stops the VM does: one spinner per CPU at the top real-time priority, all starting together
STALL = """
import os, sys, time
cpu, first, every, length, count = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
os.sched_setaffinity(0, {cpu})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(99))
for k in range(count):
    start = first + k * every
    while time.monotonic() < start:
        time.sleep(min(0.01, max(0.0, start - time.monotonic())))
    while time.monotonic() < start + length:
        pass
"""


class MachineStalls(Spawned):
    """`count` stalls of the whole machine, `length` s each, one every `every` s from `after` s on."""

    def __init__(self, after: float, every: float, length: float, count: int):
        first = time.monotonic() + after
        self.procs = [subprocess.Popen([sys.executable, "-c", STALL, str(cpu), str(first), str(every), str(length),
                                        str(count)]) for cpu in sorted(os.sched_getaffinity(0))]


def assert_lossless(doc: dict, incasts: int = 1, lab=None) -> None:
    """`doc`: one run of `incasts` incasts back to back; `lab` (state.lab_dir), whose controller's
    slow steps a failure shows."""
    ops = [(r["iteration"], r["wrong"], r["timed_out"]) for r in doc["results"]]
    assert len(ops) == incasts and all(wrong == 0 and not timed_out for _, wrong, timed_out in ops), ops
    where = f"{incasts} incast(s)"
    rx = [q for c in doc["counters"].values() for q in c["rx"]]
    tx = [q for c in doc["counters"].values() for q in c["tx"]]
    for field in ("gaps", "late", "reordered", "dropped"):
        assert sum(q[field] for q in rx) == 0, (where, field, rx)
    sent, received = sum(q["packets"] for q in tx), sum(q["packets"] for q in rx)
    assert sent == received > 0, (where, sent, received)
    ledger = doc["loss_ledger"]
    assert ledger["lossless_drops"] == 0 and ledger["total"] == 0 and ledger["unexplained_gaps"] == 0, \
        (where, ledger)
    react = doc["controller_reaction"]
    # the headroom is sized for the controller's reaction; what the machine stalled every process for
    # (stallwatch: CI's host once did for 33-46 ms) is taken out and reported, never excused silently:
    # 0 loss above is asserted whatever the machine did
    assert react["reads"] > 100 * incasts and react["controller_within_headroom"], \
        f"{where}: {react} {slow_steps(lab)}"     # a string: pytest shortens any other message
    if not react["within_headroom"]:
        print(f"{where}: {react}")


def slow_steps(lab) -> dict:
    """What the controller said about its slow steps and reads (pfc.json) and its log's last lines:
    where a slow reaction's time went."""
    if lab is None:
        return {}
    from labctl.telemetry import agentreport
    doc = agentreport.load(lab.path) or {}
    log = lab.path / "controller.log"
    return {"slow_steps": doc.get("slow_steps", [])[-12:], "long_reads": doc.get("long_reads", [])[-12:],
            "log": log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []}


@pytest.mark.parametrize("burners, reads, placement", [(0, "auto", "lab"), (2, "auto", "lab"), (2, "poll", "lab"),
                                                      (2, "auto", "node")],
                         ids=["idle", "two-cpu-burners", "polling-two-cpu-burners", "agents-in-nodes-two-cpu-burners"])
def test_the_bundled_incast_loses_nothing_twenty_times_in_a_row(built_lab, tmp_path, monkeypatch, burners, reads,
                                                                 placement):
    """`reads`: how the controller learns queue depths (dataplane/arrivals.py); polling is the path
    of kernels where the arrival counters do not load, and must hold the same promise. `placement`:
    one switch agent for the lab, or one inside each node (dataplane/agents.py)."""
    require_root()
    monkeypatch.setenv("LABCTL_QUEUE_READS", reads)
    monkeypatch.setenv("LABCTL_SWITCH_AGENTS", placement)
    plan = built_lab(LEAF_SPINE)                 # the bundled lab as a user gets it, NVLink included
    assert plan.queue_reads == ("poll" if reads == "poll" else "arrivals")
    lab = state.lab_dir(plan.lab)
    assert ("agent_pids" in lab.read_state()) == (placement == "node")
    # the twenty incasts back to back in one run, as `iterations: 20` gives them: each one's queues
    # and pauses meet the next one's start, and the agents start once, not twenty times
    workload = tmp_path / "incast.yml"
    workload.write_text(INCAST.read_text() + f"iterations: {RUNS}\n")
    with Burners(burners):
        assert_lossless(run_workload(plan, lab, load_workload(workload), tmp_path / "run"), RUNS, lab)


@pytest.mark.parametrize("placement", ["lab", "node"], ids=["one-agent", "agents-in-nodes"])
def test_a_machine_stall_is_taken_out_of_the_reaction_and_what_is_left_stays_within_the_headroom(
        built_lab, tmp_path, monkeypatch, placement):
    """The machine stops every process for 20 ms, five times during the incasts, beside two CPU
    burners: nothing is lost (the stall and the controller's own part stay within the 30 ms the
    headroom is sized for), the run sees the stalls in the controller's reads and names them the
    machine's, and the controllers' own part stays within the headroom. Stalls of 80 ms lost 2
    messages of 5 incasts in a CI run (with the VM booting beside it) and none here: past the
    headroom, 0 loss is not promised, and the report says the machine stalled longer than it
    covers. (These stalls end cleanly: in ci87 the wake-ups a stall held came up to 20 ms after its
    end, behind the rest it had held, and test_stall_logic covers that case.)"""
    require_root()
    monkeypatch.setenv("LABCTL_SWITCH_AGENTS", placement)
    plan = built_lab(LEAF_SPINE)
    lab = state.lab_dir(plan.lab)
    workload = tmp_path / "incast.yml"
    workload.write_text(INCAST.read_text() + "iterations: 5\n")
    with MachineStalls(after=1.0, every=0.7, length=0.02, count=5), Burners(2):
        doc = run_workload(plan, lab, load_workload(workload), tmp_path / "run")
    assert_lossless(doc, 5, lab)
    react = doc["controller_reaction"]
    # the watchers saw the stalls (20 ms, each seen up to 5 ms short) and the controller felt them
    assert react["machine_worst_s"] >= 0.015 and react["worst_s"] >= 0.015, react


# every hop of both kinds of path into the incast root: NVLink (srv1-gpu2 -> srv1-nvs -> srv1-gpu0)
# and the fabric (srv2-gpu1 -> leaf2 -> spines -> leaf1 -> srv1-gpu0)
HOPS = ["srv1-gpu2:srv1-nvs", "srv1-nvs:srv1-gpu0", "srv2-gpu1:leaf2", "leaf2:spine1", "leaf2:spine2",
        "spine1:leaf1", "spine2:leaf1", "leaf1:srv1-gpu0"]


def test_no_hop_reorders_a_flow_under_cpu_load(built_lab, tmp_path):
    """Captured at every hop, three runs (each its own captures: a new run's QPs start again at PSN 0)."""
    require_root()
    plan = built_lab(LEAF_SPINE)
    lab = state.lab_dir(plan.lab)
    loaded = load_workload(INCAST)
    with Burners(2):
        for k in range(3):
            d = tmp_path / f"run{k}"
            d.mkdir()
            caps = [Capture(plan, hop, d / f"{hop.replace(':', '_')}.pcapng", 64, "udp port 4791",
                            journal=lab.journal) for hop in HOPS]
            try:
                assert run_workload(plan, lab, loaded, d / "run")["results"][0]["wrong"] == 0
            finally:
                files = [c.stop() for c in caps]
            seen = {hop: reordering(f) for hop, f in zip(HOPS, files)}
            for hop, order in seen.items():
                assert order.reordered == 0, (k, hop, order.to_dict())
            for hop in ("srv1-gpu2:srv1-nvs", "srv1-nvs:srv1-gpu0", "srv2-gpu1:leaf2", "leaf1:srv1-gpu0"):
                assert seen[hop].frames >= 900, (k, hop, seen[hop].frames)   # 4 MB in 4 KB frames: 984
            assert seen["leaf2:spine1"].frames + seen["leaf2:spine2"].frames >= 900
