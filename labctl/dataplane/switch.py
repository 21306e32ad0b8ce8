"""What a switch agent watches on one node (a Switch): its netlink socket, its ECN-marking and
lossless queues, the one request that reads their backlogs, and who feeds each port."""
from __future__ import annotations

from dataclasses import dataclass, field

from labctl.dataplane import ecn, pfcport
from labctl.kernel import ecnpath, fastmaps, nsutil, rtnl
from labctl.kernel.nft import Nft
from labctl.plan import qos
from labctl.plan.model import Node
from labctl.plan.share import NodeShare
from labctl.telemetry import qdepth
from labctl.telemetry.nftcounters import family_of as nft_family


@dataclass
class Switch:
    node: Node
    sock: object
    nft: Nft | None
    share: NodeShare | None = None                # what the node's agent knows of the lab (plan/share.py)
    ecn_ports: dict[tuple[int, int], tuple] = field(default_factory=dict)  # (ifindex, leaf major) -> (tc, settings)
    marking: dict[tuple[int, int], int] = field(default_factory=dict)    # (ifindex, tc) -> N
    wanted: set = field(default_factory=set)
    pfc: dict = field(default_factory=dict)       # (ifindex, leaf major) -> pfcport.Port
    request: tuple = (b"", [])
    messages: list = field(default_factory=list)  # the request's GETs one by one, for a part of them
    feeders: dict = field(default_factory=dict)   # egress port -> ingress ports that feed it
    inflow: dict = field(default_factory=dict)    # (ifindex, leaf major) -> the most bytes/s that can arrive
    asserting: bool = False                       # some port is pausing its neighbour
    polls: int = 0
    busy: bool = False                            # a controlled queue held packets at the last read
    last_read: float | None = None
    period: float = 0.0                           # from the last read to the next one
    next_read: float = 0.0
    family: str = "ip"                            # where its nftables rules live
    queues: range = range(0)                      # its queues' places in the arrival bounds (arrivals.py)
    must: bool = False                            # pausing, held over XOFF or marking: read on every scan
    backlogs: dict = field(default_factory=dict)  # at the last read
    stateful: set = field(default_factory=set)    # queues marking or past XOFF
    place: dict = field(default_factory=dict)     # queue -> its place in the switch's request
    kick_sock: object = None                      # pfcport.kick_socket of a node with lossless classes
    fast_marking: object = None                   # fastmaps.Marking: the router's program marks
    path_marking: object = None                   # ecnpath.Queues: its ports mark in the data path

    def assert_pfc(self, congested: set[str], now: float, active: dict) -> None:
        """Pause the ports that feed a lossless egress queue past XOFF; XON once none they feed is."""
        if not congested and not self.asserting:
            return                       # the common case: nothing to pause, nothing to release
        self.asserting = False
        for port in self.pfc.values():
            wanted = port.settings.pfc and any(port.iface.name in self.feeders.get(e, ()) for e in congested)
            quanta = port.state.decide(wanted, now, port.iface.shaping.rate_bps, port.cls.pfc_quanta)
            if quanta is not None:
                port.send_pfc(quanta, now)
                active[port] = None
            self.asserting = self.asserting or port.state.asserting


def open_switch(share: NodeShare, nft: Nft | None, settings) -> Switch:
    """Open a node's sockets, install its marking rules and prepare the request that reads its
    queues. `settings(node name, ifindex, tc)` gives a class's control.PortSettings."""
    node = share.node
    lossless = share.lossless
    ports = [(ifindex, tc, qos.class_minor(tc)) for ifindex, tc in share.marking]
    with nsutil.entered(node.namespace):
        sock = rtnl.open_socket()
    kick_sock = pfcport.kick_socket(node.namespace) if lossless else None
    sw = Switch(node, sock, nft, share=share, feeders={e: set(f) for e, f in share.feeders.items()},
                family=nft_family(node), kick_sock=kick_sock)
    if ports:
        sw.nft.run(ecn.setup_rules(ports, sw.family))
        sw.path_marking = ecnpath.open_queues(sock, node, writable=True)
        if sw.path_marking is None:
            sw.fast_marking = fastmaps.open_marking(sock, node, writable=True)
    for ifindex, tc, _ in ports:
        sw.ecn_ports[(ifindex, (qos.leaf_handle(tc) >> 16))] = (tc, settings(node.name, ifindex, tc))
        sw.marking[(ifindex, tc)] = 0
    write_profiles(sw)
    for i, c in lossless:
        sw.pfc[(i.index, qos.leaf_handle(c.tc) >> 16)] = pfcport.Port(
            node, i, c, share.peer_macs[i.name], sock, settings(node.name, i.index, c.tc), kick_sock)
    sw.wanted = set(sw.ecn_ports) | (set(sw.pfc) if node.switching else set())
    total = sum(i.shaping.rate_bps for i in node.interfaces) / 8
    for key in sw.wanted:     # whatever the routes: every other port at its full rate
        own = next(i for i in node.interfaces if i.index == key[0])
        sw.inflow[key] = max(total - own.shaping.rate_bps / 8, 1.0)
    sw.messages, keys = qdepth.get_messages(sw.wanted)
    sw.request = (b"".join(sw.messages), keys)
    sw.place = {key: i for i, key in enumerate(sw.request[1])}
    return sw


def write_profiles(sw: Switch) -> None:
    """The ECN profile in force on each marking class, into the data path's slots (if it marks there)."""
    if sw.path_marking is None:
        return
    for (ifindex, _), (tc, st) in sw.ecn_ports.items():
        sw.path_marking.set_profile(ifindex, tc, st.kmin, st.kmax, st.pmax, st.ecn)
