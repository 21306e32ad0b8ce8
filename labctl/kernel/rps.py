"""Keep every flow in order across the lab's hops: steer each port's received packets by flow hash.

A veth hands a packet to the receiving namespace through the backlog of the CPU that transmitted
it. A flow's packets are transmitted from whichever CPU runs the qdisc at that moment (the sender's
thread, or the HTB watchdog on the other core), so consecutive packets can land in two CPUs'
backlogs, be processed in parallel, and arrive swapped: measured here, 1-5 reordered packets per
NVLink peer in every incast under CPU load, which a real switch never does and RoCE RC cannot
tolerate. Receive packet steering (RPS) picks the backlog from the flow hash instead, as a NIC's
RSS does, so one flow always goes through one CPU in order: 0 reordered packets in the same runs.

Two ways to set it, fastest first:
  * `net.core.rps_default_mask` in the namespace before its ports exist (per namespace since
    kernel 6.5): every port made afterwards inherits it, at no cost per port;
  * otherwise each port's `queues/rx-N/rps_cpus` in sysfs, which shows a namespace's devices only
    to a sysfs mounted from inside it: a forked child with a private mount namespace enters the
    network namespace, mounts sysfs and writes them (about a millisecond per namespace).
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

SYSCTL = "net.core.rps_default_mask"
CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)


def cpu_mask() -> str:
    """Every CPU this process may run on, as the hex mask the kernel reads."""
    return format(sum(1 << c for c in os.sched_getaffinity(0)), "x")


def set_default(mask: str) -> bool:
    """Set the current namespace's default mask; False if this kernel has no per-namespace one."""
    try:
        with open("/proc/sys/" + SYSCTL.replace(".", "/"), "w") as f:
            f.write(mask)
        return True
    except OSError:
        return False


def set_on_devices(namespace_path: str, ifnames: list[str], mask: str) -> None:
    """The sysfs path: write `mask` to every rx queue of `ifnames` in the namespace at `namespace_path`."""
    def write(sys: Path) -> str:
        for name in ifnames:
            queues = _rx_queues(sys, name)
            if not queues:      # a sysfs of another namespace than the one meant: nothing to steer
                raise OSError(f"no receive queues for {name} in {sys}")
            for q in queues:
                with open(q / "rps_cpus", "w") as f:
                    f.write(mask)
        return ""
    _in_namespace_sysfs(namespace_path, write)


def read_masks(namespace_path: str, ifnames: list[str]) -> dict[str, list[str]]:
    """{port: [mask of each rx queue]} as the kernel holds them (doctor and tests)."""
    def read(sys: Path) -> str:
        return "\n".join(f"{n} {(q / 'rps_cpus').read_text().strip()}" for n in ifnames for q in _rx_queues(sys, n))
    out: dict[str, list[str]] = {}
    for line in _in_namespace_sysfs(namespace_path, read).splitlines():
        name, mask = line.split()
        out.setdefault(name, []).append(mask)
    return out


def _in_namespace_sysfs(namespace_path: str, action) -> str:
    """Run action(sysfs root) in a forked child that sees the namespace's sysfs; returns its text.
    This process's own namespace is the one its /sys shows (a second sysfs of it cannot be mounted)."""
    there, here = os.stat(namespace_path), os.stat("/proc/thread-self/ns/net")
    if (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino):
        return action(Path("/sys"))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(r)
        code = 1
        try:
            os.write(w, _enter_and_mount(namespace_path, action).encode())
            code = 0
        except BaseException as exc:
            os.write(w, f"{type(exc).__name__}: {exc}".encode())
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise OSError(f"receive packet steering in {namespace_path}: {text}")
    return text


def _enter_and_mount(namespace_path: str, action) -> None:
    """In a forked child: a private mount namespace, the network namespace, sysfs mounted from it."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare")
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    fd = os.open(namespace_path, os.O_RDONLY)
    _check(_libc.setns(fd, CLONE_NEWNET), "setns")  # os.setns is Python 3.12+
    os.close(fd)
    _check(_libc.mount(b"sysfs", b"/sys", b"sysfs", 0, None), "mount sysfs")
    return action(Path("/sys"))


def _rx_queues(sys: Path, ifname: str) -> list[Path]:
    return sorted((sys / "class" / "net" / ifname / "queues").glob("rx-*"))


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")

