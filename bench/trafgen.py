"""trafgen (netsniff-ng), the fastest packet generator on this machine, as the benches run it: one
UDP frame written as a trafgen configuration, sent from a node's namespace for some seconds, and
what arrived counted at the receiver's port (its link counters), not what the sender meant."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from labctl.kernel import nsutil, rtnl

HEADERS = 14 + 20 + 8
MISSING = "trafgen is missing: apt-get install netsniff-ng"


def rx_packets(node) -> int:
    with nsutil.netlink_socket(node.namespace) as sock:
        return rtnl.link_dump(sock)[node.interfaces[0].name]["rx_packets"]


def conf(plan, src: str, dst: str, frame: int, dport: int = 9) -> str:
    """One UDP frame of `frame` bytes (Ethernet header included) from `src` to `dst`, whose first
    port's far end is the frame's next hop."""
    s, d = plan.node(src), plan.node(dst)
    port = s.interfaces[0]
    gateway = plan.node(port.peer_node).iface(port.peer_iface)
    return ("{\n"
            f"  eth(da={gateway.mac}, sa={port.mac}, type=0x0800),\n"
            f"  ipv4(saddr={port.address.split('/')[0]}, daddr={d.interfaces[0].address.split('/')[0]}, ttl=64),\n"
            f"  udp(sp=49152, dp={dport}),\n"
            f"  fill(0x00, {frame - HEADERS}),\n"
            "}\n")


class Sending:
    """trafgen sending `conf_text` from `src` on one CPU until the block ends. `--gap 0`: a sendto()
    per packet. Its packet ring fails in a lab node ("Flushing TX_RING failed: Resource
    temporarily unavailable", with or without the qdisc path), which a bare veth pair does not."""

    def __init__(self, plan, src: str, conf_text: str, conf_dir: Path):
        self.node = plan.node(src)
        self.path = Path(conf_dir) / f"{plan.lab}-{src}.cfg"
        self.path.write_text(conf_text)

    def __enter__(self):
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.node.namespace, "trafgen", "--dev",
                                      self.node.interfaces[0].name, "--conf", str(self.path), "--cpus", "1", "--gap", "0"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        time.sleep(0.5)             # past trafgen's start and the first packets' neighbour lookups
        if self.proc.poll() is not None:
            raise RuntimeError(f"trafgen stopped at once: {self.proc.stderr.read().strip()[-300:]}")
        return self

    def __exit__(self, *exc):
        # trafgen forks a sender per CPU: its whole group is signalled, never another process
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.communicate(timeout=3)
        except subprocess.TimeoutExpired:      # blocked in a send: the counts were read already
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.communicate(timeout=10)
