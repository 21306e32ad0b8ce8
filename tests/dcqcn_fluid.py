"""A small discrete model of N DCQCN senders sharing one marking queue, for tests without root.

Step 1 ms of lab time (the controller's busy period): each sender adds rate × dt to the queue,
the queue drains at the line rate, every packet is marked with the profile's probability, and a
sender whose packets were marked gets a CNP at most once per CNP interval, one step later.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from labctl.plan import qos
from labctl.traffic.dcqcn import Params, ReactionPoint


@dataclass
class Outcome:
    rates_bps: list[float]       # mean rate of each sender over the second half
    mean_depth: float            # bytes, second half
    max_depth: float


def run(params: Params, line_bps: float, dilation: float, seconds: float, starts: list[float],
        kmin: int = 400_000, kmax: int = 1_600_000, pmax: float = 0.2, mtu: int = 4096, seed: int = 1) -> Outcome:
    rnd = random.Random(seed)
    p = params.scaled(dilation)
    dt = 0.001
    rps: list[ReactionPoint | None] = [None] * len(starts)
    marked = [False] * len(starts)
    last_cnp = [-1e18] * len(starts)
    late_bytes = [0.0] * len(starts)
    depth = max_depth = late_depth = 0.0
    steps = int(seconds / dt)
    for k in range(steps):
        t = k * dt
        prob = qos.marking_probability(int(depth), kmin, kmax, pmax)
        arrived = 0.0
        for i, start in enumerate(starts):
            if rps[i] is None and t >= start:
                rps[i] = ReactionPoint(line_bps, p, t)
            rp = rps[i]
            if rp is None:
                continue
            sent = rp.rate(t) * dt / 8
            rp.on_sent(int(sent), t)
            arrived += sent
            if k >= steps // 2:
                late_bytes[i] += sent
            if rnd.random() < 1 - (1 - prob) ** (sent / mtu):
                marked[i] = True
            if marked[i] and t - last_cnp[i] >= p.min_cut_interval:
                rp.on_cnp(t + dt)
                last_cnp[i], marked[i] = t, False
        depth = max(0.0, depth + arrived - line_bps * dt / 8)
        max_depth = max(max_depth, depth)
        if k >= steps // 2:
            late_depth += depth
    half = steps - steps // 2
    return Outcome([b * 8 / (half * dt) for b in late_bytes], late_depth / half, max_depth)
