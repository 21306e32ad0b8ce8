"""The WAN line: one process per lab that carries every wired link (backends/wires.py).

For each direction of each link it reads the frames the sending router puts on the line, loses
some at random (`loss`), encrypts them (ESP, when the link says `encrypt`), holds them for the
link's one-way delay plus up to `jitter` (never reordering: a frame leaves no earlier than the one
before it), and puts them on the fibre; the far end decrypts and hands them to the receiving
router. The buffer of the WAN is the routers' egress queue (deep, BDP-sized by default); the line
itself only bounds what is in flight (2 x BDP + 4 MB) and counts what it drops.

    python -m labctl.wan.line LAB_DIR
"""
from __future__ import annotations

import json
import random
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from labctl.backends import nsutil, wires
from labctl import helpers
from labctl.helpers import Publisher
from labctl.plan.model import LabPlan, Link
from labctl.wakeup import Waiter
from labctl.wan import esp

ETH_P_ALL = 0x0003
COUNTERS_EVERY = 0.2


def packet_socket(namespace: str, port: str) -> socket.socket:
    with nsutil.entered(namespace):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((port, ETH_P_ALL))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    # no PACKET_QDISC_BYPASS: it skips the capture taps too, and a capture on the fibre must see both ways
    s.setblocking(False)
    return s


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
    seal: esp.Sa | None
    opens: dict[int, esp.Sa] | None
    rng: random.Random
    held: deque = field(default_factory=deque)
    held_bytes: int = 0
    last_release: float = 0.0
    c: dict = field(default_factory=lambda: dict.fromkeys(
        ("frames", "bytes", "delivered", "delivered_bytes", "lost", "overflow", "not_ip", "bad_icv", "send_errors"), 0))

    def take(self, now: float) -> None:
        """Frames the router sent onto the line: lose, seal, and queue them with their release time."""
        for frame in _drain(self.src):
            self.c["frames"] += 1
            self.c["bytes"] += len(frame)
            if self.loss and self.rng.random() < self.loss:
                self.c["lost"] += 1
                continue
            if self.held_bytes + len(frame) > self.limit:
                self.c["overflow"] += 1
                continue
            if self.seal is not None:
                sealed = esp.encapsulate(self.seal, frame)
                if sealed is None:
                    self.c["not_ip"] += 1
                    continue
                frame = sealed
            release = now + self.delay + (self.rng.random() * self.jitter if self.jitter else 0.0)
            self.last_release = release = max(release, self.last_release)
            self.held.append((release, frame))
            self.held_bytes += len(frame)

    def release(self, now: float) -> None:
        while self.held and self.held[0][0] <= now:
            _, frame = self.held.popleft()
            self.held_bytes -= len(frame)
            _send(self.tx, frame, self.c)

    def deliver(self) -> None:
        """Frames arriving at the far end of the fibre: open them and hand them to the router."""
        for frame in _drain(self.rx):
            if self.opens is not None:
                opened = esp.decapsulate(self.opens, frame)
                if opened is None:
                    self.c["bad_icv"] += 1
                    continue
                frame = opened
            self.c["delivered"] += 1
            self.c["delivered_bytes"] += len(frame)
            _send(self.dst, frame, self.c)

    def next_release(self) -> float | None:
        return self.held[0][0] if self.held else None


def _drain(sock: socket.socket):
    while True:
        try:
            data, addr = sock.recvfrom(65536)
        except BlockingIOError:
            return
        if addr[2] != socket.PACKET_OUTGOING:
            yield data


def _send(sock: socket.socket, frame: bytes, c: dict) -> None:
    try:
        sock.send(frame)
    except OSError:
        c["send_errors"] += 1


def directions(plan: LabPlan, link: Link, keys: dict, seed: int) -> list[Direction]:
    (near, _, _), (_, _, _), (far, _, _), (_, _, _) = wires.ports(link)
    near_a, near_fibre = packet_socket(near, "a"), packet_socket(near, "fibre")
    far_fibre, far_b = packet_socket(far, "fibre"), packet_socket(far, "b")
    delay, jitter = link.lab_delay_ns / 1e9, link.lab_jitter_ns / 1e9
    limit = 2 * int(link.lab_rate_bps / 8 * 2 * (delay + jitter)) + (4 << 20)
    sas = {k: esp.Sa.from_dict(v) for k, v in keys.get(str(link.id), {}).items()}
    ab, ba = sas.get("ab"), sas.get("ba")
    return [
        Direction(f"{link.a}->{link.b}", near_a, near_fibre, far_fibre, far_b, delay, jitter, link.loss, limit,
                  ab, {ab.spi: ab} if ab else None, random.Random(seed)),
        Direction(f"{link.b}->{link.a}", far_b, far_fibre, near_fibre, near_a, delay, jitter, link.loss, limit,
                  ba, {ba.spi: ba} if ba else None, random.Random(seed + 1)),
    ]


class Line:
    def __init__(self, plan: LabPlan, lab_dir: Path | None):
        keys_file = lab_dir / "esp-keys.json" if lab_dir else None
        keys = json.loads(keys_file.read_text()) if keys_file and keys_file.exists() else {}
        self.lab_dir = lab_dir
        # wan.json is written off the line's loop: a blocked file write would hold every frame in flight
        self.files = Publisher(lab_dir / "wan.json", None) if lab_dir else None
        self.dirs: list[Direction] = []
        for link in wires.wired(plan):
            self.dirs += directions(plan, link, keys, seed=2 * link.id + 1)
        # every socket, with the directions that read from it (a fibre end serves both)
        self.readers: dict[int, list] = {}
        for d in self.dirs:
            self.readers.setdefault(d.src.fileno(), []).append(d.take)
            self.readers.setdefault(d.rx.fileno(), []).append(lambda now, d=d: d.deliver())

    def counters(self) -> dict:
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
            if self.files and now - last >= COUNTERS_EVERY:
                self.files.publish(self.counters())
                last = now


def main() -> None:
    helpers.serve(Line)


if __name__ == "__main__":
    main()
