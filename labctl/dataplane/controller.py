"""The lab's data-plane controller: reads queue depths, drives ECN marking, and runs PFC.

One process per lab (started by `labctl up`, stopped by `labctl down`), in the root namespace
with a netlink socket and an nftables context inside each forwarding node's namespace. Polls at
1 kHz while a queue could reach its ECN or PFC threshold before the next read, and at 100 Hz
when all are empty; in between, a busy queue is read again after half the time its ports could
take to fill it to the nearest threshold at full rate. The loop runs real-time, so every read it
saves is CPU the agents get back (polling at 1 kHz whenever a packet was queued took most of a
core and slowed the collectives by up to 30%). With time dilation D a 1 kHz loop stands for a
1/D ms one on the real fabric.

Settings changed at runtime (`labctl tc set`) arrive through control.json (see control.py).
Counters (PFC frames, paused time, applied generation, the reaction-time histogram) go to
pfc.json whenever they change, at most every 10 ms, so a 100 Hz sampler sees every step. The loop
itself touches no file: helpers.Publisher does, on a thread of its own.

    python -m labctl.dataplane.controller LAB_DIR
"""
from __future__ import annotations

import json
import sys
import time
from collections import deque
from pathlib import Path

from labctl.kernel import nsutil, rtnl
from labctl.dataplane import arrivals, control, ecn, pfc, pfcport, switch
from labctl.dataplane.switch import Switch
from labctl.plan import qos
from labctl.telemetry import agentreport, qdepth, reaction
from labctl.procs import raise_fd_limit
from labctl.wakeup import Waiter
from labctl import helpers
from labctl.kernel.nft import Nft
from labctl.plan.model import LabPlan
from labctl.plan.share import NodeShare, served, shares

FAST, IDLE = 0.001, qos.CONTROLLER_IDLE_S   # IDLE: unless the lab is large (qos.controller_idle_s)
COUNTERS_EVERY, COUNTERS_AT_LEAST = 0.01, 1.0


class Controller:
    """The switch agent of the nodes in `shares`: every node of a lab (one process on the host) or
    one node (inside it). It reports to `report_file` (telemetry/agentreport.py) and obeys the lab's control.json."""
    def __init__(self, shares: list[NodeShare], home: Path | None = None, report_file: Path | None = None):
        raise_fd_limit(4 * sum(len(s.node.interfaces) for s in shares) + 256)
        self.shares = shares
        self.home = home               # where its control.json is: the lab's directory, or the agent's own
        if report_file is None and home is not None:
            report_file = home / agentreport.FILE
        self.files = helpers.Publisher(report_file, home / control.FILE if home else None)
        self._init_counters()
        self.classes = {}   # (node, ifindex, tc) -> (node, iface, cls), for applying control.json
        self.switches: list[Switch] = []    # nodes with queues to watch, polled every loop
        self.nodes: list[Switch] = []       # every node the controller serves (hosts obey PFC too)
        self.pfc_by_fd: dict[int, pfcport.Port] = {}
        self.pfc_ports: list[pfcport.Port] = []
        self.held: set[pfcport.Port] = set()   # ports obeying a pause now
        self.waiter = Waiter()           # not select(): no ceiling on the PFC sockets' descriptors
        self.expressions_loaded = False  # ecn.warm_up_rules ran (once: the kernel's modules are global)
        self.kick_socks = []
        self._open_switches()
        self.pfc_fds = list(self.pfc_by_fd)
        self._schedule_reads()
        reads = {s.queue_reads for s in shares}
        # a host only obeys pauses: it counts no arrivals (and its container may hold no BPF privilege)
        self.bounds = arrivals.setup(self.switches) if reads == {"arrivals"} and self.switches else None
        self._set_thresholds()

    def _init_counters(self) -> None:
        """What pfc.json reports: generations, reaction times, slow reads and steps, errors."""
        self.generation = 0
        self.last_written: tuple = ()
        # ports that ever sent or received a pause, in the order they first did: the only ones
        # pfc.json lists (readers take a port it leaves out as all zeros). Building and encoding
        # all 5,000 of a 1,024-GPU lab every 10 ms held the loop (and, on the Publisher's thread,
        # the GIL) for 10-40 ms at a time in an incast
        self.active: dict[pfcport.Port, None] = {}
        self.port_text: dict[pfcport.Port, tuple] = {}
        self.pfc_activity = 0    # frames sent or received: pfc.json changes only when this does
        # how long a busy queue goes between two reads (reaction.py): what PFC headroom must cover
        self.reactions = reaction.Histogram()
        self.work = reaction.Histogram()     # of that, the loop's own work (the rest is waiting for a CPU)
        # the slow ones with their time, so that a run can take out what the machine stalled (stallwatch.py)
        self.long_reads: deque = deque(maxlen=reaction.LONG_READS_KEPT)
        self.long_count = 0
        # wake-ups that came late, (due, woke): a slow read lists those within it, so that a run can
        # tell one held by a machine stall (and by all the stall held back) from the loop's own
        self.late_wakes: deque = deque(maxlen=reaction.LATE_WAKES_KEPT)
        self.slow = reaction.SlowSteps()     # parts of the loop over reaction.SLOW_STEP_S, by name
        self.errors: list[str] = []     # control files refused, newest last (shown by `labctl status`)

    def _open_switches(self) -> None:
        """A Switch for every node with an ECN-marking or lossless class, its rules installed."""
        # libnftables waits on its socket with select(), whose descriptors must stay below FD_SETSIZE
        # (1,024): every context opens before the thousands of PFC sockets of a large lab
        contexts = {s.node.name: Nft(s.node.namespace) for s in self.shares if s.marking}
        for share in self.shares:
            node = share.node
            for i in node.interfaces:
                for c in i.shaping.classes:
                    self.classes[(node.name, i.index, c.tc)] = (share, node, i, c)
            sw = switch.open_switch(share, contexts.get(node.name),
                                    lambda name, ifindex, tc: self._settings({}, name, ifindex, tc))
            if share.marking and not self.expressions_loaded:
                t = time.monotonic()
                sw.nft.run(ecn.warm_up_rules(*share.marking[0], sw.family))
                self.expressions_loaded = True
                print(f"nftables marking expressions ready in {(time.monotonic() - t) * 1e3:.0f} ms",
                      file=sys.stderr, flush=True)
            if sw.kick_sock is not None:
                self.kick_socks.append(sw.kick_sock)
            self.pfc_ports.extend(sw.pfc.values())
            self.nodes.append(sw)
            for p in sw.pfc.values():
                self.pfc_by_fd[p.fileno()] = p
                self.waiter.register(p.fileno())
            if sw.wanted:
                self.switches.append(sw)   # hosts only obey pauses: their sockets are served by the waiter

    def _schedule_reads(self) -> None:
        self.idle = qos.controller_idle_s([len(sw.wanted) for sw in self.switches])
        # idle reads spread over the idle period: all due at once, 176 switches took 34 ms in one
        # step, and a busy switch waited behind them
        start = time.monotonic()
        for k, sw in enumerate(self.switches):
            sw.next_read = start + self.idle * k / max(1, len(self.switches))
        self.next_scan = start

    def _set_thresholds(self) -> None:
        if self.bounds is not None:
            self.bounds.set_from(self.switches, any(s.shared_buffer is not None for s in self.shares))

    def close(self) -> None:
        """Release the packet sockets together (pfcport.close_all): exiting with them open would
        release them one by one, for tens of seconds after `down` at 1,024 GPUs."""
        pfcport.close_all([p.sock for p in self.pfc_ports] + self.kick_socks)
        for sw in self.switches:
            for held in (sw.fast_marking, sw.path_marking):
                if held is not None:
                    held.close()
            sw.fast_marking = sw.path_marking = None
        if self.bounds is not None:
            self.bounds.close()

    def _settings(self, overrides: dict, node: str, ifindex: int, tc: int) -> control.PortSettings:
        share, n, i, c = self.classes[(node, ifindex, tc)]
        return control.settings_for(share, n, i, c, overrides)

    def check_control(self) -> None:
        """Apply control.json once the Publisher saw it change."""
        if not self.files.control_changed.is_set():
            return
        self.files.control_changed.clear()
        try:
            doc = control.load(self.home, strict=True)
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
            switch.write_profiles(sw)
            for port in sw.pfc.values():
                port.settings = self._settings(doc["ports"], sw.node.name, port.iface.index, port.cls.tc)
                if not port.settings.pfc:
                    port.over_xoff = False
                    if port.state.paused_until:
                        port.resume(now)        # PFC off: stop obeying the pause we hold
        self._set_thresholds()
        self.generation = doc["generation"]

    def poll(self, sw: Switch, places: list[int] | None = None, known: dict | None = None) -> tuple[bool, float]:
        """One control step for one node: whether any controlled queue holds packets, and the
        seconds before any could reach its ECN or PFC threshold (0: it has, or may at once).
        With `places`, only those of its queues are read, and `known` stands in for the rest."""
        busy, due = False, self.idle
        now = time.monotonic()
        congested: set[str] = set()      # egress ports whose lossless queue is past XOFF
        counted = sw.path_marking.counts() if sw.path_marking is not None else None
        if places is None:
            backlogs = qdepth.backlogs_get(sw.sock, sw.request) if sw.wanted else {}
        else:
            backlogs = qdepth.backlogs_get(sw.sock, (b"".join(sw.messages[i] for i in places), sw.request[1]),
                                           len(places)) if places else {}
            backlogs.update(known)
        self.slow.note("read", sw.node.name, now)
        sw.backlogs = backlogs
        shared = sw.share.shared_buffer if sw.node.switching else None
        used = sum(backlogs.get(key, 0) for key in sw.pfc) if shared else 0
        for key, backlog in backlogs.items():
            # an empty queue still runs the steps below: a drained queue must stop marking and
            # release its XOFF state even if the read that finds it empty is the first one after
            busy = busy or backlog > 0
            threshold = None          # the nearest depth at which this queue needs a prompt read
            marking = sw.ecn_ports.get(key)
            if marking is not None and sw.path_marking is not None:
                # the ports mark each packet themselves: the read only corrects their depth estimate
                if places is None or key not in known:
                    sw.path_marking.resync(key[0], marking[0], backlog, counted)
                marking = None
            if marking is not None:
                tc, st = marking
                n = ecn.level(backlog, st.kmin, st.kmax, st.pmax, sw.marking[(key[0], tc)]) if st.ecn else 0
                if n != sw.marking[(key[0], tc)]:
                    t = time.monotonic()
                    # a fast-path router marks what its program forwards (n into its slot, through
                    # memory) and nftables what takes its IP stack (a multipath destination)
                    if sw.fast_marking is not None:
                        sw.fast_marking.set(key[0], tc, n)
                    sw.nft.run(ecn.chain_rules(key[0], tc, n, sw.family))
                    sw.marking[(key[0], tc)] = n
                    self.slow.note("ecn rule", sw.node.name, t)
                if st.ecn:
                    threshold = st.kmin if backlog < st.kmin else 0
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
                # a shared buffer's XOFF falls as the other queues fill: no distance to it is safe
                near = 0 if port.over_xoff or shared else xoff
                threshold = near if threshold is None else min(threshold, near)
            if threshold is not None and backlog > 0:
                due = min(due, max(0.0, threshold - backlog) / sw.inflow[key])
            if (marking is not None and sw.marking[(key[0], marking[0])]) or (port is not None and port.over_xoff):
                sw.stateful.add(key)
            else:
                sw.stateful.discard(key)
        if sw.node.switching and sw.pfc and (congested or sw.asserting):
            self.pfc_activity += 1
            t = time.monotonic()
            sw.assert_pfc(congested, now, self.active)
            self.slow.note("pause send", sw.node.name, t)
            if sw.asserting:
                due = 0.0            # a pause to refresh or release
        sw.polls += 1
        sw.must = sw.asserting or bool(sw.stateful)
        return busy, due

    def service_pfc(self, now: float) -> float | None:
        """Obey PFC frames that arrived (one epoll over every port instead of a recv on each) and
        end pauses that ran out; while any class is held, the seconds until the first pause ends."""
        if self.pfc_fds:
            for fd in self.waiter.wait(0):
                port = self.pfc_by_fd[fd]
                t = time.monotonic()
                port.receive(now)
                self.slow.note("pause obey", port.node.name, t)
                self.active[port] = None
                self.pfc_activity += 1
                if port.state.paused_until:
                    self.held.add(port)
        ends = None
        for port in list(self.held):   # only held ports: a 1,024-GPU lab has 5,000 of them
            t = time.monotonic()
            port.expire(now)
            self.slow.note("pause expiry", port.node.name, t)
            if port.state.paused_until:
                left = port.state.paused_until - now
                ends = left if ends is None else min(ends, left)
            else:
                self.held.discard(port)
        return ends

    def step(self) -> float:
        """Read every switch whose queues are due, then the PFC sockets; returns when the next
        read is due (time.monotonic()). Each switch keeps its own pace: one congested leaf is
        read at 1 kHz without the rest of the fabric being read with it."""
        if self.bounds is not None:
            return self._step_on_arrivals()
        for sw in self.switches:
            start = time.monotonic()
            if start < sw.next_read:
                continue
            busy, due = self.poll(sw)
            if sw.busy and sw.last_read is not None:
                # from the previous read of this switch to the end of this one's pauses; a read
                # planned later than FAST (no queue could reach a threshold before it) counts
                # only from when it was due, as if the queues had been read at FAST until then
                end = time.monotonic()
                self._record(end - sw.last_read - (sw.period - FAST), start, end)
            # half the earliest crossing: a margin for a wake-up that comes late behind other work
            sw.busy, sw.last_read = busy, start
            sw.period = min(self.idle, max(FAST, due / 2)) if busy or due <= 0 else self.idle
            sw.next_read = start + sw.period
        now = time.monotonic()
        wake = min((sw.next_read for sw in self.switches), default=now + self.idle)
        ends = self.service_pfc(now)
        if ends is not None:              # a held class must be released on time
            wake = min(wake, now + ends)
        return min(wake, now + self.idle)

    def _step_on_arrivals(self) -> float:
        """One scan of every queue's arrival bound; read only the switches where one reached its
        threshold, or that are pausing or marking, and of them only the queues whose bound is past
        its floor (below it, the bound decides as the backlog would). The reaction sample of a read runs from the
        last moment the switch was known to be below its thresholds (a scan that found it so, or
        its previous read) to the end of this read."""
        now = time.monotonic()
        if now >= self.next_scan:
            copied, reached, room = self.bounds.scan()
            self.slow.note("arrival scan", "-", now)
            planned = min(self.idle, max(FAST, room / 2))
            for k, sw in enumerate(self.switches):
                if not (reached[k] or sw.must):
                    sw.last_read, sw.period = now, planned
                    continue
                start = time.monotonic()
                places = self.bounds.unknown(sw.queues)
                # of the queues left unread, only those marking or past XOFF have a state to undo
                read = {sw.request[1][i] for i in places}
                known = {key: self.bounds.bound_at(sw.queues, sw.place[key]) for key in sw.stateful - read}
                self.poll(sw, places, known)
                end = time.monotonic()
                self.bounds.read(sw.queues, places, sw.backlogs, copied)
                if sw.last_read is not None:
                    self._record(end - sw.last_read - max(0.0, sw.period - FAST), start, end)
                sw.last_read, sw.period = start, FAST
                if sw.must:
                    planned = FAST
            self.next_scan = now + planned
        now = time.monotonic()
        wake = self.next_scan
        ends = self.service_pfc(now)
        if ends is not None:
            wake = min(wake, now + ends)
        return min(wake, now + self.idle)

    def _record(self, took: float, start: float, end: float) -> None:
        """One reaction sample (the read itself took end - start of it)."""
        self.reactions.add(took)
        self.work.add(end - start)
        if took > reaction.LONG_READ_S:
            wakes = [[round(due, 6), round(woke, 6)] for due, woke in self.late_wakes if woke > end - took and due < end]
            self.long_reads.append((round(end, 6), round(took, 6), wakes) if wakes else (round(end, 6), round(took, 6)))
            self.long_count += 1

    def write_counters(self, now: float, force: bool = False) -> None:
        """pfc.json, when a counter or the applied generation changed (or `force`)."""
        if self.home is None:
            return
        # the change test looks at one number: comparing 5,000 ports' counters every 10 ms took
        # a third of the loop at 1,024 GPUs
        summary = (self.generation, self.reactions.worst(), self.pfc_activity, self.long_count, self.slow.count)
        if summary == self.last_written and not self.held and not force:
            return
        self.last_written = summary
        # made here and only written by the Publisher: json.dumps holds the GIL (pfcport.counters_text)
        head = json.dumps({"time": now, "generation": self.generation,
                           "reaction_hist": self.reactions.to_list(), "work_hist": self.work.to_list(),
                           "long_reads": list(self.long_reads), "slow_steps": list(self.slow.steps),
                           "errors": list(self.errors)})
        self.files.publish(f'{head[:-1]}, "ports": {pfcport.counters_text(self.active, self.port_text, now)}}}')

    def run(self, stop_when_gone: bool = True) -> None:
        last_counters = last_forced = 0.0
        while True:
            self.check_control()
            try:
                wake = self.step()
            except (OSError, rtnl.NetlinkError):
                if stop_when_gone and not any(nsutil.exists(s.node.namespace) for s in self.shares):
                    return  # the lab is gone
                raise
            now = time.monotonic()
            if now - last_counters >= COUNTERS_EVERY:
                force = now - last_forced >= COUNTERS_AT_LEAST
                self.write_counters(now, force)
                last_counters = now
                last_forced = now if force else last_forced
            delay = wake - time.monotonic()
            if delay > 0:
                # wake at once when a PFC frame arrives on any port
                self.waiter.wait(delay)
                woke = time.monotonic()
                if woke - wake > reaction.LATE_WAKE_S:      # the CPU was not given back on time
                    self.late_wakes.append((wake, woke))
                self.slow.note("wake-up (late by)", "-", wake)


def needed(plan: LabPlan) -> bool:
    return bool(served(plan))


def main() -> None:
    """`LAB_DIR`: the lab's agent, serving every node that needs one, on the host. A node's own
    agent starts from dataplane/agents.py."""
    helpers.serve(lambda plan, lab_dir: Controller(shares(plan), lab_dir))


if __name__ == "__main__":
    main()
