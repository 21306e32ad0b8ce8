"""Machine stalls: stretches in which the machine itself ran nothing of ours on a CPU.

A lab stands for hardware with processes, and a busy host (a hypervisor preempting the VM's vCPUs,
firmware, another tenant) can take a CPU from every process at once: on this kind of machine a
real-time loop that sleeps 1 ms, alone and idle, sees gaps of 5-7 ms, and CI saw the controller go
33-46 ms between two reads. No headroom sized for the controller's own reaction covers that, and
no change to the controller can shorten it, so a run measures it beside the controller and says
which part of a slow reaction was the machine's.

One watcher per CPU, pinned there and real-time above every lab process, wakes every 5 ms and
records each wake-up that came more than 2 ms late. Nothing of the lab can
delay it, so such a gap is time the CPU was not the kernel's to give (or spent in the kernel with
preemption off). A run starts the watchers with its agents and reads their gaps at the end.

    python -m labctl.telemetry.stallwatch CPU     # runs until its stdin closes, then prints its gaps
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

from labctl import helpers

# Every 5 ms: a shorter period costs a watcher a noticeable share of a core (docs/design.md §8).
# A stall that starts within a sleep is seen up to one period short, so a slow read's overlap with
# it comes out up to 5 ms short (the controller's own part that much too long); a wake-up the
# stall held is credited from its due time, and only up to the stall's length after its end.
PERIOD_MS = 5
REPORT_OVER_S = 0.002
PRIORITY = 50          # above the controller and the line (procs.HELPER_RT_PRIORITY)
MAX_GAPS = 10_000


def watch(cpu: int) -> dict:
    os.sched_setaffinity(0, {cpu})
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(PRIORITY))
        scheduling = "fifo"
    except OSError:
        scheduling = "other"      # gaps then include waiting behind other processes: said in the result
    stdin = select.poll()
    stdin.register(sys.stdin.fileno(), select.POLLIN | select.POLLHUP)
    helpers.say_ready()
    gaps: list[list[float]] = []
    last = time.monotonic()
    while True:
        closed = stdin.poll(PERIOD_MS)      # the sleep and the stop signal in one call
        now = time.monotonic()
        late = now - last - PERIOD_MS / 1000     # past when it should have woken
        if late > REPORT_OVER_S and len(gaps) < MAX_GAPS:
            gaps.append([now, late])
        last = now
        if closed:
            return {"cpu": cpu, "scheduling": scheduling, "gaps": gaps}


class StallWatch:
    """The watchers of one run: `start()`, then `stop()` returns {cpu: [[end, seconds], ...]}."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.procs: list[tuple[int, subprocess.Popen]] = []   # (cpu, watcher)

    def start(self) -> "StallWatch":
        """Start a watcher on every CPU; `ready()` waits until they watch, so that other start-up
        work (the agents) runs while their interpreters start."""
        if not self.enabled:
            return self
        try:
            for cpu in sorted(os.sched_getaffinity(0)):
                p = subprocess.Popen([sys.executable, "-P", "-m", "labctl.telemetry.stallwatch", str(cpu)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, cwd="/")
                self.procs.append((cpu, p))
        except BaseException:
            self.stop()
            raise
        return self

    def ready(self) -> "StallWatch":
        try:
            for cpu, p in self.procs:
                helpers.await_ready(p, f"the stall watcher on CPU {cpu}")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> dict[int, list] | None:
        """Each CPU's gaps; None if the watch was not enabled."""
        if not self.enabled:
            return None
        out = {}
        for _, p in self.procs:
            try:
                text, _ = p.communicate(timeout=5)     # closing stdin stops it
                doc = json.loads(text)
                out[doc["cpu"]] = doc["gaps"]
            except (subprocess.TimeoutExpired, ValueError, KeyError):
                p.kill()
                p.wait()
        self.procs = []
        return out


def covered(start: float, end: float, spans) -> float:
    """Seconds of [start, end] inside the union of `spans` ([from, to] each, overlapping or not)."""
    total, reach = 0.0, start
    for lo, hi in sorted(spans):
        lo, hi = max(lo, reach), min(hi, end)
        if hi > lo:
            total += hi - lo
            reach = hi
    return total


def own_part(read_end: float, seconds: float, gaps_by_cpu: dict, late_wakes=()) -> float:
    """Of one slow interval between two reads, what is left after the machine's stalls: the most
    any single CPU stalled within it comes off (the controller was on one CPU, which is not known).
    `late_wakes`: the controller's wake-ups in that interval that came late, [due, woke] each. One
    due while a CPU was stalled was late because of the stall, all of it: when the CPU comes back,
    everything the stall held back wakes at once (with agents in the nodes, a dozen controllers on
    two CPUs), and the last to run waits behind the rest, up to about the stall's length again
    (and one watcher period) after its end. The watcher sees a stall up to one period after it
    began, so a wake-up due that much before the stall counts too. A late wake-up due outside
    every stall stays the controller's own."""
    start = read_end - seconds
    since = min([start] + [due for due, _ in late_wakes])
    stolen = 0.0
    for gaps in gaps_by_cpu.values():
        near = [(g_end - g_s, g_end) for g_end, g_s in gaps if g_end >= since and g_end - g_s < read_end]
        # held by a stall, a wake-up waits at most about the stall's length again behind what it
        # held back (ci87: 20 ms after a 60 ms stall): past that its lateness is its own, or a
        # 2 ms gap on any CPU would excuse any delay (found by review)
        period = PERIOD_MS / 1000
        held = []
        for due, woke in late_wakes:
            ends = [hi + (hi - lo) + period for lo, hi in near if lo - period <= due <= hi]
            if ends:
                held.append((due, min(woke, max(ends))))
        stolen = max(stolen, covered(start, read_end, near + held))
    return max(0.0, seconds - stolen)


def worst(gaps_by_cpu: dict) -> float:
    return max((s for g in gaps_by_cpu.values() for _, s in g), default=0.0)


if __name__ == "__main__":
    print(json.dumps(watch(int(sys.argv[1]))), flush=True)
