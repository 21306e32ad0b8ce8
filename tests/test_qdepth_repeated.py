"""The queue sampler's dump parser (qdepth.RepeatedDump): the same answers as parse_dump for the
queues it is asked about, without parsing again a qdisc whose message did not change (no root)."""
import random
import struct

from labctl.kernel import netlink
from labctl.telemetry import qdepth

RTM_NEWQDISC = 36
NLM_F_MULTI = 2


def qdisc(ifindex: int, handle: int, kind: str, backlog: int, drops: int, nbytes: int, packets: int,
          seq: int = 1) -> bytes:
    body = struct.pack("BxxxiIII", 0, ifindex, handle, 0x10010, 1)
    stats = netlink.nest(qdepth.TCA_STATS2,
                         netlink.attr(qdepth.TCA_STATS_BASIC, struct.pack("QI", nbytes, packets) + b"\0" * 4),
                         netlink.attr(qdepth.TCA_STATS_QUEUE, struct.pack("5I", 3, backlog, drops, 0, 7)))
    return netlink.message(RTM_NEWQDISC, NLM_F_MULTI, body + netlink.attr(qdepth.TCA_KIND, netlink.cstr(kind))
                           + stats, seq)


def dump(msgs: list[bytes], seq: int = 1) -> list[bytes]:
    return [b"".join(msgs), netlink.message(netlink.NLMSG_DONE, NLM_F_MULTI, b"\0" * 4, seq)]


def test_it_answers_as_parse_dump_does_for_the_queues_it_wants():
    msgs = [qdisc(2, 0x10000, "htb", 0, 0, 10, 1), qdisc(2, 0x200000, "bfifo", 4096, 2, 9000, 6),
            qdisc(3, 0x230000, "tbf", 0, 0, 5, 1), qdisc(3, 0xFFFF0000, "clsact", 0, 0, 0, 0)]
    wanted = {(2, 0x20), (3, 0x23)}
    got = qdepth.RepeatedDump(wanted).parse(dump(msgs))
    every = qdepth.parse_dump(dump(msgs))
    assert got == [q for q in every if (q.ifindex, q.handle >> 16) in wanted]
    assert [(q.kind, q.backlog, q.drops, q.bytes, q.packets) for q in got] == [("bfifo", 4096, 2, 9000, 6),
                                                                               ("tbf", 0, 0, 5, 1)]


def test_an_unchanged_qdisc_is_not_parsed_again_and_a_changed_one_is():
    wanted = {(2, 0x20), (2, 0x23)}
    rd = qdepth.RepeatedDump(wanted)
    first = rd.parse(dump([qdisc(2, 0x200000, "bfifo", 0, 0, 100, 1), qdisc(2, 0x230000, "tbf", 0, 0, 50, 1)]))
    # a later dump: another sequence number, the tbf's counters moved
    second = rd.parse(dump([qdisc(2, 0x200000, "bfifo", 0, 0, 100, 1, seq=9),
                            qdisc(2, 0x230000, "tbf", 1500, 0, 1550, 2, seq=9)], seq=9))
    assert second[0] is first[0]                     # the same object: not parsed again
    assert second[1] is not first[1] and (second[1].backlog, second[1].bytes, second[1].packets) == (1500, 1550, 2)


def test_it_agrees_with_parse_dump_over_many_random_dumps():
    rng = random.Random(5)
    keys = [(i, m) for i in (2, 3, 4) for m in (0x1, 0x20, 0x23, 0x26)]
    rd = qdepth.RepeatedDump(set(keys[::2]))
    for _ in range(200):
        msgs = [qdisc(i, m << 16, "bfifo", rng.choice([0, 0, 1500, 3000]), rng.randrange(2), rng.randrange(4) * 1000,
                      rng.randrange(4), seq=rng.randrange(100)) for i, m in keys]
        want = [q for q in qdepth.parse_dump(dump(msgs)) if (q.ifindex, q.handle >> 16) in rd.wanted]
        assert rd.parse(dump(msgs)) == want
