"""Links between machines: one point-to-point VXLAN per link, as containerlab's `type: vxlan`.

Each end is a kernel VXLAN device whose UDP socket lives in its machine's own namespace (where the
underlay address is) while the device itself is created straight into the node's namespace, with
the port's planned name, MAC, MTU and ifindex ("vxlan: add x-netns support"): the node sees an
ordinary Ethernet port. No bridge stands in the path, so 802.1Qbb pause frames (which a Linux
bridge always drops) and ECN-marked packets cross machines unchanged.

Every link gets its own VNI. The kernel refuses two VXLAN devices with one VNI on one UDP port in
one namespace, so a lab takes a block of VNIs that no other lab on this state directory holds,
recorded in its state before any device exists.
"""
from __future__ import annotations

import contextlib
import os

from labctl.errors import LabError

PORT = 14789          # containerlab's: clear of 4789, which Swarm's own overlay data path uses
VXLAN_OVERHEAD = 50   # what the underlay carries beyond the port's MTU: inner Ethernet 14, IPv4 20, UDP 8, VXLAN 8
VNI_FIRST = 10000
VNI_LAST = (1 << 24) - 1


def allocate(lab, labs, count: int) -> int:
    """The first VNI of a free block of `count` (journaled in the lab's state), given every lab's."""
    taken = []
    for other in labs:
        if other.name == lab.name:
            continue
        st = other.read_state()
        base, count_ = st.get("vni_base"), st.get("vni_count", 0)
        if base is None:
            continue
        if not (isinstance(base, int) and isinstance(count_, int) and VNI_FIRST <= base <= VNI_LAST
                and 0 <= count_ <= VNI_LAST):
            raise LabError(f"lab {other.name}'s record holds a VNI block labctl did not write ({base!r}, {count_!r})",
                           f"`labctl down {other.name}`, or remove its record if it is not a lab of yours")
        taken.append((base, base + count_))
    base = VNI_FIRST
    for lo, hi in sorted(taken):
        if base + count <= lo:
            break
        base = max(base, hi)
    if base + count > VNI_LAST:
        raise LabError("no block of free VNIs is left", "take other labs down (`labctl status`)")
    lab.write_state(vni_base=base, vni_count=count)
    return base


@contextlib.contextmanager
def _in(netns: str | None):
    """In the machine's namespace (an emulated machine), or where we are (this host)."""
    if netns is None:
        yield
        return
    from labctl.kernel import nsutil
    with nsutil.entered(netns):
        yield


def underlay(machine) -> tuple[int, int]:
    """(ifindex, MTU) of the machine's device that holds its underlay address."""
    from pyroute2 import IPRoute
    with _in(machine.netns):
        ipr = IPRoute()
    try:
        for a in ipr.get_addr(family=2):
            if a.get_attr("IFA_ADDRESS") == machine.address:
                index = a["index"]
                mtu = ipr.get_links(index)[0].get_attr("IFLA_MTU")
                return index, mtu
    finally:
        ipr.close()
    raise LabError(f"machine {machine.name}: no device holds its underlay address {machine.address}",
                   "`labctl cluster status` shows the machines; give the address of the network that joins them")


def create(plan, machines: dict, ns_fds: dict[str, int], base: int) -> int:
    """Every cross-machine link's two VXLAN ends; returns how many links. LabError naming the link
    if the kernel refuses one."""
    from labctl.kernel import rtnl
    crossing = [link for link in plan.links if link.machines]
    if not crossing:
        return 0
    ports = {name: underlay(machines[name]) for name in {m for lk in crossing for m in lk.machines}}
    socks = {}
    try:
        for name in ports:
            with _in(machines[name].netns):
                socks[name] = rtnl.open_socket()
        for link in crossing:
            for end, ((node, ifname), here, there) in enumerate(zip(link.ends, link.machines, link.machines[::-1])):
                iface = plan.node(node).iface(ifname)
                index, mtu = ports[here]
                if iface.mtu + VXLAN_OVERHEAD > mtu:
                    raise LabError(f"link {link.a} -- {link.b}: its MTU {iface.mtu} and VXLAN's {VXLAN_OVERHEAD} "
                                   f"bytes do not fit machine {here}'s underlay MTU {mtu}",
                                   f"give the lab `defaults: {{mtu: {mtu - VXLAN_OVERHEAD}}}` or less, or raise the "
                                   "underlay's MTU")
                batch = rtnl.Batch(socks[here])
                batch.add(rtnl.vxlan(iface.name, iface.index, iface.mac, iface.mtu, ns_fds[node], base + link.id,
                                     machines[here].address, machines[there].address, index, PORT),
                          f"creating VXLAN {base + link.id} for {link.a} -- {link.b} on machine {here}")
                try:
                    batch.commit()
                except rtnl.NetlinkError as exc:
                    raise LabError(f"{exc.what} failed: {os.strerror(exc.code)}",
                                   "`labctl cluster status`; another VXLAN user of UDP port "
                                   f"{PORT} there?") from None
        return len(crossing)
    finally:
        for s in socks.values():
            s.close()
