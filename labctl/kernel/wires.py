"""Links carried by a user-space line (WAN delay, loss, jitter, ESP) instead of one veth pair.

    a:port ==veth== [near ns] a | fibre ==veth== fibre | b [far ns] ==veth== b:port

The near and far namespaces hold no addresses and forward nothing: the line process
(labctl.wan.line) moves frames between their ports with AF_PACKET sockets, holding them for the
link's delay. The two routers at the ends know each other's MAC statically, as every port of a
lab knows its neighbours' (neighbours.py), so nothing but their IP traffic crosses the line (no
ARP on an encrypted WAN).
"""
from __future__ import annotations

from labctl.kernel import rtnl
from labctl.plan.model import LabPlan, Link

SYSCTLS = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1",
           "net.ipv4.ip_forward": "0"}
FIBRE_INDEX = 1_000_000          # fibre ends: 1e6 + 2 link (near) and + 1 (far), unlike their peers


def wired(plan: LabPlan) -> list[Link]:
    return [lk for lk in plan.links if lk.wire is not None]


def namespaces(plan: LabPlan) -> list[str]:
    return [ns for lk in wired(plan) for ns in (lk.wire.near, lk.wire.far)]


def wire_mac(link: int, side: int, port: int) -> str:
    return "02:1b:%02x:%02x:%02x:%02x" % (link >> 8 & 255, link & 255, side, port)


def ports(link: Link) -> list[tuple[str, str, int]]:
    """(namespace, port name, ifindex) of the four line ports: near a, near fibre, far fibre, far b."""
    w = link.wire
    return [(w.near, "a", w.near_index), (w.near, "fibre", FIBRE_INDEX + 2 * link.id),
            (w.far, "fibre", FIBRE_INDEX + 2 * link.id + 1), (w.far, "b", w.far_index)]


def veths(plan: LabPlan, link: Link, ns_fds: dict[str, int], node_fds: dict[str, int]) -> list[tuple[tuple, str]]:
    """The three veth pairs of a wired link, each end created in its namespace."""
    (a_node, a_if), (b_node, b_if) = link.ends
    a, b = plan.node(a_node).iface(a_if), plan.node(b_node).iface(b_if)
    w = link.wire
    (near_ns, _, near_i), (_, _, nf_i), (far_ns, _, ff_i), (_, _, far_i) = ports(link)
    return [
        (rtnl.veth(a.name, a.index, a.mac, a.mtu, node_fds[a_node],
                   "a", near_i, wire_mac(link.id, 0, 0), a.mtu, ns_fds[near_ns]), f"link {link.a} -- line"),
        (rtnl.veth("fibre", nf_i, wire_mac(link.id, 0, 1), w.fibre_mtu, ns_fds[near_ns],
                   "fibre", ff_i, wire_mac(link.id, 1, 1), w.fibre_mtu, ns_fds[far_ns]), f"fibre of link {link.id}"),
        (rtnl.veth("b", far_i, wire_mac(link.id, 1, 0), b.mtu, ns_fds[far_ns],
                   b.name, b.index, b.mac, b.mtu, node_fds[b_node]), f"line -- link {link.b}"),
    ]


