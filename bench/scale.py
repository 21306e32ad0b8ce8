#!/usr/bin/env python3
"""The 1,024-GPU proof: a rail-optimised leaf-spine of 128 servers x 8 GPUs (32 leaves, 16 spines,
128 NVLink switches, PFC and ECN on) built, checked, loaded with collectives, and taken down.

In one run it prints:
- `up` time, memory and descriptors per GPU host (MemAvailable before and after; the controller's
  resident size and open descriptors);
- a 200-pair `pingall --sample` (the full pingall of 1,024 hosts is a million pairs);
- the bundled 7:1 incast in the lossless class (0 loss expected), a 64-rank ring all-reduce along
  rail 0 and a 64-rank hierarchical all-reduce (8 servers, their NVLink domains), against the
  alpha-beta bound, with wrong messages, PSN gaps, the loss ledger, the controller's reaction and
  the bytes each fabric's ports counted against the collective's formula;
- `down` time, and what is left (namespaces, processes): nothing;
- then the same lab twice more, each at a dilation where two cores carry the collective, so that
  it measures the fabric rather than this machine:
  * the ring at --spray-dilation (64,000) with the leaves spraying (`--set lb=spray`). Its
    64 hops leave 4 leaves, 16 each, over 16 uplinks: a leaf puts no two of them on one uplink
    once in 16^16/16! (about 900,000) draws, and the ring needs all four leaves at once, so no
    hash seed is free of collisions here (the ECMP run names the hops); spray stands in for the
    seed that does not exist. At 32,000 its 64 senders fill two cores (800 Mbit/s of lab traffic);
  * the hierarchical all-reduce at --hier-dilation (576,000). At 32,000 its NVLink phases ask for
    64 GPUs x 225 Mbit/s at once, many times what two cores forward; at 576,000, 64 x 12.5 Mbit/s.
    NVLink keeps its 18x over the NIC: the same fabric, slower.

Dilation 32,000 (12.5 Mbit/s backend links in the lab for 400 Gbit/s): 64 senders at that rate
and their forwarding reach what two cores carry (at the bundled 4,000, eight ranks already do).
Takes about 4 minutes. Run as root:

    sudo .venv/bin/python bench/scale.py [--dilation 32000] [--spray-dilation 64000]
                                      [--hier-dilation 576000] [--sets k=v,...]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl import lifecycle as labmod  # noqa: E402
from labctl.traffic.run import run_workload  # noqa: E402
from labctl.traffic.workload import load_workload  # noqa: E402

SETS = ["servers=128", "gpus_per_server=8", "leaves=32", "spines=16"]
NAME = "bscale"


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def proc_figures(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def workloads(tmp: Path) -> dict[str, Path]:
    rail = ", ".join(f"srv{s}-gpu0" for s in range(1, 65))
    pod = ", ".join(f"srv{s}-gpu{g}" for s in range(1, 9) for g in range(8))
    files = {"ring-allreduce-64": f"collective: all_reduce\nsizes: [4MB]\nparticipants: [{rail}]\n",
             "hier-allreduce-64": f"collective: hier_all_reduce\nsizes: [4MB]\nparticipants: [{pod}]\n"}
    for name, body in files.items():
        (tmp / f"{name}.yml").write_text(f"name: {name}\n{body}")
    return {"incast": ROOT / "workloads" / "incast.yml", **{n: tmp / f"{n}.yml" for n in files}}


def leftovers() -> tuple[int, int]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    ours = [n for n in names if n.startswith(f"{NAME}-")]
    procs = subprocess.run(["pgrep", "-f", f"labctl.*{NAME}"], capture_output=True, text=True).stdout.split()
    return len(ours), len(procs)


HEADER = (f"{'workload':>18} {'dilation':>8} {'leaves':>6} {'ranks':>5} {'time (s)':>9} {'ideal (s)':>9} "
          f"{'ratio':>6} {'#wrong':>6} {'PSN gaps':>8} {'ledger':>8} {'reaction worst/p99 (ms)':>24}")


def run_rows(plan, lab, wf: Path, mode: str, out: Path) -> None:
    """Run one workload and print a row per result (and the run's ECMP note, if any)."""
    doc = run_workload(plan, lab, load_workload(wf), out, trace=labmod.trace_path)
    gaps = doc["loss_ledger"]["psn_gaps"]
    ledger = "clean" if not doc["loss_ledger"]["total"] else f"{doc['loss_ledger']['total']} lost"
    react = doc.get("controller_reaction") or {}
    for r in doc["results"]:
        print(f"{wf.stem:>18} {plan.dilation:>8g} {mode:>6} {r['n']:>5} {r['time_s']:>9.2f} {r['ideal_s']:>9.2f} "
              f"{r['ratio']:>6.2f} {r['wrong']:>6} {gaps:>8} {ledger:>8} "
              f"{react.get('worst_s', 0) * 1e3:>11.1f} / {react.get('p99_s', 0) * 1e3:<10.1f}", flush=True)
    check = {f: c for f, c in (doc.get("fabric_bytes_check") or {}).items() if c.get("ratio") is not None}
    if check:       # the bytes each fabric's ports counted against the collective's formula
        print(f"{'':>34} bytes on the ports / formula: "
              + ", ".join(f"{f} {c['ratio']:.4f}" for f, c in check.items()))
    placement = doc.get("ring_placement") or {}
    if placement.get("note"):
        print(f"{'':>34} {placement['note']}")


def take_down(plan) -> None:
    t1 = time.perf_counter()
    labmod.down(NAME)
    down_s = time.perf_counter() - t1
    ns, procs = leftovers()
    print(f"down: {down_s:.1f} s ({down_s / max(1, len(plan.nodes)) * 1e3:.2f} ms per node); "
          f"left: {ns} namespaces, {procs} processes", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dilation", default="32000")
    ap.add_argument("--spray-dilation", default="64000",
                    help="the dilation of the lab the ring runs on again with the leaves spraying (0: none)")
    ap.add_argument("--hier-dilation", default="576000",
                    help="the dilation of the lab the hierarchical all-reduce runs on again (0: none)")
    ap.add_argument("--sets", default="", help="more template variables, comma-separated")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/scale.py builds namespaces: run it as root")
    os.environ["LABCTL_STATE_DIR"] = tempfile.mkdtemp(prefix="labctl-bench-")
    tmp = Path(tempfile.mkdtemp(prefix="labctl-bench-runs-"))
    extra = [s for s in args.sets.split(",") if s]
    wl = workloads(tmp)
    before = mem_available()
    t0 = time.perf_counter()
    plan, lab, _ = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"), SETS + [f"dilation={args.dilation}"] + extra,
                             name=NAME)
    up_s = time.perf_counter() - t0
    try:
        gpus = sum(1 for n in plan.nodes if n.kind == "gpu")
        time.sleep(2)
        used = before - mem_available()
        pid = int(next(e for e in lab.journaled("pid")).split(":")[0])
        rss, fds = proc_figures(pid)
        print(f"lab: {gpus} GPU hosts, {len(plan.nodes)} nodes, {len(plan.links)} links, "
              f"{sum(len(n.routes) for n in plan.nodes)} routes, dilation {plan.dilation:g}")
        print(f"up: {up_s:.1f} s ({up_s / gpus * 1e3:.1f} ms per GPU host, controller included)")
        print(f"memory: {used / 2**20:.0f} MiB in all, {used / gpus / 2**10:.0f} KiB per GPU host "
              f"(controller {rss / 2**20:.0f} MiB resident)")
        print(f"descriptors: controller {fds} ({fds / gpus:.1f} per GPU host)")
        tried, failed = labmod.pingall(plan, sample=200, seed=1)
        print(f"pingall --sample 200: {tried - len(failed)}/{tried} pairs reachable", flush=True)
        print(HEADER)
        for name in ("incast", "ring-allreduce-64", "hier-allreduce-64"):
            run_rows(plan, lab, wl[name], "ecmp", tmp / f"{name}-{args.dilation}")
    finally:
        take_down(plan)
    # the default receivers keep every packet, so spray's reordering costs nothing but its counting
    again = [(args.spray_dilation, "spray", "ring-allreduce-64"), (args.hier_dilation, "ecmp", "hier-allreduce-64")]
    for dilation, mode, name in again:
        if float(dilation) <= 0:
            continue
        lb = [f"lb={mode}"] if mode != "ecmp" else []
        plan, lab, _ = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"),
                                 SETS + [f"dilation={dilation}"] + lb + extra, name=NAME)
        try:
            print(HEADER)
            run_rows(plan, lab, wl[name], mode, tmp / f"{name}-{dilation}")
        finally:
            take_down(plan)


if __name__ == "__main__":
    main()
