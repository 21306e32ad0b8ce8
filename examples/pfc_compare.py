#!/usr/bin/env python3
"""The bundled 7:1 incast with PFC on, then off: lossless with pauses, then drops at the leaf.

    sudo .venv/bin/python examples/pfc_compare.py [--name NAME]
"""
import argparse
import sys
from pathlib import Path

from labctl import Lab

ROOT = Path(__file__).resolve().parents[1]
ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--name", default="ex-pfc")
ap.add_argument("--out", default=None, help="a directory for the runs (default runs/<time>-...)")
args = ap.parse_args()

seen = {}
with Lab(ROOT / "topologies" / "leaf-spine.yml", name=args.name, vars={"scale_up": False}) as lab:
    for pfc in ("on", "off"):
        lab.tc("leaf1", pfc=pfc)
        doc = lab.run(ROOT / "workloads" / "incast.yml", Path(args.out) / pfc if args.out else None)
        ledger = doc["loss_ledger"]
        gaps = sum(q["gaps"] for c in doc["counters"].values() for q in c["rx"])
        pauses = sum(r.get("pfc_tx", 0) for r in lab.counters() if r["node"] == "leaf1")
        seen[pfc] = (ledger["total"], gaps)
        print(f"PFC {pfc:>3}: {ledger['total']:>5} packets dropped, {gaps:>5} PSN gaps at the receiver, "
              f"{pauses} pause frames from leaf1 so far")
ok = seen["on"] == (0, 0) and seen["off"][0] > 0
print("as expected: lossless with PFC, lossy without" if ok else "NOT as expected")
sys.exit(0 if ok else 1)
