"""The lab's data-plane controller: reads queue depths, drives ECN marking, and runs PFC.

One process per lab (started by `labctl up`, stopped by `labctl down`), in the root namespace
with a netlink socket and an nftables context inside each forwarding node's namespace. Polls at
1 kHz while any controlled queue holds packets and at 100 Hz when all are empty: with time
dilation D a 1 kHz loop stands for a 1/D ms one on the real fabric.

Settings changed at runtime (`labctl tc set`) arrive through control.json (see control.py).
Counters (PFC frames, paused time, applied generation, the reaction-time histogram) go to
pfc.json whenever they change, at most every 10 ms, so a 100 Hz sampler sees every step. The loop
itself touches no file: publisher.py does, on a thread of its own.

    python -m labctl.dataplane.controller LAB_DIR
"""
from __future__ import annotations

import select
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from labctl.backends import nsutil, rtnl
from labctl.dataplane import control, ecn, pfc, pfcport
from labctl.plan import feeders, qos
from labctl.telemetry import qdepth, reaction
from labctl.telemetry.nftcounters import family_of as nft_family
from labctl import helpers
from labctl.helpers import Publisher
from labctl.backends.nft import Nft
from labctl.plan.model import LabPlan, Node

FAST, IDLE = 0.001, 0.01
COUNTERS_EVERY, COUNTERS_AT_LEAST = 0.01, 1.0


@dataclass
class Switch:
    node: Node
    sock: object
    nft: Nft | None
    ecn_ports: dict[tuple[int, int], tuple] = field(default_factory=dict)  # (ifindex, leaf major) -> (tc, settings)
    marking: dict[tuple[int, int], int] = field(default_factory=dict)    # (ifindex, tc) -> N
    wanted: set = field(default_factory=set)
    pfc: dict = field(default_factory=dict)       # (ifindex, leaf major) -> pfcport.Port
    request: tuple = (b"", [])
    feeders: dict = field(default_factory=dict)   # egress port -> ingress ports that feed it
    asserting: bool = False                       # some port is pausing its neighbour
    polls: int = 0
    family: str = "ip"                            # where its nftables rules live


class Controller:
    def __init__(self, plan: LabPlan, lab_dir: Path | None = None):
        self.plan = plan
        self.lab_dir = lab_dir
        self.files = Publisher(lab_dir / "pfc.json" if lab_dir else None,
                               lab_dir / control.FILE if lab_dir else None)
        self.generation = 0
        self.last_written: tuple = ()
        self.classes = {}   # (node, ifindex, tc) -> (node, iface, cls), for applying control.json
        self.switches: list[Switch] = []    # nodes with queues to watch, polled every loop
        self.nodes: list[Switch] = []       # every node the controller serves (hosts obey PFC too)
        self.pfc_by_fd: dict[int, pfcport.Port] = {}
        self.pfc_fds: list[int] = []
        self.pfc_ports: list[pfcport.Port] = []
        # how long a busy queue goes between two reads (reaction.py): what PFC headroom must cover
        self.reactions = reaction.Histogram()
        self.work = reaction.Histogram()     # of that, the loop's own work (the rest is waiting for a CPU)
        self.errors: list[str] = []     # control files refused, newest last (shown by `labctl status`)
        macs = {(n.name, i.name): i.mac for n in plan.nodes for i in n.interfaces}
        for node in plan.nodes:
            lossless = [(i, c) for i in node.interfaces for c in i.shaping.classes if c.lossless]
            ports = [(i.index, c.tc, qos.class_minor(c.tc)) for i in node.interfaces for c in i.shaping.classes
                     if c.ecn] if node.switching else []
            if not ports and not lossless:
                continue
            with nsutil.entered(node.namespace):
                sock = rtnl.open_socket()
            sw = Switch(node, sock, Nft(node.namespace) if ports else None,
                        feeders=feeders.feeders(plan, node) if node.switching else {}, family=nft_family(node))
            if ports:
                sw.nft.run(ecn.setup_rules(ports, nft_family(node)))
            for i in node.interfaces:
                for c in i.shaping.classes:
                    self.classes[(node.name, i.index, c.tc)] = (node, i, c)
            for ifindex, tc, _ in ports:
                sw.ecn_ports[(ifindex, (qos.leaf_handle(tc) >> 16))] = (tc, self._settings({}, node.name, ifindex, tc))
                sw.marking[(ifindex, tc)] = 0
            for i, c in lossless:
                port = pfcport.Port(node, i, c, macs[(i.peer_node, i.peer_iface)], sock,
                                    self._settings({}, node.name, i.index, c.tc))
                sw.pfc[(i.index, qos.leaf_handle(c.tc) >> 16)] = port
                self.pfc_ports.append(port)
            sw.wanted = set(sw.ecn_ports) | (set(sw.pfc) if node.switching else set())
            sw.request = qdepth.get_requests(sw.wanted)
            self.nodes.append(sw)
            self.pfc_by_fd.update({p.fileno(): p for p in sw.pfc.values()})
            self.pfc_fds = list(self.pfc_by_fd)
            if sw.wanted:
                self.switches.append(sw)   # hosts only obey pauses: their sockets are served by select

    def _settings(self, overrides: dict, node: str, ifindex: int, tc: int) -> control.PortSettings:
        n, i, c = self.classes[(node, ifindex, tc)]
        return control.settings_for(self.plan, n, i, c, overrides)

    def check_control(self) -> None:
        """Apply control.json once the publisher saw it change."""
        if not self.files.control_changed.is_set():
            return
        self.files.control_changed.clear()
        try:
            doc = control.load(self.lab_dir, strict=True)
            for (n, i, tc) in self.classes:
                self._settings(doc["ports"], n, i, tc).validate(f"{n} port {i} tc {tc}")
        except (ValueError, TypeError) as exc:
            # a hand-edited or broken file changes nothing; the lab keeps running on what it had
            self.errors = (self.errors + [f"{control.FILE} ignored: {exc}"])[-5:]
            print(self.errors[-1], file=sys.stderr, flush=True)
            self.write_counters(time.monotonic(), force=True)
            return
        now = time.monotonic()
        for sw in self.nodes:
            for key, (tc, _) in list(sw.ecn_ports.items()):
                sw.ecn_ports[key] = (tc, self._settings(doc["ports"], sw.node.name, key[0], tc))
            for port in sw.pfc.values():
                port.settings = self._settings(doc["ports"], sw.node.name, port.iface.index, port.cls.tc)
                if not port.settings.pfc:
                    port.over_xoff = False
                    if port.state.paused_until:
                        port.resume(now)        # PFC off: stop obeying the pause we hold
        self.generation = doc["generation"]

    def poll(self, sw: Switch) -> bool:
        """One control step for one node; True if any controlled queue holds packets."""
        busy = False
        now = time.monotonic()
        congested: set[str] = set()      # egress ports whose lossless queue is past XOFF
        backlogs = qdepth.backlogs_get(sw.sock, sw.request) if sw.wanted else {}
        shared = self.plan.shared_buffer if sw.node.switching else None
        used = sum(backlogs.get(key, 0) for key in sw.pfc) if shared else 0
        for key, backlog in backlogs.items():
            busy = busy or backlog > 0
            marking = sw.ecn_ports.get(key)
            if marking is not None:
                tc, st = marking
                n = ecn.threshold(qos.marking_probability(backlog, st.kmin, st.kmax, st.pmax)) \
                    if st.ecn and backlog >= st.kmin else 0
                if n != sw.marking[(key[0], tc)]:
                    sw.nft.run(ecn.chain_rules(key[0], tc, n, sw.family))
                    sw.marking[(key[0], tc)] = n
            port = sw.pfc.get(key)
            if port is not None and port.settings.pfc:
                xoff, xon = port.settings.xoff, port.settings.xon
                if shared:
                    xoff = pfc.dynamic_xoff(xoff, shared.bytes, shared.alpha, used)
                    xon = min(xon, xoff - (port.settings.xoff - port.settings.xon))
                if backlog > xoff:
                    port.over_xoff = True
                elif backlog < xon:
                    port.over_xoff = False
                if port.over_xoff:
                    congested.add(port.iface.name)
        if sw.node.switching and sw.pfc:
            self._assert_pfc(sw, congested, now)
        sw.polls += 1
        return busy

    def service_pfc(self, now: float) -> bool:
        """Obey PFC frames that arrived (one select over every port instead of a recv on each) and
        end pauses that ran out; True while any class is held."""
        if self.pfc_fds:
            readable, _, _ = select.select(self.pfc_fds, [], [], 0)
            for fd in readable:
                self.pfc_by_fd[fd].receive(now)
        held = False
        for port in self.pfc_ports:
            if port.state.paused_until:
                port.expire(now)
                held = held or bool(port.state.paused_until)
        return held

    def step(self) -> bool:
        """One loop: every watched queue once, then the PFC sockets; True if anything is busy."""
        busy = any([self.poll(sw) for sw in self.switches])
        return self.service_pfc(time.monotonic()) or busy

    @staticmethod
    def _assert_pfc(sw: Switch, congested: set[str], now: float) -> None:
        """Pause the ports that feed a lossless egress queue past XOFF; XON once none they feed is."""
        if not congested and not sw.asserting:
            return                       # the common case: nothing to pause, nothing to release
        sw.asserting = False
        for port in sw.pfc.values():
            wanted = port.settings.pfc and any(port.iface.name in sw.feeders.get(e, ()) for e in congested)
            quanta = port.state.decide(wanted, now, port.iface.shaping.rate_bps, port.cls.pfc_quanta)
            if quanta is not None:
                port.send_pfc(quanta, now)
            sw.asserting = sw.asserting or port.state.asserting

    def write_counters(self, now: float, force: bool = False) -> None:
        """pfc.json, when a counter or the applied generation changed (or `force`)."""
        if self.lab_dir is None:
            return
        ports = [p.counters(now) for p in self.pfc_ports]
        summary = (self.generation, self.reactions.worst(),
                   tuple((p["pfc_tx"], p["pfc_rx"], p["paused"]) for p in ports))
        if summary == self.last_written and not any(p["paused"] for p in ports) and not force:
            return
        self.last_written = summary
        self.files.publish({"time": now, "generation": self.generation, "ports": ports,
                            "reaction_hist": self.reactions.to_list(), "work_hist": self.work.to_list(),
                            "errors": list(self.errors)})

    def run(self, stop_when_gone: bool = True) -> None:
        last_counters = last_forced = 0.0
        busy, last_start = False, None
        while True:
            start = time.monotonic()
            self.check_control()
            try:
                busy_before, busy = busy, self.step()
            except (OSError, rtnl.NetlinkError):
                if stop_when_gone and not any(nsutil.exists(n.namespace) for n in self.plan.nodes):
                    return  # the lab is gone
                raise
            if busy_before and last_start is not None:
                # from the previous read of every queue to the end of this loop's pauses
                end = time.monotonic()
                self.reactions.add(end - last_start)
                self.work.add(end - start)
            last_start = start
            if start - last_counters >= COUNTERS_EVERY:
                force = start - last_forced >= COUNTERS_AT_LEAST
                self.write_counters(start, force)
                last_counters = start
                last_forced = start if force else last_forced
            delay = (FAST if busy else IDLE) - (time.monotonic() - start)
            if delay > 0:
                # wake at once when a PFC frame arrives on any port
                select.select(self.pfc_fds, [], [], delay) if self.pfc_fds else time.sleep(delay)


def needed(plan: LabPlan) -> bool:
    return any((c.ecn and n.switching) or c.lossless for n in plan.nodes for i in n.interfaces
               for c in i.shaping.classes)


def main() -> None:
    helpers.serve(Controller)


if __name__ == "__main__":
    main()
