"""The WAN line's pacing, without root: frames leave in order, no faster than the link, and a frame
the kernel cannot take yet stays at the head of its queue instead of being lost."""
from __future__ import annotations

from labctl.wan.line import RETRY_S, Paced

FRAME = 1250                 # 100 us at 100 Mbit/s
RATE = 100_000_000


def test_frames_leave_in_order_at_the_link_rate_after_a_stall():
    p = Paced(RATE)
    for k in range(30):
        p.push(0.0, bytes([k]) * FRAME, FRAME)
    sent, times = [], []
    # the line woke 50 ms late: 1 ms of the link (BURST_S, ten frames) goes at once, not all thirty
    p.release(0.050, lambda f: sent.append(f[0]) or True)
    assert sent == list(range(len(sent))) and 10 <= len(sent) <= 11
    while p.frames:
        t = p.next_time()
        times.append(t)
        p.release(t, lambda f: sent.append(f[0]) or True)
    assert sent == list(range(30))
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(abs(g - FRAME * 8 / RATE) < 1e-9 for g in gaps), gaps     # then one frame per 100 us
    assert p.late_us >= 50_000


def test_a_busy_kernel_delays_a_frame_and_loses_none():
    p = Paced(RATE)
    for k in range(5):
        p.push(0.0, bytes([k]), FRAME)
    sent, refusals = [], [2]

    def send(frame: bytes) -> bool:
        if frame[0] == 2 and refusals[0]:
            refusals[0] -= 1
            return False
        sent.append(frame[0])
        return True

    p.release(1.0, send)
    assert sent == [0, 1] and len(p.frames) == 3 and p.retries == 1
    assert p.next_time() >= 1.0 + RETRY_S                    # no busy spin on a busy kernel
    assert p.release(1.0 + RETRY_S / 2, send) == 0 and sent == [0, 1]
    now = 1.0 + RETRY_S
    p.release(now, send)                                     # refused again, still at the head
    assert sent == [0, 1] and p.retries == 2
    while p.frames:
        now = max(now, p.next_time())
        p.release(now, send)
    assert sent == [0, 1, 2, 3, 4]
