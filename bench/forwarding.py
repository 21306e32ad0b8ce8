#!/usr/bin/env python3
"""Forwarding fast path vs slow path: UDP packets per second through 5 hops, side by side in one run.

h1 -- r1 -- r2 -- r3 -- r4 -- h2 (bench/topologies/five-hop.yml, 40 Gbit/s links: the CPU is the
limit). Two copies of the lab are up at once, one built with LABCTL_FORWARDING=fast (routers
forward in the tc program, kernel/fastpath.py) and one with slow (the IP stack), so the reps
interleave without rebuilding. Each rep sends one UDP flow from h1 to h2 as fast as trafgen
(netsniff-ng, one process, whole frames written to a packet socket with sendto: no UDP or IP stack
cost in the sender) can for --seconds, and measures, over that window after a 0.5 s ramp:

- pps: packets h2's port received (its rx counter), per second;
- busy: CPU time spent on all cores (/proc/stat deltas, everything but idle and iowait), in
  core-seconds per second; pps/busy is packets per busy core-second;
- that the packets took the path asked for: on the fast path every router's program counted at
  least as many packets as h2 received during the run (fastmaps.forwarded) and the IP stack's
  ForwDatagrams barely moved; on the slow path the routers have no program and ForwDatagrams did.

The machine is shared: busy counts everything that ran on it. So the bench also prints the run
time of the sender and of the ksoftirqd threads (schedstat), where the whole chain runs: a veth
hands each packet to the next namespace on the same CPU, as a softirq on the sender's stack or,
when that falls behind, in ksoftirqd. Prints the median of --reps per path and payload, and fast/slow ratios.
Run as root (apt-get install netsniff-ng for trafgen):

    sudo .venv/bin/python bench/forwarding.py [--reps 5] [--seconds 3] [--payloads 64,1500] [--perf DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
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
from labctl.kernel import fastmaps, fastpath, nsutil, rtnl  # noqa: E402

TOPOLOGY = Path(__file__).with_name("topologies") / "five-hop.yml"
ROUTERS = ("r1", "r2", "r3", "r4")
RAMP = 0.5


def cpu_busy() -> float:
    """Seconds all cores have spent busy since boot (/proc/stat, USER_HZ ticks)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def session_pids(sid: int) -> list[int]:
    """The processes of session `sid` (trafgen and the `ip netns exec` that forked it)."""
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError, IndexError):
            continue
        if d.isdigit() and int(fields[3]) == sid:
            out.append(int(d))
    return out


def ksoftirqds() -> list[int]:
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/comm") as f:
                if f.read().startswith("ksoftirqd/"):
                    out.append(int(d))
        except OSError:
            continue
    return out


def cpu_of(pids: list[int]) -> float:
    """Seconds these tasks have run (schedstat; a task's time includes the softirqs, here the whole
    forwarding chain, that ran on its stack)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            continue
    return total / 1e9


def rx_packets(node) -> int:
    with nsutil.netlink_socket(node.namespace) as sock:
        return rtnl.link_dump(sock)[node.interfaces[0].name]["rx_packets"]


def forw_datagrams(node) -> int:
    """The IP stack's forwarded packets in the node's namespace (/proc/net/snmp Ip: ForwDatagrams)."""
    with nsutil.entered(node.namespace):
        with open("/proc/thread-self/net/snmp") as f:
            head, values = [line.split() for line in f if line.startswith("Ip:")][:2]
    return int(values[head.index("ForwDatagrams")])


def counters(plan) -> dict:
    return {r: (fastmaps.forwarded(plan.node(r)), forw_datagrams(plan.node(r))) for r in ROUTERS}


def trafgen_conf(plan, payload: int, where: Path) -> Path:
    """One UDP flow h1 -> h2, addressed to r1's port (trafgen writes whole frames)."""
    h1, h2 = plan.node("h1"), plan.node("h2")
    src, dst = h1.interfaces[0], h2.interfaces[0]
    r1_port = plan.node(src.peer_node).interfaces[[i.name for i in plan.node(src.peer_node).interfaces].index(
        src.peer_iface)]
    conf = where / f"{plan.lab}-{payload}.cfg"
    conf.write_text("{\n"
                    f"  eth(da={r1_port.mac}, sa={src.mac}),\n"
                    f"  ipv4(sa={src.address.split('/')[0]}, da={dst.address.split('/')[0]}, ttl=64),\n"
                    "  udp(sp=40000, dp=9),\n"
                    f"  fill(0x00, {payload})\n"
                    "}\n")
    return conf


def warm(plan) -> None:
    """Resolve every neighbour on the path (the fast path sends only to known neighbours), then
    silence h2's ICMP errors: its port unreachables (1,000/s at the default limit) would come back
    through the routers by the stack, as ICMP does on both paths, and blur the path check."""
    h2 = plan.node("h2").interfaces[0].address.split("/")[0]
    subprocess.run(["ip", "netns", "exec", plan.node("h1").namespace, "ping", "-c", "3", "-i", "0.2", "-W", "1", h2],
                   check=True, capture_output=True)
    with nsutil.entered(plan.node("h2").namespace):
        nsutil.write_sysctls({"net.ipv4.icmp_msgs_per_sec": "0", "net.ipv4.icmp_msgs_burst": "0"})


def once(plan, conf: Path, seconds: float, perf: Path | None = None) -> dict:
    """One rep; with `perf`, a machine-wide `perf record -a -g` into that file over its window."""
    h1, h2 = plan.node("h1"), plan.node("h2")
    before, rx0 = counters(plan), rx_packets(h2)
    gen = subprocess.Popen(["ip", "netns", "exec", h1.namespace, "trafgen", "--dev", h1.interfaces[0].name,
                            "--conf", str(conf), "--cpus", "1", "--no-sock-mem",
                            # sendto, not trafgen's TX ring: sendto makes a linear packet, as a
                            # host's IP stack does; a ring frame has only its Ethernet header in
                            # the linear part, and r1's program pulls the rest in (a copy the
                            # lab's own traffic never costs)
                            "--gap", "0"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)  # `ip netns exec` forks: stop trafgen by its group
    try:
        time.sleep(RAMP)
        own = session_pids(gen.pid) + ksoftirqds()
        t0, busy0, own0, n0 = time.monotonic(), cpu_busy(), cpu_of(own), rx_packets(h2)
        if perf:
            subprocess.run(["perf", "record", "-q", "-a", "-g", "-o", str(perf), "--", "sleep", str(seconds)],
                           check=True, capture_output=True)
        else:
            time.sleep(seconds)
        t1, busy1, own1, n1 = time.monotonic(), cpu_busy(), cpu_of(own), rx_packets(h2)
    finally:
        os.killpg(gen.pid, signal.SIGINT)
        out = gen.communicate(timeout=30)[0]
    time.sleep(0.2)  # let the last packets drain before the path check
    got, after = rx_packets(h2) - rx0, counters(plan)
    if got == 0:
        sys.exit(f"h2 received nothing from trafgen on {plan.lab}:\n{out}")
    fast = {r: None if after[r][0] is None else after[r][0] - (before[r][0] or 0) for r in ROUTERS}
    stack = {r: after[r][1] - before[r][1] for r in ROUTERS}
    dt = t1 - t0
    return {"pps": (n1 - n0) / dt, "busy": (busy1 - busy0) / dt, "own": (own1 - own0) / dt, "got": got,
            "fast": fast, "stack": stack}


def check_path(path: str, r: dict) -> str:
    """Which mechanism forwarded the packets, as counted by the routers; exits if not the one asked for."""
    got = r["got"]
    if path == "fast":
        bad = [x for x in ROUTERS if r["fast"][x] is None or r["fast"][x] < got or r["stack"][x] > 0.01 * got]
        seen = f"program counted {min(r['fast'].values() or [0])}..{max(r['fast'].values())}, " \
               f"ForwDatagrams +{max(r['stack'].values())}"
    else:
        bad = [x for x in ROUTERS if r["fast"][x] is not None or r["stack"][x] < got]
        seen = f"no program, ForwDatagrams +{min(r['stack'].values())}..{max(r['stack'].values())}"
    if bad:
        sys.exit(f"{path} path: routers {bad} did not forward h2's {got} packets that way: {r}")
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--payloads", default="64,1500", help="UDP payload bytes, comma-separated")
    ap.add_argument("--perf", metavar="DIR", help="after the reps, profile one more rep per path (first payload) "
                    "with perf record -a -g into DIR/fast.data and DIR/slow.data; not in the figures")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/forwarding.py builds namespaces: run it as root")
    if not shutil.which("trafgen"):
        sys.exit("bench/forwarding.py sends with trafgen: apt-get install netsniff-ng")
    os.environ["LABCTL_STATE_DIR"] = tempfile.mkdtemp(prefix="labctl-bench-")
    tmp = Path(tempfile.mkdtemp(prefix="labctl-bench-fwd-"))
    payloads = [int(p) for p in args.payloads.split(",")]
    labs, rows = {}, {}
    try:
        for path in ("fast", "slow"):
            os.environ[fastpath.ENV] = path  # read by up: the routers' forwarding path
            plan, lab, _ = labmod.up(str(TOPOLOGY), name=f"bfwd{path[0]}")
            labs[path] = plan
            warm(plan)
        for rep in range(args.reps):
            for payload in payloads:
                for path in (("fast", "slow") if rep % 2 == 0 else ("slow", "fast")):
                    plan = labs[path]
                    r = once(plan, trafgen_conf(plan, payload, tmp), args.seconds)
                    seen = check_path(path, r)
                    rows.setdefault((path, payload), []).append(r)
                    print(f"rep {rep + 1} {payload:>5} B {path}: {r['pps'] / 1e3:7.1f} kpps, "
                          f"busy {r['busy']:.2f} cores, {r['pps'] / r['busy'] / 1e3:7.1f} kpps/core; "
                          f"sender+ksoftirqd {r['own']:.2f} cores, {r['pps'] / r['own'] / 1e3:7.1f} kpps/core "
                          f"({seen})",
                          file=sys.stderr, flush=True)
        if args.perf:
            Path(args.perf).mkdir(parents=True, exist_ok=True)
            for path, plan in labs.items():
                once(plan, trafgen_conf(plan, payloads[0], tmp), args.seconds, Path(args.perf) / f"{path}.data")
                print(f"profile of the {path} path: {Path(args.perf) / f'{path}.data'}", file=sys.stderr)
    finally:
        for plan in labs.values():
            backends.get("netns").destroy(state.lab_dir(plan.lab))
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    print(f"\n5 hops (4 routers), one UDP flow from trafgen, {args.seconds:g} s per rep, median of {args.reps}")
    print("busy: all cores (/proc/stat, other work on the machine included); own: the sender's and the")
    print("ksoftirqd threads' run time, where the forwarding chain runs")
    print(f"{'payload':>8} {'path':>5} {'kpps':>8} {'busy cores':>10} {'kpps/busy':>10} {'own cores':>10} "
          f"{'kpps/own':>9}")
    for payload in payloads:
        per = {}
        for path in ("fast", "slow"):
            rs = rows[(path, payload)]
            pps, busy, own = (med(r[k] for r in rs) for k in ("pps", "busy", "own"))
            per_busy, per_own = med(r["pps"] / r["busy"] for r in rs), med(r["pps"] / r["own"] for r in rs)
            per[path] = (pps, per_busy, per_own)
            print(f"{payload:>6} B {path:>5} {pps / 1e3:8.1f} {busy:10.2f} {per_busy / 1e3:10.1f} {own:10.2f} "
                  f"{per_own / 1e3:9.1f}")
        f, sl = per["fast"], per["slow"]
        print(f"{payload:>6} B  fast/slow: pps {f[0] / sl[0]:.2f}, pps per busy core {f[1] / sl[1]:.2f}, "
              f"pps per own core {f[2] / sl[2]:.2f}")


if __name__ == "__main__":
    main()
