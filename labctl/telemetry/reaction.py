"""How fast the controller reacts: the PFC headroom is sized for it, so it is measured, not assumed.

A lossless queue that crosses XOFF just after the controller read it is seen at the next read, and
the feeders are paused within that same loop (the frame goes out and the neighbour's class is held
by the same process). So the worst case from "past XOFF" to "feeders stopped" is the longest
interval between two reads of a busy queue. The controller keeps those intervals as a histogram
in pfc.json; a run takes the difference of two snapshots to get its own worst case and p99.

The machine can stall every process at once (stallwatch.py). A run measures those stalls beside
the controller, and for each slow interval (kept with its time) takes out what a CPU's stall
covered: `own_worst_s` is the controller's part, `machine_worst_s` the longest stall of the run.
The headroom is sized for the controller's part; a machine that stalls longer is reported as such.
"""
from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass, field

STEP_S = 0.0005            # bucket width up to FINE_S, lab seconds
FINE_S = 0.2
COARSE_STEP_S = 0.01       # from FINE_S to COARSE_S: headroom sized for hundreds of ms (an emulated
COARSE_S = 2.0             # CPU's) is judged too; at 200 ms a read within 400 ms of headroom read "over"
FINE = round(FINE_S / STEP_S)
BUCKETS = FINE + round((COARSE_S - FINE_S) / COARSE_STEP_S)   # and one more for anything longer
LONG_READ_S = 0.005        # intervals longer than this are also kept with their time (pfc.json long_reads)
LONG_READS_KEPT = 512
LATE_WAKE_S = 0.002        # a wake-up later than this is kept with the slow read it falls in
LATE_WAKES_KEPT = 32
# a part of the loop slower than this is kept with its name (pfc.json slow_steps) and logged: the
# histogram says that the controller was late, this says in what (a TCG incast's first pause came
# 1.8 s after its queue passed XOFF, and nothing showed where the time went)
SLOW_STEP_S = 0.05


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (BUCKETS + 1))

    def add(self, seconds: float) -> None:
        self.counts[bucket(seconds)] += 1

    @property
    def samples(self) -> int:
        return sum(self.counts)

    def worst(self) -> float:
        """The upper edge of the highest bucket that holds a sample (inf past the last one)."""
        for i in range(BUCKETS, -1, -1):
            if self.counts[i]:
                return upper_edge(i)
        return 0.0

    def quantile(self, q: float) -> float:
        total = self.samples
        if not total:
            return 0.0
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= q * total:
                return upper_edge(i)
        return self.worst()

    def minus(self, before: "Histogram") -> "Histogram":
        return Histogram([a - b for a, b in zip(self.counts, before.counts)])

    def to_list(self) -> list[int]:
        return list(self.counts)

    @classmethod
    def from_list(cls, counts) -> "Histogram":
        if isinstance(counts, list) and len(counts) == FINE + 1:
            # a controller started by an older labctl: 0.5 ms buckets to 200 ms, then "longer"
            counts = counts[:FINE] + [0] * (BUCKETS - FINE) + counts[FINE:]
        if not isinstance(counts, list) or len(counts) != BUCKETS + 1:
            return cls()
        return cls([int(c) for c in counts])


def bucket(seconds: float) -> int:
    # rounded first: (0.3 - 0.2) / 0.01 is 9.999..., and 300 ms belongs in [300, 310)
    if seconds < FINE_S:
        return int(round(seconds / STEP_S, 6))
    return min(BUCKETS, FINE + int(round((seconds - FINE_S) / COARSE_STEP_S, 6)))


def upper_edge(i: int) -> float:
    """Of bucket i, in seconds (inf for the last, which holds anything past COARSE_S)."""
    if i >= BUCKETS:
        return float("inf")
    return (i + 1) * STEP_S if i < FINE else round(FINE_S + (i - FINE + 1) * COARSE_STEP_S, 6)


class SlowSteps:
    """The controller's slow steps: (end, what, node, seconds) of the latest `kept`, and how many."""

    def __init__(self, kept: int = 64):
        self.steps: deque = deque(maxlen=kept)
        self.count = 0

    def note(self, what: str, node: str, start: float) -> None:
        """A step of the loop that began at `start` (time.monotonic()) ends now: kept and logged if slow."""
        end = time.monotonic()
        if end - start > SLOW_STEP_S:
            self.steps.append((round(end, 6), what, node, round(end - start, 6)))
            self.count += 1
            print(f"slow {what} at {node}: {(end - start) * 1e3:.0f} ms", file=sys.stderr, flush=True)


def summary(h: Histogram, sized_for_s: float, long_reads: list | None = None,
            machine_gaps: dict | None = None) -> dict:
    """What a report says about one stretch of time: worst, p99, how many reads, and whether the
    headroom (sized for `sized_for_s`) covered the worst case; with the slow reads of that stretch
    and the machine's stalls (stallwatch), also the controller's own part of the worst."""
    from labctl.telemetry import stallwatch
    worst = h.worst()
    out = {"reads": h.samples, "worst_s": worst, "p99_s": h.quantile(0.99), "sized_for_s": sized_for_s,
           "within_headroom": worst <= sized_for_s}
    if machine_gaps is not None:
        own = [stallwatch.own_part(end, took, machine_gaps, wakes)
               for end, took, wakes in map(parse_long, long_reads or ())]
        # reads up to LONG_READ_S are in the histogram only: their own part is at most that
        own_worst = max(own + [min(worst, LONG_READ_S)])
        if _unaccounted(h, long_reads or ()):
            # the controller keeps only its latest slow reads: on an emulated CPU most reads are
            # slow, and a stretch's worst was pushed out before the stretch ended (a TCG incast
            # reported "within headroom" beside a worst past 200 ms). What is not kept cannot be
            # put down to the machine: it is the controller's own
            own_worst = worst
        out.update({"own_worst_s": round(own_worst, 4), "machine_worst_s": round(stallwatch.worst(machine_gaps), 4),
                    "controller_within_headroom": own_worst <= sized_for_s})
    return out


def _unaccounted(h: Histogram, long_reads) -> bool:
    """Whether the histogram holds a sample slower than every kept slow read (one that was not kept)."""
    kept = max((parse_long(r)[1] for r in long_reads), default=0.0)
    return h.worst() > max(LONG_READ_S, upper_edge(bucket(kept)))


def parse_long(entry) -> tuple[float, float, tuple]:
    """One slow read as pfc.json lists it, [end, took] or [end, took, late wake-ups], as (end,
    took, ((due, woke), ...)): the wake-ups within it that came late (controller.py)."""
    wakes = entry[2] if len(entry) > 2 else ()
    return float(entry[0]), float(entry[1]), tuple((float(due), float(woke)) for due, woke in wakes)


def read_long(lab_path, since: float, seen: dict | None = None) -> list:
    """The controller's slow reads that ended after `since` (time.monotonic()), as (end, took,
    late wake-ups), with those `seen` (end -> (took, wake-ups)) in earlier copies of pfc.json: the
    controller keeps only its latest, and on an emulated CPU a run's worst read was pushed out
    before the run ended."""
    from labctl.telemetry import agentreport
    reads = (agentreport.load(lab_path) or {}).get("long_reads") or []
    merged = dict(seen or {})
    merged.update((end, (took, wakes)) for end, took, wakes in map(parse_long, reads))
    return sorted((end, took, wakes) for end, (took, wakes) in merged.items() if end >= since)


def read(lab_path) -> Histogram:
    """The controller's histogram as it last wrote it (empty if there is no controller)."""
    from labctl.telemetry import agentreport
    return Histogram.from_list((agentreport.load(lab_path) or {}).get("reaction_hist"))


def describe(s: dict) -> str:
    """One line: 'controller reaction: worst 6.5 ms, p99 2.0 ms over 3,120 reads (headroom sized for 30 ms)'."""
    def ms(x):
        return f"over {COARSE_S:g} s" if x == float("inf") else f"{x * 1e3:.1f} ms"
    text = (f"controller reaction: worst {ms(s['worst_s'])}, p99 {ms(s['p99_s'])} over {s['reads']:,} reads of busy "
            f"queues (PFC headroom sized for {s['sized_for_s'] * 1e3:g} ms)")
    if s["within_headroom"]:
        return text
    if s.get("controller_within_headroom"):
        return (text + f"; the machine stalled every process for up to {ms(s['machine_worst_s'])} (a busy host or "
                f"hypervisor): the controller's own part was {ms(s['own_worst_s'])}, but that stall was longer "
                f"than the headroom covers")
    return text + "; WORSE THAN THE HEADROOM COVERS"
