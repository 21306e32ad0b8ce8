"""What this kernel can do, each tried for real in a throwaway namespace (removed afterwards).

A qdisc kind the kernel lacks is refused with ENOENT, one it has fails differently (or succeeds)
without options, so the probe needs no per-qdisc parameters. `labctl doctor` turns the answers into
the mechanism each feature uses.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess

from labctl.kernel import nsutil, rps, rtnl

QDISCS = ("htb", "tbf", "bfifo", "clsact", "red", "netem", "prio", "mqprio", "fq_codel")


def _probe_namespace() -> str:
    return f"labctl-doctor-{os.getpid()}"


def probe_kernel() -> dict[str, bool]:
    """qdisc kinds, veth, ESP (XFRM with an AEAD state) — each tried for real in a scratch namespace."""
    name = _probe_namespace()
    found: dict[str, bool] = {}
    nsutil.create(name)
    try:
        with nsutil.entered(name):
            sock = rtnl.open_socket()
        try:
            batch = rtnl.Batch(sock)
            ns_fd = os.open(nsutil.path(name), os.O_RDONLY)
            batch.add(rtnl.veth("p0", 10, "02:00:00:00:00:01", 1500, ns_fd,
                                "p1", 11, "02:00:00:00:00:02", 1500, ns_fd), "veth")
            try:
                batch.commit()
                found["veth"] = True
            except rtnl.NetlinkError:
                found["veth"] = False
            finally:
                os.close(ns_fd)
            for kind in QDISCS:
                index = 10 if found["veth"] else 1
                batch.add(rtnl.qdisc_probe(index, kind), kind)
                try:
                    batch.commit()
                    found[kind] = True
                except rtnl.NetlinkError as exc:
                    found[kind] = exc.code != 2  # ENOENT: no such qdisc kind
                _delete_root_qdisc(sock, index)
        finally:
            sock.close()
        found["esp"] = _probe_esp(name)
        found["nftables"] = _probe_nft(name)
        found.update(_probe_multipath_hash(name))
        found["bpf_flow_hash"] = _probe_flow_hash(sock_ns=name)
        found["arrival_counters"] = _probe_arrivals(sock_ns=name)
        with nsutil.entered(name):
            found["rps_default_mask"] = rps.set_default(rps.cpu_mask())
    finally:
        nsutil.remove(name)
    found["sched_fifo"] = _probe_sched_fifo()
    found["udp_gso_no_csum"] = kernel_at_least(6, 11)
    return found


def kernel_at_least(major: int, minor: int) -> bool:
    """Whether this kernel's release is major.minor or newer (a feature no probe can try safely:
    UDP GSO from a port without checksum offload, which the agents fall back from at run time)."""
    release = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return release is not None and (int(release[1]), int(release[2])) >= (major, minor)


def _probe_sched_fifo() -> bool:
    """Whether labctl's helpers can run real-time here (a container may refuse it)."""
    try:
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        os.sched_setscheduler(0, policy, param)
        return True
    except OSError:
        return False


def _probe_multipath_hash(name: str) -> dict[str, bool]:
    """Policy 3 (hash chosen fields: the 5-tuple) and a settable seed, written as a lab would."""
    found = {}
    with nsutil.entered(name):
        for key, sysctl, value in (("hash_fields", "net.ipv4.fib_multipath_hash_policy", "3"),
                                   ("hash_seed", "net.ipv4.fib_multipath_hash_seed", "1")):
            try:
                nsutil.write_sysctl(sysctl, value)
                found[key] = True
            except OSError:
                found[key] = False
    return found


def _probe_flow_hash(sock_ns: str) -> bool:
    """labctl's ECMP hash: the program loads and attaches to a port's ingress (the scratch lo)."""
    from labctl.kernel import flowhash
    from labctl.errors import LabError
    from labctl.plan.flowhash import FlowHash
    try:
        fd = flowhash.load(FlowHash(l4=True, seed=1))
    except LabError:
        return False
    try:
        with nsutil.netlink_socket(sock_ns) as sock:
            batch = rtnl.Batch(sock)
            for request, what in flowhash.port_requests(1, fd, "lo"):
                batch.add(request, what)
            batch.commit()
        return True
    except rtnl.NetlinkError:
        return False
    finally:
        os.close(fd)


def _probe_arrivals(sock_ns: str) -> bool:
    """The controller's arrival counters: the map maps into memory and the program counts on a
    port's egress (the scratch namespace's lo, with a packet sent through it)."""
    from labctl.dataplane import arrivals
    from labctl.errors import LabError
    if arrivals.probe() is not None:
        return False
    try:
        counters = arrivals.Counters(1)
    except OSError:
        return False
    try:
        with nsutil.netlink_socket(sock_ns) as sock:
            counters.attach(sock, [(1, 0, "lo")])
            batch = rtnl.Batch(sock)
            batch.add(rtnl.link_up(1), "lo up")
            batch.commit()
        with nsutil.entered(sock_ns):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                udp.sendto(b"x" * 100, ("127.0.0.1", 9))
        return int(counters.snapshot()[arrivals.OTHER]) >= 100
    except (OSError, LabError, rtnl.NetlinkError):
        return False
    finally:
        counters.close()


def _delete_root_qdisc(sock: socket.socket, index: int) -> None:
    body = rtnl._tcmsg(index, 0, rtnl.TC_H_ROOT)
    b = rtnl.Batch(sock)
    b.add((37, rtnl.CHANGE, body), "delete qdisc")  # RTM_DELQDISC
    try:
        b.commit()
    except rtnl.NetlinkError:
        pass


def _probe_esp(name: str) -> bool:
    """Kernel ESP: add an AES-GCM SA with `ip xfrm` (fixed arguments) in the scratch namespace."""
    if not shutil.which("ip"):
        return False
    argv = ["ip", "-n", name, "xfrm", "state", "add", "src", "192.0.2.1", "dst", "192.0.2.2", "proto", "esp",
            "spi", "0x100", "reqid", "1", "mode", "tunnel", "aead", "rfc4106(gcm(aes))",
            "0x" + "11" * 20, "128"]
    return subprocess.run(argv, capture_output=True).returncode == 0


def _probe_nft(name: str) -> bool:
    if not shutil.which("nft"):
        return False
    r = subprocess.run(["ip", "netns", "exec", name, "nft", "add", "table", "inet", "labctl_probe"],
                       capture_output=True)
    return r.returncode == 0
