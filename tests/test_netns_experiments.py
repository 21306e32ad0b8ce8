"""The bundled experiments, end to end with one command: they pass, leave nothing, and their
plots and captures show what the run did."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import lab_namespaces, require_root
from labctl.experiment import plots
from labctl.plan.model import LabPlan

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.netns


def tshark(pcap: Path, *fields: str, display: str = "") -> list[list[str]]:
    args = ["tshark", "-r", str(pcap), "--disable-protocol", "rpcordma", "-T", "fields"]
    for f in fields:
        args += ["-e", f]
    if display:
        args += ["-Y", display]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [line.split("\t") for line in out.splitlines()]


@pytest.fixture(scope="module")
def all_experiments(tmp_path_factory):
    """`labctl run experiments/` once, as a user would, with this test's lab prefix and state dir."""
    require_root()
    import uuid
    prefix = f"ltx{uuid.uuid4().hex[:4]}-"
    out = tmp_path_factory.mktemp("experiments")
    env = {**os.environ, "LABCTL_STATE_DIR": str(out / "state"), "LABCTL_EXPERIMENT_PREFIX": prefix}
    r = subprocess.run([sys.executable, "-m", "labctl", "run", str(ROOT / "experiments"), "--out", str(out / "runs")],
                       capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=1800)
    left = lab_namespaces(prefix)
    for ns in left:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    return r, out / "runs", left, prefix


def test_every_bundled_experiment_passes_and_leaves_nothing_behind(all_experiments):
    r, runs, left, prefix = all_experiments
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    bundled = len(list((ROOT / "experiments").glob("*.yml")))
    assert bundled >= 13 and f"{bundled} of {bundled} experiments passed" in r.stdout, r.stdout[-2000:]
    assert left == [], left
    stray = subprocess.run(["pgrep", "-f", prefix], capture_output=True, text=True).stdout
    assert stray == "", stray
    for exp in (ROOT / "experiments").glob("*.yml"):
        (out,) = [d for d in runs.iterdir() if d.name.endswith(exp.stem)]
        report = (out / "report.md").read_text()
        # the report opens with the answer, with numbers, before anything else
        assert report.split("\n## ")[1].startswith("Answer\n\n**") and " of " in report.split("\n## ")[1]
        pngs = list((out / "runs").glob("*/*.png"))
        assert len(pngs) >= 4 * len(list((out / "runs").iterdir())), (exp.stem, pngs)   # each run plotted
        for png in pngs:
            assert png.stat().st_size > 10_000 and f"]({png.relative_to(out)})" in report
        labs = sorted(out.glob("lab*"))     # what each lab recorded before down removed it
        assert labs and all((d / "plan.json").is_file() for d in labs), (exp.stem, labs)
    (out,) = [d for d in runs.iterdir() if d.name.endswith("incast-pfc")]
    assert (out / "lab" / "controller.log").is_file()
    ports = json.loads((out / "lab" / "pfc.json").read_text())["ports"]
    assert sum(p["pfc_tx"] for p in ports) > 0     # the pauses the pfc_on run sent, as the controller kept them


def test_plots_draw_the_runs_own_counters(all_experiments, tmp_path):
    _, runs, _, _ = all_experiments
    (out,) = [d for d in runs.iterdir() if d.name.endswith("incast-pfc")]
    run_dir = out / "runs" / "pfc_on"
    plan = LabPlan.from_dict(json.loads((run_dir / "plan.json").read_text()))
    depth = plots.queue_depth(run_dir, plan, tmp_path / "q.png")
    with open(run_dir / "queues.csv") as f:
        rows = list(csv.DictReader(f))
    assert depth and rows                           # the incast's queues were drawn from real samples
    for label, (t, y) in depth.items():
        node, rest = label.split("→")
        port, cls = rest.split(" ")
        mine = [r for r in rows if (r["node"], r["port"], r["class"]) == (node, port, cls)]
        assert t == [float(r["t_s"]) for r in mine] and y == [int(r["depth_bytes"]) / 1e3 for r in mine]
        assert max(y) > 100 and min(y) == 0          # the incast filled the queue and it drained
    marks = plots.pauses_and_marks(run_dir, tmp_path / "p.png")
    last = {}
    first = {}
    for r in rows:
        first.setdefault((r["node"], r["port"], r["class"]), r)
        last[(r["node"], r["port"], r["class"])] = r
    pauses = sum(float(last[k]["pfc_tx"]) - float(first[k]["pfc_tx"]) for k in last)
    assert sum(marks["PFC frames sent"][1]) == pytest.approx(pauses) and pauses > 0
    doc = json.loads((run_dir / "results.json").read_text())
    gantt = plots.timeline(run_dir, tmp_path / "t.png")
    assert len(gantt) == len(doc["results"][0]["per_rank"]) == 8
    for rank, pr in doc["results"][0]["per_rank"].items():
        assert gantt[f"rank {rank}"][0] == [s[1] for s in pr["sends"]]


def test_captures_decode_as_roce_pfc_and_show_ce_marks(all_experiments):
    _, runs, _, _ = all_experiments
    (out,) = [d for d in runs.iterdir() if d.name.endswith("incast-pfc")]
    roce = tshark(out / "captures" / "leaf1_srv1-gpu0.pcapng", "frame.protocols", "infiniband.bth.opcode",
                  "infiniband.bth.destqp", "ip.dsfield.ecn", display="udp.dstport == 4791")
    assert len(roce) > 1000 and all(p[0].endswith("udp:infiniband") for p in roce)
    assert {p[1] for p in roce} <= {"6", "7", "8", "9", "10", "11", "17", "129"} and "7" in {p[1] for p in roce}
    assert all(int(p[2], 0) >= 2 for p in roce)                # QPN >= 2 (QP1 would decode as MADs)
    assert sum(1 for p in roce if p[3] == "3") > 0            # CE marks the leaf set, on the wire
    pfc = tshark(out / "captures" / "spine1_leaf1.pcapng", "frame.protocols", "macc.opcode", "macc.cbfc.enbv")
    assert pfc and all(p[0] == "eth:ethertype:macc" and p[1] == "0x0101" for p in pfc), pfc[:3]


def test_link_and_wait_steps_reroute_and_restore(state_dir, lab_name, tmp_path, monkeypatch):
    """A test experiment (tests/experiments/link-failure.yml): link down between two runs, then up."""
    require_root()
    from labctl.experiment.run import run_experiment
    monkeypatch.setenv("LABCTL_EXPERIMENT_PREFIX", lab_name + "-")
    doc = run_experiment(ROOT / "tests" / "experiments" / "link-failure.yml", tmp_path / "out", say=lambda m: None)
    assert doc["passed"], doc["expectations"]
    assert doc["metrics"]["after"]["uplink_imbalance"] >= 1.99 > doc["metrics"]["before"]["uplink_imbalance"]
    assert lab_namespaces(lab_name) == []


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_capture_command_writes_pcapng_until_interrupted(built_lab, lab_name, state_dir, tmp_path, stop):
    """`labctl capture NODE:PORT -w FILE -- FILTER` as a user runs it: Ctrl-C (or a kill) ends it with
    a pcapng file, and its dumpcap with it."""
    import signal
    import time
    require_root()
    from netutil import ping
    plan = built_lab(ROOT / "topologies" / "leaf-spine.yml")
    out = tmp_path / "leaf1.pcapng"
    env = {**os.environ, "LABCTL_STATE_DIR": str(state_dir)}
    p = subprocess.Popen([sys.executable, "-m", "labctl", "capture", "leaf1:srv1-gpu0", "-w", str(out), "--lab",
                          lab_name, "--", "icmp"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        # once seen stuck here (no file after 10 s, and deaf to SIGINT): say where it waited
        assert out.exists(), f"no capture file after 10 s; {_stuck(p.pid)}"
        time.sleep(1.0)   # dumpcap writes the file's header before its capture loop is running
        dst = plan.node("srv1-gpu0").interfaces[0].address.split("/")[0]
        ping(plan.node("srv2-gpu1").namespace, dst, count=3).wait(timeout=10)
        time.sleep(0.3)
        p.send_signal(getattr(signal, stop))
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"labctl capture ignored {stop} for 15 s; {_stuck(p.pid)}") from None
        left = subprocess.run(["pgrep", "-af", str(out)], capture_output=True, text=True).stdout
        assert left == "", f"still capturing after labctl capture ended: {left}"
    finally:
        if p.poll() is None:
            subprocess.run(["pkill", "-KILL", "-P", str(p.pid)], check=False)
            p.kill()
        p.wait()
    err = p.stderr.read()
    # labctl names the file; dumpcap's "File: -" (it writes to labctl's pipe) would contradict it
    assert f"capturing leaf1:srv1-gpu0 to {out}" in err and "File: -" not in err, err
    rows = tshark(out, "frame.protocols", "icmp.type", "icmp.seq")
    assert open(out, "rb").read(4) == b"\x0a\x0d\x0d\x0a"            # pcapng section header
    assert [r[1] for r in rows].count("8") == 3 and all("icmp" in r[0] for r in rows), rows


def _stuck(pid: int) -> str:
    """What a process and its children wait in: their commands and kernel wait channels."""
    out = []
    for proc in [pid] + [int(c) for c in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                        text=True).stdout.split()]:
        try:
            cmd = Path(f"/proc/{proc}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            out.append(f"{proc} [{cmd}] waits in {Path(f'/proc/{proc}/wchan').read_text() or 'nothing'}")
        except OSError:
            out.append(f"{proc} gone")
    return "; ".join(out)


def test_every_capture_of_every_experiment_decodes(all_experiments):
    """Each pcapng the experiments wrote opens in tshark and holds what its filter asked for."""
    _, runs, _, _ = all_experiments
    pcaps = sorted(runs.glob("*/captures/*.pcapng"))
    assert len(pcaps) >= 3
    for pcap in pcaps:
        rows = [r[0] for r in tshark(pcap, "frame.protocols")]
        assert rows, pcap
        assert all(p == "eth:ethertype:macc" or p.endswith("udp:infiniband") or ":arp" in p or ":icmp" in p
                   for p in rows), (pcap, set(rows))
        assert any(p.endswith("udp:infiniband") or p.endswith("macc") for p in rows), pcap
