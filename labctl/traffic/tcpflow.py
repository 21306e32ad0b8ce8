"""Real TCP flows between lab hosts: checkpoint writes, dataset reads, telemetry, bulk transfers.

Sockets are opened inside the hosts' namespaces (a socket stays in the namespace it was made in)
and driven by threads of the calling process: one thread per source and flow sends its transfers
one after the other (`period` apart, or back to back), one acceptor per destination hands each
connection to a reader, which learns from the connection's first 8 bytes which transfer it
carries. The reader counts every byte; the sender reads TCP_INFO for retransmissions and RTT.

Each sequence sends from its own fixed source port, so a flow hashes onto the same ECMP path in
every run of a lab (like RoCE QPs, whose ports follow their QP numbers): results repeat, and a
collision seen once can be studied again. The sender closes with a reset once the reader has
everything, so no TIME_WAIT holds the port against the next transfer or run.
"""
from __future__ import annotations

import itertools
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from labctl.kernel import nsutil

TCP_CONGESTION = 13
CHUNK = 256 * 1024
_INFO_RTT, _INFO_TOTAL_RETRANS = 8 + 15 * 4, 8 + 23 * 4


@dataclass
class Target:
    name: str
    namespace: str
    address: str


@dataclass
class Sequence:
    """One source's transfers of one flow: `count` (None: until stopped) of `size` bytes each."""
    flow: str
    src: str
    src_ns: str
    targets: list[Target]
    size: int
    count: int | None = 1
    period: float = 0.0          # lab seconds between transfer starts
    congestion: str = "cubic"
    offset: int = 0              # first target index, so sources spread over the targets
    sport: int = 0               # fixed TCP source port (0: the kernel picks one)


@dataclass
class Transfer:
    flow: str
    src: str
    dst: str
    size: int
    sent: int = 0
    received: int = 0
    began: float = 0.0
    ended: float = 0.0
    retransmits: int = 0
    rtt_ms: float = 0.0
    sport: int = 0
    error: str = ""
    received_at: list = field(default_factory=list)   # (t since the run started, cumulative bytes), ~10 Hz
    done: threading.Event = field(default_factory=threading.Event)

    def summary(self) -> dict:
        seconds = max(1e-9, (self.ended or self.began) - self.began)
        return {"flow": self.flow, "src": self.src, "dst": self.dst, "size": self.size, "received": self.received,
                "seconds": round(seconds, 4), "goodput_bps": round(self.received * 8 / seconds),
                "sport": self.sport, "retransmits": self.retransmits, "rtt_ms": round(self.rtt_ms, 2), "error": self.error,
                "start_s": round(self.began, 4), "received_at": self.received_at}


class FlowRun:
    def __init__(self, sequences: list[Sequence], port: int = 5201):
        self.sequences, self.port = sequences, port
        self.stop = threading.Event()
        self.transfers: dict[int, Transfer] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.listeners: list[socket.socket] = []
        self.acceptors: list[threading.Thread] = []
        self.t0 = 0.0
        for addr in {(t.namespace, t.address) for s in sequences for t in s.targets}:
            with nsutil.entered(addr[0]):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((addr[1], port))
            sock.listen(128)
            sock.settimeout(0.2)
            self.listeners.append(sock)

    def start(self) -> "FlowRun":
        self.t0 = time.monotonic()
        self.acceptors = [self._thread(self._accept, sock) for sock in self.listeners]
        self.senders = [self._thread(self._send_all, s) for s in self.sequences]
        return self

    def _thread(self, target, *args) -> threading.Thread:
        th = threading.Thread(target=target, args=args, daemon=True)
        th.start()
        self.threads.append(th)
        return th

    def _accept(self, listener: socket.socket) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = listener.accept()
            except (socket.timeout, OSError):
                continue
            self._thread(self._receive, conn)

    def _send_all(self, s: Sequence) -> None:
        for c in itertools.count() if s.count is None else range(s.count):
            if self.stop.wait(max(0.0, self.t0 + c * s.period - time.monotonic())):
                return
            target = s.targets[(s.offset + c) % len(s.targets)]
            t = Transfer(s.flow, s.src, target.name, s.size)
            with self.lock:
                tid = next(self.ids)
                self.transfers[tid] = t
            self._send(s, target, t, tid)

    def _send(self, s: Sequence, target: Target, t: Transfer, tid: int) -> None:
        try:
            with nsutil.entered(s.src_ns):
                c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            with c:
                self._transfer(c, s, target, t, tid)
        except OSError as exc:
            t.error = str(exc)
            t.done.set()

    def _transfer(self, c: socket.socket, s: Sequence, target: Target, t: Transfer, tid: int) -> None:
        c.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, s.congestion.encode())
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        if s.sport:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            c.bind(("", s.sport))
        t.began = time.monotonic() - self.t0
        c.connect((target.address, self.port))
        t.sport = c.getsockname()[1]
        c.sendall(struct.pack("!Q", tid))
        data = memoryview(bytes(CHUNK))
        while t.sent < t.size and not self.stop.is_set():
            t.sent += c.send(data[:min(CHUNK, t.size - t.sent)])
        t.rtt_ms = struct.unpack_from("I", c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104), _INFO_RTT)[0] / 1e3
        c.shutdown(socket.SHUT_WR)
        t.done.wait(timeout=None if not self.stop.is_set() else 5)
        info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        t.retransmits = struct.unpack_from("I", info, _INFO_TOTAL_RETRANS)[0]

    def _receive(self, conn: socket.socket) -> None:
        head = b""
        while len(head) < 8:
            more = conn.recv(8 - len(head))
            if not more:
                conn.close()
                return
            head += more
        with self.lock:
            t = self.transfers[struct.unpack("!Q", head)[0]]
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
        t.done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Until every finite sequence has sent everything; True if they all finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        # a background sequence repeats until close(): it is never waited for
        finite = [th for th, s in zip(self.senders, self.sequences) if s.count is not None]
        for th in finite:
            th.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(th.is_alive() for th in finite)

    def close(self) -> list[dict]:
        self.stop.set()
        for th in self.senders:
            th.join(timeout=10)
        # An accept thread polling the listener holds the kernel socket open past close(), so a run
        # started at once would find the port still listening: stop the acceptors first
        for th in self.acceptors:
            th.join(timeout=5)
        for sock in self.listeners:
            sock.close()
        with self.lock:
            return [t.summary() for t in self.transfers.values()]
