#!/usr/bin/env python3
"""Agent throughput on an unshaped 3-hop path vs iperf3, side by side in one run.

h1 -- leaf1 -- spine -- leaf2 -- h2. The agent sends 4 KB RoCE frames (RDMA WRITEs, 4096-byte
payload, 4112-byte UDP payload) from h1 to h2; iperf3 sends 4112-byte UDP datagrams (-u -b 0 -l 4112)
on the same path for the same time. Prints UDP-payload Gbit/s for both, their ratio, and the
agent receiver's loss (PSN gaps and sent - received). Interleaved, median of --reps. Run as root:

    sudo .venv/bin/python bench/agents.py [--reps 3] [--seconds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl import lifecycle as labmod  # noqa: E402
from labctl import state  # noqa: E402
from labctl import backends  # noqa: E402
from labctl.traffic import roce  # noqa: E402
from labctl.traffic.pool import AgentPool, RunOptions  # noqa: E402
from labctl.traffic.schedule import sendrecv  # noqa: E402

UDP_PAYLOAD = 4096 + roce.BTH_LEN + roce.ICRC_LEN  # a WRITE Middle: 4112 bytes, the same as iperf3 -l 4112


def agent_once(plan, lab, seconds: float) -> dict:
    pool = AgentPool(plan, lab, [0, 1], RunOptions())
    try:
        size = int(2.0e9 / 8 * seconds)  # ~2 Gbit/s worth: runs about `seconds` on this machine
        s = sendrecv([0, 1], size, slice_bytes=64 << 20)
        reports = pool.run(s, 0, timeout=60)
    finally:
        counters = pool.close()
    t = max(r["end"] for r in reports.values())
    rx = [q for c in counters.values() for q in c["rx"]]
    tx = [q for c in counters.values() for q in c["tx"]]
    got, sent = sum(q["packets"] for q in rx), sum(q["packets"] for q in tx)
    return {"gbps": sum(q["bytes"] for q in rx) / size * size * 8 / t / 1e9 * UDP_PAYLOAD / 4096,
            "pps": got / t, "lost": sent - got, "gaps": sum(q["gaps"] for q in rx), "seconds": t}


def iperf_once(plan, seconds: float) -> dict:
    h1, h2 = plan.node("h1"), plan.node("h2")
    dst = h2.interfaces[0].address.split("/")[0]
    server = subprocess.Popen(["ip", "netns", "exec", h2.namespace, "iperf3", "-s", "-1", "-J"],
                              stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    subprocess.run(["ip", "netns", "exec", h1.namespace, "iperf3", "-c", dst, "-u", "-b", "0", "-l", "4112",
                    "-t", str(seconds), "-J"], capture_output=True, check=True)
    out = json.loads(server.communicate(timeout=30)[0])
    s = out["end"]["sum"]  # the server's own view: datagrams that arrived, and those it missed
    got = s["packets"] - s.get("lost_packets", 0)
    return {"gbps": got * 4112 * 8 / s["seconds"] / 1e9, "lost": s.get("lost_packets", 0),
            "pps": got / s["seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/agents.py builds namespaces: run it as root")
    os.environ["LABCTL_STATE_DIR"] = tempfile.mkdtemp(prefix="labctl-bench-")
    plan, lab, _ = labmod.up(str(Path(__file__).with_name("topologies") / "three-hop.yml"))
    rows = []
    try:
        for rep in range(args.reps):
            a = agent_once(plan, lab, args.seconds)
            i = iperf_once(plan, args.seconds)
            rows.append((a, i))
            print(f"rep {rep + 1}: agent {a['gbps']:.2f} Gbit/s ({a['pps'] / 1e3:.0f} kpps, lost {a['lost']}) | "
                  f"iperf3 {i['gbps']:.2f} Gbit/s ({i['pps'] / 1e3:.0f} kpps, lost {i['lost']})", file=sys.stderr)
    finally:
        backends.get("netns").destroy(state.lab_dir(plan.lab))
    med = statistics.median
    ag, ip = med(a["gbps"] for a, _ in rows), med(i["gbps"] for _, i in rows)
    print(f"\n3-hop path, 4112-byte UDP payloads, median of {args.reps} (UDP payload Gbit/s)")
    print(f"  agent (RoCE WRITEs)  {ag:6.2f}   receiver loss: {max(a['lost'] for a, _ in rows)} packets, "
          f"PSN gaps {max(a['gaps'] for a, _ in rows)}")
    print(f"  iperf3 -u -b 0       {ip:6.2f}   receiver loss: {max(i['lost'] for _, i in rows)} packets")
    print(f"  ratio agent/iperf3   {ag / ip:6.2f}")


if __name__ == "__main__":
    main()
