#!/usr/bin/env python3
"""An all-reduce over the bundled leaf-spine under three ECMP hash seeds: the seed decides whether
the ring's two fabric hops share a spine, and the time shows it.

    sudo .venv/bin/python examples/allreduce_sweep.py [--name NAME] [--seeds 1,4] [--size 4MB]
"""
import argparse
import sys
from pathlib import Path

from labctl import Lab

ROOT = Path(__file__).resolve().parents[1]
ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--name", default="ex-sweep")
ap.add_argument("--seeds", default="1,4,5")
ap.add_argument("--size", default="4MB")
ap.add_argument("--out", default=None, help="a directory for the runs (default runs/<time>-...)")
args = ap.parse_args()

print(f"{'hash_seed':>9} {'time (s)':>9} {'ideal (s)':>9} {'ratio':>6} {'#wrong':>6}  spines of the ring's fabric hops")
wrong = 0
for seed in args.seeds.split(","):
    with Lab(ROOT / "topologies" / "leaf-spine.yml", name=args.name, vars={"hash_seed": int(seed)}) as lab:
        out = Path(args.out) / f"seed{seed}" if args.out else None
        doc = lab.run({"name": "ar", "collective": "all_reduce", "sizes": [args.size], "participants": "all"}, out)
    r = doc["results"][0]
    spines = [h["spine"] for h in doc["ring_placement"]["hops"]]
    wrong += r["wrong"]
    print(f"{seed:>9} {r['time_s']:>9.3f} {r['ideal_s']:>9.3f} {r['ratio']:>6.2f} {r['wrong']:>6}  {', '.join(spines)}")
sys.exit(1 if wrong else 0)
