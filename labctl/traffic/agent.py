"""A traffic agent: one process per GPU rank, inside its namespace, speaking RoCEv2 over UDP 4791.

Started by the runner with `ip netns exec <lab>-<gpu> python -m labctl.traffic.agent`; it reads JSON
lines on stdin (init, run, exit) and answers on stdout. The receiver thread accounts every packet
per QP (bytes, PSN gaps, late/duplicate PSNs, ECN-CE marks), assembles messages, ACKs them, and,
as a DCQCN notification point, sends CNPs at most once per interval per QP. The sender runs the
rank's transfers in order; each one waits until the transfers it depends on have arrived here.
"""
from __future__ import annotations

import errno
import json
import os
import random
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field

from labctl.traffic import mmsg, roce

IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2   # not exported by Python 3.11's socket module
IP_RECVTOS = 13
UDP_SEGMENT = 103            # linux/udp.h
MAX_TRACKED_GAP = 4096       # PSNs remembered per gap to recognise reordering
SO_RCVBUFFORCE = 33          # root may exceed net.core.rmem_max: a burst must not overflow the socket
RCVBUF = 32 << 20


def qpn(rank: int, peer: int, k: int) -> int:
    """QP number at `rank` for its k-th QP toward `peer` (≥ 2: QP0/QP1 are special)."""
    return 0x100000 | (rank & 0xFF) << 12 | (peer & 0x1FF) << 3 | (k & 7)


def qpn_fields(q: int) -> tuple[int, int, int]:
    return (q >> 12) & 0xFF, (q >> 3) & 0x1FF, q & 7


@dataclass
class QpRx:
    """Receiver-side accounting of one QP (one sender, one connection)."""
    packets: int = 0
    bytes: int = 0
    gaps: int = 0          # PSNs that never came (before a later one did)
    late: int = 0          # PSNs behind the expected one that filled no gap: duplicates
    reordered: int = 0     # PSNs that arrived after a later one but filled their gap
    ce: int = 0            # packets that arrived with ECN CE
    cnp_sent: int = 0
    messages: int = 0
    expected_psn: int | None = None
    msg_bytes: int = 0
    msg_len: int = 0
    msg_first: int = 0
    last_cnp: float = 0.0
    missing: set = field(default_factory=set)      # PSNs skipped over, still expected late
    unfinished: list = field(default_factory=list)  # [first psn, last psn, transfer id, bytes short]


@dataclass
class QpTx:
    psn: int = 0
    packets: int = 0
    bytes: int = 0
    acks: int = 0
    naks: int = 0
    cnp_received: int = 0


@dataclass
class Agent:
    rank: int
    mtu: int
    peers: dict            # peer ip -> (peer rank, my ip facing it)
    cnp_interval: float | None = None   # seconds between CNPs per QP; None: not a notification point
    sport_policy: str = "per-qp"
    seed: int = 1
    rx: dict = field(default_factory=dict)
    tx: dict = field(default_factory=dict)
    arrived: dict = field(default_factory=dict)   # transfer id -> (time, bytes, complete)
    cond: threading.Condition = field(default_factory=threading.Condition)
    sockets: dict = field(default_factory=dict)
    builders: dict = field(default_factory=dict)
    gso: bool = True
    stop: bool = False

    def __post_init__(self):
        self.rng = random.Random(self.seed * 7919 + self.rank)
        self.rx_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx_sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
        self.rx_sock.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
        self.rx_sock.bind(("0.0.0.0", roce.ROCE_PORT))
        # a blocking socket with a receive timeout: recvmmsg returns every 0.2 s to check `stop`
        self.rx_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 200_000))
        self.thread = threading.Thread(target=self._receive, daemon=True)
        self.thread.start()

    # -- sending ---------------------------------------------------------------------------------
    def _socket(self, src: str, sport: int, tos: int) -> socket.socket:
        key = (src, sport, tos)
        s = self.sockets.get(key)
        if s is None:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            # unconnected + PMTUDISC_DO: DF set and IP ID 0, so the precomputed ICRC holds on the wire
            s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            s.bind((src, sport))
            self.sockets[key] = s
        return s

    def _sport(self, lq: int, rq: int) -> int:
        if self.sport_policy == "fixed":
            return 0xC000
        if self.sport_policy == "random":
            return self.rng.randrange(0xC000, 0x10000)
        return roce.udp_sport(lq, rq)

    def send_message(self, t: dict) -> None:
        lq, rq = qpn(self.rank, t["dst"], t["qp"]), qpn(t["dst"], self.rank, t["qp"])
        state = self.tx.setdefault(lq, QpTx())
        sport = self._sport(lq, rq)
        sock = self._socket(t["src_addr"], sport, roce.TOS_DATA)
        builder = self._builder(t["src_addr"], t["dst_addr"], sport, rq)
        dest = (t["dst_addr"], roce.ROCE_PORT)
        if self.gso:
            # runs of Middle packets leave in one UDP_SEGMENT send; the host's veth (no checksum
            # offload, so no UDP GSO feature) cuts them into real frames before they enter the fabric
            for psn, buf, seg, count in builder.gso_batches(state.psn, t["nbytes"], t["id"]):
                cmsg = [(socket.SOL_UDP, UDP_SEGMENT, struct.pack("H", seg))] if count > 1 else []
                self._send(sock, buf, cmsg, dest)
                state.packets += count
                state.bytes += len(buf)
                state.psn = (psn + count) & roce.PSN_MASK
            return
        for psn, payload in builder.packets(state.psn, t["nbytes"], t["id"]):
            self._send(sock, payload, [], dest)
            state.packets += 1
            state.bytes += len(payload)
            state.psn = (psn + 1) & roce.PSN_MASK

    def _builder(self, src: str, dst: str, sport: int, rq: int) -> roce.MessageBuilder:
        key = (src, dst, sport, rq)
        b = self.builders.get(key)
        if b is None:
            b = self.builders[key] = roce.MessageBuilder(src, dst, sport, rq, self.mtu)
        return b

    @staticmethod
    def _send(sock: socket.socket, buf, cmsg: list, dest) -> None:
        while True:
            try:
                sock.sendmsg([buf], cmsg, 0, dest)
                return
            except (BlockingIOError, InterruptedError):
                time.sleep(0.0001)
            except OSError as exc:  # ENOBUFS: a local qdisc refused it; retry like a NIC would
                if exc.errno != errno.ENOBUFS:
                    raise
                time.sleep(0.0005)

    def run(self, op: dict) -> dict:
        start = op["start"]
        deadline = start + op["timeout"]
        delay = start - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        sends = []
        timed_out = False
        for t in op["sends"]:
            with self.cond:
                ok = self.cond.wait_for(lambda: all(d in self.arrived for d in t["after"]),
                                        timeout=max(0.0, deadline - time.monotonic()))
            if not ok:
                timed_out = True
                break
            t0 = time.monotonic()
            self.send_message(t)
            sends.append([t["id"], t0 - start, time.monotonic() - start])
        expect = op["recvs"]
        with self.cond:
            ok = self.cond.wait_for(lambda: all(i in self.arrived for i in expect),
                                    timeout=max(0.0, deadline - time.monotonic()))
            timed_out = timed_out or not ok
            recvs = [[i, self.arrived[i][0] - start, self.arrived[i][1], self.arrived[i][2]]
                     for i in expect if i in self.arrived]
            missing = [i for i in expect if i not in self.arrived]
        end = max([s[2] for s in sends] + [r[1] for r in recvs] + [0.0])
        return {"event": "done", "op": op["op"], "rank": self.rank, "end": end, "sends": sends, "recvs": recvs,
                "missing": missing, "timed_out": timed_out}

    # -- receiving -------------------------------------------------------------------------------
    def _receive(self) -> None:
        rx = mmsg.Receiver(self.rx_sock)
        names: dict[bytes, str] = {}
        packet = self._packet
        while not self.stop:
            try:
                n = rx.recv()
            except OSError:
                return
            for i in range(n):
                raw_src = rx.source(i)
                src = names.get(raw_src)
                if src is None:
                    src = names[raw_src] = socket.inet_ntoa(raw_src)
                packet(rx.payload(i), src, rx.tos(i))

    def _packet(self, data: memoryview, src_ip: str, tos: int) -> None:
        if len(data) < roce.BTH_LEN + roce.ICRC_LEN:
            return
        opcode, pad, dqpn, psn, _becn = roce.parse_bth(data)
        if opcode == roce.CNP:
            self.tx.setdefault(dqpn, QpTx()).cnp_received += 1
            return
        if opcode == roce.ACK:
            syndrome = data[roce.BTH_LEN]
            st = self.tx.setdefault(dqpn, QpTx())
            if syndrome == 0:
                st.acks += 1
            else:
                st.naks += 1
            return
        key = (src_ip, dqpn)
        q = self.rx.get(key)
        if q is None:
            q = self.rx[key] = QpRx()
        q.packets += 1
        if tos & 3 == roce.CE:
            q.ce += 1
            self._maybe_cnp(q, src_ip, dqpn)
        if q.expected_psn is None:
            q.expected_psn = psn
        gap = (psn - q.expected_psn) & roce.PSN_MASK
        if gap == 0:
            q.expected_psn = (psn + 1) & roce.PSN_MASK
        elif gap < 1 << 23:
            q.gaps += gap
            if gap <= MAX_TRACKED_GAP:
                q.missing.update((q.expected_psn + i) & roce.PSN_MASK for i in range(gap))
            q.expected_psn = (psn + 1) & roce.PSN_MASK
        else:
            self._late(q, data, opcode, pad, psn)
            return
        off = roce.BTH_LEN
        if opcode in roce.STARTS:
            q.msg_bytes, q.msg_first = 0, psn
            if opcode in roce.HAS_RETH:
                q.msg_len = struct.unpack_from("!I", data, off + 12)[0]
                off += roce.RETH_LEN
        immediate = None
        if opcode in roce.HAS_IMM:
            immediate = struct.unpack_from("!I", data, off)[0]
            off += roce.IMM_LEN
        size = len(data) - off - roce.ICRC_LEN - pad
        q.bytes += size
        q.msg_bytes += size
        if opcode in roce.ENDS:
            q.messages += 1
            self._ack(src_ip, dqpn, psn, q.messages)
            if immediate is not None:
                complete = q.msg_bytes == q.msg_len
                if not complete:  # a reordered packet may still fill it
                    q.unfinished.append([q.msg_first, psn, immediate, q.msg_len - q.msg_bytes])
                    del q.unfinished[:-64]
                with self.cond:
                    self.arrived[immediate] = (time.monotonic(), q.msg_bytes, complete)
                    self.cond.notify_all()

    def _late(self, q: QpRx, data: memoryview, opcode: int, pad: int, psn: int) -> None:
        """A PSN behind the expected one: a reordered packet filling its gap, or a duplicate."""
        if psn not in q.missing:
            q.late += 1
            return
        q.missing.discard(psn)
        q.gaps -= 1
        q.reordered += 1
        off = roce.BTH_LEN + (roce.RETH_LEN if opcode in roce.HAS_RETH else 0) + \
            (roce.IMM_LEN if opcode in roce.HAS_IMM else 0)
        size = len(data) - off - roce.ICRC_LEN - pad
        q.bytes += size
        for entry in q.unfinished:
            first, last, imm, short = entry
            if (psn - first) & roce.PSN_MASK <= (last - first) & roce.PSN_MASK:
                entry[3] = short - size
                if entry[3] == 0:
                    with self.cond:
                        t, got, _ = self.arrived[imm]
                        self.arrived[imm] = (t, got + size, True)
                    q.unfinished.remove(entry)
                return
        q.msg_bytes += size  # the message still being received

    def _reply(self, src_ip: str, dqpn: int, payload_fn, tos: int) -> None:
        peer = self.peers.get(src_ip)
        if peer is None:
            return
        me, _, k = qpn_fields(dqpn)
        peer_rank, my_ip = peer
        peer_qpn = qpn(peer_rank, self.rank, k)
        sport = roce.udp_sport(dqpn, peer_qpn)
        sock = self._socket(my_ip, sport, tos)
        try:
            sock.sendto(payload_fn(my_ip, src_ip, sport, peer_qpn), (src_ip, roce.ROCE_PORT))
        except OSError:
            pass  # a control packet lost to a full local queue is just lost, as on a NIC

    def _ack(self, src_ip: str, dqpn: int, psn: int, msn: int) -> None:
        self._reply(src_ip, dqpn, lambda s, d, sp, q: roce.ack_payload(s, d, sp, q, psn, msn), roce.TOS_DATA)

    def _maybe_cnp(self, q: QpRx, src_ip: str, dqpn: int) -> None:
        if self.cnp_interval is None:
            return
        now = time.monotonic()
        if now - q.last_cnp >= self.cnp_interval:
            q.last_cnp = now
            q.cnp_sent += 1
            self._reply(src_ip, dqpn, lambda s, d, sp, qq: roce.cnp_payload(s, d, sp, qq), roce.TOS_CNP)

    def counters(self) -> dict:
        rx = [{"peer": ip, "qpn": dq, **{k: v for k, v in vars(q).items()
                                          if k in ("packets", "bytes", "gaps", "late", "reordered", "ce", "cnp_sent",
                                                   "messages")}}
              for (ip, dq), q in self.rx.items()]
        tx = [{"qpn": lq, **vars(t)} for lq, t in self.tx.items()]
        return {"event": "counters", "rank": self.rank, "rx": rx, "tx": tx}


def main() -> None:
    out = sys.stdout
    agent = None

    def say(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg["cmd"]
        if cmd == "init":
            if msg.get("cpu") is not None:
                # a flow's packets are forwarded on its sender's CPU (veth has no NAPI): a sender that
                # migrates between CPUs reorders its own flow, which a NIC never does
                os.sched_setaffinity(0, {msg["cpu"]})
            agent = Agent(msg["rank"], msg["mtu"], {ip: tuple(v) for ip, v in msg["peers"].items()},
                          msg.get("cnp_interval"), msg.get("sport_policy", "per-qp"), msg.get("seed", 1),
                          gso=msg.get("gso", True))
            say({"event": "ready", "rank": agent.rank, "pid": os.getpid()})
        elif cmd == "run":
            say(agent.run(msg))
        elif cmd == "exit":
            time.sleep(msg.get("linger", 0.05))  # late ACKs and CNPs
            say(agent.counters())
            agent.stop = True
            return


if __name__ == "__main__":
    main()
