#!/usr/bin/env python3
"""Ring RS/AG/AR at 8 ranks vs the α-β bound, at several lab link rates (one dilation each).

Builds the bundled leaf-spine once per rate and runs each collective at 16 MB and 64 MB. Shows
the accuracy where the machine keeps up (the bound is met within a few %) and where eight agents
plus forwarding saturate two cores. Run as root:

    sudo .venv/bin/python bench/collectives.py [--rates 100M,200M,400M] [--sizes 16MB,64MB]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl import lab as labmod  # noqa: E402
from labctl import state  # noqa: E402
from labctl.backends.netns import NetnsBackend  # noqa: E402
from labctl.traffic.run import run_workload  # noqa: E402
from labctl.traffic.workload import load_workload  # noqa: E402
from labctl.units import parse_rate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="100M,200M,400M")
    ap.add_argument("--sizes", default="16MB,64MB")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/collectives.py builds namespaces: run it as root")
    os.environ["LABCTL_STATE_DIR"] = tempfile.mkdtemp(prefix="labctl-bench-")
    tmp = Path(tempfile.mkdtemp(prefix="labctl-bench-runs-"))
    print(f"{'lab rate':>9} {'collective':>15} {'size':>10} {'time (s)':>9} {'ideal (s)':>9} {'ratio':>6} {'#wrong':>6}")
    for rate in args.rates.split(","):
        dilation = 400e9 / parse_rate(rate)
        plan, lab, _ = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"), [f"dilation={dilation:g}"],
                                 name="bcoll")
        try:
            for coll in ("reduce_scatter", "all_gather", "all_reduce"):
                wf = tmp / f"{coll}.yml"
                wf.write_text(f"name: b\ncollective: {coll}\nsizes: [{args.sizes}]\nparticipants: all\n")
                doc = run_workload(plan, lab, load_workload(wf), tmp / coll)
                for r in doc["results"]:
                    print(f"{rate:>9} {coll:>15} {r['size']:>10} {r['time_s']:>9.3f} {r['ideal_s']:>9.3f} "
                          f"{r['ratio']:>6.2f} {r['wrong']:>6}", flush=True)
        finally:
            NetnsBackend().destroy(state.lab_dir(plan.lab))


if __name__ == "__main__":
    main()
