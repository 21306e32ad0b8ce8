#!/usr/bin/env python3
"""Bring-up and teardown of leaf-spine labs with 16, 64 and 128 GPU hosts, three ways side by side:
labctl's netns backend, labctl's mininet backend, and plain Mininet building the same plan.

The two labctl backends build the whole lab (nodes, links, addresses, shaping, ECMP routes, the
controller's classification); plain Mininet builds the nodes, links and shaping only. Runs are
interleaved (rep → size → tool) and the median of --reps is printed, with ms per GPU host and each
one's ratio to the netns backend. Run as root:

    sudo .venv/bin/python bench/bringup.py [--reps 3] [--sizes 16,64,128] [--no-mininet]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl import state  # noqa: E402
from labctl import backends  # noqa: E402
from labctl.plan.compile import compile_plan  # noqa: E402
from labctl.topology.load import load_topology  # noqa: E402

SIZES = {  # GPU hosts → template vars
    16: ["servers=4", "gpus_per_server=4", "leaves=4", "spines=2"],
    64: ["servers=8", "gpus_per_server=8", "leaves=8", "spines=4"],
    128: ["servers=16", "gpus_per_server=8", "leaves=8", "spines=4"],
}
MININET_PY = "/usr/bin/python3"


def labctl_once(sets: list[str], backend: str = "netns") -> dict:
    name = f"bench{os.getpid() % 10000}"
    t0 = time.perf_counter()
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml", sets, name=name))
    t1 = time.perf_counter()
    lab = state.claim(name, plan.to_dict(), None)
    backends.get(backend).apply(plan, lab)
    t2 = time.perf_counter()
    backends.get(backend).destroy(lab)
    t3 = time.perf_counter()
    return {"up_s": t2 - t0, "compile_s": t1 - t0, "down_s": t3 - t2, "plan": plan}


def mininet_once(plan) -> dict | None:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(plan.to_dict(), f)
    try:
        r = subprocess.run([MININET_PY, str(Path(__file__).with_name("mininet_leafspine.py")), f.name],
                           capture_output=True, text=True, timeout=600)
    finally:
        os.unlink(f.name)
    if r.returncode != 0:
        print(f"mininet failed: {r.stderr.strip()[-400:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def mininet_available() -> bool:
    return (shutil.which("mnexec") is not None and shutil.which("brctl") is not None
            and subprocess.run([MININET_PY, "-c", "import mininet.net"], capture_output=True).returncode == 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="16,64,128")
    ap.add_argument("--no-mininet", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/bringup.py builds namespaces: run it as root")
    os.environ["LABCTL_STATE_DIR"] = tempfile.mkdtemp(prefix="labctl-bench-")
    sizes = [int(s) for s in args.sizes.split(",")]
    use_mn = not args.no_mininet and mininet_available()
    if not use_mn and not args.no_mininet:
        print("Mininet not found (apt-get install mininet bridge-utils): labctl only\n")
    tools = ["netns", "mininet backend", "plain mininet"] if use_mn else ["netns"]
    results: dict[tuple[str, int], list[dict]] = {}
    for rep in range(args.reps):
        for n in sizes:
            line = []
            for tool in tools:
                if tool == "plain mininet":
                    r = mininet_once(results[("netns", n)][-1]["plan"])
                else:
                    r = labctl_once(SIZES[n], "mininet" if tool == "mininet backend" else "netns")
                if r:
                    results.setdefault((tool, n), []).append(r)
                    line.append(f"{tool} up {r['up_s']:.2f} s down {r['down_s']:.2f} s")
            print(f"rep {rep + 1} size {n}: " + " | ".join(line), file=sys.stderr)

    def med(tool, n, key):
        vals = [x[key] for x in results.get((tool, n), [])]
        return statistics.median(vals) if vals else None

    print(f"\nleaf-spine bring-up, median of {args.reps}: ms per GPU host (the lab also has its switches); "
          "ratio = time / netns backend's")
    head = f"{'GPU hosts':>9} {'nodes':>6} {'links':>6}"
    for tool in tools:
        head += f" | {tool + ' up':>20} {'down':>7}" + ("" if tool == "netns" else f" {'ratio up/down':>14}")
    print(head)
    for n in sizes:
        plan = results[("netns", n)][0]["plan"]
        lu, ld = med("netns", n, "up_s"), med("netns", n, "down_s")
        row = f"{n:>9} {len(plan.nodes):>6} {len(plan.links):>6}"
        for tool in tools:
            u, d = med(tool, n, "up_s"), med(tool, n, "down_s")
            if u is None:
                row += f" | {'failed':>20} {'':>7}" + ("" if tool == "netns" else f" {'':>14}")
                continue
            row += f" | {u / n * 1000:>20.2f} {d / n * 1000:>7.2f}"
            if tool != "netns":
                row += f" {u / lu:>6.1f}x/{d / ld:>5.1f}x"
        print(row)


if __name__ == "__main__":
    main()
