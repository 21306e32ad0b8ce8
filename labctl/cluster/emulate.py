"""Emulate N machines on this host: one network namespace and one dockerd each, joined in one Swarm.

Machine mN is the namespace `lcm-mN`, cabled by a veth (`lcm-mN` here, `eth0` there, MTU 9100)
to the underlay bridge `lcm-underlay`, and runs its own dockerd (socket /run/lcm-mN.sock, data
root /var/lib/labctl/machines/mN, kept so that images loaded once stay). dockerd is started by
`nsenter --net` (`ip netns exec` hides the cgroup mounts from it) and its managed containerd,
its child, lives in the same namespace. Docker's bridge, iptables and forwarding stay off: a
Swarm task then gets a namespace of its own with only `lo`, as a lab node wants.

Everything made is journaled in /run/labctl/cluster-emulation.json before it is made (a process
right after its start, as PID and start time), and stop() removes only what the journal names,
after checking it is the very namespace, link or process that was made.
"""
from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from labctl import procs
from labctl.cluster import machines as mrec
from labctl.cluster import swarm, teardown
from labctl.cluster.teardown import exec_root, pidfile, sock
from labctl.errors import LabError
from labctl.kernel import nsutil, rps, rtnl

RUN_DIR = Path("/run/labctl")
RECORD = RUN_DIR / "cluster-emulation.json"
LOCK = RUN_DIR / "cluster-emulation.lock"
DATA_ROOT = Path("/var/lib/labctl/machines")
BRIDGE = "lcm-underlay"
MTU = 9100
MACHINE_RE = re.compile(r"m[1-9]")
MAX_MACHINES = 8            # each engine costs ~100 MB and some CPU: this host has 2 cores
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
STOP_FIX = "`sudo labctl cluster emulate --stop` removes what the emulation made"
_CHILDREN: dict[int, subprocess.Popen] = {}   # dockerds started by this process: reaped when they end


def netns(m: str) -> str:
    return mrec.emulated_netns(m)


def dockerd_args(m: str) -> list[str]:
    ns = netns(m)
    return ["--config-file", str(exec_root(m) / "daemon.json"), "--data-root", str(DATA_ROOT / m),
            "--exec-root", str(exec_root(m)), "-H", f"unix://{sock(m)}", "--pidfile", str(pidfile(m)),
            "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false", "--ip-forward=false",
            "--userland-proxy=false", f"--cgroup-parent=/labctl-{m}",
            # separate containerd namespaces even if a shared system containerd ever appears
            "--containerd-namespace", ns, "--containerd-plugins-namespace", f"{ns}p",
            "--label", f"{mrec.MACHINE_LABEL}={m}"]


def _load() -> dict | None:
    try:
        rec = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("boot") == procs.boot_id() else None


def _save(rec: dict) -> None:
    RUN_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = RECORD.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1))
    os.replace(tmp, RECORD)


@contextlib.contextmanager
def _locked():
    """One start or stop at a time on this host."""
    RUN_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _machine(m: str, address: str, manager: bool) -> mrec.Machine:
    return mrec.Machine(m, f"unix://{sock(m)}", address, netns=netns(m), manager=manager)


def start(count: int = 3, subnet: str = "192.168.77.0/24", progress=None) -> dict[str, mrec.Machine]:
    """Emulate `count` machines m1..mN, form their Swarm (m1 manages) and record them as the cluster."""
    if os.geteuid() != 0:
        raise LabError("emulating machines needs root", "run it with sudo")
    net = _check(count, subnet)
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise LabError("dockerd is not installed", "`sudo ./install.sh` installs it (apt: docker.io)")
    with _locked():
        if _load() is not None:
            raise LabError("machines are emulated on this host already", STOP_FIX + " first")
        known = mrec.load()
        if any(not (m.netns or "").startswith("lcm-") for m in known.values()):
            raise LabError(f"labctl knows real machines ({', '.join(known)}): the emulation would replace them",
                           "`labctl cluster reset` forgets them first")
        names = [f"m{i}" for i in range(1, count + 1)]
        _refuse_foreign([BRIDGE, *map(netns, names)])
        rec = {"boot": procs.boot_id(), "subnet": str(net), "bridge": None, "machines": {},
               "cluster_record": str(mrec.record_path())}
        _save(rec)
        try:
            return _build(rec, names, net, dockerd, progress)
        except BaseException as exc:     # failed or interrupted: nothing may stay half made
            _stop_locked()
            if isinstance(exc, LabError) or not isinstance(exc, Exception):
                raise
            raise LabError(f"emulating {count} machines failed, and what was made is removed again: "
                           f"{type(exc).__name__}: {exc}", f"see the engines' logs {RUN_DIR}/lcm-m*.log") from exc


def _check(count: int, subnet: str) -> ipaddress.IPv4Network:
    if not 1 <= count <= MAX_MACHINES:
        raise LabError(f"cannot emulate {count} machines", f"give 1 to {MAX_MACHINES}")
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as exc:
        raise LabError(f"{subnet!r} is not an IPv4 subnet ({exc})", "e.g. --subnet 192.168.77.0/24") from None
    if net.num_addresses - 2 < count:
        raise LabError(f"subnet {net} has no room for {count} machines", "give a larger one, e.g. a /24")
    if net.overlaps(ipaddress.IPv4Network(swarm.DEFAULT_ADDR_POOL[0])):
        raise LabError(f"subnet {net} overlaps the Swarm's address pool {swarm.DEFAULT_ADDR_POOL[0]}",
                       "pick another underlay subnet, e.g. 192.168.77.0/24")
    return net


def _refuse_foreign(names: list[str]) -> None:
    """A namespace or link of ours by name that no journal names: never reuse or remove it."""
    with contextlib.closing(rtnl.open_socket()) as s:
        links = rtnl.link_indexes(s)
    for name in names:
        if name in links or nsutil.exists(name):
            raise LabError(f"{name} exists on this host but no emulation of labctl's made it",
                           f"if it is a leftover, `ip netns del {name}` / `ip link del {name}` removes it")


def _build(rec: dict, names: list[str], net, dockerd: str, progress) -> dict[str, mrec.Machine]:
    t0 = time.monotonic()
    say = progress or (lambda *a: None)
    with contextlib.closing(rtnl.open_socket()) as root:
        rec["bridge"] = {"name": BRIDGE}
        _save(rec)
        _commit(root, rtnl.bridge(BRIDGE, 0, MTU), f"bridge {BRIDGE}", lambda: (rec.update(bridge=None), _save(rec)))
        br = rec["bridge"]["ifindex"] = rtnl.link_indexes(root)[BRIDGE]
        _save(rec)
        _commit(root, rtnl.link_up(br), f"{BRIDGE} up")
        for i, m in enumerate(names, 1):
            say("machines", i - 1, len(names))
            address = str(net.network_address + i)
            ent = rec["machines"][m] = {"netns": netns(m), "address": address}
            _save(rec)
            nsutil.create(netns(m), note=lambda ident: (ent.__setitem__("netns_id", ident), _save(rec)))
            _cable(root, rec, ent, m, i, br, f"{address}/{net.prefixlen}")
            ent["dockerd"] = _start_dockerd(m, dockerd, ent, rec)
        say("machines", len(names), len(names))
    for i, m in enumerate(names):
        say("engines answering", i, len(names))
        _wait_engine(m, rec["machines"][m])
        _save(rec)
    say("engines answering", len(names), len(names))
    machines = {m: _machine(m, rec["machines"][m]["address"], m == names[0]) for m in names}
    for mach in machines.values():
        swarm.leave(mach)          # a kept data root may remember a Swarm of a run killed before stop
    swarm.init(machines[names[0]])
    for m in names[1:]:
        swarm.join(machines[m], machines[names[0]])
    for mach in machines.values():
        swarm.label(machines[names[0]], mach)
    swarm.wait_ready(machines[names[0]], len(names), progress=progress)
    mrec.save(machines)
    rec["seconds"] = round(time.monotonic() - t0, 1)
    _save(rec)
    return machines


def _commit(sock_, request, what: str, unmade=None) -> None:
    """One rtnetlink request. If the kernel refuses it, `unmade()` drops the journal entry written
    for it: a name that existed is someone else's, and stop() must not remove it."""
    b = rtnl.Batch(sock_)
    b.add(request, what)
    try:
        b.commit()
    except Exception:
        if unmade:
            unmade()
        raise


def _cable(root, rec: dict, ent: dict, m: str, i: int, br: int, cidr: str) -> None:
    """veth lcm-mN (root side, on the bridge) / eth0 (in the machine), addressed and up."""
    ent["veth"] = {"name": netns(m)}
    _save(rec)
    here = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    there = os.open(nsutil.path(netns(m)), os.O_RDONLY)
    try:
        _commit(root, rtnl.veth(netns(m), 0, f"02:1c:6d:00:00:{i:02x}", MTU, here,
                                "eth0", 0, f"02:1c:6d:01:00:{i:02x}", MTU, there),
                f"veth {netns(m)}", lambda: (ent.update(veth=None), _save(rec)))
    finally:
        os.close(here)
        os.close(there)
    idx = ent["veth"]["ifindex"] = rtnl.link_indexes(root)[netns(m)]
    _save(rec)
    _commit(root, rtnl.set_master(idx, br), f"{netns(m)} on {BRIDGE}")
    _commit(root, rtnl.link_up(idx), f"{netns(m)} up")
    with nsutil.netlink_socket(netns(m)) as inside:
        links = rtnl.link_indexes(inside)
        b = rtnl.Batch(inside)
        b.add(rtnl.addr_add(links["eth0"], cidr), f"{cidr} on eth0 of {m}")
        b.add(rtnl.link_up(links["eth0"]), f"eth0 of {m} up")
        b.add(rtnl.link_up(links["lo"]), f"lo of {m} up")
        b.commit()
    # a real machine's NIC keeps a flow on one CPU (RSS); a veth hands each packet to the backlog of
    # the CPU that sent it, and two of them reorder a VXLAN flow between machines (kernel/rps.py)
    mask = rps.cpu_mask()
    rps.set_on_devices(str(nsutil.path(netns(m))), ["eth0"], mask)
    rps.set_on_devices("/proc/thread-self/ns/net", [netns(m)], mask)


def _start_dockerd(m: str, dockerd: str, ent: dict, rec: dict) -> str:
    ent["dirs"] = True
    _save(rec)
    exec_root(m).mkdir(mode=0o700, parents=True, exist_ok=True)
    (DATA_ROOT / m).mkdir(mode=0o700, parents=True, exist_ok=True)
    (exec_root(m) / "daemon.json").write_text("{}")    # never /etc/docker/daemon.json, the host engine's
    # the hostname (mN, labctl's own name, never user text) is set inside a new UTS namespace, then
    # the shell execs dockerd: the PID started here is dockerd's own
    argv = ["nsenter", f"--net={nsutil.path(netns(m))}", "--", "unshare", "--uts", "--",
            "/bin/sh", "-c", 'hostname "$0" && exec "$@"', m, dockerd, *dockerd_args(m)]
    # a task's image is never pulled (these machines reach no registry): only local images are used
    # nothing of the caller's environment (proxies, DOCKER_*, LD_*): the engine runs as a daemon would
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
           "DOCKER_SERVICE_PREFER_OFFLINE_IMAGE": "1"}
    with open(RUN_DIR / f"lcm-{m}.log", "wb") as log:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/", env=env,
                             start_new_session=True)
    ident = ent["dockerd"] = procs.identity(p.pid)
    _CHILDREN[p.pid] = p
    _save(rec)
    return ident


def _wait_engine(m: str, ent: dict) -> None:
    from labctl.containers import engine
    docker = engine.sdk()
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if procs.verified(ent["dockerd"]) is None:
            raise LabError(f"the dockerd of machine {m} exited while starting: {_log_tail(m)}",
                           f"see {RUN_DIR / f'lcm-{m}.log'}")
        with contextlib.suppress(Exception):     # not listening yet
            c = docker.DockerClient(base_url=f"unix://{sock(m)}", timeout=5)
            try:
                c.ping()
            finally:
                c.close()
            break
        if time.monotonic() > deadline:
            raise LabError(f"the dockerd of machine {m} did not answer within {START_TIMEOUT_S} s: "
                           f"{_log_tail(m)}", f"see {RUN_DIR / f'lcm-{m}.log'}")
        time.sleep(0.1)
    pid = int(ent["dockerd"].split(":")[0])
    for child in teardown.children(pid):       # its managed containerd: waited for at stop
        if teardown.comm(child) == "containerd":
            ent["containerd"] = procs.identity(child)


def _log_tail(m: str) -> str:
    try:
        return (RUN_DIR / f"lcm-{m}.log").read_text(errors="replace").strip().splitlines()[-1][-300:]
    except (OSError, IndexError):
        return "(no log)"


def stop() -> bool:
    """Remove everything the emulation made (only that); True if there was one. Idempotent."""
    with _locked():
        return _stop_locked()


def _stop_locked() -> bool:
    rec = _load()
    if rec is None:
        RECORD.unlink(missing_ok=True)      # another boot's, or unreadable: it names nothing alive
        return False
    failures: list[str] = []
    # only names this module gives: a name from the record becomes paths that are removed
    ms = [(m, ent) for m, ent in rec.get("machines", {}).items() if MACHINE_RE.fullmatch(m) and isinstance(ent, dict)]
    teardown.quiesce_all([m for m, ent in ms if ent.get("dockerd") and procs.verified(ent["dockerd"])])
    teardown.stop_processes([(m, ent) for m, ent in ms], STOP_TIMEOUT_S, _CHILDREN, failures)
    for m, ent in ms:
        teardown.remove_machine(m, ent, DATA_ROOT / m, failures)
    br = rec.get("bridge") or {}
    if br.get("name") == BRIDGE:
        teardown.delete_link(BRIDGE, br.get("ifindex"), failures)
    cluster_record = rec.get("cluster_record")
    if isinstance(cluster_record, str) and Path(cluster_record).name == "cluster.json":
        teardown.forget_machines(cluster_record, {netns(m) for m, _ in ms}, failures)
    if failures:
        _save(rec)
        raise LabError("stopping the emulated machines left: " + "; ".join(failures),
                       "run it again; " + STOP_FIX)
    RECORD.unlink(missing_ok=True)
    _CHILDREN.clear()
    return True


def halt(m: str) -> None:
    """Take machine `m` away, as a machine that goes down: its engine stops, and every container
    it runs with it. Its namespace, address and data root stay, so that resume() brings it back
    with its Swarm state (what a real machine that reboots keeps)."""
    with _locked():
        rec, ent = _entry(m)
        failures: list[str] = []
        teardown.stop_processes([(m, ent)], STOP_TIMEOUT_S, _CHILDREN, failures)
        ent["dockerd"] = ent["containerd"] = None
        _save(rec)
        if failures:
            raise LabError(f"halting machine {m} left: " + "; ".join(failures), STOP_FIX)


def resume(m: str) -> None:
    """Bring machine `m` back after halt(): its engine starts again on its data root, and its Swarm
    agent rejoins (and carries out what the manager decided meanwhile)."""
    with _locked():
        rec, ent = _entry(m)
        if ent.get("dockerd") and procs.verified(ent["dockerd"]):
            return
        ent["dockerd"] = _start_dockerd(m, shutil.which("dockerd") or "dockerd", ent, rec)
        _wait_engine(m, ent)
        _save(rec)


def _entry(m: str) -> tuple[dict, dict]:
    """The emulation's record and machine m's entry in it."""
    rec = _load() or {}
    ent = (rec.get("machines") or {}).get(m)
    if not MACHINE_RE.fullmatch(m) or not isinstance(ent, dict):
        raise LabError(f"machine {m} is not emulated here", "`labctl cluster status` lists the machines")
    return rec, ent


def status() -> dict[str, dict]:
    """The emulated machines: their engine, address, and whether namespace and dockerd are alive."""
    rec = _load() or {}
    out = {}
    for m, ent in rec.get("machines", {}).items():
        pid = procs.verified(ent.get("dockerd") or "")
        out[m] = {"engine": f"unix://{sock(m)}", "address": ent.get("address"), "netns": ent.get("netns"),
                  "netns_alive": nsutil.identity(netns(m)) == ent.get("netns_id"), "dockerd_pid": pid,
                  "answering": bool(pid) and teardown.answers(m)}
    return out

