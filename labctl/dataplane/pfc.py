"""IEEE 802.1Qbb priority flow control: frames, and the per-port state the controller keeps.

A PFC frame goes to 01:80:C2:00:00:01 with EtherType 0x8808 (MAC control), opcode 0x0101, a
class-enable vector and eight pause times in quanta of 512 bit times (0 = resume), padded to the
60-byte minimum. Built and parsed with struct, so that a switch agent needs no scapy (inside a node
image); the tests hold every frame to scapy's MACControlClassBasedFlowControl, byte for byte.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache

PFC_DST = "01:80:c2:00:00:01"
ETH_P_MAC_CONTROL = 0x8808
OPCODE_PFC = 0x0101
QUANTUM_BITS = 512
MAX_QUANTA = 0xFFFF
MIN_FRAME = 60       # without the FCS, which the port adds
ETH_P_KICK = 0x88B5  # IEEE local experimental: the frame that restarts a resumed queue (see controller)


@lru_cache(maxsize=4096)
def frame(src_mac: str, tc: int, quanta: int) -> bytes:
    """A PFC frame pausing class `tc` for `quanta` (0 resumes it)."""
    times = [0] * 8
    times[tc] = quanta
    head = (bytes.fromhex(PFC_DST.replace(":", "")) + bytes.fromhex(src_mac.replace(":", ""))
            + struct.pack("!HHH8H", ETH_P_MAC_CONTROL, OPCODE_PFC, 1 << tc, *times))
    return head + bytes(MIN_FRAME - len(head))


def parse(data: bytes) -> dict[int, int] | None:
    """{class: quanta} for every enabled class of a PFC frame; None if it is not one."""
    if len(data) < 34 or struct.unpack_from("!H", data, 12)[0] != ETH_P_MAC_CONTROL:
        return None
    opcode, vector = struct.unpack_from("!HH", data, 14)
    if opcode != OPCODE_PFC:
        return None
    times = struct.unpack_from("!8H", data, 18)
    return {tc: times[tc] for tc in range(8) if vector >> tc & 1}


def dynamic_xoff(static_xoff: int, shared: int, alpha: float, used: int) -> int:
    """XOFF under a shared buffer (the dynamic threshold of shared-memory switches): a queue may
    grow to alpha x the buffer still free, so one hot port cannot take it all, and never past its
    own XOFF. With alpha 1 a lone congested queue pauses at half the shared buffer."""
    return min(static_xoff, int(alpha * max(0, shared - used)))


def pause_seconds(quanta: int, rate_bps: int) -> float:
    return quanta * QUANTUM_BITS / rate_bps


@dataclass
class PortPfc:
    """One port's PFC state for its lossless class."""
    tc: int
    paused_until: float = 0.0   # 0: not paused (we received no pause, or it ended)
    paused_since: float = 0.0
    paused_total: float = 0.0
    asserting: bool = False     # we are pausing our neighbours because this port's queue is past XOFF
    last_sent: float = 0.0
    tx_frames: int = 0          # PFC frames sent out of this port (XOFF and XON)
    rx_frames: int = 0          # PFC frames received on this port

    def counters(self, now: float) -> dict:
        paused = self.paused_total + (now - self.paused_since if self.paused_until else 0.0)
        return {"tc": self.tc, "pfc_tx": self.tx_frames, "pfc_rx": self.rx_frames, "paused_s": round(paused, 6),
                "paused": bool(self.paused_until)}

    # -- decisions, pure: the controller feeds them the clock and acts on the answers -------------
    def decide(self, congested_elsewhere: bool, now: float, rate_bps: int, quanta: int = MAX_QUANTA) -> int | None:
        """The pause time to send to this port's neighbour now (0 = XON), or None to send nothing.

        While another of the node's lossless queues is past XOFF this port's neighbour feeds it:
        pause it, and refresh the pause at half its duration; once none is, release it."""
        if congested_elsewhere:
            if not self.asserting or now - self.last_sent >= pause_seconds(quanta, rate_bps) / 2:
                self.asserting = True
                return quanta
            return None
        if self.asserting:
            self.asserting = False
            return 0
        return None

    def on_frame(self, quanta: int, now: float, rate_bps: int) -> str | None:
        """A PFC frame for this class arrived: 'pause' to start holding the class, 'resume' to let it
        go, None when an existing pause is only extended (or nothing changes)."""
        self.rx_frames += 1
        if quanta:
            start = not self.paused_until
            if start:
                self.paused_since = now
            self.paused_until = now + pause_seconds(quanta, rate_bps)
            return "pause" if start else None
        return "resume" if self.paused_until else None

    def expired(self, now: float) -> bool:
        return bool(self.paused_until) and now >= self.paused_until

    def ended(self, now: float) -> None:
        self.paused_total += now - self.paused_since
        self.paused_until = 0.0
