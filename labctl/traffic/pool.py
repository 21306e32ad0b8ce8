"""The controller side of a run: agents in the GPU namespaces, operations started in lock-step.

All namespaces share CLOCK_MONOTONIC, so every operation starts at one instant chosen here and
each agent reports times relative to it; an operation's time is the last rank's finish.
"""
from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass

from labctl.errors import LabError
from labctl.kinds import fabric_kind, node_kind
from labctl.plan.model import Interface, LabPlan, Node
from labctl.state import LabDir
from labctl.plan import qos
from labctl.traffic import roce, spawn
from labctl.traffic.dcqcn import Params
from labctl.traffic.schedule import Schedule


ID_BITS = 24                      # transfer ids in the 32-bit immediate; the top 8 bits number the operation
ID_MASK = (1 << ID_BITS) - 1
OP_TAGS = 1 << (32 - ID_BITS)


def gpu_ranks(plan: LabPlan) -> dict[int, Node]:
    ranks = {n.rank: n for n in plan.nodes if node_kind(n.kind).holds_rank and n.rank is not None}
    if not ranks:
        raise LabError(f"lab {plan.lab!r} has no GPU nodes to run traffic on",
                       "add nodes of kind gpu (in a containerlab file: `labels: {labctl.kind: gpu, labctl.rank: "
                       "'0'}` on each, ranks from 0; docs/containerlab.md)")
    return dict(sorted(ranks.items()))


def local_index(plan: LabPlan, node: Node) -> int:
    """A GPU's index inside its server (its rail)."""
    peers = sorted(n.rank for n in plan.nodes if node_kind(n.kind).holds_rank and n.server == node.server)
    return peers.index(node.rank)


def path_ports(plan: LabPlan, a: Node, b: Node) -> tuple[Interface, Interface]:
    """The NICs two GPUs use to talk: scale-up inside a server, else scale-out, else any shared fabric."""
    shared = []
    for ia in a.interfaces:
        for ib in b.interfaces:
            if ia.peer_node == a.name or ib.peer_node == b.name:
                continue        # a loop cable (`addresses: none` nodes may have one) leads nowhere
            if ia.fabric == ib.fabric:
                kind = fabric_kind(plan.fabrics[ia.fabric].kind)
                if kind.islands and getattr(a, kind.islands) != getattr(b, kind.islands) \
                        and ia.peer_node != ib.peer_node:
                    continue    # an NVLink domain ends at its server, or at its NVLink switch (a rack's NVL72)
                shared.append((kind.path_rank, ia, ib))
    if not shared:
        raise LabError(f"{a.name} and {b.name} share no fabric", "cable both to the same fabric")
    _, ia, ib = min(shared, key=lambda x: x[0])
    return ia, ib


@dataclass
class RunOptions:
    qps: int = 1
    sport_policy: str = "per-qp"
    cnp_interval_us: float | None = None   # real-fabric µs; None: receivers are no notification points
    seed: int = 1
    reliable: bool = False
    ooo: str = "drop"                      # reliable receivers: go-back-N (drop) or tolerate reordering
    dcqcn: bool = False
    dcqcn_params: Params = dataclasses.field(default_factory=Params)


def retransmission_timeout(plan: LabPlan) -> float:
    """Go-back-N's timer, lab seconds: a few hundred microseconds on the real fabric, x dilation, plus,
    across a WAN, its round trip and the time its fullest queue takes to drain. A timer shorter than
    that fires while the ACK is still on its way back (100 km is a 0.98 ms round trip, 3.9 s in a
    lab at dilation 4000), and each firing sends the whole window again into the same queue. A
    jittered WAN adds up to its jitter each way: its longest round trip counts."""
    wan = [2 * (lk.lab_delay_ns + lk.lab_jitter_ns) / 1e9 + max((c.buffer_bytes for n in plan.nodes for i in n.interfaces
                                               if i.link == lk.id for c in i.shaping.classes), default=0)
           * 8 / lk.lab_rate_bps for lk in plan.links if lk.wire is not None]
    return max(0.02, 250e-6 * plan.dilation) + max(wan, default=0.0)


# An operation reaches its agents in two messages: the command (however large: a 64-rank ring of
# 1 GB is megabytes of JSON) and, once every agent has parsed it, a one-line `go` with the common
# start time, START_MARGIN_S + 1 ms a rank ahead. A late `go` is measured, not hidden (late_start_s).
START_MARGIN_S, START_MARGIN_PER_RANK_S = 0.015, 0.001

# What a healthy agent can wait on top of the lab's own silences: another process's stalls (a
# sender whose CPU another lab's burst took, a page fault storm) and its own scheduling, under load,
# with margin. A stall of the waiting agent itself (the whole machine's: a VM whose host is busy)
# is measured by the agent and not counted as silence (agent.py).
STALL_MARGIN_S = 1.5


def quiet_floor(plan: LabPlan, dcqcn: Params | None = None) -> float:
    """The longest a healthy lab can leave a waiting agent with nothing arriving, lab seconds: two
    go-back-N timers (a lost message's resend, and the loss of that resend), the time its deepest
    queue takes to drain (a paused or full queue delivers its last packet that late) and the
    machine's stalls. An agent that hears nothing for longer has lost what it waits for. With
    `dcqcn`, the reaction points' parameters, also two frames' time at their minimum rate."""
    # a class that other classes crowd drains at its guaranteed rate, not the port's; a WAN port's
    # queue is in the go-back-N timer already
    wan = {lk.id for lk in plan.links if lk.wire is not None}
    drain = max((c.buffer_bytes * 8 / (c.rate_bps or i.shaping.rate_bps) for n in plan.nodes for i in n.interfaces
                 if i.shaping is not None and i.shaping.rate_bps and i.link not in wan for c in i.shaping.classes),
                default=0.0)
    floor = STALL_MARGIN_S + 2 * retransmission_timeout(plan) + drain
    if dcqcn is not None:     # a sender DCQCN cut to its minimum rate is slow, not silent
        floor = max(floor, STALL_MARGIN_S + 2 * paced_silence(plan, dcqcn))
    return floor


def paced_silence(plan: LabPlan, params: Params) -> float:
    """The longest a DCQCN sender cut to its minimum rate leaves its receiver hearing nothing, lab
    seconds: one frame's time at that rate (it sends one frame at a time there: sender.py)."""
    mtu = roce.roce_mtu(max(i.mtu for n in plan.nodes for i in n.interfaces))
    return (mtu + roce.FRAME_OVERHEAD) * 8 / params.scaled(plan.dilation).min_rate


class AgentPool:
    """One agent process per participating rank, each inside its GPU's namespace."""

    def __init__(self, plan: LabPlan, lab: LabDir, ranks: list[int], options: RunOptions):
        self.plan, self.options = plan, options
        self.nodes = gpu_ranks(plan)
        missing = [r for r in ranks if r not in self.nodes]
        if missing:
            raise LabError(f"lab {plan.lab!r} has no GPU with rank {missing[0]}",
                           f"its ranks are {min(self.nodes)}..{max(self.nodes)}")
        self.ranks = ranks
        self.rto = retransmission_timeout(plan)
        self.procs: dict[int, spawn.Agent] = {}
        self.identities: dict[str, str] = {}    # journaled as started, and as ended once reaped
        self.launched: spawn.Launched | None = None
        self.lab = lab
        self.events: queue.Queue = queue.Queue()
        self.counters: dict[int, dict] = {}
        cpus = sorted(os.sched_getaffinity(0))
        interval = None
        if options.cnp_interval_us is not None:
            interval = options.cnp_interval_us * 1e-6 * plan.dilation  # real-fabric time x dilation
        from labctl.traffic import crafting    # scapy: here once, not in each agent
        templates = crafting.table(roce.OPCODES)
        try:
            self.launched = spawn.Launched({r: self.nodes[r].namespace for r in ranks})
            self._journal("launcher", self.launched.identity)
            for r, a in self.launched.agents.items():
                self._journal(r, a.identity)
            for r in ranks:
                node = self.nodes[r]
                p = self.procs[r] = self.launched.agents[r]
                threading.Thread(target=self._read, args=(r, p), daemon=True).start()
                peers = {}
                for q in self.nodes.values():
                    if q.rank == r:
                        continue
                    mine, theirs = path_ports(plan, node, q)
                    peers[theirs.address.split("/")[0]] = [q.rank, mine.address.split("/")[0]]
                mtu = min(i.mtu for i in node.interfaces)
                self._send(r, {"cmd": "init", "rank": r, "mtu": roce.roce_mtu(mtu), "peers": peers,
                               "cnp_interval": interval, "sport_policy": options.sport_policy,
                               "seed": options.seed, "cpu": cpus[len(self.procs) % len(cpus)],
                               "templates": templates,
                               "reliable": options.reliable, "ooo": options.ooo, "priorities": _priorities(node),
                               "dcqcn": dataclasses.asdict(options.dcqcn_params.scaled(plan.dilation)) if options.dcqcn
                               else None})
            self._collect("ready", len(ranks), timeout=60)
        except BaseException:
            self.close(kill=True)
            raise

    def _read(self, rank: int, p: spawn.Agent) -> None:
        for line in p.stdout:
            try:
                self.events.put((rank, json.loads(line)))
            except ValueError:
                continue
        self.events.put((rank, {"event": "exited", "code": p.wait()}))

    def _send(self, rank: int, msg: dict) -> None:
        p = self.procs[rank]
        p.stdin.write(json.dumps(msg) + "\n")
        p.stdin.flush()

    def _collect(self, event: str, count: int, timeout: float) -> dict[int, dict]:
        got: dict[int, dict] = {}
        deadline = time.monotonic() + timeout
        while len(got) < count:
            try:
                rank, msg = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise LabError(f"agents did not report {event!r} within {timeout:.0f} s "
                               f"(waiting for ranks {sorted(set(self.ranks) - set(got))})") from None
            if msg.get("event") == "exited":
                if rank in got:
                    continue         # it answered, then ended (as `exit` asks): another rank may still answer
                raise LabError(f"the agent of rank {rank} exited (code {msg['code']}) before {event!r}")
            if msg.get("event") == event:
                got[rank] = msg
        return got

    def run(self, schedule: Schedule, op: int, timeout: float, quiet: float | None = None) -> dict[int, dict]:
        """Run one schedule on the agents; returns each rank's report.

        Every operation numbers its transfers from 0, and an agent remembers what arrived: the
        ids on the wire (the immediate data) carry the operation's number too, so that a step of
        the next operation never finds its input already "arrived" from the one before.
        An agent gives up at `timeout`, or once nothing has reached it for `quiet` seconds."""
        if len(schedule.transfers) > ID_MASK:
            raise LabError(f"one operation of {len(schedule.transfers):,} transfers is more than "
                           f"{ID_MASK:,}: use a larger slice (options.slice) or fewer ranks")
        tag = (op % OP_TAGS) << ID_BITS
        conn_count: dict[tuple[int, int], int] = {}
        per_rank: dict[int, dict] = {r: {"sends": [], "recvs": []} for r in schedule.ranks}
        for t in schedule.transfers:
            a, b = self.nodes[t.src], self.nodes[t.dst]
            ia, ib = path_ports(self.plan, a, b)
            k = conn_count.get((t.src, t.dst), 0)
            conn_count[(t.src, t.dst)] = k + 1
            per_rank[t.src]["sends"].append({"id": tag | t.id, "dst": t.dst, "nbytes": t.nbytes,
                                             "after": [tag | x for x in t.after],
                                             "qp": k % self.options.qps, "line_rate": ia.shaping.rate_bps,
                                             "src_addr": ia.address.split("/")[0],
                                             "dst_addr": ib.address.split("/")[0], "delay": t.delay})
            per_rank[t.dst]["recvs"].append(tag | t.id)
        for r in schedule.ranks:
            self._send(r, {"cmd": "run", "op": op, "timeout": timeout,
                           "quiet": timeout if quiet is None else quiet, "rto": self.rto,
                           **per_rank[r]})
        self._collect("armed", len(schedule.ranks), 60 + timeout)
        start = time.monotonic() + START_MARGIN_S + START_MARGIN_PER_RANK_S * len(schedule.ranks)
        for r in schedule.ranks:
            self._send(r, {"cmd": "go", "start": start})
        reports = self._collect("done", len(schedule.ranks), timeout + 30)
        late = max(rep["received"] for rep in reports.values()) - start
        for rep in reports.values():         # back to the schedule's own ids
            rep["late_start_s"] = max(0.0, late)
            for key in ("sends", "recvs"):
                for x in rep.get(key, []):
                    x[0] &= ID_MASK
            rep["missing"] = [i & ID_MASK for i in rep.get("missing", [])]
        return reports

    def close(self, kill: bool = False) -> dict[int, dict]:
        if not kill:
            for r in self.procs:
                try:
                    self._send(r, {"cmd": "exit"})
                except (BrokenPipeError, OSError):
                    pass
            try:
                self.counters = self._collect("counters", len(self.procs), timeout=15)
            except LabError as exc:
                # the run's accounting (bytes, packets, gaps) comes from these: without every rank's,
                # a run would report nothing sent and nothing lost
                self._end(kill=True)
                raise LabError(f"the run's counters are incomplete: {exc}",
                               "run it again; `labctl status` shows whether the lab is still up") from None
        self._end(kill)
        return self.counters

    def _journal(self, key, ident: str) -> None:
        self.identities[str(key)] = ident
        self.lab.journal("pid", ident)

    def _end(self, kill: bool) -> None:
        agents = list(self.launched.agents.values()) if self.launched is not None else []
        for p in agents:
            if kill and p.poll() is None:
                p.kill()
            try:
                p.stdin.close()         # an agent whose commands end exits, as when its pool dies
            except OSError:
                pass
        for p in agents:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.launched is not None:
            try:
                self.launched.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.launched.kill()
        for ident in self.identities.values():
            self.lab.journal("released-pid", ident)
        self.identities = {}


def _priorities(node: Node) -> dict[int, int]:
    """DSCP → SO_PRIORITY for the agent's sockets: the HTB class of that DSCP on the host's ports."""
    classes = node.interfaces[0].shaping.classes if node.interfaces else []
    return {d: qos.priority_value(c.tc) for c in classes for d in c.dscp}
