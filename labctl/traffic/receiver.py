"""The receiving side of an agent: account every packet per QP, assemble messages, answer.

Per QP (sender address, destination QP): packets, bytes, PSN gaps, late packets (duplicates),
reordered packets (late ones that filled a gap), ECN-CE marks. A message arrives with its last
packet (WRITE with Immediate: the immediate names the transfer). It spans the PSNs after the previous
message's last one, so it is complete when none of them is missing, whatever order they came in: a
packet that arrives after a later one completes its message then. Each message is ACKed.

In reliable mode the receiver is one of two kinds of RC NIC (`ooo`):

- drop (go-back-N): a packet ahead of the expected PSN is dropped and answered with one NAK (PSN
  sequence error) per expected PSN, so the sender resends from there: reordering costs
  retransmissions;
- tolerate: a packet up to OOO_WINDOW PSNs ahead is placed where it belongs (its PSN kept in a
  bitmap, here a dict), and when the hole before it fills, the receiver moves on past every PSN
  it holds; it ACKs the highest contiguous PSN at each message's end and NAKs only beyond the
  window (as NICs that support packet spraying do).

Either kind counts the network's reordering the same way (RFC 4737's reordered packet, first
transmissions only): a packet is reordered when a later PSN of its QP arrived before it did, and
it was not seen before (a resent copy of a packet that was dropped or held is not).

As a DCQCN notification point the receiver sends a CNP per QP at most once per interval while
CE-marked packets arrive.
"""
from __future__ import annotations

import struct
import threading
import time
from dataclasses import dataclass, field

from labctl.traffic import roce
from labctl.traffic.sender import Sender, qpn, qpn_fields

MAX_TRACKED_GAP = 4096  # PSNs remembered per gap to recognise reordering
# how far the expected PSN moves between two cuts of the PSNs still missing: a quarter of the
# 2^24 PSN space, so that none is kept long enough to wrap into a new message (_forget_wrapped)
PRUNE_EVERY = 1 << 22
OOO_WINDOW = 1024       # tolerate: PSNs ahead of the expected one a receiver places (its bitmap)
# the bytes an opcode's headers take, its ICRC included: a shorter datagram is dropped unread
HEADERS = {op: roce.BTH_LEN + roce.ICRC_LEN + (roce.RETH_LEN if op in roce.HAS_RETH else 0)
           + (roce.IMM_LEN if op in roce.HAS_IMM else 0) for op in roce.OPCODES}
HEADERS[roce.ACK] = roce.BTH_LEN + roce.AETH_LEN + roce.ICRC_LEN


@dataclass
class QpRx:
    packets: int = 0
    bytes: int = 0
    gaps: int = 0          # PSNs that never came (before a later one did)
    late: int = 0          # PSNs behind the expected one that filled no gap: duplicates
    reordered: int = 0     # PSNs that arrived after a later one (first transmissions)
    dropped: int = 0       # reliable mode: out-of-order packets discarded (go-back-N, or beyond the window)
    early: int = 0         # tolerate: packets placed ahead of the expected PSN
    ce: int = 0
    cnp_sent: int = 0
    naks_sent: int = 0
    messages: int = 0
    expected_psn: int = 0  # the initial PSN both ends agreed on (RC exchanges it at setup; agents use 0)
    msg_bytes: int = 0
    msg_first: int = 0     # the first PSN of the message being received: the one after the last END
    untracked: int = 0     # PSNs of that message lost in a gap too long to remember one by one
    full_size: int = 0     # payload bytes of a First or Middle packet (the RoCE MTU)
    last_cnp: float = 0.0
    nak_for: int | None = None
    next_exp: int = 0      # reliable mode: one past the highest PSN seen
    ahead: set = field(default_factory=set)    # reliable mode: PSNs seen ahead of the expected one
    held: dict = field(default_factory=dict)   # tolerate: psn -> (opcode, immediate, size), placed early
    missing: set = field(default_factory=set)
    pruned_at: int = 0     # expected_psn when `missing` was last cut to the half-space behind it
    unfinished: list = field(default_factory=list)  # [first psn, last psn, transfer id, PSNs missing]

    PUBLIC = ("packets", "bytes", "gaps", "late", "reordered", "dropped", "early", "ce", "cnp_sent", "naks_sent",
              "messages")

    def public(self) -> dict:
        return {k: getattr(self, k) for k in self.PUBLIC}


class Receiver:
    def __init__(self, rank: int, peers: dict, sender: Sender, cnp_interval: float | None, reliable: bool,
                 ooo: str = "drop"):
        self.rank, self.peers, self.sender = rank, peers, sender
        self.cnp_interval, self.reliable = cnp_interval, reliable
        self.tolerate = reliable and ooo == "tolerate"
        self.qps: dict[tuple[str, int], QpRx] = {}
        self.arrived: dict[int, tuple[float, int, bool]] = {}
        self.cond = threading.Condition()

    def packet(self, data: memoryview, src_ip: str, tos: int) -> None:
        if len(data) < roce.BTH_LEN + roce.ICRC_LEN:
            return
        opcode, pad, dqpn, psn, _becn = roce.parse_bth(data)
        if len(data) < HEADERS.get(opcode, roce.BTH_LEN + roce.ICRC_LEN) + pad:
            return        # shorter than its own headers and pad: not a packet any sender of the lab makes
        if opcode == roce.CNP:
            self.sender.on_cnp(dqpn)
            return
        if opcode == roce.ACK:
            self.sender.on_ack(dqpn, psn, data[roce.BTH_LEN])
            return
        key = (src_ip, dqpn)
        q = self.qps.get(key)
        if q is None:
            q = self.qps[key] = QpRx()
        q.packets += 1
        if tos & 3 == roce.CE:
            q.ce += 1
            self._maybe_cnp(q, src_ip, dqpn)
        gap = (psn - q.expected_psn) & roce.PSN_MASK
        if self.reliable:
            self._reliable(q, src_ip, dqpn, data, opcode, pad, psn, gap)
            return
        if gap == 0:
            q.expected_psn = (psn + 1) & roce.PSN_MASK
        elif gap < 1 << 23:
            q.gaps += gap
            if gap <= MAX_TRACKED_GAP:
                q.missing.update((q.expected_psn + i) & roce.PSN_MASK for i in range(gap))
            else:
                q.untracked += gap  # too many to remember: the message they belong to stays short
            q.expected_psn = (psn + 1) & roce.PSN_MASK
        else:
            self._late(q, src_ip, dqpn, data, opcode, pad, psn)
            return
        self._accept(q, src_ip, dqpn, opcode, psn, *_payload(data, opcode, pad))

    def take_run(self, src_ip: str, dqpn: int, psn: int, count: int, size_sum: int, last_size: int) -> bool:
        """`count` WRITE Middle packets of one QP with PSNs `psn`, `psn`+1, ..., none CE-marked, in
        that order (rxbatch.py): counted at once, as `packet` would count each, when they start at
        the QP's expected PSN and it holds nothing seen ahead. False leaves them to `packet`."""
        q = self.qps.get((src_ip, dqpn))
        if q is None or psn != q.expected_psn:
            return False
        if self.reliable and (q.ahead or q.held or q.next_exp != psn):
            return False
        q.packets += count
        q.bytes += size_sum
        q.msg_bytes += size_sum
        q.full_size = last_size
        q.expected_psn = (psn + count) & roce.PSN_MASK
        if self.reliable:
            q.next_exp = q.expected_psn
            q.nak_for = None
        return True

    def _reliable(self, q: QpRx, src_ip: str, dqpn: int, data: memoryview, opcode: int, pad: int, psn: int,
                  gap: int) -> None:
        """An RC receiver, go-back-N or tolerant of reordering (the module's docstring)."""
        newest = (psn - q.next_exp) & roce.PSN_MASK < 1 << 23
        if newest:
            q.next_exp = (psn + 1) & roce.PSN_MASK
        elif gap < 1 << 23 and psn not in q.ahead:
            q.reordered += 1            # behind a later PSN, not before the expected one, never seen
        if gap == 0:
            q.expected_psn = (psn + 1) & roce.PSN_MASK
            q.nak_for = None
            q.ahead.discard(psn)
            self._accept(q, src_ip, dqpn, opcode, psn, *_payload(data, opcode, pad))
            while q.expected_psn in q.held:      # the hole is filled: what was placed after it counts now
                p = q.expected_psn
                q.ahead.discard(p)
                op, immediate, size = q.held.pop(p)
                q.expected_psn = (p + 1) & roce.PSN_MASK
                self._accept(q, src_ip, dqpn, op, p, immediate, size)
            return
        if gap < 1 << 23:
            if self.tolerate and gap < OOO_WINDOW:
                if psn not in q.held:
                    q.held[psn] = (opcode, *_payload(data, opcode, pad))
                    q.ahead.add(psn)
                    q.early += 1
                else:
                    q.late += 1
                return
            # go-back-N (or past the window): drop it, ask once for the PSN we expect
            q.ahead.add(psn)
            q.dropped += 1
            if q.nak_for != q.expected_psn:
                q.nak_for = q.expected_psn
                q.naks_sent += 1
                self._reply(src_ip, dqpn, lambda s, d, sp, qq, e=q.expected_psn, m=q.messages:
                            roce.ack_payload(s, d, sp, qq, e, m, roce.NAK_PSN_SEQ_ERR), roce.TOS_DATA)
            return
        q.late += 1
        if opcode in roce.ENDS:  # a resent message we already have: its ACK was lost
            self._ack(src_ip, dqpn, (q.expected_psn - 1) & roce.PSN_MASK, q.messages)

    def _accept(self, q: QpRx, src_ip: str, dqpn: int, opcode: int, psn: int, immediate: int | None,
                size: int) -> None:
        """A packet in order (or placed, its hole now filled): its bytes count; a message's last
        packet ACKs it and records its arrival."""
        q.bytes += size
        q.msg_bytes += size
        if opcode not in roce.ENDS:
            q.full_size = size       # Firsts and Middles carry the path's whole RoCE MTU
        else:
            q.messages += 1
            self._ack(src_ip, dqpn, psn, q.messages)
            if q.missing and (q.expected_psn - q.pruned_at) & roce.PSN_MASK >= PRUNE_EVERY:
                _forget_wrapped(q)
            first, q.msg_first = q.msg_first, (psn + 1) & roce.PSN_MASK
            got, untracked, q.msg_bytes, q.untracked = q.msg_bytes, q.untracked, 0, 0
            if immediate is not None:
                short = _missing_in(q.missing, first, psn) + untracked
                if short:  # a reordered packet may still fill it
                    q.unfinished.append([first, psn, immediate, short])
                    del q.unfinished[:-64]
                with self.cond:
                    self.arrived[immediate] = (time.monotonic(), got, not short)
                    self.cond.notify_all()

    def _late(self, q: QpRx, src_ip: str, dqpn: int, data: memoryview, opcode: int, pad: int, psn: int) -> None:
        """A PSN behind the expected one: a reordered packet filling its gap, or a duplicate."""
        if psn not in q.missing:
            q.late += 1
            return
        q.missing.discard(psn)
        q.gaps -= 1
        q.reordered += 1
        immediate, size = _payload(data, opcode, pad)
        q.bytes += size
        if opcode in roce.ENDS:
            self._late_end(q, src_ip, dqpn, psn, immediate, size)
            return
        q.full_size = size
        for entry in q.unfinished:
            first, last, imm, short = entry
            if _within(psn, first, last):
                entry[3] = short - 1
                with self.cond:
                    t, got, _ = self.arrived[imm]
                    self.arrived[imm] = (t, got + size, entry[3] == 0)
                    if entry[3] == 0:
                        q.unfinished.remove(entry)
                        self.cond.notify_all()
                return
        q.msg_bytes += size  # the message still being received

    def _late_end(self, q: QpRx, src_ip: str, dqpn: int, psn: int, immediate: int | None, size: int) -> None:
        """A message's last packet, overtaken by the next message's first: the span taken for one
        message since the previous end holds two. The next message is either still being received,
        or ended too (an unfinished entry). The span splits after this PSN; before it every packet
        of the message is full (a First or a Middle)."""
        q.messages += 1
        self._ack(src_ip, dqpn, psn, q.messages)
        ended = next((e for e in q.unfinished if _within(psn, e[0], e[1])), None)
        if ended is not None:
            first = ended[0]
            # PSNs lost in a gap too long to remember one by one are in the entry's count only
            untracked = ended[3] - 1 - _missing_in(q.missing, first, ended[1])
        elif _within(psn, q.msg_first, q.expected_psn):
            first, untracked = q.msg_first, q.untracked
        else:                       # older than any span remembered: it came, whole or not
            if immediate is not None:
                with self.cond:
                    self.arrived[immediate] = (time.monotonic(), size, False)
                    self.cond.notify_all()
            return
        tracked = _missing_in(q.missing, first, psn)
        # where in the span the untracked PSNs were is not known: both messages stay short of them
        short = tracked + untracked
        got = max(0, ((psn - first) & roce.PSN_MASK) - short) * q.full_size
        with self.cond:
            if ended is not None:   # the next message keeps the rest of the span
                ended[0] = (psn + 1) & roce.PSN_MASK
                ended[3] -= tracked + 1
                t, rest, _ = self.arrived[ended[2]]
                self.arrived[ended[2]] = (t, max(0, rest - got), ended[3] == 0)
                if ended[3] == 0:
                    q.unfinished.remove(ended)
            else:
                q.msg_first = (psn + 1) & roce.PSN_MASK
                q.msg_bytes = max(0, q.msg_bytes - got)
            if immediate is not None:
                if short:
                    q.unfinished.append([first, psn, immediate, short])
                self.arrived[immediate] = (time.monotonic(), got + size, not short)
            self.cond.notify_all()

    def settled(self, ids) -> bool:
        """Every transfer in `ids` has arrived and is complete (call with `cond` held)."""
        return all(i in self.arrived and self.arrived[i][2] for i in ids)

    def _reply(self, src_ip: str, dqpn: int, payload_fn, tos: int) -> None:
        peer = self.peers.get(src_ip)
        if peer is None:
            return
        _, _, k = qpn_fields(dqpn)
        peer_rank, my_ip = peer
        peer_qpn = qpn(peer_rank, self.rank, k)
        sport = roce.udp_sport(dqpn, peer_qpn)
        sock = self.sender.socket_for(my_ip, sport, tos)
        try:
            sock.sendto(payload_fn(my_ip, src_ip, sport, peer_qpn), (src_ip, roce.ROCE_PORT))
        except OSError:
            pass  # a control packet lost to a full local queue is lost, as on a NIC

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


def _payload(data: memoryview, opcode: int, pad: int) -> tuple[int | None, int]:
    """(immediate or None, payload bytes) of a data packet."""
    off = roce.BTH_LEN + (roce.RETH_LEN if opcode in roce.HAS_RETH else 0)
    immediate = None
    if opcode in roce.HAS_IMM:
        immediate = struct.unpack_from("!I", data, off)[0]
        off += roce.IMM_LEN
    return immediate, len(data) - off - roce.ICRC_LEN - pad


def _within(psn: int, first: int, last: int) -> bool:
    return (psn - first) & roce.PSN_MASK <= (last - first) & roce.PSN_MASK


def _forget_wrapped(q: QpRx) -> None:
    """PSNs lost more than half the PSN space ago can no longer come late (a packet that far behind
    counts as ahead), and once the PSNs wrap they would fall inside a new message's span and call it
    short: they are forgotten, and so are the short messages that ended that far back (a late
    packet of the new round would otherwise fill one of them). They stay counted in `gaps`."""
    def behind(psn: int) -> bool:
        return (q.expected_psn - psn) & roce.PSN_MASK <= 1 << 23
    q.missing = {p for p in q.missing if behind(p)}
    q.unfinished = [e for e in q.unfinished if behind(e[1])]
    q.pruned_at = q.expected_psn


def _missing_in(missing: set, first: int, last: int) -> int:
    """How many PSNs of [first, last] never came (the set holds only the few PSNs still missing)."""
    return sum(1 for p in missing if _within(p, first, last))
