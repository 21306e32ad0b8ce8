"""The hand-packed rtnetlink messages, decoded by pyroute2's parser as an independent check."""
from __future__ import annotations

import struct

from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from labctl.kernel import rtnl


def _decode(cls, request):
    kind, flags, body = request
    data = struct.pack("IHHII", 16 + len(body), kind, flags, 7, 0) + body
    msg = cls(data)
    msg.decode()
    return msg


def test_veth_carries_both_ends_with_their_indexes():
    m = _decode(ifinfmsg, rtnl.veth("spine1", 5, "02:1a:00:00:00:01", 9000, 11,
                                    "leaf1", 7, "02:1a:00:00:00:02", 9000, 12))
    assert m["index"] == 5 and m.get_attr("IFLA_IFNAME") == "spine1" and m.get_attr("IFLA_MTU") == 9000
    assert m.get_attr("IFLA_ADDRESS") == "02:1a:00:00:00:01" and m.get_attr("IFLA_NET_NS_FD") == 11
    info = m.get_attr("IFLA_LINKINFO")
    assert info.get_attr("IFLA_INFO_KIND") == "veth"
    peer = info.get_attr("IFLA_INFO_DATA").get_attr("VETH_INFO_PEER")
    assert peer["index"] == 7 and peer.get_attr("IFLA_IFNAME") == "leaf1"
    assert peer.get_attr("IFLA_NET_NS_FD") == 12


def test_multipath_route():
    m = _decode(rtmsg, rtnl.route_add("10.1.0.18/31", [("10.1.0.1", 2), ("10.1.0.3", 3)]))
    assert m["dst_len"] == 31 and m.get_attr("RTA_DST") == "10.1.0.18"
    hops = m.get_attr("RTA_MULTIPATH")
    assert [(h["oif"], h.get_attr("RTA_GATEWAY")) for h in hops] == [(2, "10.1.0.1"), (3, "10.1.0.3")]


def test_weighted_multipath_route_carries_weights_as_hops():
    m = _decode(rtmsg, rtnl.route_add("10.1.0.18/31", [("10.1.0.1", 2, 3), ("10.1.0.3", 3, 1)]))
    assert [(h["oif"], h["hops"]) for h in m.get_attr("RTA_MULTIPATH")] == [(2, 2), (3, 0)]  # weight - 1


def test_single_route():
    m = _decode(rtmsg, rtnl.route_add("10.0.0.0/16", [("10.1.0.17", 4)]))
    assert m.get_attr("RTA_GATEWAY") == "10.1.0.17" and m.get_attr("RTA_OIF") == 4


def test_htb_class_rate_and_burst():
    m = _decode(tcmsg, rtnl.htb_class(3, 0x10001, 0x10000, 400_000_000, 50_000, 9014))
    parms = m.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")
    assert parms["rate"] == 50_000_000  # bytes/s
    assert parms["quantum"] == 9014
    # 50 kB at 50 MB/s is 1 ms = 15625 psched ticks of 64 ns
    assert parms["buffer"] == 15625


def test_htb_class_above_32_bits_uses_rate64():
    kind, flags, body = rtnl.htb_class(3, 0x10001, 0x10000, 40_000_000_000, 5_000_000, 9014)
    attrs = rtnl.parse_attrs(body, 20)
    opts = rtnl.parse_attrs(attrs[rtnl.TCA_OPTIONS], 0)
    assert struct.unpack("Q", opts[rtnl.TCA_HTB_RATE64])[0] == 5_000_000_000


def test_batch_numbers_requests():
    class FakeSock:
        pass
    b = rtnl.Batch(FakeSock())
    b.add(rtnl.link_up(1), "lo")
    b.add(rtnl.link_up(2), "eth")
    seqs = [struct.unpack_from("IHHII", m)[3] for m, _ in b.messages]
    assert seqs == [1, 2]
