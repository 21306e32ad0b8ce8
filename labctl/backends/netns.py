"""The default backend: Linux network namespaces joined by veth pairs, configured over rtnetlink.

Build order, chosen by measurement (docs/design.md §8):
  1. every namespace, created in-process, with its sysctls set before any interface exists in it
     (receive packet steering among them, so that no flow is reordered between hops: rps.py);
  2. every veth pair in one netlink burst from the root namespace, each end created directly in its
     namespace with its final name, MAC, MTU and ifindex;
  3. per namespace, one burst: links up, addresses, HTB shaping, the bridge, ECMP routes (netconf.py).
Everything made is journaled first; any failure destroys what the journal lists.
"""
from __future__ import annotations

import os
import socket
import sys
import time

from labctl import procs
from labctl.kernel import neighbours, netconf, nsutil, rps, rtnl, wires
from labctl.backends.base import Backend, Progress, own_namespaces, quiet, refuse_taken_namespaces
from labctl.containers import nodes as container_nodes
from labctl.errors import InputError, LabError, Where
from labctl.plan.model import LabPlan
from labctl.state import LabDir


class NetnsBackend(Backend):
    name = "netns"
    description = "Linux network namespaces and veth pairs, built over rtnetlink (the default)"

    def apply(self, plan: LabPlan, lab: LabDir, progress: Progress = quiet) -> None:
        if not any(n.container for n in plan.nodes):
            return self._apply(plan, lab, progress)
        from labctl.containers import engine
        with engine.lease():      # no other labctl stops the engine before our containers are journaled
            return self._apply(plan, lab, progress)

    def check(self, plan: LabPlan) -> list[tuple[str, str, str]]:
        """A placed lab's machines must be in labctl's cluster record."""
        wanted = sorted({n.machine for n in plan.nodes if n.machine})
        if not wanted:
            return []
        from labctl.cluster import machines
        known = machines.load()
        out = [("placement", f"machine {m!r} is not in labctl's cluster"
                + (f" (it knows {', '.join(known)})" if known else " (it knows none)"),
                "`labctl cluster status` lists the machines; `labctl cluster join` adds one, or "
                "`labctl cluster emulate 3` emulates three on this host") for m in wanted if m not in known]
        for m in (m for m in wanted if m in known and not known[m].on_this_host):
            out.append(("placement", f"machine {m!r} is another host ({known[m].engine}): labctl cables and "
                        "configures a node through its network namespace, which it reaches on this host only",
                        "place the lab on machines emulated here (`labctl cluster emulate`) or on this host's own "
                        "engine; building on other hosts is not done yet (docs/multi-machine.md says what is missing)"))
        return out

    def _apply(self, plan: LabPlan, lab: LabDir, progress: Progress) -> None:
        procs.raise_fd_limit(3 * len(plan.nodes) + 6 * len(wires.wired(plan)) + 64)
        refuse_taken_namespaces(plan)
        for node in plan.nodes:       # a privileged node on a machine whose root lacks a capability: refused here
            if node.container:
                container_nodes.can_grant(node)
        handles: dict[str, _NsHandles] = {}
        docker_client = None
        try:
            docker_client = _container_engine(plan, lab, progress, self.build_images)
            placed = _placed_nodes(plan, lab, progress, self.build_images)
            for i, node in enumerate(plan.nodes):
                lab.journal("netns", node.namespace)
                try:
                    if node.machine:
                        pid, checked = placed[node.name]
                        nsutil.attach(node.namespace, pid, note=lab.noter(node.namespace), expect=checked)
                    elif node.container:
                        nsutil.attach(node.namespace, container_nodes.start(docker_client, node, lab),
                                      note=lab.noter(node.namespace))
                    else:
                        nsutil.create(node.namespace, note=lab.noter(node.namespace))
                except FileExistsError:
                    lab.journal("released-netns", node.namespace)
                    raise LabError(f"namespace {node.namespace!r} appeared while building") from None
                handles[node.name] = _NsHandles.open(node.namespace, node.sysctls)
                progress("namespaces", i + 1, len(plan.nodes))
            for ns in wires.namespaces(plan):
                lab.journal("netns", ns)
                nsutil.create(ns, note=lab.noter(ns))
                handles[ns] = _NsHandles.open(ns, wires.SYSCTLS)
            self._create_links(plan, handles, progress)
            if any(link.machines for link in plan.links):
                from labctl.cluster import machines, vxlan
                from labctl.state import all_labs
                base = vxlan.allocate(lab, all_labs(), len(plan.links))
                vxlan.create(plan, machines.load(), {k: h.ns_fd for k, h in handles.items()}, base)
            _steer_without_default_mask(plan, handles)
            for i, node in enumerate(plan.nodes):
                h = handles[node.name]
                netconf.configure(node, h.nl, h.ioctl, neighbours.of_node(plan, node.name))
                progress("configure", i + 1, len(plan.nodes))
            for link in wires.wired(plan):
                _configure_line(link, handles)
            _wait_links_up(plan, handles)
            for h in handles.values():
                h.close()
            handles.clear()
            # after the handles are closed: libnftables waits with select(), so its socket must get a
            # descriptor below FD_SETSIZE, and a 1,024-GPU lab holds thousands while it builds
            for node in plan.nodes:
                netconf.classify(node)
        except BaseException:
            for h in handles.values():
                h.close()
            handles.clear()
            self.destroy(lab)
            if any(n.container and not n.machine for n in plan.nodes):
                # an engine started for this lab goes again (destroy releases it only where the lab
                # had made a container: not when the first one was refused)
                from labctl.containers import engine
                from labctl.state import all_labs
                engine.release_if_idle(container_nodes.labs_with_containers(all_labs(), but=lab.name))
            raise
        finally:
            if docker_client is not None:
                docker_client.close()

    def _create_links(self, plan: LabPlan, handles: dict[str, "_NsHandles"], progress: Progress) -> None:
        # The requests go through a lab namespace's socket, not the root namespace's: a kernel before
        # 6.14 looks a fixed ifi_index up in the *sender's* namespace and answers EEXIST when a root
        # device has it (the VM's eth0 is ifindex 2, our first port's), where a new kernel looks in
        # the target. A lab namespace holds only lo and lab ports, whose indexes are unique in the lab.
        if not plan.links:
            return
        sock = next(iter(handles.values())).nl
        batch = rtnl.Batch(sock)
        ns_fds = {name: h.ns_fd for name, h in handles.items()}
        for link in plan.links:
            if link.machines:
                continue          # a VXLAN between two machines: cluster/vxlan.py, once every node exists
            if link.wire is not None:
                for request, what in wires.veths(plan, link, ns_fds, ns_fds):
                    batch.add(request, f"creating {what}")
                continue
            (a_node, a_if), (b_node, b_if) = link.ends
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

    def destroy(self, lab: LabDir, keep_record: bool = False) -> list[str]:
        """Remove everything the journal lists: processes in the lab's namespaces, then the namespaces.
        A namespace is removed only if it is provably the one this lab made (its journaled identity
        and boot); one that merely has its name is left alone, with a message on stderr."""
        names, others = own_namespaces(lab)
        for name, why in others:
            print(f"labctl: left namespace {name} alone: {why}. If it is a leftover of lab {lab.name}, "
                  f"`ip netns del {name}` removes it", file=sys.stderr)
        had_containers = bool(lab.journaled("container"))
        container_nodes.remove(lab)     # first: Docker stops what runs in them, and forgets them
        services_left = []
        if lab.journaled("service"):
            from labctl.cluster import services
            services_left = services.remove(lab)        # and Swarm, on every machine
        inodes = {i for i in (nsutil.inode(n) for n in names) if i is not None}
        # only processes provably started by labctl (PID and start time, in this boot), and those
        # inside the lab's own namespaces: never a PID that was reused since
        same_boot = lab.read_state().get("boot", procs.boot_id()) == procs.boot_id()
        pids = [p for p in (procs.verified(e) for e in lab.journaled("pid")) if p is not None] if same_boot else []
        if inodes:
            pids += nsutil.pids_in(inodes)
        nsutil.kill_all(sorted(set(p for p in pids if nsutil.pid_alive(p))))
        removed = [n for n in names if nsutil.remove(n)]
        # a build killed between making a name's file and mounting the namespace on it left that
        # file bare: no namespace, but `ip netns list` shows it and a later `up` would find it taken
        removed += [n for n in lab.namespaces() if nsutil.remove_bare_placeholder(n)]
        if inodes:
            # a process that was entering a namespace while we looked (`ip netns exec` setns-ing)
            # would keep it, and its veths, alive: look once more now that no one can enter
            nsutil.kill_all(nsutil.pids_in(inodes))
        if not keep_record and not services_left:
            lab.remove()
        if had_containers:
            from labctl.containers import engine
            from labctl.state import all_labs
            engine.release_if_idle(container_nodes.labs_with_containers(all_labs(), but=lab.name))
        if services_left:
            # the journal is the only record of them: kept, so that `down` can finish the job
            raise LabError(f"lab {lab.name}: everything on this host is removed, but {len(services_left)} of its "
                           f"Swarm services are not ({', '.join(services_left[:3])})",
                           f"`labctl down {lab.name}` again once its Swarm manager answers (`labctl cluster status`)")
        return removed


def _placed_nodes(plan: LabPlan, lab: LabDir, progress: Progress, build_images: bool) -> dict[str, tuple]:
    """Nodes placed on machines (plan/placement.py): each machine gets the images its nodes need,
    then every node's Swarm service; returns node -> (its container's PID, that namespace as checked)."""
    placed = [n for n in plan.nodes if n.machine]
    if not placed:
        return {}
    from labctl.cluster import images, machines, services
    known = machines.load()
    source, started = images.default_images_client(sorted({n.container.image for n in placed}), progress,
                                                   build_images)
    try:
        for name in sorted({n.machine for n in placed}):
            images.ensure_images(known[name], sorted({n.container.image for n in placed if n.machine == name}),
                                 source, progress)
    finally:
        source.close()
        images.release_default(started)
    return services.start(plan, lab, known, lambda node: container_nodes.binds_for(lab, node), progress)


def _container_engine(plan: LabPlan, lab: LabDir, progress: Progress, build_images: bool = True):
    """A Docker client if the lab has container nodes on this host (starting the engine if none
    runs), after checking that none of their names is taken, building any labctl/* image they lack
    and checking that every other image is there, before any container exists."""
    wanted = [n for n in plan.nodes if n.container and not n.machine]
    if not wanted:
        return None
    from labctl.containers import engine, images
    client = engine.ensure(auto=True, progress=progress)
    try:
        images.ensure_present(client, sorted({n.container.image for n in wanted}), build_images, progress)
        missing = images.missing(client, wanted)
        if missing:
            node = missing[0]
            raise InputError(Where(lab.read_state().get("topology_file") or plan.lab, key=f"nodes.{node.name}.image"),
                             f"node {node.name}: image {node.container.image!r} is not in this machine's Docker "
                             "engine, and labctl uses no registry"
                             + (f" ({len(missing) - 1} more node(s) lack theirs)" if len(missing) > 1 else ""),
                             images.missing_fix(node.container.image))
    except BaseException:
        client.close()
        raise
    for node in wanted:
        there = _existing(client, node.container.name)
        if there is not None:
            client.close()
            owner = there.labels.get(container_nodes.LAB_LABEL)
            raise LabError(f"a container named {node.container.name!r} already exists"
                           + (f": lab {owner!r} has it" if owner else ", and no lab of labctl made it"),
                           f"`labctl down {owner}` first, or give this lab another name with --name" if owner else
                           f"`docker rm {node.container.name}` if it is a leftover; else give this lab another "
                           "name with --name")
    return client


def _existing(client, name: str):
    from labctl.containers import engine
    try:
        return client.containers.get(name)
    except engine.sdk().errors.NotFound:
        return None


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
        netconf.commit(batch)


def _wait_links_up(plan: LabPlan, handles: dict[str, _NsHandles], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    wanted = [(node.name, {i.name for i in node.interfaces}) for node in plan.nodes]
    for link in wires.wired(plan):
        wanted += [(ns, {name}) for ns, name, _ in wires.ports(link)]
    tunnels: dict[str, set[str]] = {}
    for link in plan.links:
        if link.machines:
            for node, ifname in link.ends:
                tunnels.setdefault(node, set()).add(ifname)
    for name, want in wanted:
        netconf.wait_up(handles[name].nl, name, want, deadline, tunnels.get(name, set()))
