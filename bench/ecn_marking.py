#!/usr/bin/env python3
"""ECN marked in the data path vs by the controller: the bundled incast on the bundled lab, side by
side in one run.

Two copies of the bundled leaf-spine are up at once, one built with LABCTL_ECN_MARKING=datapath
(a tc program on each switch port's egress marks every packet on the depth it meets,
kernel/ecnpath.py) and one with controller (the controller switches nftables rules and the fast
path's marking slots from the depths it reads, dataplane/ecn.py). The runs interleave, so whatever
else the machine does falls on both alike. Per run:

- the collective's time and its ratio to the α-β bound, and that nothing was wrong or lost;
- the CE marks and PFC frames the switches counted (queues.csv: the kernel's counters);
- the controller's CPU time during the run (/proc/PID/stat), and its reaction as the run reports
  it (worst and p99 of how long a busy queue went unread, and how many reads);
- the loop's slow steps that were nftables marking transactions ("ecn rule").

Prints the median per mechanism and the datapath/controller ratios. Run as root:

    sudo .venv/bin/python bench/ecn_marking.py [--runs 5] [--workload workloads/incast.yml]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl import backends, state  # noqa: E402
from labctl import lifecycle as labmod  # noqa: E402
from labctl.kernel import ecnpath  # noqa: E402
from labctl.traffic.run import run_workload  # noqa: E402
from labctl.traffic.workload import load_workload  # noqa: E402

MECHANISMS = ("datapath", "controller")


def counters(queues_csv: Path) -> dict[str, int]:
    """CE marks and pause frames the run added over every port and class (first and last row)."""
    first, last = {}, {}
    with open(queues_csv) as f:
        for row in csv.DictReader(f):
            key = (row["node"], row["port"], row["tc"])
            first.setdefault(key, row)
            last[key] = row
    return {field: sum(int(last[k][field]) - int(first[k][field]) for k in last)
            for field in ("ecn_marked", "pfc_tx", "drops")}


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ecn_rule_steps(lab_path: Path) -> int:
    try:
        doc = json.loads((lab_path / "pfc.json").read_text())
    except (OSError, ValueError):
        return 0
    return sum(1 for step in doc.get("slow_steps", []) if "ecn rule" in json.dumps(step))


def one_run(plan, lab, workload, out: Path) -> dict:
    pid = lab.read_state()["controller_pid"]
    cpu = cpu_seconds(pid)
    doc = run_workload(plan, lab, workload, out)
    (r,) = doc["results"]
    reaction = doc.get("controller_reaction") or {}
    row = {"time_s": r["time_s"], "ratio": r.get("ratio") or 0.0, "wrong": r["wrong"],
           "lossless_drops": doc["loss_ledger"]["lossless_drops"],
           "controller_cpu_s": cpu_seconds(pid) - cpu,
           "reaction_worst_ms": 1e3 * (reaction.get("worst_s") or 0.0),
           "reaction_p99_ms": 1e3 * (reaction.get("p99_s") or 0.0), "reads": reaction.get("reads", 0)}
    row.update(counters(out / "queues.csv"))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workload", default=str(ROOT / "workloads" / "incast.yml"))
    args = ap.parse_args()
    os.environ.setdefault("LABCTL_STATE_DIR", tempfile.mkdtemp(prefix="labctl-bench-ecn-"))
    workload = load_workload(Path(args.workload))
    names = {m: f"lbe{m[0]}{uuid.uuid4().hex[:4]}" for m in MECHANISMS}
    plans = {}
    try:
        for m in MECHANISMS:
            os.environ[ecnpath.ENV] = m
            plans[m], _, _ = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"), (), names[m])
        os.environ.pop(ecnpath.ENV)
        rows = {m: [] for m in MECHANISMS}
        with tempfile.TemporaryDirectory() as tmp:
            for k in range(args.runs):
                for m in MECHANISMS:
                    row = one_run(plans[m], state.lab_dir(names[m]), workload, Path(tmp) / f"{m}{k}")
                    rows[m].append(row)
                    print(m, k, {f: round(v, 3) if isinstance(v, float) else v for f, v in row.items()},
                          flush=True)
        steps = {m: ecn_rule_steps(state.lab_dir(names[m]).path) for m in MECHANISMS}
    finally:
        for name in names.values():
            if state.lab_dir(name).path.exists():
                backends.get("netns").destroy(state.lab_dir(name))
    fields = list(rows["datapath"][0])
    print(f"\nmedian of {args.runs} runs each ({Path(args.workload).name} on the bundled leaf-spine)")
    print(f"{'':22}" + "".join(f"{m:>14}" for m in MECHANISMS) + f"{'ratio':>10}")
    for f in fields:
        med = {m: statistics.median(r[f] for r in rows[m]) for m in MECHANISMS}
        ratio = f"{med['datapath'] / med['controller']:.2f}" if med["controller"] else "-"
        print(f"{f:22}" + "".join(f"{med[m]:14.3f}" for m in MECHANISMS) + f"{ratio:>10}")
    print(f"{'slow ecn rule steps':22}" + "".join(f"{steps[m]:14d}" for m in MECHANISMS))


if __name__ == "__main__":
    main()
