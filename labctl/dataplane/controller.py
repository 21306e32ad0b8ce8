"""The lab's data-plane controller: reads queue depths, drives ECN marking, and runs PFC.

One process per lab (started by `labctl up`, stopped by `labctl down`), in the root namespace
with a netlink socket and an nftables context inside each forwarding node's namespace. Polls at
1 kHz while any controlled queue holds packets and at 100 Hz when all are empty: with time
dilation D a 1 kHz loop stands for a 1/D ms one on the real fabric.

    python -m labctl.dataplane.controller LAB_DIR
"""
from __future__ import annotations

import json
import select
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from labctl.backends import nsutil, rtnl
from labctl.dataplane import ecn, pfcport, qdepth, qos
from labctl.dataplane.nft import Nft
from labctl.plan.model import LabPlan, Node

FAST, IDLE = 0.001, 0.01
COUNTERS_EVERY = 0.2


@dataclass
class Switch:
    node: Node
    sock: object
    nft: Nft | None
    ecn_ports: dict[tuple[int, int], int] = field(default_factory=dict)  # (ifindex, leaf major) -> tc
    marking: dict[tuple[int, int], int] = field(default_factory=dict)    # (ifindex, tc) -> N
    wanted: set = field(default_factory=set)
    pfc: dict = field(default_factory=dict)       # (ifindex, leaf major) -> pfcport.Port
    request: tuple = (b"", [])
    polls: int = 0


class Controller:
    def __init__(self, plan: LabPlan, counters_file: Path | None = None):
        self.plan = plan
        self.counters_file = counters_file
        self.switches: list[Switch] = []
        self.pfc_ports: list[pfcport.Port] = []
        macs = {(n.name, i.name): i.mac for n in plan.nodes for i in n.interfaces}
        for node in plan.nodes:
            lossless = [(i, c) for i in node.interfaces for c in i.shaping.classes if c.lossless]
            ports = [(i.index, c.tc, qos.class_minor(c.tc)) for i in node.interfaces for c in i.shaping.classes
                     if c.ecn] if node.forwarding else []
            if not ports and not lossless:
                continue
            with nsutil.entered(node.namespace):
                sock = rtnl.open_socket()
            sw = Switch(node, sock, Nft(node.namespace) if ports else None)
            if ports:
                sw.nft.run(ecn.setup_rules(ports))
            for ifindex, tc, _ in ports:
                sw.ecn_ports[(ifindex, (qos.leaf_handle(tc) >> 16))] = tc
                sw.marking[(ifindex, tc)] = 0
            for i, c in lossless:
                port = pfcport.Port(node, i, c, macs[(i.peer_node, i.peer_iface)], sock)
                sw.pfc[(i.index, qos.leaf_handle(c.tc) >> 16)] = port
                self.pfc_ports.append(port)
            sw.wanted = set(sw.ecn_ports) | (set(sw.pfc) if node.forwarding else set())
            sw.request = qdepth.get_requests(sw.wanted)
            self.switches.append(sw)

    def poll(self, sw: Switch) -> bool:
        """One control step for one node; True if any controlled queue holds packets."""
        busy = False
        e = self.plan.ecn
        now = time.monotonic()
        congested = False
        backlogs = qdepth.backlogs_get(sw.sock, sw.request) if sw.wanted else {}
        for key, backlog in backlogs.items():
            busy = busy or backlog > 0
            tc = sw.ecn_ports.get(key)
            if tc is not None:
                n = ecn.threshold(ecn.probability(backlog, e.kmin, e.kmax, e.pmax)) if backlog >= e.kmin else 0
                if n != sw.marking[(key[0], tc)]:
                    sw.nft.run(ecn.chain_rules(key[0], tc, n))
                    sw.marking[(key[0], tc)] = n
            port = sw.pfc.get(key)
            if port is not None:
                if backlog > port.cls.xoff_bytes:
                    port.over_xoff = True
                elif backlog < port.cls.xon_bytes:
                    port.over_xoff = False
                congested = congested or port.over_xoff
        if sw.node.forwarding and sw.pfc:
            self._assert_pfc(sw, congested, now)
        for port in sw.pfc.values():
            port.receive(now)
            port.expire(now)
            busy = busy or bool(port.state.paused_until)
        sw.polls += 1
        return busy

    @staticmethod
    def _assert_pfc(sw: Switch, congested: bool, now: float) -> None:
        """Pause every feeding port while any lossless egress queue is past XOFF; XON below XON."""
        for port in sw.pfc.values():
            quanta = port.state.decide(congested and not port.over_xoff, now, port.iface.shaping.rate_bps,
                                       port.cls.pfc_quanta)
            if quanta is not None:
                port.send_pfc(quanta, now)

    def write_counters(self) -> None:
        if self.counters_file is None:
            return
        now = time.monotonic()
        data = {"time": now, "ports": [p.counters(now) for p in self.pfc_ports]}
        tmp = self.counters_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.counters_file)

    def run(self, stop_when_gone: bool = True) -> None:
        last_counters = 0.0
        while True:
            start = time.monotonic()
            try:
                busy = any([self.poll(sw) for sw in self.switches])
            except (OSError, rtnl.NetlinkError):
                if stop_when_gone and not any(nsutil.exists(sw.node.namespace) for sw in self.switches):
                    return  # the lab is gone
                raise
            if start - last_counters > COUNTERS_EVERY:
                self.write_counters()
                last_counters = start
            delay = (FAST if busy else IDLE) - (time.monotonic() - start)
            if delay > 0:
                # wake at once when a PFC frame arrives on any port
                select.select(self.pfc_ports, [], [], delay) if self.pfc_ports else time.sleep(delay)


def needed(plan: LabPlan) -> bool:
    return any((c.ecn and n.forwarding) or c.lossless for n in plan.nodes for i in n.interfaces
               for c in i.shaping.classes)


def main() -> None:
    lab_dir = Path(sys.argv[1])
    plan = LabPlan.from_dict(json.loads((lab_dir / "plan.json").read_text()))
    ctl = Controller(plan, lab_dir / "pfc.json")
    print("ready", flush=True)
    ctl.run()


if __name__ == "__main__":
    main()
