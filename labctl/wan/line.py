"""The WAN line: one process per lab that carries every wired link (kernel/wires.py).

For each direction of each link it reads the frames the sending router puts on the line, loses
some at random (`loss`), encrypts them (ESP, when the link says `encrypt`), holds them for the
link's one-way delay plus up to `jitter` (never reordering: a frame leaves no earlier than the one
before it), and puts them on the fibre no faster than the link's rate, counted on the frame as it
leaves (ESP's 54-57 bytes included; an encrypted port's shaper charges them too, plan/qos.py); the
far end decrypts and hands them to the receiving router. The buffer of the WAN is the routers' egress queue (deep, BDP-sized by default); the line
itself only bounds what is in flight (2 x BDP + 4 MB + one second of the link) and counts what it
drops.

The line is a process, and a busy machine can leave it without a CPU for tens of ms. A fibre
neither drops nor bunches frames meanwhile, so: its sockets hold what arrives (RCVBUF), each frame's
delay counts from its kernel arrival stamp, and frames never leave faster than the link's rate (a
burst after a stall would overrun the far router's lossless headroom, which is sized for feeders at
line rate). A send the kernel cannot take yet (a full send buffer or receive backlog) is retried,
in order, as a fibre still holding the frame would. What a stall costs is then only time, reported
as `max_lag_us`.

    python -m labctl.wan.line LAB_DIR
"""
from __future__ import annotations

import errno
import json
import random
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from labctl.kernel import nsutil, wires
from labctl import helpers
from labctl.helpers import Publisher
from labctl.plan.model import LabPlan, Link
from labctl.wakeup import Waiter
from labctl.wan import esp

ETH_P_ALL = 0x0003
COUNTERS_EVERY = 0.2
SO_RCVBUFFORCE, SO_SNDBUFFORCE = 33, 32
SOL_PACKET, PACKET_STATISTICS = 263, 6
# The line stands for a fibre, which never drops for want of a reader: its sockets must hold what
# arrives while the line waits for a CPU. 64 MB of skb memory is ~7,000 full-size frames, 0.6 s of
# a 100 Mbit/s lab link. SO_RCVBUF alone is capped by net.core.rmem_max (208 kB on a stock
# kernel: 20 ms of that link, shorter than a hypervisor's stall on a busy VM).
RCVBUF = 64 << 20


def send_buffer(plan: LabPlan) -> int:
    """What a line socket's send buffer must hold: a frame the line puts on a port stays charged
    to it until it leaves the node's far side, and across a bridge (no routing step to orphan it)
    that is after waiting in the bridge's egress queue. Smaller than the deepest queue, the socket
    and not the queue would hold the overflow: the bridge's bottleneck then never dropped, and the
    line's own retries grew seconds of delay instead (a 10M link behind a 1 ms line)."""
    deepest = max((c.buffer_bytes for n in plan.nodes for i in n.interfaces if i.shaping is not None
                   for c in i.shaping.classes), default=0)
    return max(RCVBUF, 2 * deepest + (4 << 20))
SO_TIMESTAMPNS = SCM_TIMESTAMPNS = 35
TIMESPEC = struct.Struct("qq")
CMSG_SPACE = socket.CMSG_SPACE(TIMESPEC.size)


def packet_socket(namespace: str, port: str, sndbuf: int = RCVBUF) -> socket.socket:
    with nsutil.entered(namespace):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((port, ETH_P_ALL))
    s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
    s.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, sndbuf)
    # each frame's delay counts from when it reached the line, not from when the line got to it
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    # no PACKET_QDISC_BYPASS: it skips the capture taps too, and a capture on the fibre must see both ways
    s.setblocking(False)
    return s


BURST_S = 0.001   # how far behind real time the line may fall before it paces (a late wake-up is normal)
# A send the kernel cannot take now (EAGAIN: the socket's send buffer is full of frames still on
# their way; ENOBUFS: the receiving CPU's backlog is full) is a fibre with frames still in it, not a
# loss: the frame stays at the head of its queue and is tried again this long after.
RETRY_S = 0.0002
BUSY = (errno.EAGAIN, errno.ENOBUFS)


@dataclass
class Paced:
    """Frames waiting for their time, let out no faster than the link's rate. After a stall the
    waiting frames leave at line rate, not as one burst: the far router's lossless headroom is sized
    for feeders at line rate, and a burst overran it."""
    rate_bps: int
    frames: deque = field(default_factory=deque)   # (due, frame, bytes on the wire)
    free: float = 0.0                              # when the link can take the next frame
    late_us: int = 0                               # the worst lateness, once over 1 ms
    retry_at: float = 0.0                          # the kernel was busy: not before this
    retries: int = 0

    def push(self, due: float, frame: bytes, size: int) -> None:
        """`size`: the bytes the link's rate is spent on (on the fibre: the frame as sealed)."""
        self.frames.append((due, frame, size))

    def release(self, now: float, send) -> int:
        """Send each frame whose turn has come, in order, with `send(frame)` (True: taken, False: the
        kernel is busy, try again later); the bytes let out."""
        out = 0
        if now < self.retry_at:
            return out
        while self.frames:
            due, frame, size = self.frames[0]
            start = max(due, self.free, now - BURST_S)
            if start > now:
                break
            if not send(frame):
                self.retry_at, self.retries = now + RETRY_S, self.retries + 1
                break
            self.frames.popleft()
            out += len(frame)
            self.free = start + (size * 8 / self.rate_bps if self.rate_bps else 0.0)
            if now - due > 1e-3:
                self.late_us = max(self.late_us, int((now - due) * 1e6))
        return out

    def next_time(self) -> float | None:
        return max(self.frames[0][0], self.free, self.retry_at) if self.frames else None


@dataclass
class Direction:
    """One way along one link: `src` (router side) -> fibre `tx`; far fibre `rx` -> `dst` (router side)."""
    name: str
    src: socket.socket
    tx: socket.socket
    rx: socket.socket
    dst: socket.socket
    delay: float
    jitter: float
    loss: float
    limit: int
    rate_bps: int
    seal: esp.Sa | None
    opens: dict[int, esp.Sa] | None
    rng: random.Random
    held_bytes: int = 0
    last_release: float = 0.0
    c: dict = field(default_factory=lambda: dict.fromkeys(
        ("frames", "bytes", "delivered", "delivered_bytes", "lost", "overflow", "not_ip", "bad_icv", "send_errors",
         "socket_drops", "max_lag_us", "send_retries"), 0))

    def __post_init__(self):
        self.fibre = Paced(self.rate_bps)     # sealed frames on their way along the fibre
        self.landing = Paced(self.rate_bps)   # opened at the far end, on their way into the router

    def count_socket_drops(self) -> None:
        """Frames the kernel dropped because the line's sockets were full (each socket is read by
        one direction only: `src` by take, `rx` by deliver); reading the statistics resets them."""
        for sock in (self.src, self.rx):
            stats = sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
            self.c["socket_drops"] += struct.unpack("II", stats)[1]     # struct tpacket_stats: packets, drops
        self.c["max_lag_us"] = max(self.fibre.late_us, self.landing.late_us)
        self.c["send_retries"] = self.fibre.retries + self.landing.retries

    def take(self, now: float) -> None:
        """Frames the router sent onto the line: lose, seal, and queue them with their release time."""
        for frame, arrived in _drain(self.src, now):
            self.c["frames"] += 1
            self.c["bytes"] += len(frame)
            if self.loss and self.rng.random() < self.loss:
                self.c["lost"] += 1
                continue
            if self.held_bytes + len(frame) > self.limit:
                self.release(now)         # after a stall, frames already due make room
            if self.held_bytes + len(frame) > self.limit:
                self.c["overflow"] += 1
                continue
            if self.seal is not None:
                sealed = esp.encapsulate(self.seal, frame)
                if sealed is None:
                    self.c["not_ip"] += 1
                    continue
                frame = sealed
            due = arrived + self.delay + (self.rng.random() * self.jitter if self.jitter else 0.0)
            self.last_release = due = max(due, self.last_release)
            self.fibre.push(due, frame, len(frame))   # the fibre carries the sealed frame, ESP and all
            self.held_bytes += len(frame)

    def release(self, now: float) -> None:
        self.held_bytes -= self.fibre.release(now, lambda frame: _send(self.tx, frame, self.c))

    def deliver(self, now: float) -> None:
        """Frames arriving at the far end of the fibre: open them and hand them to the router."""
        for frame, arrived in _drain(self.rx, now):
            if self.opens is not None:
                opened = esp.decapsulate(self.opens, frame)
                if opened is None:
                    self.c["bad_icv"] += 1
                    continue
                frame = opened
            self.landing.push(arrived, frame, len(frame))
        self.land(now)

    def land(self, now: float) -> None:
        self.landing.release(now, self._deliver_one)

    def _deliver_one(self, frame: bytes) -> bool:
        if not _send(self.dst, frame, self.c):
            return False
        self.c["delivered"] += 1
        self.c["delivered_bytes"] += len(frame)
        return True

    def next_release(self) -> float | None:
        times = [t for t in (self.fibre.next_time(), self.landing.next_time()) if t is not None]
        return min(times) if times else None


def _drain(sock: socket.socket, now: float):
    """(frame, when it arrived on time.monotonic()'s clock) for each frame waiting on the socket."""
    to_monotonic = time.monotonic() - time.time()   # the kernel stamps frames on the wall clock
    while True:
        try:
            data, ancillary, _, addr = sock.recvmsg(65536, CMSG_SPACE)
        except BlockingIOError:
            return
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        arrived = now
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(value) >= TIMESPEC.size:
                sec, nsec = TIMESPEC.unpack_from(value)
                arrived = min(now, sec + nsec / 1e9 + to_monotonic)
        yield data, arrived


def _send(sock: socket.socket, frame: bytes, c: dict) -> bool:
    """False if the kernel is busy (the caller keeps the frame); any other error loses it, counted."""
    try:
        sock.send(frame)
    except OSError as e:
        if e.errno in BUSY:
            return False
        c["send_errors"] += 1
    return True


def directions(plan: LabPlan, link: Link, keys: dict, seed: int) -> list[Direction]:
    (near, _, _), (_, _, _), (far, _, _), (_, _, _) = wires.ports(link)
    sndbuf = send_buffer(plan)
    near_a, near_fibre = packet_socket(near, "a", sndbuf), packet_socket(near, "fibre", sndbuf)
    far_fibre, far_b = packet_socket(far, "fibre", sndbuf), packet_socket(far, "b", sndbuf)
    delay, jitter = link.lab_delay_ns / 1e9, link.lab_jitter_ns / 1e9
    limit = 2 * int(link.lab_rate_bps / 8 * 2 * (delay + jitter)) + (4 << 20) + link.lab_rate_bps // 8
    sas = {k: esp.Sa.from_dict(v) for k, v in keys.get(str(link.id), {}).items()}
    ab, ba = sas.get("ab"), sas.get("ba")
    return [
        Direction(f"{link.a}->{link.b}", near_a, near_fibre, far_fibre, far_b, delay, jitter, link.loss, limit,
                  link.lab_rate_bps, ab, {ab.spi: ab} if ab else None, random.Random(seed)),
        Direction(f"{link.b}->{link.a}", far_b, far_fibre, near_fibre, near_a, delay, jitter, link.loss, limit,
                  link.lab_rate_bps, ba, {ba.spi: ba} if ba else None, random.Random(seed + 1)),
    ]


class Line:
    def __init__(self, plan: LabPlan, lab_dir: Path | None):
        keys_file = lab_dir / "esp-keys.json" if lab_dir else None
        keys = json.loads(keys_file.read_text()) if keys_file and keys_file.exists() else {}
        self.lab_dir = lab_dir
        # wan.json is written off the line's loop: a blocked file write would hold every frame in flight
        self.files = Publisher(lab_dir / "wan.json", None) if lab_dir else None
        self.dirs: list[Direction] = []
        self.senders: list[tuple[Direction, str, str]] = []     # each direction and the port that feeds it
        for link in wires.wired(plan):
            made = directions(plan, link, keys, seed=2 * link.id + 1)
            self.dirs += made
            self.senders += [(d, *end.split(":", 1)) for d, end in zip(made, (link.a, link.b))]
        self.plan_seen = self._plan_stamp()
        # every socket, with the directions that read from it (a fibre end serves both)
        self.readers: dict[int, list] = {}
        for d in self.dirs:
            self.readers.setdefault(d.src.fileno(), []).append(d.take)
            self.readers.setdefault(d.rx.fileno(), []).append(d.deliver)

    def _plan_stamp(self):
        try:
            st = (self.lab_dir / "plan.json").stat() if self.lab_dir else None
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_ino) if st else None

    def follow_rates(self) -> None:
        """`labctl tc set --rate` on a port that feeds the line rewrites the lab's record: the line
        carries that direction at the port's new rate from then on (it paced at the rate `up`
        gave, and a port set faster than that still left at the old rate)."""
        stamp = self._plan_stamp()
        if stamp == self.plan_seen:
            return
        self.plan_seen = stamp
        try:
            plan = LabPlan.from_lab_dir(self.lab_dir)
        except (OSError, ValueError, KeyError):
            return                              # caught half-written: the next look reads it whole
        for d, node, port in self.senders:
            shaping = plan.node(node).iface(port).shaping
            if shaping is not None and shaping.rate_bps and shaping.rate_bps != d.rate_bps:
                d.rate_bps = d.fibre.rate_bps = d.landing.rate_bps = shaping.rate_bps

    def counters(self) -> dict:
        for d in self.dirs:
            d.count_socket_drops()
        return {"time": time.monotonic(), "directions": [{"name": d.name, "held_bytes": d.held_bytes, **d.c}
                                                          for d in self.dirs]}

    def run(self) -> None:
        last = 0.0
        waiter = Waiter()                 # not select(): no ceiling on descriptors, nanosecond deadlines
        for fd in self.readers:
            waiter.register(fd)
        while True:
            now = time.monotonic()
            due = [t for t in (d.next_release() for d in self.dirs) if t is not None]
            timeout = max(0.0, min(due) - now) if due else COUNTERS_EVERY
            readable = waiter.wait(min(timeout, COUNTERS_EVERY))
            now = time.monotonic()
            for fd in readable:
                for handler in self.readers[fd]:
                    handler(now)
            for d in self.dirs:
                d.release(now)
                d.land(now)
            if now - last >= COUNTERS_EVERY:
                self.follow_rates()
                if self.files:
                    self.files.publish(self.counters())
                last = now


def main() -> None:
    helpers.serve(Line)


if __name__ == "__main__":
    main()
