#!/usr/bin/env python3
"""The data-plane controller's loop rate per switch and its CPU use, on a 19-switch lab and (with
--size 1024) on the 1,024-GPU lab's 176 switches; then, side by side, what reading on arrivals
(dataplane/arrivals.py) costs instead: one scan of every queue's bound per loop.

Builds a leaf-spine with 4 spines and 12 leaves (or 128 servers x 8 GPUs, 32 leaves, 16 spines), then runs the controller's loop (one batched qdisc
query per switch, ECN and PFC decisions, one epoll over every PFC socket) as fast as it can for
--seconds, and again paced at 1 kHz as it runs in a lab with busy queues. GPU hosts are not polled:
they only obey pauses, which the select delivers. Target: >= 1 kHz per switch on this 2-core machine. Run as root:

    sudo .venv/bin/python bench/controller.py [--seconds 3] [--size 19|1024]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl import state  # noqa: E402
from labctl import backends  # noqa: E402
from labctl.dataplane import arrivals  # noqa: E402
from labctl.dataplane.controller import FAST, Controller  # noqa: E402
from labctl.plan.share import shares  # noqa: E402
from labctl.plan import qos  # noqa: E402
from labctl.plan.compile import compile_plan  # noqa: E402
from labctl.topology.load import load_topology  # noqa: E402


SIZES = {"19": ["spines=4", "leaves=12", "servers=3", "gpus_per_server=4"],
         "1024": ["spines=16", "leaves=32", "servers=128", "gpus_per_server=8"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--size", choices=sorted(SIZES), default="19")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/controller.py builds namespaces: run it as root")
    os.environ["LABCTL_STATE_DIR"] = tempfile.mkdtemp(prefix="labctl-bench-")
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml",
                                      SIZES[args.size], name="bctl"), "poll")
    lab = state.claim(plan.lab, plan.to_dict(), None)
    backends.get("netns").apply(plan, lab)  # no controller process: this one is measured in-process
    try:
        ctl = Controller(shares(plan))
        n = len(ctl.switches)

        def read_all() -> None:
            for sw in ctl.switches:   # due now: each switch is read, as when all are near a threshold
                sw.next_read = 0.0
            ctl.step()

        ports = sum(len(sw.ecn_ports) for sw in ctl.switches)
        # 1. flat out
        t0, c0 = time.monotonic(), time.process_time()
        polls = 0
        while time.monotonic() - t0 < args.seconds:
            read_all()
            polls += 1
        wall, cpu = time.monotonic() - t0, time.process_time() - c0
        print(f"{n} switches, {ports} controlled queues")
        print(f"flat out:    {polls / wall:8.0f} polls/s per switch ({polls * n / wall:.0f} dumps/s), "
              f"{cpu / wall * 100:.0f}% of one core")
        # 2. paced at 1 kHz per switch, as when queues are busy
        t0, c0 = time.monotonic(), time.process_time()
        polls = 0
        next_t = t0
        while time.monotonic() - t0 < args.seconds:
            read_all()
            polls += 1
            next_t += FAST
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        wall, cpu = time.monotonic() - t0, time.process_time() - c0
        print(f"at 1 kHz:    {polls / wall:8.0f} polls/s per switch, {cpu / wall * 100:.0f}% of one core")
        print(f"reaction:    one loop = {1e3 / (polls / wall):.2f} ms lab time = "
              f"{1e6 / (polls / wall) / plan.dilation:.2f} us on the real fabric (dilation {plan.dilation:g})")
        print(f"idle pace:   every {ctl.idle * 1e3:.1f} ms per switch (qos.controller_idle_s); "
              f"PFC headroom sized for {plan.pfc_response_s * 1e3:.1f} ms")
        read_s = wall / polls / n
        ctl.close()
        # 3. on arrivals: each loop scans every queue's bound; only a switch whose bound reached a
        # threshold is read
        why = arrivals.probe()
        if why is not None:
            print(f"on arrivals: not on this machine ({why})")
            return
        plan.queue_reads = "arrivals"
        t0 = time.monotonic()
        ctl = Controller(shares(plan))
        attach = time.monotonic() - t0
        scans, t0, c0 = 0, time.monotonic(), time.process_time()
        while time.monotonic() - t0 < args.seconds:
            ctl.bounds.scan()
            scans += 1
        wall, cpu = time.monotonic() - t0, time.process_time() - c0
        scan_s = wall / scans
        print(f"on arrivals: counters on {len(ctl.bounds.keys)} queues attached in {attach:.1f} s; one scan of "
              f"every bound takes {scan_s * 1e6:.0f} us ({scans / wall:,.0f} scans/s flat out, {cpu / wall * 100:.0f}% "
              f"of one core); at 1 kHz that is {scan_s / FAST * 100:.1f}% of a core")
        print(f"reaction:    a switch whose queue fills is read within one loop ({FAST * 1e3:.0f} ms) plus its "
              f"read ({read_s * 1e3:.2f} ms): {(FAST + scan_s + read_s) * 1e3:.2f} ms; if all {n} filled at "
              f"once, the last read ends {(FAST + scan_s + n * read_s) * 1e3:.1f} ms after")
        print(f"headroom:    sized for {qos.pfc_response_s([len(sw.wanted) for sw in ctl.switches], None, True) * 1e3:.0f}"
              f" ms on arrivals (the idle pace adds nothing)")
        ctl.close()
    finally:
        backends.get("netns").destroy(lab)


if __name__ == "__main__":
    main()
