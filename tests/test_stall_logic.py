"""How a run tells the controller's slowness from the machine's stalls (pure logic, no root)."""
from __future__ import annotations

import json
import os

import pytest

from labctl.telemetry import reaction, stallwatch


def test_covered_counts_each_moment_inside_the_interval_once():
    spans = [(9.5, 10.0), (11.0, 12.0), (19.9, 20.0)]
    assert stallwatch.covered(9.0, 11.5, spans) == pytest.approx(0.5 + 0.5)
    assert stallwatch.covered(13.0, 19.0, spans) == 0.0
    assert stallwatch.covered(9.8, 9.9, spans) == pytest.approx(0.1)
    # overlapping spans (a stall and a wake-up it held) are counted once
    assert stallwatch.covered(9.0, 11.5, spans + [(9.8, 10.4), (10.3, 10.5)]) == pytest.approx(0.5 + 0.5 + 0.5)


def test_the_controllers_part_is_what_the_most_stalled_cpu_leaves():
    # a 46 ms interval ending at t=100: CPU 0 stalled 40 ms of it, CPU 1 10 ms
    gaps = {0: [[99.995, 0.04]], 1: [[99.96, 0.01]]}
    assert stallwatch.own_part(100.0, 0.046, gaps) == pytest.approx(0.006)
    assert stallwatch.own_part(100.0, 0.046, {}) == pytest.approx(0.046)
    assert stallwatch.worst(gaps) == 0.04


def test_a_wake_up_the_stall_held_is_the_machines_the_wait_behind_its_backlog_included():
    # ci87: with an agent in every node, a 60 ms stall of the machine held a dozen controllers'
    # wake-ups, and they ran one after another once it ended: a read of 98.5 ms, 60 ms of it the
    # stall the watcher saw and 20 ms more the wait behind the others the stall had held
    gaps = {0: [[100.0, 0.060]], 1: []}
    read_end, took = 100.030, 0.0985
    assert stallwatch.own_part(read_end, took, gaps) == pytest.approx(0.0385)
    # the read ran from 99.9315; due within the stall (seen from 99.940), woke 80 ms late at 100.025:
    # the machine's part is 99.940 to 100.025
    held = [(99.945, 100.025)]
    assert stallwatch.own_part(read_end, took, gaps, held) == pytest.approx(0.0985 - 0.085)
    # due up to one watcher period before the stall the watcher saw: the stall may have begun then
    assert stallwatch.own_part(read_end, took, gaps, [(99.936, 100.025)]) == pytest.approx(0.0985 - 0.089)
    # a wake-up due outside every stall that came late is the controller's own, however late
    assert stallwatch.own_part(read_end, took, gaps, [(100.010, 100.025)]) == pytest.approx(0.0385)
    assert stallwatch.own_part(read_end, took, {}, held) == pytest.approx(took)
    # a wake-up held by a stall is credited up to the stall's length again (and a watcher period)
    # after its end, no further: a 2.1 ms gap on some CPU does not excuse a 200 ms delay
    short = {3: [[100.000, 0.0021]]}
    assert stallwatch.own_part(100.2, 0.2, short, [(99.996, 100.195)]) == pytest.approx(0.2 - 0.0071)   # from 100.0
    # and it is judged that way from pfc.json's form of a slow read, [end, took, [[due, woke], ...]]
    h = hist(0.001, 0.0985)
    s = reaction.summary(h, 0.03, [[read_end, took, [list(w) for w in held]]], gaps)
    assert s["controller_within_headroom"] and s["own_worst_s"] == pytest.approx(0.0135, abs=1e-4)
    s = reaction.summary(h, 0.03, [[read_end, took]], gaps)
    assert not s["controller_within_headroom"]


def hist(*seconds):
    h = reaction.Histogram()
    for s in seconds:
        h.add(s)
    return h


def test_a_stall_the_machine_made_is_named_as_such_and_a_slow_controller_is_not():
    h = hist(0.001, 0.002, 0.0455)
    stalled = {0: [[50.0, 0.040]]}
    s = reaction.summary(h, 0.03, [(50.001, 0.0455)], stalled)
    assert not s["within_headroom"] and s["controller_within_headroom"]
    assert s["own_worst_s"] == pytest.approx(0.0055, abs=1e-4) and s["machine_worst_s"] == 0.04
    assert "the machine stalled every process for up to 40.0 ms" in reaction.describe(s)
    # the same slow read with the machine's stall elsewhere in time: the controller's own
    s = reaction.summary(h, 0.03, [(50.001, 0.0455)], {0: [[20.0, 0.040]]})
    assert not s["controller_within_headroom"] and "WORSE THAN THE HEADROOM COVERS" in reaction.describe(s)


def test_reads_too_short_to_be_kept_count_as_the_controllers_own():
    s = reaction.summary(hist(0.001, 0.004), 0.03, [], {})
    assert s["own_worst_s"] == pytest.approx(0.0045) and s["controller_within_headroom"]
    assert "machine" not in reaction.describe(s)


def test_a_slow_read_that_was_not_kept_is_the_controllers_own():
    # a stretch whose worst read (over 200 ms) fell out of the kept list: the kept ones, all
    # covered by a machine stall, must not vouch for it
    h = hist(0.001, 0.0455, 0.25)
    stalled = {0: [[50.0, 0.040]]}
    s = reaction.summary(h, 0.2, [(50.001, 0.0455)], stalled)
    assert s["worst_s"] == pytest.approx(0.26) and s["own_worst_s"] == pytest.approx(0.26)
    assert not s["controller_within_headroom"] and "WORSE THAN THE HEADROOM COVERS" in reaction.describe(s)
    # the same stretch with its worst read kept: the machine's stall is taken out as before
    s = reaction.summary(hist(0.001, 0.0455), 0.03, [(50.001, 0.0455)], stalled)
    assert s["controller_within_headroom"] and s["own_worst_s"] == pytest.approx(0.0055, abs=1e-4)


def test_reads_between_200_ms_and_2_s_are_measured_and_judged_against_the_headroom():
    # a TCG guest's controller sized for 400 ms: a 300 ms read is within it, not "over 200 ms"
    s = reaction.summary(hist(0.001, 0.3), 0.4)
    assert s["worst_s"] == pytest.approx(0.31) and s["within_headroom"]
    assert "worst 310.0 ms" in reaction.describe(s)
    s = reaction.summary(hist(0.001, 0.45), 0.4)
    assert s["worst_s"] == pytest.approx(0.46) and not s["within_headroom"]
    assert reaction.summary(hist(0.1995), 0.4)["worst_s"] == pytest.approx(0.2)
    assert reaction.summary(hist(0.2), 0.4)["worst_s"] == pytest.approx(0.21)
    s = reaction.summary(hist(2.5), 0.4)
    assert s["worst_s"] == float("inf") and "worst over 2 s" in reaction.describe(s)


def test_an_older_controllers_histogram_keeps_its_counts():
    old = [0] * (reaction.FINE + 1)
    old[10], old[reaction.FINE] = 3, 1          # three reads of 5-5.5 ms, one over 200 ms
    h = reaction.Histogram.from_list(old)
    assert h.samples == 4 and h.worst() == float("inf") and h.quantile(0.5) == pytest.approx(0.0055)


def test_a_runs_slow_reads_include_those_the_controller_listed_and_then_dropped(tmp_path):
    """The sampler keeps every slow read it saw in pfc.json; the run's list is those and the file's."""
    from labctl.telemetry.sampler import PfcFile
    f = tmp_path / "pfc.json"
    watch = PfcFile(tmp_path)

    def publish(reads, mtime):
        f.write_text(json.dumps({"ports": [], "long_reads": reads}))
        os.utime(f, (mtime, mtime))
        watch.get()

    publish([[9.0, 0.006], [10.0, 0.25], [11.0, 0.007]], 1)
    publish([[11.0, 0.007], [12.0, 0.008]], 2)          # 9.0 and the 250 ms read were pushed out
    assert watch.long_reads == {9.0: (0.006, ()), 10.0: (0.25, ()), 11.0: (0.007, ()), 12.0: (0.008, ())}
    assert reaction.read_long(tmp_path, 10.0, watch.long_reads) == [(10.0, 0.25, ()), (11.0, 0.007, ()),
                                                                    (12.0, 0.008, ())]
    # with the worst read accounted for, a machine stall that covered it is taken out
    s = reaction.summary(hist(0.006, 0.25, 0.007, 0.008), 0.4, reaction.read_long(tmp_path, 10.0, watch.long_reads),
                         {0: [[10.0, 0.245]]})
    assert s["own_worst_s"] == pytest.approx(0.008) and s["controller_within_headroom"]
