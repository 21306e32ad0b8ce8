"""Arrival counters: what tells the controller which switch to read, without reading it.

Reading a switch's queues is a netlink round trip per switch (about 20 µs plus 10 µs per queue).
At 1,024 GPUs (176 switches, 3,072 queues) reading all of them takes 30 ms, so polling alone
left idle switches unread for over 100 ms, and PFC headroom had to cover that. Instead, a tc
program on the egress of every controlled port adds each packet's length to a counter per
(port, traffic class) as the packet enters the qdisc. The counters live in one BPF array map
that the controller maps into its memory, so a scan of every queue in the lab is a copy of a
few KiB and some array arithmetic, with no system call.

A queue's backlog can only grow by what arrived: at any scan,

    backlog now <= backlog at its last read + bytes counted since the counters were copied for that read

and that bound is exact, whatever the routes or the rates. A switch whose every bound is below
its queues' thresholds (ECN Kmin, PFC XOFF) cannot need anything done, and is not read; one
whose bound reached a threshold is read at once. Bytes that pass through without queueing also
raise the bound, so a switch that forwards steadily is read about once per threshold's worth of
traffic. A packet whose skb->priority names no traffic class (the HTB default) is counted once
per port, and that count is added to the bound of every class on the port.

    LABCTL_QUEUE_READS=auto|arrivals|poll   (auto: arrivals where the kernel loads the program)
"""
from __future__ import annotations

import mmap
import os
import re

import numpy as np

from labctl.kernel import ebpf, rtnl
from labctl.kernel.ebpf import (ADD_K, AND_K, ATOMIC_ADD_DW, BPF_FUNC_MAP_LOOKUP_ELEM, CALL, EXIT, JEQ_K,
                                  JGT_K, JNE_K, LDX_W, MOV_K, MOV_X, R0, R1, R2, R3, R4, R6, R10, RSH_K,
                                  SKB_LEN, SKB_PRIORITY, STX_W, TC_ACT_UNSPEC, Asm)
from labctl import switches
from labctl.errors import LabError
from labctl.plan import qos

ENV = "LABCTL_QUEUE_READS"
ENGINES = ("auto", "arrivals", "poll")
CLASSES = 8                    # traffic classes 0..7 (topology/schema.py)
STRIDE = CLASSES + 1           # per port: one counter per class, one for packets in no class
OTHER = CLASSES
NAME = "labctl_arrive"

PREF = 1
# create or change, never refuse (rtnl.ENSURE): a port of a router hashing with labctl's program
# or forwarding on the fast path already has clsact, and a controller started again on a running
# lab replaces its own filter
ENSURE = rtnl.ENSURE


def engine() -> str:
    return switches.choice(ENV, ENGINES, "a way of reading queues")


def probe() -> str | None:
    """None if this machine counts arrivals in the kernel (it loads the program); otherwise why not."""
    why = unsupported()
    if why is not None:
        return why
    try:
        fd = ebpf.array_map(STRIDE, 8, NAME, mmapable=True)
    except ebpf.BpfError as exc:
        return str(exc)
    try:
        os.close(ebpf.load_program(program(fd, 0), NAME))
    except ebpf.BpfError as exc:
        return str(exc)
    finally:
        os.close(fd)
    return None


def unsupported() -> str | None:
    """Why this machine cannot count arrivals, judged without loading anything, so that `labctl plan`
    run by any user shows the plan `up` builds: the CPU's bpf() number, and Linux 5.5 (maps that map
    into memory). `labctl doctor` loads the program for real; a kernel that refuses it anyway makes
    `up` fail with the way out."""
    if not ebpf.supported():
        return f"no bpf() system call number for a {os.uname().machine} CPU here"
    release = re.match(r"(\d+)\.(\d+)", os.uname().release)
    if release is None or (int(release[1]), int(release[2])) < (5, 5):
        return f"kernel {os.uname().release} is older than 5.5 (no memory-mapped BPF maps)"
    return None


def choose() -> str:
    """What `up` records in the plan: "arrivals" or "poll" (LABCTL_QUEUE_READS, else the machine)."""
    wanted = engine()
    if wanted == "poll":
        return "poll"
    why = unsupported()
    if why is None:
        return "arrivals"
    if wanted == "arrivals":
        raise LabError(f"{ENV}=arrivals, but the kernel cannot count arrivals here: {why}",
                       f"unset {ENV} (labctl then polls every switch)")
    return "poll"


def program(map_fd: int, base: int) -> bytes:
    """counters[base + class] += skb->len, the class from skb->priority 1:(0x10+tc) as HTB reads it
    (set by nftables on the forward hook, before the egress hook); any other priority is OTHER."""
    a = Asm()
    a.op(MOV_X, R6, R1)
    a.op(LDX_W, R2, R6, SKB_PRIORITY)
    a.op(MOV_X, R3, R2)
    a.op(RSH_K, R3, imm=16)
    a.op(MOV_K, R4, imm=OTHER)
    a.jump(JNE_K, R3, "slot", imm=qos.HTB_ROOT >> 16)
    a.op(AND_K, R2, imm=0xFFFF)
    a.op(ADD_K, R2, imm=-qos.class_minor(0))
    a.jump(JGT_K, R2, "slot", imm=CLASSES - 1)      # unsigned: below 0x10 wraps and goes too
    a.op(MOV_X, R4, R2)
    a.label("slot")
    a.op(ADD_K, R4, imm=base)
    a.op(STX_W, R10, R4, -4)
    a.op(MOV_X, R2, R10)
    a.op(ADD_K, R2, imm=-4)
    a.ld_map(R1, map_fd)
    a.op(CALL, imm=BPF_FUNC_MAP_LOOKUP_ELEM)
    a.jump(JEQ_K, R0, "out", imm=0)
    a.op(LDX_W, R1, R6, SKB_LEN)
    a.op(ATOMIC_ADD_DW, R0, R1, 0)
    a.label("out")
    a.op(MOV_K, R0, imm=TC_ACT_UNSPEC)
    a.op(EXIT)
    return a.assemble()


def port_requests(index: int, prog_fd: int, where: str, pref: int = PREF) -> list[tuple[tuple[int, int, bytes], str]]:
    """clsact on a port and the counting program on its egress (`tc filter add … egress bpf da`)."""
    return ebpf.clsact_requests(index, prog_fd, NAME, where, "arrival counter", ingress=False,
                                protocol=ebpf.ETH_P_ALL, pref=pref, handle=1, flags=ENSURE)


class Counters:
    """The map and the controller's view of it. Its programs hold it once attached; it is freed
    when the last port holding one goes (`down` deletes the namespaces)."""

    def __init__(self, ports: int):
        self.entries = max(1, ports) * STRIDE
        self.fd = ebpf.array_map(self.entries, 8, NAME, mmapable=True)
        size = -(-self.entries * 8 // mmap.PAGESIZE) * mmap.PAGESIZE
        self.mem = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        self.view = np.frombuffer(self.mem, dtype=np.int64, count=self.entries)

    def attach(self, sock, ports: list[tuple[int, int, str]], pref: int = PREF) -> None:
        """Each (ifindex, base, description) of one namespace gets its program, in one burst."""
        batch, fds = rtnl.Batch(sock), []
        try:
            for ifindex, base, where in ports:
                fds.append(ebpf.load_program(program(self.fd, base), NAME))
                for request, what in port_requests(ifindex, fds[-1], where, pref):
                    batch.add(request, what)
            batch.commit()
        finally:
            for fd in fds:
                os.close(fd)       # the filters hold them

    def snapshot(self) -> np.ndarray:
        return self.view.copy()

    def close(self) -> None:
        self.view = None
        self.mem.close()
        os.close(self.fd)


def setup(switches) -> "Bounds":
    """Counters on every controlled port of `switches` (dataplane/switch.py), and their bounds."""
    bases, ports_of, n = {}, [], 0
    for k, sw in enumerate(switches):
        names = {i.index: i.name for i in sw.node.interfaces}
        ports_of.append([])
        for ifindex in sorted({key[0] for key in sw.wanted}):
            bases[(k, ifindex)] = n * STRIDE
            ports_of[k].append((ifindex, n * STRIDE, f"{sw.node.name}:{names.get(ifindex, ifindex)}"))
            n += 1
    try:
        counters = Counters(n)
    except ebpf.BpfError as exc:
        raise LabError(f"the kernel refused the controller's arrival counters: {exc}",
                       f"set {ENV}=poll to read queues by polling alone") from None
    try:
        for sw, ports in zip(switches, ports_of):
            try:
                counters.attach(sw.sock, ports)
            except rtnl.NetlinkError as exc:
                raise LabError(f"{exc.what} failed: {os.strerror(exc.code)}",
                               f"set {ENV}=poll to read queues by polling alone") from None
            except ebpf.BpfError as exc:
                raise LabError(f"the kernel refused the controller's arrival counter: {exc}",
                               f"set {ENV}=poll to read queues by polling alone") from None
    except BaseException:
        counters.close()
        raise
    return Bounds(counters, switches, bases)


class Bounds:
    """Per controlled queue, in switch order: the backlog at its last read and the counters copied
    for that read; per switch, whether a scan must read it."""

    def __init__(self, counters: Counters, switches, bases: dict):
        self.counters = counters
        keys, slot, other, inflow, starts = [], [], [], [], []
        for k, sw in enumerate(switches):
            starts.append(len(keys))
            for key in sorted(sw.wanted):
                base = bases[(k, key[0])]
                tc = key[1] - (qos.leaf_handle(0) >> 16)         # the leaf qdisc major is 0x20 + tc
                keys.append(key)
                slot.append(base + tc if 0 <= tc < CLASSES else base + OTHER)
                other.append(base + OTHER)
                inflow.append(sw.inflow[key])
            sw.queues = range(starts[-1], len(keys))
        self.keys = keys
        self.slot, self.other = np.array(slot, dtype=np.int64), np.array(other, dtype=np.int64)
        self.inflow = np.array(inflow, dtype=np.float64)
        self.starts = np.array(starts, dtype=np.int64)
        self.nonempty = np.array([len(sw.wanted) > 0 for sw in switches])
        self.backlog = np.zeros(len(keys), dtype=np.int64)
        now = counters.snapshot()
        self.seen = now[self.slot] + now[self.other]
        self.threshold = np.full(len(keys), np.inf)   # a switch is read once a bound reaches this
        self.floor = np.full(len(keys), np.inf)       # and of it, the queues whose bound reaches this
        self.bound = self.backlog.copy()

    def set_from(self, switches, shared_buffer: bool) -> None:
        """Each queue's limits from its switch's settings (dataplane/switch.py): the threshold is Kmin
        where the controller marks and XOFF where it pauses, the floor Kmin and XON; under a shared
        buffer any depth, since its XOFF falls as the other queues fill. Where the switch's ports
        mark themselves (kernel/ecnpath.py), Kmin matters only to a class that can drop: its reads
        correct the ports' depth estimate for what was dropped."""
        for sw in switches:
            for q in sw.queues:
                key = self.keys[q]
                threshold = floor = float("inf")
                marking = sw.ecn_ports.get(key)
                port = sw.pfc.get(key)
                pausing = port is not None and port.settings.pfc and sw.node.switching
                if marking is not None and marking[1].ecn and not (sw.path_marking is not None and pausing):
                    threshold = floor = marking[1].kmin
                if pausing:
                    threshold = min(threshold, 1 if shared_buffer else port.settings.xoff)
                    floor = min(floor, 1 if shared_buffer else port.settings.xon)
                self.set_limits(q, threshold, floor)

    def set_limits(self, q: int, threshold: float, floor: float) -> None:
        """`threshold`: the depth at which the queue needs the controller (Kmin, XOFF); `floor`:
        below it, the bound alone decides as a read would (no marking, no XOFF state: Kmin, XON)."""
        self.threshold[q], self.floor[q] = threshold, min(floor, threshold)

    def scan(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(the counters copied now, which switches must be read, seconds until any queue could
        reach its threshold at full inflow). The bounds stay in `self.bound` for `unknown`."""
        now = self.counters.snapshot()
        self.bound = bound = self.backlog + (now[self.slot] + now[self.other] - self.seen)
        over = bound >= self.threshold
        if not len(over):
            return now, np.zeros(0, dtype=bool), float("inf")
        reached = np.logical_or.reduceat(over, self.starts) & self.nonempty
        room = (self.threshold - bound) / self.inflow
        return now, reached, max(0.0, float(room.min()))

    def unknown(self, queues: range) -> list[int]:
        """Of a switch's queues at the last scan, the places of those that must be read; the bound
        of every other is below its floor and decides for it as its backlog would (`bound_at`)."""
        return [int(i) for i in np.flatnonzero(self.bound[queues.start:queues.stop] >= self.floor[queues.start:queues.stop])]

    def bound_at(self, queues: range, place: int) -> int:
        return int(self.bound[queues.start + place])

    def read(self, queues: range, places: list[int], backlogs: dict, copied: np.ndarray) -> None:
        """Queues of a switch (by place) were read: their backlogs are known, as of counters `copied`
        before the read. The others keep accumulating from their last read."""
        for i in places:
            q = queues.start + i
            self.backlog[q] = backlogs.get(self.keys[q], 0)
            self.seen[q] = copied[self.slot[q]] + copied[self.other[q]]

    def close(self) -> None:
        self.counters.close()


def explain(reads: str) -> str:
    if reads == "arrivals":
        return ("arrival-triggered: a tc BPF counter per port and class, mapped into the controller; a switch "
                "is read only once what arrived could have filled a queue to a threshold")
    return "polled: every switch read at 1 kHz while busy, idle ones at a slower pace"

