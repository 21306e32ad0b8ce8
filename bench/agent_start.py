#!/usr/bin/env python3
"""Starting a run's agents: forked by one launcher (labctl's way) vs one interpreter each, side by side.

On the bundled leaf-spine (8 GPUs), interleaved, median of --reps:
- pool: starting the 8 agents until each answered `ready`, and ending them (counters, exit);
- incast: the bundled incast run whole (`run_workload`), wall time, and its collective time.

The baseline starts each agent as labctl did before the launcher:
`ip netns exec <lab>-<gpu> python -P -m labctl.traffic.agent`, one interpreter per rank, each
importing the agent itself. Run as root:

    sudo .venv/bin/python bench/agent_start.py [--reps 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl import backends, procs, state  # noqa: E402
from labctl import lifecycle as labmod  # noqa: E402
from labctl.traffic import pool as poolmod, spawn  # noqa: E402
from labctl.traffic.pool import AgentPool, RunOptions  # noqa: E402
from labctl.traffic.run import run_workload  # noqa: E402
from labctl.traffic.workload import load_workload  # noqa: E402


class Execed:
    """The baseline, with the launcher's interface: one `ip netns exec ... python` per agent."""

    def __init__(self, namespaces: dict[int, str]):
        self.agents = {}
        for rank, ns in namespaces.items():
            p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-P", "-m", "labctl.traffic.agent"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, cwd="/")
            p.identity = procs.identity(p.pid)
            self.agents[rank] = p
        self.identity = next(iter(self.agents.values())).identity   # nothing of its own to journal

    def kill(self) -> None:
        for p in self.agents.values():
            p.kill()

    def wait(self, timeout=None) -> None:
        pass


def timed(fn) -> float:
    t = time.monotonic()
    fn()
    return time.monotonic() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/agent_start.py builds namespaces: run it as root")
    os.environ["LABCTL_STATE_DIR"] = tempfile.mkdtemp(prefix="labctl-bench-")
    tmp = Path(tempfile.mkdtemp(prefix="labctl-bench-runs-"))
    plan, lab, _ = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"), [], name="bstart")
    ranks = sorted(poolmod.gpu_ranks(plan))
    incast = load_workload(ROOT / "workloads" / "incast.yml")
    launcher = spawn.Launched
    ways = {"launcher": launcher, "exec each": Execed}
    got = {w: {"pool": [], "incast": [], "collective": []} for w in ways}
    try:
        for k in range(args.reps + 1):           # the first round warms caches and is not counted
            for way, cls in ways.items():
                poolmod.spawn.Launched = cls      # the pool's `spawn` is the module itself: restored below
                try:
                    pool_s = timed(lambda: AgentPool(plan, lab, ranks, RunOptions()).close())
                    t = time.monotonic()
                    doc = run_workload(plan, lab, incast, tmp / f"{way.replace(' ', '-')}-{k}")
                    wall = time.monotonic() - t
                finally:
                    poolmod.spawn.Launched = launcher
                r = doc["results"][0]
                if r["wrong"]:
                    sys.exit(f"{way}: {r['wrong']} wrong messages")
                if k:
                    got[way]["pool"].append(pool_s)
                    got[way]["incast"].append(wall)
                    got[way]["collective"].append(r["time_s"])
    finally:
        backends.get("netns").destroy(state.lab_dir(plan.lab))
    med = {w: {m: statistics.median(v) for m, v in d.items()} for w, d in got.items()}
    print(f"median of {args.reps}, 8 agents on the bundled leaf-spine, {os.cpu_count()} CPUs")
    print(f"{'':>12} {'start+end (s)':>14} {'incast wall (s)':>16} {'its collective (s)':>19}")
    for w, m in med.items():
        print(f"{w:>12} {m['pool']:>14.3f} {m['incast']:>16.3f} {m['collective']:>19.3f}")
    a, b = med["launcher"], med["exec each"]
    print(f"{'ratio':>12} {a['pool'] / b['pool']:>14.2f} {a['incast'] / b['incast']:>16.2f} "
          f"{a['collective'] / b['collective']:>19.2f}")


if __name__ == "__main__":
    main()
