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

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl.kernel import ecnpath  # noqa: E402
from labctl.traffic.workload import load_workload  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from sidebyside import arguments, compare, cpu_seconds, measured_run, print_medians  # noqa: E402

MECHANISMS = ("datapath", "controller")


def ecn_rule_steps(lab_path: Path) -> int:
    try:
        doc = json.loads((lab_path / "pfc.json").read_text())
    except (OSError, ValueError):
        return 0
    return sum(1 for step in doc.get("slow_steps", []) if "ecn rule" in json.dumps(step))


def one_run(plan, lab, workload, out: Path) -> dict:
    pid = lab.read_state()["controller_pid"]
    cpu, steps = cpu_seconds(pid), ecn_rule_steps(lab.path)
    row = measured_run(plan, lab, workload, out)
    return {**row, "controller_cpu_s": cpu_seconds(pid) - cpu, "slow_ecn_rule_steps": ecn_rule_steps(lab.path) - steps}


def main() -> None:
    args = arguments(__doc__)
    rows, once = compare(ecnpath.ENV, MECHANISMS, load_workload(Path(args.workload)), args.runs, one_run)
    print_medians(rows, once, MECHANISMS,
                  f"median of {args.runs} runs each ({Path(args.workload).name} on the bundled leaf-spine)")


if __name__ == "__main__":
    main()
