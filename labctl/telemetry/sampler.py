"""Per-port, per-class queue time series during a run, at 100 Hz or more, into queues.csv.

Columns: t_s (lab seconds since the sampler started), node, port, class, tc, depth_bytes,
sent_bytes, sent_packets, drops (cumulative counters of that class's queue), ecn_marked (packets
this port's class marked CE, cumulative, from the marking rule's nft counter), pfc_tx, pfc_rx
(PFC frames sent / received on this port for this class) and paused_s (time this class was held
by pauses from the neighbour). PFC columns come from the switch agents' reports (agentreport.py), which they rewrite
within 10 ms of a change. A row is written when any column changed since the queue's previous
row, so idle queues cost nothing.
"""
from __future__ import annotations

import csv
import threading
import time
from pathlib import Path

from labctl import procs
from labctl.kernel import ecnpath, fastmaps, nsutil, rtnl
from labctl.plan import qos
from labctl.telemetry import agentreport, nftcounters, qdepth, reaction
from labctl.telemetry.nftcounters import family_of as nft_family
from labctl.plan.model import LabPlan

COLUMNS = ("t_s", "node", "port", "class", "tc", "depth_bytes", "sent_bytes", "sent_packets", "drops",
           "ecn_marked", "pfc_tx", "pfc_rx", "paused_s")


class PfcFile:
    """The switch agents' counters (agentreport.py), re-read only when a report changed; and every
    slow read they listed while this watched (end -> (took, late wake-ups)), since each lists only
    its latest (reaction.read_long)."""
    def __init__(self, lab_path: Path | None):
        self.watch = agentreport.Watch(lab_path)
        self.ports = {}
        self.long_reads: dict[float, tuple] = {}
        self.newest = 0.0

    def get(self) -> dict[tuple[str, str, int], dict]:
        doc = self.watch.get()
        if doc is not None:
            try:
                self.ports = {(p["node"], p["port"], p["tc"]): p for p in doc["ports"]}
                self._add_long_reads(doc.get("long_reads") or [])
            except (KeyError, TypeError):
                pass
        return self.ports

    def _add_long_reads(self, reads: list) -> None:
        # each agent lists its reads oldest first, but the merged list of several agents is only
        # sorted: a slower agent's old read can come after another's newer one, so each is added
        self.long_reads.update((end, (took, wakes)) for end, took, wakes in map(reaction.parse_long, reads))


class QueueSampler:
    def __init__(self, plan: LabPlan, path: Path, hz: float = 200.0, lab_path: Path | None = None):
        self.plan, self.path, self.period = plan, path, 1.0 / hz
        self.pfc = PfcFile(lab_path)
        self.names: dict[tuple[str, int, int], tuple[str, str, int, str]] = {}   # port, class, tc, CE counter
        self.socks = []
        self.marking: dict = {}     # nodes whose programs mark (ecnpath.Queues, fastmaps.Marking)
        for node in plan.nodes:
            if not nsutil.exists(node.namespace):
                continue
            marks = node.switching and any(c.ecn for i in node.interfaces for c in i.shaping.classes)
            with nsutil.entered(node.namespace):
                self.socks.append((node.name, rtnl.open_socket(), nftcounters.open_socket() if marks else None,
                                   nft_family(node)))
            if marks:
                sock = self.socks[-1][1]
                found = ecnpath.open_queues(sock, node) or fastmaps.open_marking(sock, node)
                if found is not None:
                    self.marking[node.name] = found
            for i in node.interfaces:
                for c in i.shaping.classes:
                    self.names[(node.name, i.index, qos.leaf_handle(c.tc) >> 16)] = (
                        i.name, c.name, c.tc, qos.ce_counter_name(i.index, c.tc))
        self.dumps = {node: qdepth.RepeatedDump({(ifindex, major) for (n, ifindex, major) in self.names if n == node})
                      for node, _, _, _ in self.socks}
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
                pfc = self.pfc.get()
                with procs.in_kernel():     # the dumps hold rtnl: real-time for them, once per sample
                    raw = [qdepth.dump_raw(sock) for _, sock, _, _ in self.socks]
                for (node, _, nft_sock, family), chunks in zip(self.socks, raw):
                    marks = nftcounters.read_marks(nft_sock, family) if nft_sock else {}
                    if node in self.marking:
                        marks = self.marking[node].add_to(marks)
                    for q in self.dumps[node].parse(chunks):
                        key = (node, q.ifindex, q.handle >> 16)
                        name = self.names.get(key)
                        if name is None:
                            continue
                        p = pfc.get((node, name[0], name[2]))
                        row = (q.backlog, q.bytes, q.packets, q.drops, marks.get(name[3], 0),
                               *((p["pfc_tx"], p["pfc_rx"], p["paused_s"]) if p else (0, 0, 0.0)))
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
        for _, sock, nft_sock, _ in self.socks:
            sock.close()
            if nft_sock:
                nft_sock.close()
        for marking in self.marking.values():
            marking.close()
        return {"file": self.path.name, "samples": self.samples, "seconds": round(self.duration, 3),
                "rate_hz": round(self.samples / self.duration, 1) if self.duration else 0.0}
