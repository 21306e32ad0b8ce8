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

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl.dataplane import agents  # noqa: E402
from labctl.traffic.workload import load_workload  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from sidebyside import arguments, compare, cpu_seconds, measured_run, print_medians  # noqa: E402

PLACEMENTS = ("node", "lab")     # printed as node / lab


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
    row = measured_run(plan, lab, workload, out)
    return {**row, "agents_cpu_s": sum(cpu_seconds(p) for p in pids) - cpu}


def main() -> None:
    args = arguments(__doc__)

    def after_up(lab, up_s: float) -> dict:
        pids = agent_pids(lab)
        return {"up_s": up_s, "agents": len(pids), "agents_rss_mib": rss_mib(pids)}

    rows, once = compare(agents.ENV, PLACEMENTS, load_workload(Path(args.workload)), args.runs, one_run, after_up)
    print_medians(rows, once, PLACEMENTS,
                  f"median of {args.runs} runs each ({Path(args.workload).name} on the bundled leaf-spine)")


if __name__ == "__main__":
    main()
