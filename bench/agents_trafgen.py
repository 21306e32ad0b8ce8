#!/usr/bin/env python3
"""Agent vs trafgen (netsniff-ng) vs iperf3 on one unshaped 3-hop path, counted at the receiver's port.

h1 -- leaf1 -- spine -- leaf2 -- h2. Three senders take turns from h1 to h2, interleaved, median
of --reps:

- the labctl agent (RDMA WRITEs; Middle frames carry MTU-byte payloads);
- trafgen, the fastest packet generator here, replaying the exact bytes of one agent Middle frame
  (built by labctl's own encoder, roce.MessageBuilder) from a TX ring on h1's port, through h1's
  qdiscs (-q) as the agent's packets go, one process (-P 1) as the agent is one. trafgen pins it
  to CPU 0 itself; the agent runs twice, as the pool places it and with its sender moved to CPU 0
  (agent@cpu0): the ports steer the flow to one CPU by its hash (RPS), so the sender's CPU decides
  whether the forwarding shares it or runs beside it;
- iperf3 -u -b 0 with datagrams of the same UDP payload size.

Every figure is what arrived: h2's port rx counters (RTM_GETLINK in h2's namespace) sampled every
50 ms, over the samples whose whole interval carried traffic, so no sender's own claim and no
start-up or drain time counts. Gbit/s are UDP payload (rx bytes minus 42 bytes of Ethernet, IP and
UDP headers per frame). Run as root, alone on the machine's namespaces:

    sudo flock /tmp/labctl-netns.lock .venv/bin/python bench/agents_trafgen.py [--reps 3] [--seconds 3] [--mtu 9000]

--mtu 1500 gives 1 KB RoCE frames (RoCE MTU 1024), 9000 gives 4 KB ones.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl import backends, state  # noqa: E402
from labctl import lifecycle as labmod  # noqa: E402
from labctl.kernel import nsutil, rtnl  # noqa: E402
from labctl.traffic import roce  # noqa: E402
from labctl.traffic.pool import AgentPool, RunOptions  # noqa: E402
from labctl.traffic.schedule import sendrecv  # noqa: E402
from labctl.traffic.sender import qpn  # noqa: E402

HEADERS = 14 + 20 + 8          # Ethernet + IPv4 + UDP: what rx_bytes counts beyond the UDP payload
PERIOD = 0.05
ACTIVE = 20                    # packets per sample interval above which the path counts as busy (not ARP)
INSTALL = "trafgen not found: it comes with netsniff-ng (Debian/Ubuntu: apt-get install -y netsniff-ng)"


class PortRate:
    """Samples one port's rx counters in its namespace; rate() over the fully busy intervals."""

    def __init__(self, namespace: str, ifname: str):
        self.ifname = ifname
        with nsutil.netlink_socket(namespace) as s:   # the socket stays bound to the namespace
            self.sock = s.dup()
        self.samples: list[tuple[float, int, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> tuple[float, int, int]:
        c = rtnl.link_dump(self.sock)[self.ifname]
        return time.monotonic(), c["rx_packets"], c["rx_bytes"]

    def _run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(self._read())
            self.stop.wait(PERIOD)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.samples.append(self._read())
        self.sock.close()

    def rate(self) -> dict:
        s = self.samples
        busy = [i for i in range(1, len(s)) if s[i][1] - s[i - 1][1] > ACTIVE]
        if len(busy) < 3:
            return {"pps": 0.0, "gbps": 0.0, "frame": 0.0, "seconds": 0.0, "packets": s[-1][1] - s[0][1]}
        a, b = busy[0], busy[-1] - 1    # sample a ends the first busy interval, b starts the last one
        (t0, p0, b0), (t1, p1, b1) = s[a], s[b]
        pk = p1 - p0
        return {"pps": pk / (t1 - t0), "gbps": (b1 - b0 - HEADERS * pk) * 8 / (t1 - t0) / 1e9,
                "frame": (b1 - b0) / pk, "seconds": t1 - t0, "packets": s[-1][1] - s[0][1]}


def agent_frame(plan, mtu: int) -> bytes:
    """One WRITE Middle frame exactly as the agent at h1 sends it to h2 (rank 0 → rank 1, QP 0):
    its ports, addresses, ToS, DF and IP ID 0, BTH and ICRC, with the MACs of h1 and leaf1's port."""
    h1, h2 = plan.node("h1"), plan.node("h2")
    port = h1.interfaces[0]
    gw = next(i for i in plan.node(port.peer_node).interfaces if i.name == port.peer_iface)
    src, dst = port.address.split("/")[0], h2.interfaces[0].address.split("/")[0]
    lq, rq = qpn(0, 1, 0), qpn(1, 0, 0)
    sport = roce.udp_sport(lq, rq)
    b = roce.MessageBuilder(src, dst, sport, rq, mtu)
    _, payload = next(p for p in b.packets(0, 3 * mtu, 0) if p[1] is b.middle)
    frame = roce.frame(port.mac, gw.mac, src, dst, sport, bytes(payload))
    assert roce.verify_icrc(frame)   # the same bytes the agent's receiver would accept
    return frame


def trafgen_config(frame: bytes) -> str:
    """trafgen's packet syntax: one packet in braces, its bytes as comma-separated hex."""
    return "{\n" + ",\n".join(", ".join(f"0x{x:02x}" for x in frame[i:i + 16])
                              for i in range(0, len(frame), 16)) + "\n}\n"


def pin(pid: int, cpu: int) -> None:
    """Move every thread of an agent to `cpu` (it pinned itself at init; its threads keep their own)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), {cpu})


def trafgen_once(plan, conf: Path, seconds: float, cpus: int = 1, bypass: bool = False) -> dict:
    h1, h2 = plan.node("h1"), plan.node("h2")
    argv = ["ip", "netns", "exec", h1.namespace, "trafgen", "--dev", h1.interfaces[0].name, "--conf", str(conf),
            "--jumbo-support",     # ring slots of 2 KB by default: a 4 KB frame needs bigger ones
            "--cpus", str(cpus),   # one process by default, as the agent's sender is one
            "--no-sock-mem",       # leave the machine's socket memory settings alone
            "--num", "0"]
    if not bypass:
        argv.append("--qdisc-path")   # through h1's qdiscs, as the agent's packets go
    with nsutil.entered(h2.namespace):
        # a socket on UDP 4791 at h2, as the agent's receiver has, never read: without one each frame
        # would take the port-unreachable path (an uncached route lookup and an ICMP attempt) that the
        # agent's frames do not take
        sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("0.0.0.0", roce.ROCE_PORT))
    with sink, PortRate(h2.namespace, h2.interfaces[0].name) as pr:
        # its own process group: trafgen forks its sender, and only a SIGINT to the group (as Ctrl-C
        # sends) stops that child; the parent alone exits and leaves it sending
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        try:
            time.sleep(seconds)
        finally:
            os.killpg(p.pid, signal.SIGINT)
            try:
                err = p.communicate(timeout=10)[1]
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                err = p.communicate()[1]
        time.sleep(3 * PERIOD)
    r = pr.rate()
    if r["packets"] == 0:
        raise SystemExit(f"trafgen delivered nothing to h2:\n{err}")
    return r


def agent_once(plan, lab, seconds: float, sender_cpu: int | None = None) -> dict:
    h2 = plan.node("h2")
    size = int(2.0e9 / 8 * seconds)   # ~2 Gbit/s worth: about `seconds` on this machine
    with PortRate(h2.namespace, h2.interfaces[0].name) as pr:
        pool = AgentPool(plan, lab, [0, 1], RunOptions())
        try:
            if sender_cpu is not None:   # the sender where trafgen's sits, the receiver on another CPU
                cpus = sorted(os.sched_getaffinity(0))
                pin(pool.procs[0].pid, sender_cpu)
                pin(pool.procs[1].pid, next((c for c in cpus if c != sender_cpu), sender_cpu))
            reports = pool.run(sendrecv([0, 1], size, slice_bytes=64 << 20), 0, timeout=60)
        finally:
            counters = pool.close()
    r = pr.rate()
    r["missing"] = sum(len(rep["missing"]) for rep in reports.values())
    rx = [q for c in counters.values() for q in c["rx"]]
    r["gaps"] = sum(q["gaps"] for q in rx)
    r["sent"] = sum(q["packets"] for c in counters.values() for q in c["tx"])
    r["received"] = sum(q["packets"] for q in rx)
    return r


def iperf_once(plan, seconds: float, udp_payload: int) -> dict:
    h1, h2 = plan.node("h1"), plan.node("h2")
    dst = h2.interfaces[0].address.split("/")[0]
    with PortRate(h2.namespace, h2.interfaces[0].name) as pr:
        server = subprocess.Popen(["ip", "netns", "exec", h2.namespace, "iperf3", "-s", "-1"],
                                  stdout=subprocess.DEVNULL)
        try:
            time.sleep(0.3)
            subprocess.run(["ip", "netns", "exec", h1.namespace, "iperf3", "-c", dst, "-u", "-b", "0",
                            "-l", str(udp_payload), "-t", str(seconds)], capture_output=True, check=True)
            server.wait(timeout=30)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
    return pr.rate()


def topology(mtu: int, tmp: Path) -> Path:
    src = Path(__file__).with_name("topologies") / "three-hop.yml"
    if mtu == 9000:
        return src
    doc = yaml.safe_load(src.read_text())
    doc["defaults"]["mtu"] = mtu
    out = tmp / f"three-hop-{mtu}.yml"
    out.write_text(yaml.safe_dump(doc))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--mtu", type=int, default=9000, help="the lab's interface MTU (9000: 4 KB RoCE frames)")
    ap.add_argument("--no-iperf", action="store_true")
    ap.add_argument("--trafgen-cpus", type=int, default=1, help="trafgen sender processes (default 1, as the agent)")
    ap.add_argument("--bypass-qdisc", action="store_true", help="trafgen skips h1's qdiscs (its own default)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/agents_trafgen.py builds namespaces: run it as root")
    if shutil.which("trafgen") is None:
        sys.exit(INSTALL)
    if not args.no_iperf and shutil.which("iperf3") is None:
        sys.exit("iperf3 not found: apt-get install -y iperf3, or run with --no-iperf")
    tmp = Path(tempfile.mkdtemp(prefix="labctl-trafgen-"))
    os.environ["LABCTL_STATE_DIR"] = str(tmp / "state")
    plan, lab, _ = labmod.up(str(topology(args.mtu, tmp)))
    rmtu = roce.roce_mtu(args.mtu)
    frame = agent_frame(plan, rmtu)
    conf = tmp / "agent-frame.cfg"
    conf.write_text(trafgen_config(frame))
    names = ["agent", "agent@cpu0", "trafgen"] + ([] if args.no_iperf else ["iperf3"])
    rows: dict[str, list[dict]] = {n: [] for n in names}
    try:
        for rep in range(args.reps):
            rows["agent"].append(agent_once(plan, lab, args.seconds))
            # trafgen pins its sender to CPU 0 itself, with no option to choose: the agent's sender
            # moved there is the same-CPU match
            rows["agent@cpu0"].append(agent_once(plan, lab, args.seconds, sender_cpu=0))
            rows["trafgen"].append(trafgen_once(plan, conf, args.seconds, args.trafgen_cpus, args.bypass_qdisc))
            if not args.no_iperf:
                rows["iperf3"].append(iperf_once(plan, args.seconds, len(frame) - HEADERS))
            print(f"rep {rep + 1}: " + " | ".join(f"{n} {rows[n][-1]['gbps']:.2f} Gbit/s "
                                                   f"{rows[n][-1]['pps'] / 1e3:.0f} kpps" for n in names),
                  file=sys.stderr)
    finally:
        backends.get("netns").destroy(state.lab_dir(plan.lab))
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    print(f"\n3-hop path, {len(frame)}-byte frames ({len(frame) - HEADERS}-byte UDP payloads), counted at h2's "
          f"port, median of {args.reps}")
    print(f"  {'sender':<10} {'kpps':>8} {'Gbit/s':>8}   per rep (Gbit/s)")
    for n in names:
        print(f"  {n:<10} {med(r['pps'] for r in rows[n]) / 1e3:8.0f} {med(r['gbps'] for r in rows[n]):8.2f}   "
              + " / ".join(f"{r['gbps']:.2f}" for r in rows[n]))
    print("  frame bytes seen at h2: " + ", ".join(f"{n} {med(r['frame'] for r in rows[n]):.0f}" for n in names))
    cpus = sorted(os.sched_getaffinity(0))
    print(f"  the agent's sender runs on CPU {cpus[1 % len(cpus)]} as the pool "
          "places it, or on CPU 0 (agent@cpu0) where trafgen pins its own")
    for n in ("agent", "agent@cpu0"):
        print(f"  {n}, per rep: sent / at h2's port / at its receiver (PSN gaps, messages missing): " + ", ".join(
            f"{r['sent']} / {r['packets']} / {r['received']} ({r['gaps']}, {r['missing']})" for r in rows[n]))
    for n in ("agent", "agent@cpu0"):
        ratio = med(r["pps"] for r in rows[n]) / med(r["pps"] for r in rows["trafgen"])
        print(f"  ratio {n}/trafgen (packets/s) {ratio:.2f}   target >= 0.8")


if __name__ == "__main__":
    main()
