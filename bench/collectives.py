#!/usr/bin/env python3
"""Ring RS/AG/AR at 8 ranks vs the α-β bound, at several lab link rates (one dilation each).

Builds the bundled leaf-spine once per rate and runs each collective at 16 MB and 64 MB. Shows
the accuracy where the machine keeps up (the bound is met within a few %) and where eight agents
plus forwarding saturate two cores.

It measures the fabric, not an ECMP draw: the bundled lab's default hash seed puts the ring's two
fabric hops on one spine (the ring then runs at half its bound, which the ecmp-entropy experiment
is about). The benchmark takes the first hash seed under which the hops cross different spines,
checked on the kernel's own routes, and prints it.

--paths runs each rate on each forwarding path (LABCTL_FORWARDING, kernel/fastpath.py), one after
the other, and ends with the ratios side by side. The two paths hash ECMP with different kernel
policies (fast-path routers use policy 1), so each path gets its own collision-free seed.

--rx one,batch runs each collective twice on the same lab, the agents counting what they receive
one packet at a time, then a recvmmsg batch's in-order runs at once (traffic/rxbatch.py), and
prints the agents' CPU seconds of each. Run as root:

    sudo .venv/bin/python bench/collectives.py [--rates 100M,200M,400M] [--sizes 16MB,64MB] [--paths fast,slow]
                                               [--rx one,batch]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl import lifecycle as labmod  # noqa: E402
from labctl import state  # noqa: E402
from labctl import backends  # noqa: E402
from labctl.kernel import fastpath  # noqa: E402
from labctl.traffic import placement, rxbatch  # noqa: E402
from labctl.traffic.run import run_workload  # noqa: E402
from labctl.traffic.workload import load_workload  # noqa: E402
from labctl.units import parse_rate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="100M,200M,400M")
    ap.add_argument("--sizes", default="16MB,64MB")
    ap.add_argument("--paths", default="",
                    help="forwarding paths to run each rate on, e.g. fast,slow (default: LABCTL_FORWARDING as set)")
    ap.add_argument("--rx", default="batch",
                    help="how agents count received packets, e.g. one,batch to compare (default: batch)")
    args = ap.parse_args()
    rx_modes = [m for m in args.rx.split(",") if m]
    if not rx_modes or set(rx_modes) - {"one", "batch"}:
        sys.exit("--rx: a list of one and batch")
    if os.geteuid() != 0:
        sys.exit("bench/collectives.py builds namespaces: run it as root")
    paths = [p for p in args.paths.split(",") if p] or [os.environ.get(fastpath.ENV, "auto") or "auto"]
    for p in paths:
        if p not in fastpath.MODES:
            sys.exit(f"--paths: {p!r} is not a forwarding path (one of {', '.join(fastpath.MODES)})")
    os.environ["LABCTL_STATE_DIR"] = tempfile.mkdtemp(prefix="labctl-bench-")
    tmp = Path(tempfile.mkdtemp(prefix="labctl-bench-runs-"))
    seeds = {}
    for p in paths:
        os.environ[fastpath.ENV] = p  # read by up: the routers' forwarding path (and so their ECMP hash)
        seeds[p] = collision_free_seed(p)
    ratios = {}
    print(f"{'lab rate':>9} {'path':>5} {'rx':>5} {'collective':>15} {'size':>10} {'time (s)':>9} {'ideal (s)':>9} "
          f"{'ratio':>6} {'#wrong':>6} {'agents CPU (s)':>14}")
    cpu = {}
    for rate in args.rates.split(","):
        dilation = 400e9 / parse_rate(rate)
        for p in paths:
            os.environ[fastpath.ENV] = p
            plan, lab, _ = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"),
                                     [f"dilation={dilation:g}", seeds[p]], name="bcoll")
            try:
                for coll in ("reduce_scatter", "all_gather", "all_reduce"):
                    wf = tmp / f"{coll}.yml"
                    wf.write_text(f"name: b\ncollective: {coll}\nsizes: [{args.sizes}]\nparticipants: all\n")
                    for rx in rx_modes:
                        os.environ[rxbatch.ENV] = "off" if rx == "one" else "on"   # read by each agent
                        before = children_cpu()
                        doc = run_workload(plan, lab, load_workload(wf), tmp / f"{coll}-{rx}")
                        used = children_cpu() - before
                        cpu[(rate, p, coll, rx)] = used
                        for r in doc["results"]:
                            ratios[(rate, p, rx, coll, r["size"])] = r["ratio"]
                            print(f"{rate:>9} {p:>5} {rx:>5} {coll:>15} {r['size']:>10} {r['time_s']:>9.3f} "
                                  f"{r['ideal_s']:>9.3f} {r['ratio']:>6.2f} {r['wrong']:>6} {used:>14.2f}", flush=True)
            finally:
                backends.get("netns").destroy(state.lab_dir(plan.lab))
    if len(paths) > 1:
        print(f"\ntime / alpha-beta bound, {' | '.join(paths)}")
        for (rate, rx, coll, size) in dict.fromkeys((k[0], k[2], k[3], k[4]) for k in ratios):
            both = " | ".join(f"{ratios[(rate, p, rx, coll, size)]:.2f}" for p in paths)
            print(f"{rate:>9} {rx:>5} {coll:>15} {size:>10}  {both}")
    if len(rx_modes) > 1:
        print(f"\ntime / alpha-beta bound, and the agents' CPU seconds (the launcher's children), {' | '.join(rx_modes)}")
        for (rate, p, coll, size) in dict.fromkeys((k[0], k[1], k[3], k[4]) for k in ratios):
            both = " | ".join(f"{ratios[(rate, p, rx, coll, size)]:.2f}" for rx in rx_modes)
            spent = " | ".join(f"{cpu[(rate, p, coll, rx)]:.2f}" for rx in rx_modes)
            print(f"{rate:>9} {p:>5} {coll:>15} {size:>10}  {both}   CPU {spent}")


def children_cpu() -> float:
    """CPU seconds of this process's waited-for descendants: each run's launcher, which waits for
    its agents, so their time is in it."""
    t = os.times()
    return t.children_user + t.children_system


def collision_free_seed(path: str) -> str:
    """The first hash_seed under which the ring's fabric hops cross different spines (on `path`)."""
    for seed in range(1, 33):
        plan, lab, _ = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"), [f"hash_seed={seed}"], name="bseed")
        try:
            spines = placement.ring_spines(plan, labmod.trace_path)
        finally:
            backends.get("netns").destroy(state.lab_dir(plan.lab))
        if not placement.collides(spines):
            print(f"# ECMP placement, {path} path: hash_seed={seed}, under which the ring's fabric hops cross "
                  f"{' and '.join(spines)} (seeds before it put them on one spine)")
            return f"hash_seed={seed}"
    sys.exit("no hash seed from 1 to 32 keeps the ring's fabric hops apart")


if __name__ == "__main__":
    main()
