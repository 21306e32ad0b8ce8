#!/usr/bin/env python3
"""One switch agent for the lab vs one inside each node: the bundled incast on the bundled lab,
side by side in one run.

Two copies of the bundled leaf-spine are up at once, one built with LABCTL_SWITCH_AGENTS=lab (one
agent on the host serves every node) and one with node (an agent in each node that needs one,
from its share of the plan, dataplane/agents.py). The runs interleave, so whatever else the
machine does falls on both alike. Per run:

- the collective's time and its ratio to the α-β bound, and that nothing was wrong or lost;
- the CE marks and PFC frames the switches counted (queues.csv: the kernel's counters);
- the agents' CPU time during the run (/proc/PID/stat, summed over the agents), and their reaction
  as the run reports it (worst and p99 of how long a busy queue went unread, and how many reads).

Once per placement: the time `up` took, and the agents' resident memory (VmRSS, summed).
Prints the median per placement and the node/lab ratios. Run as root:

    sudo .venv/bin/python bench/agent_placement.py [--runs 5] [--workload workloads/incast.yml]
"""
from __future__ import annotations

import argparse
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
from labctl.dataplane import agents  # noqa: E402
from labctl.traffic.run import run_workload  # noqa: E402
from labctl.traffic.workload import load_workload  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from ecn_marking import counters, cpu_seconds  # noqa: E402

PLACEMENTS = ("lab", "node")


def agent_pids(lab) -> list[int]:
    st = lab.read_state()
    return list((st.get("agent_pids") or {}).values()) or [st["controller_pid"]]


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return total / 1024


def one_run(plan, lab, workload, out: Path) -> dict:
    pids = agent_pids(lab)
    cpu = sum(cpu_seconds(p) for p in pids)
    doc = run_workload(plan, lab, workload, out)
    (r,) = doc["results"]
    reaction = doc.get("controller_reaction") or {}
    row = {"time_s": r["time_s"], "ratio": r.get("ratio") or 0.0, "wrong": r["wrong"],
           "lost": doc["loss_ledger"]["total"], "agents_cpu_s": sum(cpu_seconds(p) for p in pids) - cpu,
           "reaction_worst_ms": 1e3 * (reaction.get("worst_s") or 0.0),
           "reaction_p99_ms": 1e3 * (reaction.get("p99_s") or 0.0), "reads": reaction.get("reads", 0)}
    row.update(counters(out / "queues.csv"))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workload", default=str(ROOT / "workloads" / "incast.yml"))
    args = ap.parse_args()
    os.environ.setdefault("LABCTL_STATE_DIR", tempfile.mkdtemp(prefix="labctl-bench-agents-"))
    workload = load_workload(Path(args.workload))
    names = {p: f"lba{p[0]}{uuid.uuid4().hex[:4]}" for p in PLACEMENTS}
    plans, once = {}, {}
    try:
        for p in PLACEMENTS:
            os.environ[agents.ENV] = p
            plans[p], lab, up_s = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"), (), names[p])
            pids = agent_pids(lab)
            once[p] = {"up_s": up_s, "agents": len(pids), "agents_rss_mib": rss_mib(pids)}
        os.environ.pop(agents.ENV)
        rows = {p: [] for p in PLACEMENTS}
        with tempfile.TemporaryDirectory() as tmp:
            for k in range(args.runs):
                for p in PLACEMENTS:
                    row = one_run(plans[p], state.lab_dir(names[p]), workload, Path(tmp) / f"{p}{k}")
                    rows[p].append(row)
                    print(p, k, {f: round(v, 3) if isinstance(v, float) else v for f, v in row.items()},
                          flush=True)
    finally:
        for name in names.values():
            if state.lab_dir(name).path.exists():
                backends.get("netns").destroy(state.lab_dir(name))
    print(f"\nmedian of {args.runs} runs each ({Path(args.workload).name} on the bundled leaf-spine)")
    print(f"{'':22}" + "".join(f"{p:>14}" for p in PLACEMENTS) + f"{'node/lab':>10}")
    table = [(f, {p: statistics.median(r[f] for r in rows[p]) for p in PLACEMENTS}) for f in rows["lab"][0]]
    table += [(f, {p: once[p][f] for p in PLACEMENTS}) for f in once["lab"]]
    for f, med in table:
        ratio = f"{med['node'] / med['lab']:.2f}" if med["lab"] else "-"
        print(f"{f:22}" + "".join(f"{med[p]:14.3f}" for p in PLACEMENTS) + f"{ratio:>10}")


if __name__ == "__main__":
    main()
