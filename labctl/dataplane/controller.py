"""The lab's data-plane controller: reads queue depths and drives ECN marking on every switch.

One process per lab (started by `labctl up`, stopped by `labctl down`), in the root namespace
with a netlink socket and an nftables context inside each forwarding node's namespace. Polls at
1 kHz while any controlled queue holds packets and at 100 Hz when all are empty: with time
dilation D a 1 kHz loop stands for a 1/D ms one on the real fabric.

    python -m labctl.dataplane.controller LAB_DIR
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from labctl.backends import nsutil, rtnl
from labctl.dataplane import ecn, qdepth, qos
from labctl.dataplane.nft import Nft
from labctl.plan.model import LabPlan, Node

FAST, IDLE = 0.001, 0.01


@dataclass
class Switch:
    node: Node
    sock: object
    nft: Nft
    ecn_ports: dict[tuple[int, int], int] = field(default_factory=dict)  # (ifindex, leaf major) -> tc
    marking: dict[tuple[int, int], int] = field(default_factory=dict)    # (ifindex, tc) -> N
    wanted: set = field(default_factory=set)
    request: tuple = (b"", [])
    polls: int = 0


class Controller:
    def __init__(self, plan: LabPlan):
        self.plan = plan
        self.switches: list[Switch] = []
        for node in plan.nodes:
            if not node.forwarding:
                continue
            ports = [(i.index, c.tc, qos.class_minor(c.tc)) for i in node.interfaces for c in i.shaping.classes
                     if c.ecn]
            if not ports:
                continue
            with nsutil.entered(node.namespace):
                sock = rtnl.open_socket()
            sw = Switch(node, sock, Nft(node.namespace))
            sw.nft.run(ecn.setup_rules(ports))
            for ifindex, tc, _ in ports:
                sw.ecn_ports[(ifindex, (qos.leaf_handle(tc) >> 16))] = tc
                sw.marking[(ifindex, tc)] = 0
            sw.wanted = set(sw.ecn_ports)
            sw.request = qdepth.get_requests(sw.wanted)
            self.switches.append(sw)

    def poll(self, sw: Switch) -> bool:
        """One control step for one switch; True if any controlled queue holds packets."""
        busy = False
        e = self.plan.ecn
        for (ifindex, major), backlog in qdepth.backlogs_get(sw.sock, sw.request).items():
            tc = sw.ecn_ports[(ifindex, major)]
            busy = busy or backlog > 0
            n = ecn.threshold(ecn.probability(backlog, e.kmin, e.kmax, e.pmax)) if backlog >= e.kmin else 0
            if n != sw.marking[(ifindex, tc)]:
                sw.nft.run(ecn.chain_rules(ifindex, tc, n))
                sw.marking[(ifindex, tc)] = n
        sw.polls += 1
        return busy

    def run(self, stop_when_gone: bool = True) -> None:
        while True:
            start = time.monotonic()
            try:
                busy = any([self.poll(sw) for sw in self.switches])
            except (OSError, rtnl.NetlinkError):
                if stop_when_gone and not any(nsutil.exists(sw.node.namespace) for sw in self.switches):
                    return  # the lab is gone
                raise
            delay = (FAST if busy else IDLE) - (time.monotonic() - start)
            if delay > 0:
                time.sleep(delay)


def needed(plan: LabPlan) -> bool:
    return any(c.ecn for n in plan.nodes if n.forwarding for i in n.interfaces for c in i.shaping.classes)


def main() -> None:
    lab_dir = Path(sys.argv[1])
    plan = LabPlan.from_dict(json.loads((lab_dir / "plan.json").read_text()))
    ctl = Controller(plan)
    print("ready", flush=True)
    ctl.run()


if __name__ == "__main__":
    main()
