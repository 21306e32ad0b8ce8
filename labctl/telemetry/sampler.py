"""Per-port, per-class queue time series during a run, at 100 Hz or more, into queues.csv.

Columns: t_s (lab seconds since the sampler started), node, port, class, tc, depth_bytes,
sent_bytes, sent_packets, drops (cumulative counters of that class's queue). A row is written
when any of them changed since the queue's previous row, so idle queues cost nothing.
"""
from __future__ import annotations

import csv
import threading
import time
from pathlib import Path

from labctl.backends import nsutil, rtnl
from labctl.dataplane import qdepth, qos
from labctl.plan.model import LabPlan

COLUMNS = ("t_s", "node", "port", "class", "tc", "depth_bytes", "sent_bytes", "sent_packets", "drops")


class QueueSampler:
    def __init__(self, plan: LabPlan, path: Path, hz: float = 200.0):
        self.plan, self.path, self.period = plan, path, 1.0 / hz
        self.names: dict[tuple[str, int, int], tuple[str, str, int]] = {}
        self.socks = []
        for node in plan.nodes:
            if not nsutil.exists(node.namespace):
                continue
            with nsutil.entered(node.namespace):
                self.socks.append((node.name, rtnl.open_socket()))
            for i in node.interfaces:
                for c in i.shaping.classes:
                    self.names[(node.name, i.index, qos.leaf_handle(c.tc) >> 16)] = (i.name, c.name, c.tc)
        self.stop = threading.Event()
        self.samples = 0
        self.duration = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "QueueSampler":
        self.thread.start()
        return self

    def _run(self) -> None:
        last: dict = {}
        t0 = time.monotonic()
        with open(self.path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(COLUMNS)
            next_t = t0
            while not self.stop.is_set():
                t = time.monotonic() - t0
                for node, sock in self.socks:
                    for q in qdepth.dump(sock):
                        key = (node, q.ifindex, q.handle >> 16)
                        name = self.names.get(key)
                        if name is None:
                            continue
                        row = (q.backlog, q.bytes, q.packets, q.drops)
                        if last.get(key) != row:
                            last[key] = row
                            w.writerow((f"{t:.4f}", node, name[0], name[1], name[2], *row))
                self.samples += 1
                next_t += self.period
                delay = next_t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    next_t = time.monotonic()  # fell behind: do not try to catch up in a burst
        self.duration = time.monotonic() - t0

    def close(self) -> dict:
        self.stop.set()
        self.thread.join(timeout=5)
        for _, sock in self.socks:
            sock.close()
        return {"file": self.path.name, "samples": self.samples, "seconds": round(self.duration, 3),
                "rate_hz": round(self.samples / self.duration, 1) if self.duration else 0.0}
