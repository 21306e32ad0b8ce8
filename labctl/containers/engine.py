"""The Docker engine: use the one that runs, or start dockerd so that it leaves the host's network alone.

No init system starts daemons on the machines labctl targets (PID 1 is not systemd), so labctl
starts dockerd itself when no engine answers, and stops it again when it started it and nothing
of a lab still needs it. It is started with `--iptables=false --ip-forward=false --ip-masq=false
--bridge=none`: Docker's default iptables mode sets the FORWARD policy to DROP, which drops what
Linux bridges forward (bridge-nf-call-iptables), and lab nodes use no network of Docker's anyway
(`network_mode: none`, labctl cables them). Its socket and data root are Docker's defaults, so
`docker ps` and images built earlier work as usual.

What labctl started is recorded in /run/labctl/dockerd.json as PID and start time (procs.identity):
only that process is ever stopped. A labctl process that uses the engine outside a lab (an image
build, an `up` before its first container is journaled) holds a lease, a file named by its own
identity in /run/labctl/engine-users/, and the engine is never stopped under a live lease.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

from labctl import procs
from labctl.errors import LabError

SOCKET = "/var/run/docker.sock"
RUN_DIR = Path("/run/labctl")
RECORD = RUN_DIR / "dockerd.json"
LEASES = RUN_DIR / "engine-users"
LOG = RUN_DIR / "dockerd.log"
START_TIMEOUT_S = 60
DOCKERD_ARGS = ["--host", f"unix://{SOCKET}", "--iptables=false", "--ip6tables=false", "--ip-forward=false",
                "--ip-masq=false", "--bridge=none", "--userland-proxy=false"]
INSTALL_HINT = "`sudo ./install.sh` installs it (apt: docker.io, debootstrap; pip: docker)"


def sdk():
    try:
        import docker
    except ImportError:
        raise LabError("the Docker SDK for Python is not installed", INSTALL_HINT) from None
    return docker


def client(timeout: int = 120):
    """A client of the running engine; LabError if none answers."""
    docker = sdk()
    try:
        c = docker.DockerClient(base_url=f"unix://{SOCKET}", timeout=timeout)
        c.ping()
        return c
    except Exception as exc:    # the SDK raises requests' and its own errors alike
        raise LabError(f"no Docker engine answers on {SOCKET} ({type(exc).__name__})",
                       "`sudo labctl engine start` starts one (labctl up does it for a lab with containers)") from None


def answering() -> bool:
    try:
        client(timeout=5).close()
        return True
    except LabError:
        return False


def _read_record() -> dict | None:
    try:
        rec = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def started_by_labctl() -> dict | None:
    """The record of the dockerd labctl started, if that very process still runs."""
    rec = _read_record()
    if rec is None or procs.verified(str(rec.get("identity", ""))) is None:
        return None
    return rec


def _socket_identity() -> str | None:
    """The engine socket's device, inode and change time: what labctl's record names as the socket
    its dockerd made."""
    try:
        st = os.lstat(SOCKET)
    except OSError:
        return None
    return f"{st.st_dev}:{st.st_ino}:{st.st_ctime_ns}" if stat.S_ISSOCK(st.st_mode) else None


def _listening(path: str) -> bool:
    """Something accepts connections on the unix socket `path` (a live engine, slow or not)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(path)
        return True
    except OSError as exc:
        return exc.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK)
    finally:
        s.close()


def _refuse_foreign_socket() -> None:
    """Before labctl starts dockerd: a socket where the engine's belongs is removed only if labctl's
    own dockerd made it and has gone, never one that something else made or that is listening
    (an engine slow to answer a ping is still an engine; dockerd would replace its socket)."""
    if not os.path.lexists(SOCKET):
        return
    if _listening(SOCKET):
        raise LabError(f"an engine listens on {SOCKET} but did not answer within 5 s; labctl starts no "
                       "second one over it", "wait for it (`docker info`), or stop it, then try again")
    rec = _read_record()
    mine = rec is not None and rec.get("socket") is not None and rec.get("socket") == _socket_identity()
    if not mine:
        raise LabError(f"{SOCKET} exists, no engine answers on it, and labctl did not make it: labctl "
                       "removes no file it did not create", f"if no Docker engine runs here, remove it "
                       f"(rm {SOCKET}) and try again")
    os.unlink(SOCKET)          # left by the dockerd labctl started, which died


def status() -> dict:
    """What `labctl doctor` and `labctl engine status` show."""
    dockerd = shutil.which("dockerd")
    rec = started_by_labctl()
    out = {"dockerd": dockerd, "socket": SOCKET, "answering": answering(), "started_by_labctl": bool(rec),
           "auto": bool(rec and rec.get("auto"))}
    if out["answering"]:
        c = client(timeout=5)
        try:
            out["version"] = c.version().get("Version")
        finally:
            c.close()
    return out


def ensure(auto: bool = True, progress=None):
    """A client of a running engine, starting dockerd first if none answers. `auto`: started on a
    lab's behalf, so the last `down` stops it again (`labctl engine start` keeps it)."""
    if answering():
        rec = started_by_labctl()
        if rec and not auto and rec.get("auto"):
            _write_record({**rec, "auto": False})     # asked for explicitly now: keep it
        return client()
    start(auto, progress)
    return client()


def start(auto: bool, progress=None) -> int:
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise LabError("dockerd is not installed, and a node of this lab has an image:", INSTALL_HINT)
    _refuse_foreign_socket()
    RUN_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    if progress:
        progress("docker engine", 0, 1)
    log = open(LOG, "ab")
    p = subprocess.Popen([dockerd, *DOCKERD_ARGS], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         cwd="/", start_new_session=True)
    log.close()
    _write_record({"pid": p.pid, "identity": procs.identity(p.pid), "auto": auto, "started": time.time()})
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise LabError(f"dockerd exited with status {p.returncode} while starting: {_log_tail()}",
                           f"see {LOG}")
        if answering():
            if progress:
                progress("docker engine", 1, 1)
            _write_record({**(_read_record() or {}), "socket": _socket_identity()})   # this socket is ours
            return p.pid
        time.sleep(0.1)
    stop(force=True)
    raise LabError(f"dockerd did not answer within {START_TIMEOUT_S} s: {_log_tail()}", f"see {LOG}")


def stop(force: bool = False) -> bool:
    """Stop the dockerd labctl started (only that one); `force` even if containers still run.
    Returns whether one was stopped."""
    rec = started_by_labctl()
    if rec is None:
        RECORD.unlink(missing_ok=True)
        return False
    if not force and answering():
        c = client(timeout=10)
        try:
            running = c.containers.list(all=True, ignore_removed=True)   # one may go while listed
        finally:
            c.close()
        if running:
            names = ", ".join(x.name for x in running[:5])
            raise LabError(f"the Docker engine labctl started still holds {len(running)} container(s): {names}",
                           "take their labs down first (`labctl status`), or `labctl engine stop --force`")
    pid = rec["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while procs.verified(rec["identity"]) == pid and time.monotonic() < deadline:
        time.sleep(0.05)
    if procs.verified(rec["identity"]) == pid:
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while procs.verified(rec["identity"]) == pid and time.monotonic() < deadline:
            time.sleep(0.05)
    if rec.get("socket") and rec.get("socket") == _socket_identity() and not _listening(SOCKET):
        os.unlink(SOCKET)        # the socket our dockerd made and, killed, left behind
    RECORD.unlink(missing_ok=True)
    return True


@contextlib.contextmanager
def lease():
    """Hold the engine for the block: no other labctl process stops it meanwhile."""
    LEASES.mkdir(mode=0o700, parents=True, exist_ok=True)
    mine = LEASES / procs.identity(os.getpid())
    mine.touch()
    try:
        yield
    finally:
        mine.unlink(missing_ok=True)


def leased_by_others() -> bool:
    """Another live labctl process holds a lease (stale leases of dead processes are dropped)."""
    me = procs.identity(os.getpid())
    held = False
    for entry in (LEASES.iterdir() if LEASES.is_dir() else ()):
        if entry.name == me:
            continue
        if procs.verified(entry.name) is None:
            entry.unlink(missing_ok=True)
        else:
            held = True
    return held


def release_if_idle(still_needed: bool) -> bool:
    """After a lab's containers are gone: stop an engine labctl started on a lab's behalf, unless
    another lab still has containers or another labctl process holds a lease. Returns whether it
    was stopped."""
    rec = started_by_labctl()
    if rec is None or not rec.get("auto") or still_needed or leased_by_others():
        return False
    try:
        return stop()
    except LabError:
        return False          # something else runs containers on it now: leave it to `engine stop`


def _write_record(rec: dict) -> None:
    RUN_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = RECORD.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, RECORD)


def _log_tail() -> str:
    try:
        return LOG.read_text(errors="replace").strip().splitlines()[-1][-300:]
    except (OSError, IndexError):
        return "(no log)"
