"""Taking an emulated machine apart (cluster/emulate.py journals what it made; this removes it).

Every step acts on one of labctl's own names (lcm-mN, /run/lcm-mN, cgroup /labctl-mN) and,
where the kernel gives an identity, only after checking it: a dockerd by PID and start time, a
namespace by its cookie, a link by its ifindex. Each step that fails is named in `failures`
and the rest still run, so a second stop() finishes what the first could not.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from labctl import procs
from labctl.kernel import nsutil, rtnl
from labctl.kernel.netlink import NetlinkError

RTM_DELLINK = 17
MNT_DETACH = 2
CGROUP_ROOT = Path("/sys/fs/cgroup")
# what a machine's engine starts besides dockerd itself: found by the paths of its exec root
ENGINE_COMMS = {"dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2", "runc", "docker-proxy"}
_libc = ctypes.CDLL(None, use_errno=True)


def exec_root(m: str) -> Path:
    return Path(f"/run/lcm-{m}")


def sock(m: str) -> Path:
    return Path(f"/run/lcm-{m}.sock")


def pidfile(m: str) -> Path:
    return Path(f"/run/lcm-{m}.pid")


def children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _client(m: str, timeout: int):
    from labctl.containers import engine
    c = engine.sdk().DockerClient(base_url=f"unix://{sock(m)}", timeout=timeout)
    c.ping()
    return c


def answers(m: str) -> bool:
    try:
        _client(m, 3).close()
        return True
    except Exception:
        return False


def quiesce_all(names: list[str]) -> None:
    """Before the dockerds are stopped: remove the Swarm's services (on a manager), make every
    engine leave the Swarm (a kept data root would otherwise rejoin it at the next start) and
    remove the task containers, so that dockerd's shutdown has nothing left to stop. The engines
    leave at once: one worker's leave took 6 s. An engine that does not answer is skipped: its
    process is stopped anyway."""
    for m in names:
        with contextlib.suppress(Exception):
            c = _client(m, 20)
            try:
                if (c.info().get("Swarm") or {}).get("ControlAvailable"):
                    for svc in c.services.list():
                        with contextlib.suppress(Exception):
                            svc.remove()
            finally:
                c.close()
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        list(pool.map(_quiesce, names))


def _quiesce(m: str) -> None:
    with contextlib.suppress(Exception):
        c = _client(m, 20)
        try:
            if (c.info().get("Swarm") or {}).get("LocalNodeState", "inactive") != "inactive":
                c.swarm.leave(force=True)
            for ctr in c.containers.list(all=True, filters={"label": "com.docker.swarm.task.id"}):
                with contextlib.suppress(Exception):
                    ctr.remove(force=True)
        finally:
            c.close()


def _gone(identity: str | None, reapable: dict) -> bool:
    if not identity:
        return True
    pid = int(identity.split(":")[0])
    if pid in reapable:
        reapable[pid].poll()        # our own child: reap it, or it stays a zombie of this process
    return procs.verified(identity) is None


def _signal_wait(identities: list[str], timeout: float, reapable: dict) -> list[str]:
    """SIGTERM each live process (verified), wait up to `timeout`, then SIGKILL; returns the ones
    still alive."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
        alive = [i for i in identities if not _gone(i, reapable)]
        for ident in alive:
            pid = procs.verified(ident)
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [i for i in alive if not _gone(i, reapable)]
        if not alive:
            return []
        identities = alive
    return identities


def _engine_pids(m: str) -> list[int]:
    """Processes of machine m's engine that outlived it (a containerd, shims): their command lines
    name its exec root or socket; and whatever runs in its containers' cgroup /labctl-m."""
    root, own = str(exec_root(m)), {str(sock(m)), f"unix://{sock(m)}", str(pidfile(m))}
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            args = Path(f"/proc/{entry.name}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if comm(int(entry.name)) in ENGINE_COMMS and any(a == root or a.startswith(root + "/") or a in own
                                                         for a in args):
            found.add(int(entry.name))
    for d in _cgroup_dirs(m):
        for sub, _dirs, _files in os.walk(d):
            with contextlib.suppress(OSError, ValueError):
                found.update(int(x) for x in Path(sub, "cgroup.procs").read_text().split())
    return sorted(found)


def stop_processes(items: list[tuple[str, dict]], timeout: float, reapable: dict, failures: list[str]) -> None:
    """Every machine's dockerd at once (each takes seconds to shut down), then containerd, then any
    process of its engine left over."""
    left = _signal_wait([ent["dockerd"] for _, ent in items if ent.get("dockerd")], timeout, reapable)
    left += _signal_wait([ent["containerd"] for _, ent in items if ent.get("containerd")], 10, reapable)
    for m, _ent in items:
        pids = _engine_pids(m)
        if pids:
            nsutil.kill_all(pids, grace=5)
        if _engine_pids(m):
            failures.append(f"processes of machine {m}'s engine: {_engine_pids(m)}")
    if left:
        failures.append(f"processes that would not end: {left}")


def _mounts_under(roots: list[str]) -> list[str]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")    # \040 for a space, as the kernel writes
            if any(point == r or point.startswith(r + "/") for r in roots):
                out.append(point)
    return sorted(set(out), key=len, reverse=True)      # deepest first


def unmount_under(roots: list[str], failures: list[str]) -> None:
    """What the engine mounted and, killed, left: its sandboxes' namespaces under <exec-root>/netns,
    its containers' root filesystems under the data root."""
    for _ in range(5):                   # a mount point may hold several stacked mounts
        points = _mounts_under(roots)
        if not points:
            return
        for p in points:
            _libc.umount2(p.encode(), MNT_DETACH)
    left = _mounts_under(roots)
    if left:
        failures.append(f"mounts: {', '.join(left[:5])}")


def delete_link(name: str, ifindex: int | None, failures: list[str]) -> None:
    """Delete link `name` if it is the one made (its ifindex as journaled; a journal entry written
    just before the link was made has none yet)."""
    with contextlib.closing(rtnl.open_socket()) as s:
        idx = rtnl.link_indexes(s).get(name)
        if idx is None or (ifindex is not None and idx != ifindex):
            return
        b = rtnl.Batch(s)
        b.add((RTM_DELLINK, rtnl.CHANGE, rtnl.ifinfo(idx)), f"delete {name}", tolerate=(19,))   # ENODEV: gone
        try:
            b.commit()
        except (OSError, NetlinkError) as exc:
            failures.append(f"link {name} ({exc})")


def _cgroup_dirs(m: str) -> list[Path]:
    try:
        ctrls = [e for e in CGROUP_ROOT.iterdir() if e.is_dir()]
    except OSError:
        return []
    # cgroup v1: one tree per controller (/sys/fs/cgroup/cpu/labctl-mN ...); v2: one tree
    return [c / f"labctl-{m}" for c in [CGROUP_ROOT, *ctrls] if (c / f"labctl-{m}").is_dir()]


def remove_machine(m: str, ent: dict, data_root: Path, failures: list[str]) -> None:
    """Everything of machine m but its data root (kept: the images loaded there stay)."""
    unmount_under([str(exec_root(m)), str(data_root)], failures)
    veth = ent.get("veth") or {}
    if veth.get("name") == f"lcm-{m}":
        delete_link(veth["name"], veth.get("ifindex"), failures)
    name = ent.get("netns")
    if name == f"lcm-{m}" and ent.get("netns_id"):        # the identity is journaled before the name is bound
        if nsutil.identity(name) == ent["netns_id"]:
            nsutil.remove(name)
        else:
            nsutil.remove_bare_placeholder(name)
        if nsutil.identity(name) == ent["netns_id"]:
            failures.append(f"namespace {name}")
    if ent.get("dirs"):
        if ent.get("dockerd") and procs.verified(ent["dockerd"]):
            failures.append(f"the dockerd of {m} still runs")
            return
        pidfile(m).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(sock(m)).st_mode):
                sock(m).unlink()
        if not _mounts_under([str(exec_root(m))]):      # never rmtree across a mount
            shutil.rmtree(exec_root(m), ignore_errors=True)
    for d in _cgroup_dirs(m):                            # the cgroup parent its containers were in
        for sub, _dirs, _files in os.walk(d, topdown=False):
            try:
                os.rmdir(sub)
            except OSError as exc:
                failures.append(f"cgroup {sub} ({exc.strerror})")


def forget_machines(path: str | None, names: set[str], failures: list[str]) -> None:
    """Drop the emulated machines from the cluster record the emulation wrote (and the record, if
    they were all it held)."""
    if not path:
        return
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        failures.append(f"cluster record {p} ({exc})")
        return
    keep = [m for m in raw.get("machines", []) if m.get("netns") not in names]
    if not keep:
        p.unlink(missing_ok=True)
        return
    from labctl.state import write_private
    write_private(p, json.dumps({"machines": keep}, indent=1))
