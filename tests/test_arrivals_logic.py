"""The arrival bounds (pure): a switch is read exactly when what arrived since its last read could
have filled one of its queues to a threshold, and the counting program is what the map layout says.
The counters are a plain array here; tests/test_netns_arrivals.py checks the kernel's against HTB's."""
from __future__ import annotations

import struct
from types import SimpleNamespace

import numpy as np
import pytest

from labctl.dataplane import arrivals
from labctl.dataplane.arrivals import OTHER, STRIDE, Bounds
from labctl.plan import qos

ROCE, CNP = 3, 6
KEY = lambda ifindex, tc: (ifindex, qos.leaf_handle(tc) >> 16)   # noqa: E731


class FakeCounters:
    def __init__(self, entries: int):
        self.values = np.zeros(entries, dtype=np.int64)

    def snapshot(self):
        return self.values.copy()


def switch(name: str, keys: list[tuple[int, int]]):
    return SimpleNamespace(node=SimpleNamespace(name=name), wanted=set(keys),
                           inflow={k: 1_000_000.0 for k in keys}, queues=range(0))


@pytest.fixture
def two_switches():
    leaf = switch("leaf1", [KEY(2, ROCE), KEY(2, CNP), KEY(4, ROCE)])
    spine = switch("spine1", [KEY(2, ROCE)])
    bases = {(0, 2): 0, (0, 4): STRIDE, (1, 2): 2 * STRIDE}
    counters = FakeCounters(3 * STRIDE)
    b = Bounds(counters, [leaf, spine], bases)
    for q in range(len(b.keys)):
        b.set_limits(q, 10_000, 5_000)          # e.g. XOFF and XON
    return b, counters, leaf, spine


def test_nothing_arrived_nothing_to_read(two_switches):
    b, counters, leaf, spine = two_switches
    _, reached, room = b.scan()
    assert list(reached) == [False, False]
    assert room == pytest.approx(10_000 / 1_000_000)          # an empty queue at full inflow


def test_a_switch_is_read_once_its_class_could_have_reached_the_threshold(two_switches):
    b, counters, leaf, spine = two_switches
    counters.values[STRIDE + ROCE] = 9_999                     # leaf1 port 4, RoCE class
    _, reached, room = b.scan()
    assert list(reached) == [False, False] and room == pytest.approx(1 / 1_000_000)
    counters.values[STRIDE + ROCE] += 1
    _, reached, _ = b.scan()
    assert list(reached) == [True, False]                      # spine1 is not read with it


def test_a_read_resets_the_bound_to_what_it_found(two_switches):
    b, counters, leaf, spine = two_switches
    counters.values[STRIDE + ROCE] = 50_000
    copied, reached, _ = b.scan()
    assert reached[0]
    places = b.unknown(leaf.queues)
    assert [b.keys[leaf.queues.start + i] for i in places] == [KEY(4, ROCE)]
    b.read(leaf.queues, places, {KEY(4, ROCE): 3_000}, copied)  # most of it had left already
    counters.values[STRIDE + ROCE] += 6_999
    _, reached, _ = b.scan()
    assert not reached[0]                                      # 3,000 queued + 6,999 since < 10,000
    counters.values[STRIDE + ROCE] += 1
    assert b.scan()[1][0]


def test_bytes_counted_after_the_copy_stay_in_the_bound(two_switches):
    """Arrivals between the copy and the read may be in the backlog too: counted twice, never lost."""
    b, counters, leaf, spine = two_switches
    counters.values[ROCE] = 20_000
    copied, _, _ = b.scan()
    counters.values[ROCE] += 9_000                              # arrives while the switch is read
    b.read(leaf.queues, b.unknown(leaf.queues), {KEY(2, ROCE): 9_000}, copied)
    _, reached, _ = b.scan()
    assert reached[0]                                          # 9,000 + 9,000 >= 10,000


def test_only_queues_past_their_floor_are_read_and_the_rest_are_decided_by_their_bound(two_switches):
    """Between the floor (XON) and the threshold (XOFF) a read can change a queue's state; below
    the floor it cannot, and the bound stands in for the backlog."""
    b, counters, leaf, spine = two_switches
    counters.values[ROCE] = 12_000                              # port 2 RoCE: past XOFF
    counters.values[CNP] = 4_999                               # port 2 CNP: below its floor
    counters.values[STRIDE + ROCE] = 6_000                      # port 4 RoCE: between XON and XOFF
    copied, reached, _ = b.scan()
    assert list(reached) == [True, False]
    places = b.unknown(leaf.queues)
    assert sorted(b.keys[leaf.queues.start + i] for i in places) == [KEY(2, ROCE), KEY(4, ROCE)]
    cnp = b.keys[leaf.queues.start:leaf.queues.stop].index(KEY(2, CNP))
    assert cnp not in places and b.bound_at(leaf.queues, cnp) == 4_999
    b.read(leaf.queues, places, {KEY(2, ROCE): 100, KEY(4, ROCE): 0}, copied)
    counters.values[CNP] += 1                                  # the unread queue's bound goes on growing
    b.scan()
    assert b.unknown(leaf.queues) == [cnp]
    assert b.bound_at(leaf.queues, places[0]) in (100, 0)


def test_packets_in_no_class_count_against_every_class_of_their_port(two_switches):
    b, counters, leaf, spine = two_switches
    counters.values[OTHER] = 10_000                            # leaf1 port 2, unclassified
    _, reached, _ = b.scan()
    assert list(reached) == [True, False]
    counters.values[:] = 0
    b2 = Bounds(counters, [switch("leaf1", [KEY(2, ROCE), KEY(4, ROCE)])], {(0, 2): 0, (0, 4): STRIDE})
    b2.set_limits(0, 10_000, 10_000)
    b2.set_limits(1, 10_000, 10_000)
    counters.values[STRIDE + OTHER] = 10_000                   # port 4's: not port 2's
    bound = b2.backlog + counters.values[b2.slot] + counters.values[b2.other] - b2.seen
    assert list(bound) == [0, 10_000]


def test_a_queue_without_a_threshold_never_calls_for_a_read(two_switches):
    b, counters, leaf, spine = two_switches
    b.set_limits(3, np.inf, np.inf)                            # spine1's only queue: no ECN, no PFC
    counters.values[2 * STRIDE + ROCE] = 10**9
    _, reached, room = b.scan()
    assert not reached[1] and room == pytest.approx(0.01)


def test_the_program_counts_into_the_ports_slots():
    code = arrivals.program(map_fd=7, base=5 * STRIDE)
    insns = [struct.unpack_from("=BBhi", code, off) for off in range(0, len(code), 8)]
    ld_map = [i for i, ins in enumerate(insns) if ins[0] == 0x18]
    assert len(ld_map) == 1 and insns[ld_map[0]][3] == 7 and insns[ld_map[0]][1] >> 4 == 1   # BPF_PSEUDO_MAP_FD
    assert (0x07, 4, 0, 5 * STRIDE) == (insns[ld_map[0] - 4][0], insns[ld_map[0] - 4][1] & 0xF, 0,
                                         insns[ld_map[0] - 4][3])          # r4 += base
    assert any(ins[0] == 0xDB for ins in insns)                # one atomic add, no read-modify-write
    assert insns[-1][0] == 0x95


def test_the_engine_is_chosen_or_refused_clearly(monkeypatch):
    monkeypatch.setenv(arrivals.ENV, "poll")
    assert arrivals.choose() == "poll"
    monkeypatch.setenv(arrivals.ENV, "sometimes")
    with pytest.raises(Exception, match="LABCTL_QUEUE_READS='sometimes'"):
        arrivals.engine()
    monkeypatch.setenv(arrivals.ENV, "arrivals")
    monkeypatch.setattr(arrivals, "unsupported", lambda: "no bpf here")
    with pytest.raises(Exception, match="no bpf here"):
        arrivals.choose()
    monkeypatch.setenv(arrivals.ENV, "auto")
    assert arrivals.choose() == "poll"
    monkeypatch.undo()
    monkeypatch.setattr(arrivals.ebpf, "supported", lambda: True)
    monkeypatch.setattr(arrivals.os, "uname", lambda: SimpleNamespace(release="5.4.0-150-generic", machine="x86_64"))
    assert "older than 5.5" in arrivals.unsupported()
    monkeypatch.setattr(arrivals.os, "uname", lambda: SimpleNamespace(release="6.1.0-50-amd64", machine="x86_64"))
    assert arrivals.unsupported() is None


def test_on_arrivals_the_headroom_does_not_grow_with_the_lab():
    big = [96] * 176
    assert qos.pfc_response_s(big, on_arrivals=True) == qos.PFC_RESPONSE_S
    assert qos.pfc_response_s(big) > qos.PFC_RESPONSE_S


@pytest.mark.parametrize("path_marking, pfc, threshold, floor", [
    (None, True, 100_000, 50_000),          # the controller marks: read from Kmin, or XON below it
    (object(), True, 300_000, 50_000),      # the ports mark themselves: a lossless queue only at XOFF
    (object(), False, 100_000, 100_000),    # a lossy one from Kmin, to correct for what it dropped
])
def test_the_read_threshold_leaves_kmin_out_where_the_ports_mark_a_lossless_class(path_marking, pfc,
                                                                                  threshold, floor):
    sw = switch("leaf1", [KEY(2, ROCE)])
    sw.node.switching = True
    sw.path_marking = path_marking
    sw.ecn_ports = {KEY(2, ROCE): (ROCE, SimpleNamespace(ecn=True, kmin=100_000))}
    sw.pfc = {KEY(2, ROCE): SimpleNamespace(settings=SimpleNamespace(pfc=pfc, xoff=300_000, xon=50_000))}
    b = Bounds(FakeCounters(STRIDE), [sw], {(0, 2): 0})
    b.set_from([sw], shared_buffer=False)
    assert (b.threshold[0], b.floor[0]) == (threshold, min(floor, threshold))
