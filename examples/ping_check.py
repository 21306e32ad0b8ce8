#!/usr/bin/env python3
"""Build the bundled leaf-spine from Python, check every pair, and look at a flow's path.

    sudo .venv/bin/python examples/ping_check.py [--name NAME]
"""
import argparse
import sys
from pathlib import Path

from labctl import Lab

ROOT = Path(__file__).resolve().parents[1]
ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--name", default="ex-ping", help="the lab's name (its namespaces are NAME-<node>)")
args = ap.parse_args()

with Lab(ROOT / "topologies" / "leaf-spine.yml", name=args.name) as lab:
    result = lab.pingall()
    print(f"pingall: {result.tried - result} of {result.tried} pairs reachable")
    ping = lab.node("srv1-gpu0").cmd(["ping", "-c", "1", "-W", "2", "srv2-gpu1"])   # a node name, as in Mininet
    print(ping.stdout.splitlines()[-1] if ping.returncode == 0 else ping.stderr)
    for sport in (49152, 49158):
        hops = lab.route("srv1-gpu0", "srv2-gpu1", sport=sport)
        print(f"udp sport {sport}: " + " -> ".join(h["node"] for h in hops))
sys.exit(1 if result or ping.returncode else 0)
