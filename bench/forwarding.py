#!/usr/bin/env python3
"""Forwarding rate per core through four routers, fast path against slow path, side by side.

h1 -- r1 -- r2 -- r3 -- r4 -- h2 (bench/topologies/chain5.yml, 40 Gbit/s links: the CPU is the
limit), built twice in one run: once with LABCTL_FORWARDING=fast (the routers forward in their tc
programs, kernel/fastpath.py) and once with slow (their IP stacks). trafgen (netsniff-ng) sends
UDP frames of each size from h1 to h2 as fast as one core can; the bench counts what arrives at
h2's port (its link counters) and the machine's busy CPU time (/proc/stat, all cores), and prints
packets per second, packets per busy core-second and the fast/slow ratio. Reps interleave the two
labs; the median is printed. It also checks where the packets went: on the fast path every
router's program counted them, on the slow path every router's IP stack did.

    sudo .venv/bin/python bench/forwarding.py [--reps 3] [--seconds 3] [--sizes 64,1500]

trafgen is in Debian's netsniff-ng package: apt-get install netsniff-ng.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from labctl import lifecycle as labmod  # noqa: E402
from labctl.kernel import fastmaps, fastpath, nsutil  # noqa: E402

import trafgen  # noqa: E402  (bench/trafgen.py)

TOPOLOGY = Path(__file__).with_name("topologies") / "chain5.yml"
ROUTERS = ("r1", "r2", "r3", "r4")


def busy_seconds() -> float:
    """Core-seconds the machine spent not idle since boot (/proc/stat, every CPU)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def kernel_forwarded(node) -> int:
    with nsutil.entered(node.namespace):
        with open("/proc/thread-self/net/snmp") as f:
            head, values = [line.split() for line in f if line.startswith("Ip:")][:2]
    return int(values[head.index("ForwDatagrams")])


def once(plan, frame: int, seconds: float, conf_dir: Path) -> dict:
    h2 = plan.node("h2")
    routers = [plan.node(r) for r in ROUTERS]
    fast0 = [fastmaps.forwarded(r) or 0 for r in routers]
    slow0 = [kernel_forwarded(r) for r in routers]
    with trafgen.Sending(plan, "h1", trafgen.conf(plan, "h1", "h2", frame), conf_dir):
        rx0, cpu0, t0 = trafgen.rx_packets(h2), busy_seconds(), time.monotonic()
        time.sleep(seconds)
        rx1, cpu1, t1 = trafgen.rx_packets(h2), busy_seconds(), time.monotonic()
    fast = [(fastmaps.forwarded(r) or 0) - a for r, a in zip(routers, fast0)]
    slow = [kernel_forwarded(r) - a for r, a in zip(routers, slow0)]
    pps, busy = (rx1 - rx0) / (t1 - t0), (cpu1 - cpu0) / (t1 - t0)
    return {"pps": pps, "busy_cores": busy, "pps_per_core": pps / busy if busy else 0.0,
            "by_program": min(fast), "by_stack": min(slow)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--sizes", default="64,1500", help="Ethernet frame sizes, comma-separated")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/forwarding.py builds namespaces: run it as root")
    if shutil.which("trafgen") is None:
        sys.exit(trafgen.MISSING)
    os.environ["LABCTL_STATE_DIR"] = tempfile.mkdtemp(prefix="labctl-bench-")
    sizes = [int(s) for s in args.sizes.split(",")]
    plans = {}
    try:
        for path in ("fast", "slow"):
            os.environ[fastpath.ENV] = path
            plans[path], _, _ = labmod.up(str(TOPOLOGY), name=f"fwd{path}")
        results: dict = {(p, s): [] for p in plans for s in sizes}
        with tempfile.TemporaryDirectory() as conf_dir:
            for _ in range(args.reps):
                for size in sizes:
                    for path, plan in plans.items():
                        results[(path, size)].append(once(plan, size, args.seconds, Path(conf_dir)))
        print(f"{'frame':>6} {'path':>5} {'pps':>10} {'busy cores':>11} {'pps/core':>10} {'ratio':>6}  where")
        for size in sizes:
            per_core = {}
            for path in plans:
                rows = results[(path, size)]
                med = {k: statistics.median(r[k] for r in rows) for k in ("pps", "busy_cores", "pps_per_core")}
                per_core[path] = med["pps_per_core"]
                where = (f"program {min(r['by_program'] for r in rows):,}, stack {max(r['by_stack'] for r in rows):,}"
                         if path == "fast" else
                         f"stack {min(r['by_stack'] for r in rows):,}, program {max(r['by_program'] for r in rows):,}")
                ratio = f"{per_core['fast'] / per_core['slow']:.2f}" if path == "slow" else ""
                print(f"{size:>6} {path:>5} {med['pps']:>10,.0f} {med['busy_cores']:>11.2f} "
                      f"{med['pps_per_core']:>10,.0f} {ratio:>6}  {where}")
    finally:
        for path in plans:
            labmod.down(f"fwd{path}")


if __name__ == "__main__":
    main()
