"""The sending side of an agent: QPs, PSNs, GSO sends, and go-back-N when reliability is on.

In reliable mode a QP keeps its unacknowledged messages; a NAK (AETH syndrome 0x60, PSN sequence
error) or a retransmission timeout sends everything again from the PSN the receiver expects, as
an RC QP does. Otherwise packets are sent once and loss shows up at the receiver as PSN gaps.
"""
from __future__ import annotations

import errno
import math
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from labctl.traffic import roce

IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2   # not exported by Python 3.11's socket module
UDP_SEGMENT = 103                          # linux/udp.h
# A paced QP whose rate would hold a whole GSO batch back longer than this (lab seconds) sends one
# frame per send: at DCQCN's minimum rate a batch of 15 frames would leave its receiver hearing
# nothing for 15 frames' time (over three minutes at dilation 4000), one frame for 13 s.
PACED_BATCH_MAX_S = 0.2


# what a frame adds on the wire to the UDP payload a send carries (BTH and ICRC are in the payload)
WIRE_EXTRA = roce.FRAME_OVERHEAD - roce.BTH_LEN - roce.ICRC_LEN


def qpn(rank: int, peer: int, k: int) -> int:
    """QP number at `rank` for its k-th QP toward `peer` (≥ 2: QP0/QP1 are special)."""
    return 0x100000 | (rank & 0xFF) << 12 | (peer & 0x1FF) << 3 | (k & 7)


def qpn_fields(q: int) -> tuple[int, int, int]:
    return (q >> 12) & 0xFF, (q >> 3) & 0x1FF, q & 7


def psn_before(a: int, b: int) -> bool:
    """a comes before b in 24-bit PSN space."""
    return 0 < (b - a) & roce.PSN_MASK < 1 << 23


@dataclass
class Message:
    first: int
    last: int
    length: int
    imm: int
    builder: roce.MessageBuilder
    sock: socket.socket
    dest: tuple


@dataclass
class QpTx:
    psn: int = 0
    packets: int = 0
    bytes: int = 0
    acks: int = 0
    naks: int = 0
    cnp_received: int = 0
    retransmitted: int = 0
    retransmitted_bytes: int = 0
    timeouts: int = 0
    unacked: deque = field(default_factory=deque)
    resend_from: int | None = None
    rp: object = None               # DCQCN reaction point when rate control is on
    next_send: float = 0.0
    sent_upto: int = 0          # the first PSN not sent yet (go-back-N never runs ahead of it)
    last_progress: float = 0.0

    def public(self) -> dict:
        out = {k: getattr(self, k) for k in ("psn", "packets", "bytes", "acks", "naks", "cnp_received",
                                             "retransmitted", "retransmitted_bytes", "timeouts")}
        if self.rp is not None:
            out["dcqcn_cuts"] = self.rp.cuts
            out["dcqcn_rate_bps"] = self.rp.rc
        return out


class Sender:
    socket_type = socket.socket

    def __init__(self, rank: int, mtu: int, sport_policy: str, rng, reliable: bool, gso: bool = True,
                 priorities: dict[int, int] | None = None, dcqcn=None):
        self.rank, self.mtu, self.sport_policy, self.rng = rank, mtu, sport_policy, rng
        self.priorities = priorities or {}  # DSCP → skb->priority: the HTB class of the host's own port
        self.dcqcn = dcqcn                  # dcqcn.Params (lab-scaled) or None
        self.reliable, self.gso = reliable, gso
        self.qps: dict[int, QpTx] = {}
        self.sockets: dict = {}
        self.builders: dict = {}
        self.lock = threading.Lock()
        self.deadline = math.inf            # the running operation's (Agent.run sets it)

    def qp(self, lq: int) -> QpTx:
        q = self.qps.get(lq)
        if q is None:
            q = self.qps[lq] = QpTx()
        return q

    def socket_for(self, src: str, sport: int, tos: int) -> socket.socket:
        key = (src, sport, tos)
        s = self.sockets.get(key)
        if s is None:
            s = self.socket_type(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            # unconnected + PMTUDISC_DO: DF set and IP ID 0, so the precomputed ICRC holds on the wire
            s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            if tos >> 2 in self.priorities:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, self.priorities[tos >> 2])
            s.bind((src, sport))
            self.sockets[key] = s
        return s

    def _sport(self, lq: int, rq: int) -> int:
        if self.sport_policy == "fixed":
            return 0xC000
        if self.sport_policy == "random":
            return self.rng.randrange(0xC000, 0x10000)
        return roce.udp_sport(lq, rq)

    def _builder(self, src: str, dst: str, sport: int, rq: int) -> roce.MessageBuilder:
        key = (src, dst, sport, rq)
        b = self.builders.get(key)
        if b is None:
            b = self.builders[key] = roce.MessageBuilder(src, dst, sport, rq, self.mtu)
        return b

    def send_message(self, t: dict) -> None:
        lq, rq = qpn(self.rank, t["dst"], t["qp"]), qpn(t["dst"], self.rank, t["qp"])
        q = self.qp(lq)
        sport = self._sport(lq, rq)
        sock = self.socket_for(t["src_addr"], sport, roce.TOS_DATA)
        builder = self._builder(t["src_addr"], t["dst_addr"], sport, rq)
        dest = (t["dst_addr"], roce.ROCE_PORT)
        npkts = len(roce.message_opcodes(t["nbytes"], self.mtu))
        if self.dcqcn is not None and q.rp is None:
            from labctl.traffic.dcqcn import ReactionPoint
            q.rp = ReactionPoint(t["line_rate"], self.dcqcn, time.monotonic())
        if self.reliable:
            with self.lock:
                if not q.unacked:
                    # the timer runs only while something is outstanding: a QP idle since its last
                    # ACK would otherwise resend this message as soon as it is sent
                    q.last_progress = time.monotonic()
                q.unacked.append(Message(q.psn, (q.psn + npkts - 1) & roce.PSN_MASK, t["nbytes"], t["id"],
                                         builder, sock, dest))
        resume = self._send_batched(q, builder, sock, dest, t) if self.gso else q.psn
        if resume is not None:
            self._send_each(q, builder, sock, dest, t, resume)
        q.psn = (q.psn + npkts) & roce.PSN_MASK
        if self.reliable:
            with self.lock:     # the timer counts from the last packet out: a paced message can take
                q.last_progress = time.monotonic()      # longer than the timer to leave

    def _send_batched(self, q: QpTx, builder, sock, dest, t: dict) -> int | None:
        """Runs of Middle packets leave in one UDP_SEGMENT send; the host's veth (no checksum offload,
        so no UDP GSO feature) cuts them into real frames before they enter the fabric. Returns None
        when the message is out, or the PSN to go on from one packet per send: a kernel before 6.11
        refuses UDP GSO from a device without checksum offload (EIO, and nothing left)."""
        for psn, buf, seg, count in builder.gso_batches(q.psn, t["nbytes"], t["id"]):
            if q.rp is not None:
                wire = len(buf) + count * WIRE_EXTRA
                if count > 1 and wire * 8 / self._rate(q) > PACED_BATCH_MAX_S:
                    return psn     # the rest of this message one frame per send (a batch's IP IDs are its own)
                self._pace(q, wire)
            try:
                send(sock, buf, [(socket.SOL_UDP, UDP_SEGMENT, struct.pack("H", seg))] if count > 1 else [], dest)
            except OSError as exc:
                if exc.errno != errno.EIO or count == 1:
                    raise
                self.gso = False
                return psn
            q.packets += count
            q.bytes += len(buf)
            q.sent_upto = (psn + count) & roce.PSN_MASK
            if self.reliable and q.resend_from is not None:
                self.go_back(q)
        return None

    def _send_each(self, q: QpTx, builder, sock, dest, t: dict, start: int) -> None:
        """One packet per send from PSN `start` on (each with IP ID 0, as its ICRC assumes)."""
        for psn, payload in builder.packets(q.psn, t["nbytes"], t["id"]):
            if psn_before(psn, start):
                continue
            if q.rp is not None:
                self._pace(q, len(payload) + WIRE_EXTRA)
            send(sock, payload, [], dest)
            q.packets += 1
            q.bytes += len(payload)
            q.sent_upto = (psn + 1) & roce.PSN_MASK
            if self.reliable and q.resend_from is not None:
                self.go_back(q)

    def _rate(self, q: QpTx) -> float:
        with self.lock:
            return q.rp.rate(time.monotonic())

    def _pace(self, q: QpTx, wire_bytes: int) -> None:
        """Hold a QP to its DCQCN rate: each batch leaves no earlier than its predecessor's end."""
        now = time.monotonic()
        with self.lock:
            rate = q.rp.rate(now)
            q.rp.on_sent(wire_bytes, now)
        if q.next_send > now:
            time.sleep(q.next_send - now)
            now = q.next_send
        q.next_send = now + wire_bytes * 8 / rate

    def on_cnp(self, lq: int) -> None:
        q = self.qp(lq)
        q.cnp_received += 1
        if q.rp is not None:
            with self.lock:
                q.rp.on_cnp(time.monotonic())

    # -- reliability -----------------------------------------------------------------------------
    def on_ack(self, lq: int, psn: int, syndrome: int) -> None:
        q = self.qp(lq)
        with self.lock:
            if syndrome == 0:
                q.acks += 1
                while q.unacked and not psn_before(psn, q.unacked[0].last):
                    q.unacked.popleft()
                q.last_progress = time.monotonic()
            else:
                q.naks += 1
                if syndrome == roce.NAK_PSN_SEQ_ERR:
                    q.resend_from = psn

    def go_back(self, q: QpTx) -> None:
        """Send again every unacknowledged packet from the PSN the receiver asked for, at the QP's
        DCQCN rate when it has one (a NIC's rate limiter holds every packet of the QP, resends
        too). Not past the operation's deadline: under go-back-N a sprayed flow's resends are
        reordered and asked for again without end, and an agent that went on resending ran its
        operation to twice its `timeout`. The request is kept, so the next operation's first pass
        resends from there (from where a paced resend stopped, if the deadline came during it)."""
        if time.monotonic() > self.deadline:
            return
        with self.lock:
            start, q.resend_from = q.resend_from, None
            msgs = list(q.unacked)
        if start is None:
            return
        for m in msgs:
            if psn_before(m.last, start):
                continue
            for psn, payload in m.builder.packets(m.first, m.length, m.imm):
                if psn_before(psn, start):
                    continue
                if not psn_before(psn, q.sent_upto):
                    return  # the rest of this message has not been sent for the first time yet
                wire = len(payload) + WIRE_EXTRA
                if q.rp is not None:    # a paced pass takes time: the receiver's word may change meanwhile
                    with self.lock:
                        if q.resend_from is not None:
                            return      # a new NAK or time-out: the next pass starts where it asks
                        if time.monotonic() > self.deadline:
                            q.resend_from = psn
                            return
                        if not q.unacked:
                            return
                        acked = psn_before(psn, q.unacked[0].first)
                    if acked:
                        continue        # acknowledged since the pass began
                    self._pace(q, wire)
                send(m.sock, payload, [], m.dest)
                q.retransmitted += 1
                q.retransmitted_bytes += wire
        q.last_progress = time.monotonic()

    def settle(self, deadline: float, rto: float) -> bool:
        """Reliable mode: answer NAKs and time-outs until every message is acknowledged."""
        if not self.reliable:
            return True
        while time.monotonic() < deadline:
            if not self.service(rto):
                return True
            time.sleep(0.001)
        return False

    def service(self, rto: float) -> bool:
        """Reliable mode, one pass: resend after a NAK or once `rto` passed without progress. Also
        called while the agent waits for a message it depends on: its peer may be waiting for one
        of ours that was lost, and only we can resend it. True while messages are unacknowledged."""
        pending = [q for q in self.qps.values() if q.unacked] if self.reliable else []
        for q in pending:
            if q.resend_from is None and time.monotonic() - q.last_progress > rto:
                with self.lock:
                    if q.unacked:
                        q.resend_from = q.unacked[0].first  # the tail was lost: no NAK can come
                        q.timeouts += 1
            if q.resend_from is not None:
                self.go_back(q)
        return bool(pending)


def send(sock: socket.socket, buf, cmsg: list, dest) -> None:
    while True:
        try:
            sock.sendmsg([buf], cmsg, 0, dest)
            return
        except (BlockingIOError, InterruptedError):
            time.sleep(0.0001)
        except OSError as exc:  # ENOBUFS: a local qdisc refused it; retry as a NIC would
            if exc.errno != errno.ENOBUFS:
                raise
            time.sleep(0.0005)
