"""The receiver's accounting with no network: packets from a MessageBuilder, some of them withheld."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from labctl.traffic import roce
from labctl.traffic.receiver import Receiver

SRC, DST, MTU = "10.0.0.1", "10.0.0.2", 1024


class NoSender:
    """The receiver's replies need peers; with none it answers nobody, and data needs no sender."""


def _packets(length: int, imm: int, psn: int = 0) -> list[tuple[int, bytes]]:
    builder = roce.MessageBuilder(SRC, DST, 49152, 0x10, MTU)
    return [(p, bytes(payload)) for p, payload in builder.packets(psn, length, imm)]


def _deliver(rx: Receiver, packets) -> None:
    for _, payload in packets:
        rx.packet(memoryview(payload), SRC, roce.TOS_DATA)


def test_a_message_arrives_complete_with_every_byte():
    rx = Receiver(1, {}, NoSender(), None, reliable=False)
    _deliver(rx, _packets(10 * MTU + 100, imm=7))
    (q,) = rx.qps.values()
    assert rx.arrived[7][1:] == (10 * MTU + 100, True)
    assert (q.packets, q.gaps, q.messages) == (11, 0, 1)


def test_losing_the_very_first_packet_of_a_qp_is_a_gap_not_a_new_start():
    """A QP's PSNs start where both ends agreed (0 here, as RC exchanges them at setup): a receiver
    that started from the first PSN it happened to see would call a message short of its first
    packet whole-but-short and never ask for the packet again."""
    pkts = _packets(4 * MTU, imm=9)
    rx = Receiver(1, {}, NoSender(), None, reliable=False)
    _deliver(rx, pkts[1:])
    (q,) = rx.qps.values()
    assert q.gaps == 1 and q.missing == {0}
    assert rx.arrived[9] == (rx.arrived[9][0], 3 * MTU, False)


def test_reliable_mode_drops_everything_after_a_lost_first_packet_and_asks_for_it():
    pkts = _packets(4 * MTU, imm=9)
    rx = Receiver(1, {}, NoSender(), None, reliable=True)
    _deliver(rx, pkts[1:])
    (q,) = rx.qps.values()
    assert (q.dropped, q.naks_sent, q.nak_for, q.messages) == (3, 1, 0, 0)
    assert 9 not in rx.arrived
    _deliver(rx, pkts)                      # go-back-N from PSN 0
    assert rx.arrived[9][1:] == (4 * MTU, True)
    assert q.expected_psn == 4


def test_a_swapped_pair_is_one_reordered_packet_and_its_message_is_complete():
    pkts = _packets(6 * MTU, imm=5)
    pkts[2], pkts[3] = pkts[3], pkts[2]
    rx = Receiver(1, {}, NoSender(), None, reliable=False)
    _deliver(rx, pkts)
    (q,) = rx.qps.values()
    assert (q.gaps, q.reordered, q.late) == (0, 1, 0)
    assert rx.arrived[5][1:] == (6 * MTU, True)


def test_a_late_first_packet_completes_its_message_after_the_last_one_arrived():
    """The defect seen on the NVLink incast: the first packet (with the RETH) of the second message
    came after the message's last one, and the message was judged short for good."""
    first = _packets(3 * MTU, imm=1)
    second = _packets(3 * MTU, imm=2, psn=3)
    rx = Receiver(1, {}, NoSender(), None, reliable=False)
    _deliver(rx, first + second[1:])
    assert rx.arrived[1][1:] == (3 * MTU, True)
    assert rx.arrived[2][1:] == (2 * MTU, False)
    _deliver(rx, second[:1])
    (q,) = rx.qps.values()
    assert rx.arrived[2][1:] == (3 * MTU, True)
    assert (q.gaps, q.reordered, q.messages, q.unfinished) == (0, 1, 2, [])


def test_a_packet_lost_for_good_leaves_its_message_short_and_the_next_one_whole():
    first = _packets(4 * MTU, imm=1)
    second = _packets(2 * MTU, imm=2, psn=4)
    rx = Receiver(1, {}, NoSender(), None, reliable=False)
    _deliver(rx, first[:2] + first[3:] + second)
    (q,) = rx.qps.values()
    assert rx.arrived[1][1:] == (3 * MTU, False)
    assert rx.arrived[2][1:] == (2 * MTU, True)
    assert (q.gaps, q.missing) == (1, {2})


def _spread(pkts, depth: int):
    """Every `depth`+1 packets as if sprayed over two paths, the second one `depth` packets behind:
    p0 p2 p1 p4 p3 ... (a packet overtaken by the next)."""
    out = list(pkts)
    for k in range(1, len(out) - 1, 2):
        out[k], out[k + 1] = out[k + 1], out[k]
    return out


def test_tolerant_receiver_places_reordered_packets_and_asks_for_nothing():
    pkts = _packets(20 * MTU, imm=4) + _packets(4 * MTU, imm=5, psn=20)
    rx = Receiver(1, {}, NoSender(), None, reliable=True, ooo="tolerate")
    _deliver(rx, _spread(pkts, 1))
    (q,) = rx.qps.values()
    assert rx.arrived[4][1:] == (20 * MTU, True) and rx.arrived[5][1:] == (4 * MTU, True)
    assert (q.naks_sent, q.dropped, q.late, q.held, q.ahead) == (0, 0, 0, {}, set())
    assert q.reordered == q.early == 11          # each swap: one placed early, one arrived after it
    assert q.expected_psn == 24


def test_go_back_n_receiver_pays_for_the_same_reordering_with_naks_and_resends():
    pkts = _packets(20 * MTU, imm=4)
    rx = Receiver(1, {}, NoSender(), None, reliable=True, ooo="drop")
    _deliver(rx, _spread(pkts, 1))
    (q,) = rx.qps.values()
    assert 4 not in rx.arrived                    # the last packet overtook its predecessor: dropped
    assert q.naks_sent >= 1 and q.dropped >= 1
    # the sender resends from the NAKed PSN: copies of dropped packets are not reordering
    reordered = q.reordered
    _deliver(rx, pkts[q.expected_psn:])
    assert rx.arrived[4][1:] == (20 * MTU, True)
    assert q.reordered == reordered and q.ahead == set()


def test_a_tolerant_receiver_drops_and_naks_beyond_its_window():
    from labctl.traffic.receiver import OOO_WINDOW
    pkts = _packets((OOO_WINDOW + 4) * MTU, imm=3)
    rx = Receiver(1, {}, NoSender(), None, reliable=True, ooo="tolerate")
    _deliver(rx, pkts[1:])
    (q,) = rx.qps.values()
    assert q.early == OOO_WINDOW - 1 and q.dropped == len(pkts) - OOO_WINDOW and q.naks_sent == 1
    _deliver(rx, pkts[:1])                       # the hole fills: the window's packets count at once
    assert q.expected_psn == OOO_WINDOW and q.held == {}
    _deliver(rx, pkts[OOO_WINDOW:])              # the rest, resent
    assert rx.arrived[3][1:] == ((OOO_WINDOW + 4) * MTU, True)



def test_a_late_last_packet_ends_its_message_while_the_next_one_is_still_arriving():
    """The defect seen across three machines: a message's last packet came after the next
    message's first. No PSN was missing once it landed, yet the message never arrived and the ring
    waited on it until it gave up."""
    first = _packets(3 * MTU + 100, imm=1)
    second = _packets(3 * MTU, imm=2, psn=4)
    rx = Receiver(1, {}, NoSender(), None, reliable=False)
    _deliver(rx, first[:3] + second[:1] + first[3:])
    assert rx.arrived[1][1:] == (3 * MTU + 100, True)
    _deliver(rx, second[1:])
    (q,) = rx.qps.values()
    assert rx.arrived[2][1:] == (3 * MTU, True)
    assert (q.gaps, q.reordered, q.late, q.messages, q.unfinished) == (0, 1, 0, 2, [])


def test_a_late_last_packet_splits_the_span_the_next_message_ended():
    first = _packets(3 * MTU + 100, imm=1)
    second = _packets(3 * MTU, imm=2, psn=4)
    third = _packets(MTU, imm=3, psn=7)
    rx = Receiver(1, {}, NoSender(), None, reliable=False)
    _deliver(rx, first[:3] + second + first[3:] + third)
    (q,) = rx.qps.values()
    assert rx.arrived[1][1:] == (3 * MTU + 100, True)
    assert rx.arrived[2][1:] == (3 * MTU, True)
    assert rx.arrived[3][1:] == (MTU, True)
    assert (q.gaps, q.reordered, q.messages, q.unfinished) == (0, 1, 3, [])


def test_a_late_last_packet_of_a_message_short_of_another_stays_short_until_that_one_lands():
    first = _packets(4 * MTU + 100, imm=1)
    second = _packets(2 * MTU, imm=2, psn=5)
    rx = Receiver(1, {}, NoSender(), None, reliable=False)
    _deliver(rx, first[:1] + first[2:4] + second + first[4:])     # PSN 1 still missing
    assert rx.arrived[1][1:] == (3 * MTU + 100, False)
    assert rx.arrived[2][1:] == (2 * MTU, True)
    _deliver(rx, first[1:2])
    (q,) = rx.qps.values()
    assert rx.arrived[1][1:] == (4 * MTU + 100, True)
    assert (q.gaps, q.reordered, q.messages, q.unfinished) == (0, 2, 2, [])


def test_a_late_last_packet_splits_by_the_size_a_late_first_packet_gave():
    """Found by the property below: the only full packet of the split span had itself come late."""
    a, b, c = _packets(1, imm=0), _packets(MTU + 1, imm=1, psn=1), _packets(1, imm=2, psn=3)
    rx = Receiver(1, {}, NoSender(), None, reliable=False)
    _deliver(rx, a + c + b)
    assert {i: rx.arrived[i][1:] for i in range(3)} == {0: (1, True), 1: (MTU + 1, True), 2: (1, True)}


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 5 * MTU), min_size=1, max_size=6),
       swaps=st.lists(st.integers(0, 40), max_size=12))
def test_any_reordering_of_adjacent_packets_delivers_every_message_whole(sizes, swaps):
    """Whatever pairs of neighbours the network swaps, across message boundaries or inside one,
    every message arrives once with its bytes and no PSN is left missing."""
    pkts, psn = [], 0
    for imm, size in enumerate(sizes):
        msg = _packets(size, imm=imm, psn=psn)
        pkts += msg
        psn += len(msg)
    for k in swaps:
        if k + 1 < len(pkts):
            pkts[k], pkts[k + 1] = pkts[k + 1], pkts[k]
    rx = Receiver(1, {}, NoSender(), None, reliable=False)
    _deliver(rx, pkts)
    (q,) = rx.qps.values()
    assert {imm: rx.arrived[imm][1:] for imm in range(len(sizes))} == {i: (s, True) for i, s in enumerate(sizes)}
    assert (q.gaps, q.late, q.messages, q.missing, q.unfinished) == (0, 0, len(sizes), set(), [])


def test_a_late_last_packet_after_a_gap_too_long_to_track_leaves_both_messages_short():
    """Found in review: PSNs lost in a gap longer than the receiver tracks one by one were counted
    as received when the span split, and the message that lost them was called whole."""
    from labctl.traffic.receiver import MAX_TRACKED_GAP
    n = MAX_TRACKED_GAP + 4
    a, b = _packets(n * MTU, imm=1), _packets(2 * MTU, imm=2, psn=n)
    rx = Receiver(1, {}, NoSender(), None, reliable=False)
    _deliver(rx, a[:1] + a[n - 2:n - 1] + b[:1] + a[n - 1:] + b[1:])   # a[1..n-3] lost, a's end late
    assert rx.arrived[1][2] is False and rx.arrived[2][2] is False
    assert rx.arrived[1][1] >= 0 and rx.arrived[2][1] >= 0


def test_a_psn_lost_long_ago_does_not_make_a_message_short_once_the_psns_wrap():
    """PSNs are 24 bits. A PSN lost for good stays missing; after 2^24 more PSNs a new message
    spans that number again and arrives whole. Jumps just under half the PSN space (gaps the
    receiver counts without tracking them) bring the QP round in a few packets."""
    rx = Receiver(1, {}, NoSender(), None, reliable=False)
    lost = _packets(4 * MTU, imm=1)
    _deliver(rx, lost[:2] + lost[3:])                               # PSN 2 lost for good
    half = 1 << 23
    _deliver(rx, _packets(4 * MTU, imm=2, psn=half - 100))
    _deliver(rx, _packets(196 * MTU, imm=3, psn=2 * half - 200))   # ends at PSN 2^24-5
    wrap = _packets(8 * MTU, imm=4, psn=roce.PSN_MASK - 3)          # PSNs 2^24-4 .. 3: round again
    _deliver(rx, wrap[:5] + wrap[6:] + wrap[5:6])                   # its PSN 1 after PSNs 2 and 3
    (q,) = rx.qps.values()
    assert rx.arrived[1][1:] == (3 * MTU, False)                    # the first round's loss stays a loss
    assert rx.arrived[4][1:] == (8 * MTU, True)                     # spans PSN 2 of the first round
    assert 2 not in q.missing and q.gaps >= 1 and q.reordered == 1


def test_a_psn_exactly_half_the_space_behind_can_still_fill_its_gap():
    """The receiver takes a PSN up to half the PSN space behind the expected one as late, so the
    PSNs still missing are kept that far back."""
    rx = Receiver(1, {}, NoSender(), None, reliable=False)
    first = _packets(4 * MTU, imm=1)
    _deliver(rx, first[:2] + first[3:])                             # PSN 2 late, not lost
    _deliver(rx, _packets(4 * MTU, imm=2, psn=(1 << 23) - 2))      # the expected PSN is now 2 + 2^23
    _deliver(rx, first[2:3])
    (q,) = rx.qps.values()
    assert rx.arrived[1][1:] == (4 * MTU, True)
    assert (q.late, q.reordered) == (0, 1)
