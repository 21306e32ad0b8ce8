"""A machine's engine is believed only where this kernel agrees (docs/security.md): what a hostile
or mistaken engine says of a container (its ID, its PID, its name) must never make root enter,
cable or later empty a namespace that is not that container's, or pass an option to `docker`.
Real processes, cgroups and namespaces; a fake engine that answers what it is told to."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import require_root
from labctl.cluster.services import verified_pid
from labctl.containers import nodes
from labctl.errors import LabError
from labctl.kernel import nsutil

pytestmark = pytest.mark.netns
CID = "ab" * 32


class Engine:
    """An engine whose inspect answers with the PID it is given, for any ID."""

    def __init__(self, pid: int, cid: str = CID):
        self.api = SimpleNamespace(inspect_container=lambda _cid: {"Id": cid, "State": {"Pid": pid}})


def cgroup_root() -> Path:
    for root in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        if (root / "cgroup.procs").exists():
            return root
    pytest.fail("no cgroup hierarchy to make a container's cgroup in")


class Process:
    """A process started by `argv` (with `child`, the process it forks: unshare's --fork), moved
    into cgroup `name` (none if None) once it runs; killed and its cgroup removed at exit."""

    def __init__(self, argv: list[str], cgroup: str | None, child: bool = False):
        self.proc = subprocess.Popen(argv)
        self.pid = pid_of_child(self.proc.pid) if child else self.proc.pid
        running_sleep(self.pid)          # its namespaces made: unshare has exec'd sleep
        self.cgroup = cgroup_root() / cgroup if cgroup else None
        if self.cgroup:
            self.cgroup.mkdir()
            (self.cgroup / "cgroup.procs").write_text(str(self.pid))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()
        if self.cgroup:
            for _ in range(100):         # the forked child dies with its parent (--kill-child), a moment later
                try:
                    self.cgroup.rmdir()
                    return
                except OSError:
                    time.sleep(0.02)
            self.cgroup.rmdir()


def node(lab_name: str) -> SimpleNamespace:
    return SimpleNamespace(name="srv1-gpu0", machine="m2", namespace=f"{lab_name}-srv1-gpu0")


def namespaced_sleep() -> list[str]:
    """A process in a network and PID namespace of its own, as a container's init is: the PID
    is the `sleep` itself (unshare --fork execs it as the new namespace's PID 1)."""
    return ["unshare", "--net", "--pid", "--fork", "--kill-child", "sleep", "60"]


def running_sleep(pid: int) -> None:
    for _ in range(250):
        try:
            if os.readlink(f"/proc/{pid}/exe").endswith("/sleep"):
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"process {pid} never ran sleep")


def pid_of_child(outer: int) -> int:
    """The `sleep` unshare forked (a child of `outer`)."""
    for _ in range(100):
        kids = Path(f"/proc/{outer}/task/{outer}/children").read_text().split()
        if kids:
            return int(kids[0])
        time.sleep(0.02)
    raise AssertionError("unshare started no child")


def test_an_id_that_is_not_a_container_id_is_refused_before_anything_is_asked():
    # "0" is a substring of every cgroup file: it once passed the cgroup check for any PID
    with pytest.raises(LabError, match="not a container ID"):
        verified_pid(Engine(1), "0", node("lt"))


def test_a_pid_whose_cgroup_only_contains_the_id_is_refused(lab_name):
    require_root()
    with Process(namespaced_sleep(), f"x{CID}", child=True) as p:    # a cgroup named X<ID>: the ID a substring only
        with pytest.raises(LabError, match="not in container"):
            verified_pid(Engine(p.pid), CID, node(lab_name))


def test_the_hosts_own_processes_are_refused_whatever_cgroup_they_sit_in(lab_name):
    require_root()
    with Process(["sleep", "60"], CID) as p:                   # the right cgroup, the host's namespaces
        with pytest.raises(LabError, match="this host's"):
            verified_pid(Engine(p.pid), CID, node(lab_name))
    with Process(["unshare", "--net", "sleep", "60"], CID) as p:   # its own network, the host's PIDs
        with pytest.raises(LabError, match="this host's PID namespace"):
            verified_pid(Engine(p.pid), CID, node(lab_name))


def test_another_labs_namespace_is_refused_and_the_nodes_own_is_believed(lab_name):
    """A process in a namespace bound under another name (another lab's node): binding it as this
    node's would cable it, and `down` would kill every process in it."""
    require_root()
    other = f"{lab_name}-other"
    nsutil.create(other)
    try:
        argv = ["ip", "netns", "exec", other, "unshare", "--pid", "--fork", "--kill-child", "sleep", "60"]
        with Process(argv, CID, child=True) as p:
            pid = p.pid
            with pytest.raises(LabError, match=f"{other}'s, bound by another lab"):
                verified_pid(Engine(pid), CID, node(lab_name))
            # the same namespace bound under this node's own name (after `up` bound it) is believed
            assert verified_pid(Engine(pid), CID, SimpleNamespace(name="x", machine="m2", namespace=other)) == pid
        with Process(namespaced_sleep(), CID, child=True) as p:
            pid = p.pid
            assert verified_pid(Engine(pid), CID, node(lab_name)) == pid
            # the engine naming another container than the one asked about is refused
            with pytest.raises(LabError, match="not in container"):
                verified_pid(Engine(pid, cid="cd" * 32), CID, node(lab_name))
    finally:
        nsutil.remove(other)


def test_no_process_of_the_hosts_pid_namespace_is_taken_for_an_exec_in_a_container():
    """An engine that says a container's PID is 1 made exec_pid search every process of the host
    for the agent's marker (another lab's agent on the host would match, be journaled, and killed)."""
    marker = "labctl-test-marker-" + CID[:8]
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker]) as p:
        try:
            for _ in range(250):         # exec'd: the marker is in its command line
                if marker.encode() in Path(f"/proc/{p.pid}/cmdline").read_bytes().split(b"\0"):
                    break
                time.sleep(0.02)
            ctr = SimpleNamespace(attrs={"State": {"Pid": 1, "Running": True}})
            assert nodes.exec_pid(ctr, marker) is None
            ctr.attrs["State"]["Pid"] = p.pid           # the host's namespace, whichever process
            assert nodes.exec_pid(ctr, marker) is None
        finally:
            p.kill()


def test_docker_exec_names_the_container_by_its_id_never_its_name():
    ctr = SimpleNamespace(name="--env-file=/root/x.env", id=CID, attrs={"State": {"Running": True}})
    argv = nodes.enter_argv(ctr, "unix:///run/x.sock", ["ip", "link"])
    at = argv.index("exec")
    assert argv[at + 1:] == [CID, "ip", "link"]
    assert not any(a.startswith("-") for a in argv[at + 1:])
    ctr.id = "--privileged"
    with pytest.raises(LabError, match="not a container ID"):
        nodes.enter_argv(ctr, "unix:///run/x.sock", ["ip", "link"])
    assert os.path.basename(argv[0]) == "docker"


def test_a_namespace_is_bound_only_if_it_is_still_the_one_that_was_checked(lab_name):
    """Between the check of a container's PID and the bind of its namespace the process may die and
    its PID go to another: attach holds the namespace open and binds it only if it is the one the
    check saw."""
    require_root()
    with Process(["unshare", "--net", "sleep", "60"], None) as p:
        st = os.stat(f"/proc/{p.pid}/ns/net")
        name = f"{lab_name}-att"
        with pytest.raises(OSError, match="no longer in the network namespace that was checked"):
            nsutil.attach(name, p.pid, expect=(st.st_dev, st.st_ino + 1))
        assert not nsutil.exists(name)
        nsutil.attach(name, p.pid, expect=(st.st_dev, st.st_ino))
        try:
            bound = os.stat(nsutil.path(name))
            assert (bound.st_dev, bound.st_ino) == (st.st_dev, st.st_ino)
            assert nsutil.bound_as((st.st_dev, st.st_ino)) == name
        finally:
            nsutil.remove(name)
