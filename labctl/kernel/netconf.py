"""Configuring the kernel inside a node's namespace over rtnetlink, whatever built the namespace.

Every backend hands labctl a named netns per node (`<lab>-<node>`) with the node's ports in it;
this module then brings them up and gives them their addresses, HTB trees, bridge and routes, and
changes them while the lab runs (links, routes, rates). One netlink burst per namespace.
"""
from __future__ import annotations

import errno
import os
import socket
import time

from labctl.kernel import fastmaps, fastpath, flowhash, lb, nft, nsutil, rtnl
from labctl.errors import LabError
from labctl.plan import qos
from labctl.plan.model import Interface, Node

BRIDGE_NAME, BRIDGE_INDEX = "br0", 999_999     # a bridge node's one bridge (ports are 2+2k)
CHANGE = rtnl.NLM_F_REQUEST | rtnl.NLM_F_ACK    # RTM_NEW* without CREATE: change what exists


def commit(batch: rtnl.Batch) -> None:
    try:
        batch.commit()
    except rtnl.NetlinkError as exc:
        raise LabError(f"{exc.what} failed: {os.strerror(exc.code)}") from None


def configure(node: Node, nl: socket.socket, ioctl: socket.socket, extra: list = (), extra_first: list = ()) -> None:
    """Ports up with checksums computed in software, addresses, shaping, the bridge, routes.
    `extra_first` goes before all that (a backend that made the ports without their MTU), `extra` after."""
    for iface in node.interfaces:
        nsutil.tx_checksum_off(ioctl, iface.name)
    batch = rtnl.Batch(nl)
    for request, what in extra_first:
        batch.add(request, what)
    # shaping while the ports are still down: grafting a root qdisc on a running device deactivates
    # it and waits for an RCU grace period (~1 ms each; at 1,024 GPUs most of `up`'s time)
    for iface in node.interfaces:
        add_shaping(batch, node, iface)
    # a router with an lb: mode gets its programs once every namespace exists (kernel/lb.py)
    program = flowhash.load(node.flow_hash) if node.flow_hash and node.flow_hash.mode is None else None
    for iface in node.interfaces if program is not None else ():
        for request, what in flowhash.port_requests(iface.index, program, f"{node.name}:{iface.name}"):
            batch.add(request, what)
    fast = fastpath.load(node)      # a router's forwarding in a tc program (kernel/fastpath.py)
    for iface in node.interfaces if fast is not None else ():
        for request, what in fastpath.port_requests(iface.index, fast, f"{node.name}:{iface.name}"):
            batch.add(request, what)
    batch.add(rtnl.link_up(1), f"{node.name}: bringing up lo")
    if node.bridged:
        mtu = max((i.mtu for i in node.interfaces), default=1500)
        batch.add(rtnl.bridge(BRIDGE_NAME, BRIDGE_INDEX, mtu), f"{node.name}: bridge {BRIDGE_NAME}")
        batch.add(rtnl.link_up(BRIDGE_INDEX), f"{node.name}: bringing up {BRIDGE_NAME}")
    for iface in node.interfaces:
        if node.bridged:
            batch.add(rtnl.set_master(iface.index, BRIDGE_INDEX), f"{node.name}: {iface.name} into {BRIDGE_NAME}")
        batch.add(rtnl.link_up(iface.index), f"{node.name}: bringing up {iface.name}")
        if iface.address:
            batch.add(rtnl.addr_add(iface.index, iface.address), f"{node.name}: address {iface.address}")
    if node.loopback:
        batch.add(rtnl.addr_add(1, node.loopback), f"{node.name}: loopback {node.loopback}")
    index = {i.name: i.index for i in node.interfaces}
    for route in node.routes:
        batch.add(rtnl.route_add(route.dst, [(h.via, index[h.dev], h.weight) for h in route.nexthops]),
                  f"{node.name}: route {route.dst}")
    for rule in node.te:        # WAN traffic engineering (plan/te.py): the program marks, these route
        batch.add(rtnl.rule_add(rule.pref, rule.mark, rule.table), f"{node.name}: te rule {rule.rule}")
        for route in rule.routes:
            batch.add(rtnl.route_add(route.dst, [(h.via, index[h.dev], h.weight) for h in route.nexthops],
                                     rule.table), f"{node.name}: route {route.dst} in table {rule.table}")
    for request, what in extra:
        batch.add(request, what)
    try:
        commit(batch)
    finally:
        for fd in (program, fast):
            if fd is not None:
                os.close(fd)      # the ports' filters hold the programs now


def add_shaping(batch: rtnl.Batch, node: Node, iface: Interface) -> None:
    """HTB at the link rate with a class and a leaf per traffic class (plan/qos.py)."""
    s = iface.shaping
    where = f"{node.name}:{iface.name}"
    classes = s.classes
    default = next((c.tc for c in classes if not c.dscp), None)
    default_minor = qos.class_minor(default) if default is not None else 1
    batch.add(rtnl.htb_qdisc(iface.index, qos.HTB_ROOT, default_minor), f"{where}: htb root")
    batch.add(rtnl.htb_class(iface.index, qos.HTB_LINK, qos.HTB_ROOT, s.rate_bps, s.burst_bytes, s.quantum,
                             overhead=s.overhead_bytes),
              f"{where}: htb class at {s.rate_bps} bit/s")
    if not classes:
        batch.add(rtnl.bfifo(iface.index, 0x100000, qos.HTB_LINK, s.buffer_bytes), f"{where}: bfifo leaf")
        return
    for c in classes:
        batch.add(rtnl.htb_class(iface.index, qos.class_handle(c.tc), qos.HTB_LINK, c.rate_bps, s.burst_bytes,
                                 s.quantum, prio=c.prio, ceil_bps=s.rate_bps, overhead=s.overhead_bytes),
                  f"{where}: class {c.name}")
        if c.lossless:  # a TBF leaf, so that a PFC pause can stop this class alone (dataplane/pfcport.py)
            batch.add(rtnl.tbf(iface.index, qos.leaf_handle(c.tc), qos.class_handle(c.tc),
                               qos.lossless_tbf_rate(s.rate_bps), qos.lossless_tbf_burst(s.rate_bps, s.quantum),
                               c.buffer_bytes), f"{where}: {c.name} queue (lossless)")
        else:
            batch.add(rtnl.bfifo(iface.index, qos.leaf_handle(c.tc), qos.class_handle(c.tc), c.buffer_bytes),
                      f"{where}: {c.name} queue")


def classify(node: Node) -> None:
    """Switching nodes put packets in their class by DSCP (nftables sets skb->priority)."""
    if not node.switching or not node.interfaces or not node.interfaces[0].shaping.classes:
        return
    specs = [{"tc": c.tc, "dscp": c.dscp} for c in node.interfaces[0].shaping.classes]
    ctx = nft.Nft(node.namespace)
    try:
        ctx.run(nft.classify_ruleset(specs, bridged=node.bridged))
    finally:
        ctx.close()


def wait_up(nl: socket.socket, namespace: str, ports: set[str], deadline: float,
            no_carrier: set[str] = frozenset()) -> None:
    """Until every port is operationally up: until linkwatch runs, a veth's qdisc is still noop and
    drops everything, so a lab reported up must really forward. A VXLAN port (`no_carrier`) reports
    no carrier at all: the kernel calls its state unknown once it is up."""
    while True:
        states = rtnl.link_states(nl)
        down = sorted(n for n in ports if states.get(n) != rtnl.IF_OPER_UP
                      and not (n in no_carrier and states.get(n) == rtnl.IF_OPER_UNKNOWN))
        if not down:
            return
        if time.monotonic() > deadline:
            raise LabError(f"{namespace}: ports {', '.join(down)} did not come up in time")
        time.sleep(0.005)


def commit_in(namespace: str, requests: list[tuple[tuple, str]]) -> int:
    """Send (request, description) pairs to a namespace in one burst; returns how many were sent."""
    with nsutil.netlink_socket(namespace) as sock:
        batch = rtnl.Batch(sock)
        for request, what, *tolerate in requests:
            batch.add(request, what, *tolerate)
        try:
            batch.commit()
        except rtnl.NetlinkError as exc:
            raise LabError(f"{exc.what} failed: {exc}") from None
    return len(requests)


def set_link(node: Node, iface: Interface, up: bool, neighbours: list = ()) -> None:
    """Administratively bring one port up or down (both ends make a link failure); coming up, with
    its permanent neighbours again (going down flushed them)."""
    kind, _, _ = rtnl.link_up(iface.index)
    commit_in(node.namespace, [((kind, CHANGE, rtnl.ifinfo(iface.index, rtnl.IFF_UP if up else 0, rtnl.IFF_UP)),
                                f"{node.name}: {'up' if up else 'down'} {iface.name}")] + (list(neighbours) if up else []))


def replace_routes(node: Node, old: list, new: list, table: int = rtnl.RT_TABLE_MAIN) -> int:
    """Replace the routes that changed and delete the ones that vanished; returns how many changed.
    `table`: main, or a te: rule's (plan/te.py)."""
    before = {r.dst: [(h.via, h.dev, h.weight) for h in r.nexthops] for r in old}
    after = {r.dst: [(h.via, h.dev, h.weight) for h in r.nexthops] for r in new}
    index = {i.name: i.index for i in node.interfaces}
    requests = [(rtnl.route_replace(dst, [(via, index[dev], w) for via, dev, w in hops], table),
                 f"{node.name}: route {dst}" + (f" in table {table}" if table != rtnl.RT_TABLE_MAIN else ""))
                for dst, hops in after.items() if before.get(dst) != hops]
    # a port that went down took its routes with it: the kernel flushed them, which is what we wanted
    requests += [(rtnl.route_del(dst, table), f"{node.name}: delete route {dst}", (errno.ESRCH,))
                 for dst in before.keys() - after.keys()]
    if table == rtnl.RT_TABLE_MAIN:     # before the routes: a new multipath one is never fast-pathed
        fastmaps.note_multipath(node, new)
        lb.note_multipath(node, new)         # adaptive takes its turn for multipath destinations only
    return commit_in(node.namespace, requests) if requests else 0


def set_rate(node: Node, iface: Interface, rate_bps: int) -> None:
    """Shape a port to `rate_bps`: the link class and every traffic class's ceil, shares kept."""
    s = qos.reshaped(iface.shaping, rate_bps)
    kind, _, body = rtnl.htb_class(iface.index, qos.HTB_LINK, qos.HTB_ROOT, rate_bps, s.burst_bytes, s.quantum,
                                   overhead=s.overhead_bytes)
    requests = [((kind, CHANGE, body), f"{node.name}:{iface.name}: link class")]
    for c in s.classes:
        kind, _, body = rtnl.htb_class(iface.index, qos.class_handle(c.tc), qos.HTB_LINK,
                                       max(qos.MIN_CLASS_BPS, c.rate_bps), s.burst_bytes,
                                       s.quantum, prio=c.prio, ceil_bps=rate_bps, overhead=s.overhead_bytes)
        requests.append(((kind, CHANGE, body), f"{node.name}:{iface.name}: class {c.name}"))
    commit_in(node.namespace, requests)
