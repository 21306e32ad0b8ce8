#!/usr/bin/env python3
"""Bring-up and teardown of leaf-spine labs from 16 to 1,024 GPU hosts, side by side: labctl's
netns backend, the iproute2 floor (floor.py: the same namespaces, veths and addresses with
`ip -batch`, and with one `ip` per command), labctl's mininet backend, and plain Mininet building
the same plan.

The labctl backends build the whole lab (nodes, links, addresses, shaping, ECMP routes, the
controller's classification; not the controller process, which bench/controller.py measures);
the floors build nodes, cables and addresses only; plain Mininet builds nodes, links and shaping.
Runs are interleaved (rep → size → tool), each after the kernel has finished tearing down the one
before (namespace cleanup runs after `ip netns del` returns and would slow the next build), and
the median of --reps is printed in ms per GPU host with each one's ratio to the netns backend.
Mininet runs up to --mininet-max hosts (it takes ~130 ms per host). Run as root:

    sudo .venv/bin/python bench/bringup.py [--reps 3] [--sizes 16,128,1024] [--mininet-max 128]
                                           [--no-mininet] [--no-floor]
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

import floor  # noqa: E402  (bench/floor.py)

SIZES = {  # GPU hosts → template vars
    16: ["servers=4", "gpus_per_server=4", "leaves=4", "spines=2"],
    64: ["servers=8", "gpus_per_server=8", "leaves=8", "spines=4"],
    128: ["servers=16", "gpus_per_server=8", "leaves=8", "spines=4"],
    256: ["servers=32", "gpus_per_server=8", "leaves=16", "spines=8"],
    512: ["servers=64", "gpus_per_server=8", "leaves=32", "spines=8"],
    1024: ["servers=128", "gpus_per_server=8", "leaves=32", "spines=16"],
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


def settle(timeout: float = 120.0) -> None:
    """Wait until the CPUs are idle again: the kernel's namespace cleanup after a teardown."""
    def busy_idle():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        t0, i0 = busy_idle()
        time.sleep(0.5)
        t1, i1 = busy_idle()
        if t1 > t0 and (i1 - i0) / (t1 - t0) > 0.9:
            return


def mininet_available() -> bool:
    return (shutil.which("mnexec") is not None and shutil.which("brctl") is not None
            and subprocess.run([MININET_PY, "-c", "import mininet.net"], capture_output=True).returncode == 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="16,128,1024")
    ap.add_argument("--mininet-max", type=int, default=128)
    ap.add_argument("--no-mininet", action="store_true")
    ap.add_argument("--no-floor", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/bringup.py builds namespaces: run it as root")
    os.environ["LABCTL_STATE_DIR"] = tempfile.mkdtemp(prefix="labctl-bench-")
    sizes = [int(s) for s in args.sizes.split(",")]
    use_mn = not args.no_mininet and mininet_available()
    if not use_mn and not args.no_mininet:
        print("Mininet not found (apt-get install mininet bridge-utils): labctl only\n")
    tools = ["netns"] + ([] if args.no_floor else ["ip -batch", "ip per command"])
    tools += ["mininet backend", "plain mininet"] if use_mn else []
    results: dict[tuple[str, int], list[dict]] = {}
    for rep in range(args.reps):
        for n in sizes:
            line = []
            for tool in tools:
                settle()
                if "mininet" in tool and n > args.mininet_max:
                    continue
                if tool == "plain mininet":
                    r = mininet_once(results[("netns", n)][-1]["plan"])
                elif tool.startswith("ip "):
                    r = floor.timed(results[("netns", n)][-1]["plan"], "batch" if tool == "ip -batch" else "per-command")
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
          "ratios are up / the ip -batch floor's, and up / labctl netns's")
    print(f"{'GPU hosts':>9} {'nodes':>6} {'links':>6}  {'tool':<16} {'up ms/host':>10} {'down ms/host':>12} "
          f"{'vs floor':>8} {'vs netns':>8}")
    for n in sizes:
        plan = results[("netns", n)][0]["plan"]
        floor_up, netns_up = med("ip -batch", n, "up_s"), med("netns", n, "up_s")
        for tool in tools:
            u, d = med(tool, n, "up_s"), med(tool, n, "down_s")
            if u is None:
                continue
            vs_floor = f"{u / floor_up:.2f}x" if floor_up else "-"
            print(f"{n:>9} {len(plan.nodes):>6} {len(plan.links):>6}  {tool:<16} {u / n * 1000:>10.2f} "
                  f"{d / n * 1000:>12.2f} {vs_floor:>8} {u / netns_up:>7.2f}x")


if __name__ == "__main__":
    main()
