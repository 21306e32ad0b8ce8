"""The default backend: Linux network namespaces joined by veth pairs, configured over rtnetlink.

Build order, chosen by measurement (docs/design.md §8):
  1. every namespace, created in-process, with its sysctls set before any interface exists in it
     (receive packet steering among them, so that no flow is reordered between hops: rps.py);
  2. every veth pair in one netlink burst from the root namespace, each end created directly in its
     namespace with its final name, MAC, MTU and ifindex;
  3. per namespace, one burst: links up, addresses, HTB shaping with a bfifo leaf, ECMP routes.
Everything made is journaled first; any failure destroys what the journal lists.
"""
from __future__ import annotations

import os
import resource
import socket
import time
from typing import Callable

from labctl.backends import nsutil, rps, rtnl, wires
from labctl.dataplane import nft, qos
from labctl import procs
from labctl.errors import LabError
from labctl.plan.model import Interface, LabPlan, Node
from labctl.state import LabDir

Progress = Callable[[str, int, int], None]



def _quiet(stage: str, done: int, total: int) -> None:
    pass


class NetnsBackend:
    name = "netns"

    def apply(self, plan: LabPlan, lab: LabDir, progress: Progress = _quiet) -> None:
        _raise_fd_limit(3 * len(plan.nodes) + 6 * len(wires.wired(plan)) + 64)
        for node in plan.nodes:
            if nsutil.exists(node.namespace):
                raise LabError(f"namespace {node.namespace!r} already exists; it is not this lab's to reuse",
                               f"`labctl down {plan.lab}` if it is a lab of that name, or pick another "
                               "name with --name")
        handles: dict[str, _NsHandles] = {}
        try:
            for i, node in enumerate(plan.nodes):
                lab.journal("netns", node.namespace)
                try:
                    nsutil.create(node.namespace)
                except FileExistsError:
                    lab.journal("released-netns", node.namespace)
                    raise LabError(f"namespace {node.namespace!r} appeared while building") from None
                handles[node.name] = _NsHandles.open(node.namespace, node.sysctls)
                progress("namespaces", i + 1, len(plan.nodes))
            for ns in wires.namespaces(plan):
                lab.journal("netns", ns)
                nsutil.create(ns)
                handles[ns] = _NsHandles.open(ns, wires.SYSCTLS)
            self._create_links(plan, handles, progress)
            _steer_without_default_mask(plan, handles)
            for i, node in enumerate(plan.nodes):
                _configure(node, handles[node.name], wires.static_neighbours(plan, node.name))
                _classify(node)
                progress("configure", i + 1, len(plan.nodes))
            for link in wires.wired(plan):
                _configure_line(link, handles)
            _wait_links_up(plan, handles)
        except BaseException:
            for h in handles.values():
                h.close()
            handles.clear()
            self.destroy(lab)
            raise
        finally:
            for h in handles.values():
                h.close()

    def _create_links(self, plan: LabPlan, handles: dict[str, "_NsHandles"], progress: Progress) -> None:
        sock = rtnl.open_socket()
        try:
            batch = rtnl.Batch(sock)
            ns_fds = {name: h.ns_fd for name, h in handles.items()}
            for link in plan.links:
                if link.wire is not None:
                    for request, what in wires.veths(plan, link, ns_fds, ns_fds):
                        batch.add(request, f"creating {what}")
                    continue
                a_node, a_if = link.a.split(":")
                b_node, b_if = link.b.split(":")
                a = plan.node(a_node).iface(a_if)
                b = plan.node(b_node).iface(b_if)
                batch.add(rtnl.veth(a.name, a.index, a.mac, a.mtu, handles[a_node].ns_fd,
                                    b.name, b.index, b.mac, b.mtu, handles[b_node].ns_fd),
                          f"creating link {link.a} -- {link.b}")
            try:
                batch.commit()
            except rtnl.NetlinkError as exc:
                raise LabError(f"{exc.what} failed: {os.strerror(exc.code)}") from None
            progress("links", len(plan.links), len(plan.links))
        finally:
            sock.close()

    def destroy(self, lab: LabDir, keep_record: bool = False) -> list[str]:
        """Remove everything the journal lists: processes in the lab's namespaces, then the namespaces."""
        names = lab.namespaces()
        inodes = {i for i in (nsutil.inode(n) for n in names) if i is not None}
        # only processes provably started by labctl (PID and start time), and those inside the lab's
        # own namespaces: never a PID that was reused since
        pids = [p for p in (procs.verified(e) for e in lab.journaled("pid")) if p is not None]
        if inodes:
            pids += nsutil.pids_in(inodes)
        nsutil.kill_all(sorted(set(p for p in pids if nsutil.pid_alive(p))))
        removed = [n for n in names if nsutil.remove(n)]
        if inodes:
            # a process that was entering a namespace while we looked (`ip netns exec` setns-ing)
            # would keep it, and its veths, alive: look once more now that no one can enter
            nsutil.kill_all(nsutil.pids_in(inodes))
        if not keep_record:
            lab.remove()
        return removed


class _NsHandles:
    """Open handles into one namespace: its fd (to place veth ends), an rtnetlink socket, an ioctl socket."""

    def __init__(self, ns_fd: int, nl: socket.socket, ioctl: socket.socket, namespace: str, rps_default: bool):
        self.ns_fd, self.nl, self.ioctl = ns_fd, nl, ioctl
        self.namespace, self.rps_default = namespace, rps_default

    @classmethod
    def open(cls, namespace: str, sysctls: dict[str, str]) -> "_NsHandles":
        with nsutil.entered(namespace):
            nsutil.write_sysctls(sysctls)
            rps_default = rps.set_default(rps.cpu_mask())
            nl = rtnl.open_socket()
            ioctl = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            ns_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        return cls(ns_fd, nl, ioctl, namespace, rps_default)

    def close(self) -> None:
        for closer in (lambda: os.close(self.ns_fd), self.nl.close, self.ioctl.close):
            try:
                closer()
            except OSError:
                pass


def _steer_without_default_mask(plan: LabPlan, handles: dict[str, _NsHandles]) -> None:
    """Kernels without a per-namespace default RPS mask: set each port's mask through sysfs."""
    ports: dict[str, list[str]] = {node.name: [i.name for i in node.interfaces] for node in plan.nodes}
    for link in wires.wired(plan):
        for ns, name, _ in wires.ports(link):
            ports.setdefault(ns, []).append(name)
    mask = rps.cpu_mask()
    for key, names in ports.items():
        h = handles[key]
        if not h.rps_default and names:
            rps.set_on_devices(str(nsutil.path(h.namespace)), names, mask)


def _configure_line(link, handles: dict[str, _NsHandles]) -> None:
    """The line's ports: up, no checksum offload (frames leave as the sender made them)."""
    for ns in (link.wire.near, link.wire.far):
        batch = rtnl.Batch(handles[ns].nl)
        batch.add(rtnl.link_up(1), f"{ns}: bringing up lo")
        for port_ns, name, index in wires.ports(link):
            if port_ns == ns:
                nsutil.tx_checksum_off(handles[ns].ioctl, name)
                batch.add(rtnl.link_up(index), f"{ns}: bringing up {name}")
        try:
            batch.commit()
        except rtnl.NetlinkError as exc:
            raise LabError(f"{exc.what} failed: {os.strerror(exc.code)}") from None


def _configure(node: Node, h: _NsHandles, extra: list = ()) -> None:
    for iface in node.interfaces:
        nsutil.tx_checksum_off(h.ioctl, iface.name)
    batch = rtnl.Batch(h.nl)
    batch.add(rtnl.link_up(1), f"{node.name}: bringing up lo")
    for iface in node.interfaces:
        batch.add(rtnl.link_up(iface.index), f"{node.name}: bringing up {iface.name}")
        batch.add(rtnl.addr_add(iface.index, iface.address), f"{node.name}: address {iface.address}")
        _add_shaping(batch, node, iface)
    if node.loopback:
        batch.add(rtnl.addr_add(1, node.loopback), f"{node.name}: loopback {node.loopback}")
    index = {i.name: i.index for i in node.interfaces}
    for route in node.routes:
        batch.add(rtnl.route_add(route.dst, [(h.via, index[h.dev], h.weight) for h in route.nexthops]),
                  f"{node.name}: route {route.dst}")
    for request, what in extra:
        batch.add(request, what)
    try:
        batch.commit()
    except rtnl.NetlinkError as exc:
        raise LabError(f"{exc.what} failed: {os.strerror(exc.code)}") from None


def _add_shaping(batch: rtnl.Batch, node: Node, iface: Interface) -> None:
    """HTB at the link rate with a class and a bfifo leaf per traffic class (dataplane/qos.py)."""
    s = iface.shaping
    where = f"{node.name}:{iface.name}"
    classes = s.classes
    default = next((c.tc for c in classes if not c.dscp), None)
    default_minor = qos.class_minor(default) if default is not None else 1
    batch.add(rtnl.htb_qdisc(iface.index, qos.HTB_ROOT, default_minor), f"{where}: htb root")
    batch.add(rtnl.htb_class(iface.index, qos.HTB_LINK, qos.HTB_ROOT, s.rate_bps, s.burst_bytes, s.quantum),
              f"{where}: htb class at {s.rate_bps} bit/s")
    if not classes:
        batch.add(rtnl.bfifo(iface.index, 0x100000, qos.HTB_LINK, s.buffer_bytes), f"{where}: bfifo leaf")
        return
    for c in classes:
        batch.add(rtnl.htb_class(iface.index, qos.class_handle(c.tc), qos.HTB_LINK, c.rate_bps, s.burst_bytes,
                                 s.quantum, prio=c.prio, ceil_bps=s.rate_bps), f"{where}: class {c.name}")
        if c.lossless:  # a TBF leaf, so that a PFC pause can stop this class alone (dataplane/pfc.py)
            batch.add(rtnl.tbf(iface.index, qos.leaf_handle(c.tc), qos.class_handle(c.tc),
                               qos.lossless_tbf_rate(s.rate_bps), qos.lossless_tbf_burst(s.rate_bps, s.quantum),
                               c.buffer_bytes), f"{where}: {c.name} queue (lossless)")
        else:
            batch.add(rtnl.bfifo(iface.index, qos.leaf_handle(c.tc), qos.class_handle(c.tc), c.buffer_bytes),
                      f"{where}: {c.name} queue")


def _classify(node: Node) -> None:
    """Forwarding nodes put packets in their class by DSCP (nftables sets skb->priority)."""
    if not node.forwarding or not node.interfaces or not node.interfaces[0].shaping.classes:
        return
    specs = [{"tc": c.tc, "dscp": c.dscp} for c in node.interfaces[0].shaping.classes]
    ctx = nft.Nft(node.namespace)
    try:
        ctx.run(qos.classify_ruleset(specs))
    finally:
        ctx.close()


def _wait_links_up(plan: LabPlan, handles: dict[str, _NsHandles], timeout: float = 10.0) -> None:
    """Wait for every port to be operationally up: until linkwatch runs, a veth's qdisc is still
    noop and drops everything, so a lab reported up must really forward."""
    deadline = time.monotonic() + timeout
    wanted = [(node.name, {i.name for i in node.interfaces}) for node in plan.nodes]
    for link in wires.wired(plan):
        wanted += [(ns, {name}) for ns, name, _ in wires.ports(link)]
    for name, want in wanted:
        while True:
            states = rtnl.link_states(handles[name].nl)
            down = sorted(n for n in want if states.get(n) != rtnl.IF_OPER_UP)
            if not down:
                break
            if time.monotonic() > deadline:
                raise LabError(f"{name}: ports {', '.join(down)} did not come up within {timeout:g} s")
            time.sleep(0.005)


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(need, soft), hard), hard))


def commit_in(namespace: str, requests: list[tuple[tuple, str]]) -> int:
    """Send (request, description) pairs to a namespace in one burst; returns how many were sent."""
    with nsutil.netlink_socket(namespace) as sock:
        batch = rtnl.Batch(sock)
        for request, what in requests:
            batch.add(request, what)
        try:
            batch.commit()
        except rtnl.NetlinkError as exc:
            raise LabError(f"{exc.what} failed: {exc}") from None
    return len(requests)


def set_link(node: Node, iface: Interface, up: bool) -> None:
    """Administratively bring one port up or down (both ends make a link failure)."""
    kind, flags, _ = rtnl.link_up(iface.index)
    commit_in(node.namespace, [((kind, flags, rtnl.ifinfo(iface.index, rtnl.IFF_UP if up else 0, rtnl.IFF_UP)),
                                f"{node.name}: {'up' if up else 'down'} {iface.name}")])


def apply_routes(node: Node, old: list, new: list) -> int:
    """Replace the routes that changed and delete the ones that vanished; returns how many changed."""
    before = {r.dst: [(h.via, h.dev, h.weight) for h in r.nexthops] for r in old}
    after = {r.dst: [(h.via, h.dev, h.weight) for h in r.nexthops] for r in new}
    index = {i.name: i.index for i in node.interfaces}
    requests = [(rtnl.route_replace(dst, [(via, index[dev], w) for via, dev, w in hops]), f"{node.name}: route {dst}")
                for dst, hops in after.items() if before.get(dst) != hops]
    requests += [(rtnl.route_del(dst), f"{node.name}: delete route {dst}") for dst in before.keys() - after.keys()]
    return commit_in(node.namespace, requests) if requests else 0
