"""DCQCN reaction point (sender rate control), pure logic with an injected clock.

Per QP: on a CNP, RT ← RC, RC ← RC(1 − α/2), α ← (1 − g)α + g, and both increase counters reset
(at most one cut per `min_cut_interval`). Every α period without a CNP, α ← (1 − g)α. The rate-
increase timer and the byte counter each count events; while both counts are below F the QP is in
fast recovery (RC ← (RT + RC)/2); once both pass F, hyper increase (RT += i·R_HAI); otherwise
additive increase (RT += R_AI), RC ← (RT + RC)/2 after each. Defaults from docs/design.md §6 (reference
simulators). All times are real-fabric times and all rates real rates: `scaled()` applies a lab's
time dilation (times × D, rates ÷ D, bytes unchanged).
"""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Params:
    g: float = 1 / 256
    alpha_period: float = 55e-6        # s
    increase_period: float = 55e-6     # s
    byte_counter: int = 10_000_000     # bytes
    fast_recovery_steps: int = 5       # F
    rate_ai: float = 40e6              # bit/s, additive increase
    rate_hai: float = 400e6            # bit/s, hyper increase
    min_rate: float = 10e6             # bit/s
    min_cut_interval: float = 50e-6    # s, as the NP's CNP interval

    def scaled(self, dilation: float) -> "Params":
        return replace(self, alpha_period=self.alpha_period * dilation,
                       increase_period=self.increase_period * dilation,
                       rate_ai=self.rate_ai / dilation, rate_hai=self.rate_hai / dilation,
                       min_rate=self.min_rate / dilation, min_cut_interval=self.min_cut_interval * dilation)


class ReactionPoint:
    def __init__(self, line_rate: float, params: Params, now: float):
        self.line_rate, self.p = line_rate, params
        self.rc = self.rt = line_rate
        self.alpha = 1.0
        self.timer_count = self.byte_count = 0
        self.bytes_since = 0
        self.last_alpha = self.last_increase = now
        self.last_cut = -1e18
        self.cnp_seen_in_period = False
        self.cuts = 0

    def on_cnp(self, now: float) -> None:
        self.advance(now)
        self.cnp_seen_in_period = True
        if now - self.last_cut < self.p.min_cut_interval:
            return
        self.last_cut = now
        self.cuts += 1
        self.rt = self.rc
        self.rc = max(self.p.min_rate, self.rc * (1 - self.alpha / 2))
        self.alpha = (1 - self.p.g) * self.alpha + self.p.g
        self.timer_count = self.byte_count = 0
        self.bytes_since = 0
        self.last_increase = now

    def on_sent(self, nbytes: int, now: float) -> None:
        self.advance(now)
        self.bytes_since += nbytes
        while self.bytes_since >= self.p.byte_counter:
            self.bytes_since -= self.p.byte_counter
            self.byte_count += 1
            self._increase()

    def advance(self, now: float) -> None:
        """Run the α and rate-increase timers up to `now`."""
        while now - self.last_alpha >= self.p.alpha_period:
            self.last_alpha += self.p.alpha_period
            if not self.cnp_seen_in_period:
                self.alpha = (1 - self.p.g) * self.alpha
            self.cnp_seen_in_period = False
        while now - self.last_increase >= self.p.increase_period:
            self.last_increase += self.p.increase_period
            self.timer_count += 1
            self._increase()

    def _increase(self) -> None:
        f = self.p.fast_recovery_steps
        if self.rc >= self.line_rate:
            return
        if max(self.timer_count, self.byte_count) < f:
            pass                                   # fast recovery: toward the target
        elif min(self.timer_count, self.byte_count) > f:
            i = min(self.timer_count, self.byte_count) - f
            self.rt = min(self.line_rate, self.rt + i * self.p.rate_hai)
        else:
            self.rt = min(self.line_rate, self.rt + self.p.rate_ai)
        self.rc = min(self.line_rate, (self.rt + self.rc) / 2)

    def rate(self, now: float) -> float:
        self.advance(now)
        return self.rc
