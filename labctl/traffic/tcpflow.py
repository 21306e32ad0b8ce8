"""Real TCP flows between lab hosts: checkpoint writes, dataset reads, telemetry, bulk transfers.

Sockets are opened inside the hosts' namespaces (a socket stays in the namespace it was made in)
and driven by threads of the calling process: at lab rates one thread per flow keeps up, and the
kernel's TCP, with its congestion control, does the rest. The receiver counts every byte; the
sender reads TCP_INFO for retransmissions and the smoothed RTT.
"""
from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from labctl.backends import nsutil

TCP_CONGESTION = 13
CHUNK = 256 * 1024
_INFO_RTT, _INFO_TOTAL_RETRANS = 8 + 15 * 4, 8 + 23 * 4


@dataclass
class Transfer:
    """One connection's worth of data, `size` bytes from `src` to `dst` (lab addresses)."""
    flow: str
    src: str
    dst: str
    src_ns: str
    dst_ns: str
    dst_addr: str
    size: int
    start: float = 0.0          # lab seconds after the flows started
    congestion: str = "cubic"
    # filled in by the run
    sent: int = 0
    received: int = 0
    began: float = 0.0
    ended: float = 0.0
    retransmits: int = 0
    rtt_ms: float = 0.0
    error: str = ""
    received_at: list = field(default_factory=list)   # (t since start of the run, cumulative bytes), ~10 Hz

    def summary(self) -> dict:
        seconds = max(1e-9, self.ended - self.began)
        return {"flow": self.flow, "src": self.src, "dst": self.dst, "size": self.size, "received": self.received,
                "seconds": round(seconds, 4), "goodput_bps": round(self.received * 8 / seconds),
                "retransmits": self.retransmits, "rtt_ms": round(self.rtt_ms, 2), "error": self.error,
                "start_s": round(self.began, 4), "received_at": self.received_at}


class FlowRun:
    """Run transfers (each at its start time, one connection each) until done or stopped."""

    def __init__(self, transfers: list[Transfer], port: int = 5201):
        self.transfers, self.port = transfers, port
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.listeners: dict[tuple[str, str], socket.socket] = {}
        for t in transfers:
            key = (t.dst_ns, t.dst_addr)
            if key not in self.listeners:
                with nsutil.entered(t.dst_ns):
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((t.dst_addr, port))
                s.listen(64)
                self.listeners[key] = s
        self.t0 = 0.0

    def start(self) -> "FlowRun":
        self.t0 = time.monotonic()
        for t in self.transfers:
            th = threading.Thread(target=self._transfer, args=(t,), daemon=True)
            th.start()
            self.threads.append(th)
        return self

    def _transfer(self, t: Transfer) -> None:
        if self.stop.wait(t.start):
            return
        listener = self.listeners[(t.dst_ns, t.dst_addr)]
        try:
            with nsutil.entered(t.src_ns):
                c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            c.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, t.congestion.encode())
            t.began = time.monotonic() - self.t0
            c.connect((t.dst_addr, self.port))
            conn, _ = listener.accept()   # connections to one listener are accepted in arrival order
            reader = threading.Thread(target=self._receive, args=(t, conn), daemon=True)
            reader.start()
            data = memoryview(bytes(CHUNK))
            while t.sent < t.size and not self.stop.is_set():
                t.sent += c.send(data[:min(CHUNK, t.size - t.sent)])
            info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
            t.rtt_ms = struct.unpack_from("I", info, _INFO_RTT)[0] / 1000
            c.shutdown(socket.SHUT_WR)
            reader.join()
            info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
            t.retransmits = struct.unpack_from("I", info, _INFO_TOTAL_RETRANS)[0]
            c.close()
        except OSError as exc:
            t.error = str(exc)

    def _receive(self, t: Transfer, conn: socket.socket) -> None:
        buf = bytearray(CHUNK)
        last_mark = 0.0
        while True:
            n = conn.recv_into(buf)
            if not n:
                break
            t.received += n
            now = time.monotonic() - self.t0
            if now - last_mark >= 0.1:
                t.received_at.append((round(now, 3), t.received))
                last_mark = now
        t.ended = time.monotonic() - self.t0
        t.received_at.append((round(t.ended, 3), t.received))
        conn.close()

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for th in self.threads:
            th.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(th.is_alive() for th in self.threads)

    def close(self) -> list[dict]:
        self.stop.set()
        self.wait(timeout=10)
        for s in self.listeners.values():
            s.close()
        return [t.summary() for t in self.transfers]
