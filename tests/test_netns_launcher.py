"""The agent launcher (traffic/launcher.py, traffic/spawn.py): one process forks a run's agents,
each in its own GPU namespace with only its own two pipes, and nothing outlives them."""
from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import pytest

from conftest import require_root
from labctl.kernel import nsutil
from labctl.traffic import launcher, spawn

@pytest.fixture
def namespaces():
    require_root()
    names = [f"ltl{uuid.uuid4().hex[:6]}-g{k}" for k in range(3)]
    for n in names:
        subprocess.run(["ip", "netns", "add", n], check=True)
    yield names
    for n in names:
        subprocess.run(["ip", "netns", "del", n], capture_output=True)


def _inode(path: str) -> int:
    return os.stat(path).st_ino


def _fds(pid: int) -> dict[int, str]:
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
    return out


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].startswith("Z")    # dead, left for init to reap
    except OSError:
        return True


@pytest.mark.netns
def test_each_agent_runs_in_its_namespace_with_only_its_own_pipes_and_ends_with_them(namespaces):
    run = spawn.Launched({r: ns for r, ns in enumerate(namespaces)})
    try:
        pids = {r: a.pid for r, a in run.agents.items()}
        assert len(set(pids.values())) == 3 and run.proc.pid not in pids.values()
        for r, ns in enumerate(namespaces):
            pid, a = pids[r], run.agents[r]
            # in the GPU's namespace, not the launcher's, and forked by the launcher
            assert _inode(f"/proc/{pid}/ns/net") == _inode(f"/var/run/netns/{ns}")
            assert _inode(f"/proc/{pid}/ns/net") != _inode(f"/proc/{run.proc.pid}/ns/net")
            ppid = int(open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()[1])
            assert ppid == run.proc.pid
            # its stdin and stdout are its own pipes, and nothing else of the launcher's stays open in
            # it: no other rank's pipe, no namespace descriptor (once the child has set itself up: the
            # launcher reports it as soon as it is forked)
            mine = {0: f"pipe:[{os.fstat(a.stdin.fileno()).st_ino}]", 1: f"pipe:[{os.fstat(a.stdout.fileno()).st_ino}]"}
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                fds = _fds(pid)
                if set(fds) == {0, 1, 2} and all(fds[k] == v for k, v in mine.items()):
                    break
                time.sleep(0.02)
            assert set(fds) == {0, 1, 2} and all(fds[k] == v for k, v in mine.items()), fds
        # a closed command pipe ends an agent, as when its pool dies; its answers then reach EOF
        a0, a1, a2 = (run.agents[r] for r in range(3))
        a0.stdin.close()
        assert a0.wait(timeout=10) == 0
        assert a0.stdout.read() == ""
        # a killed one is reported by its signal; the third, whose pipes stay open, still runs
        a1.kill()
        assert a1.wait(timeout=10) == -9
        assert a2.poll() is None and os.path.exists(f"/proc/{a2.pid}")
        a2.stdin.close()
        assert a2.wait(timeout=10) == 0
        run.wait(timeout=10)
        assert run.proc.returncode == 0
        for pid in pids.values():
            assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1][:1]
    finally:
        run.kill()


@pytest.mark.netns
def test_a_launcher_killed_with_its_agents_leaves_no_process(namespaces):
    run = spawn.Launched({r: ns for r, ns in enumerate(namespaces)})
    pids = [a.pid for a in run.agents.values()]
    run.kill()
    run.wait(timeout=10)
    # the launcher reaped them before it ended: none is left to init as a zombie (init here took
    # over a second to reap such orphans)
    deadline = time.monotonic() + 1
    while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]


@pytest.mark.netns
def test_three_hundred_agents_start_from_one_launcher_and_end_with_their_pipes(namespaces):
    """A large run's list goes to the launcher on stdin (one argument is limited to 128 KiB), and every
    rank gets its own command pipe, and ends when that pipe closes."""
    run = spawn.Launched({r: namespaces[r % 3] for r in range(300)})
    try:
        assert len({a.pid for a in run.agents.values()}) == 300
        # each one's stdin is the very pipe this side writes to (once the child has taken it)
        deadline = time.monotonic() + 10
        for a in run.agents.values():
            mine = f"pipe:[{os.fstat(a.stdin.fileno()).st_ino}]"
            while os.readlink(f"/proc/{a.pid}/fd/0") != mine and time.monotonic() < deadline:
                time.sleep(0.01)
            assert os.readlink(f"/proc/{a.pid}/fd/0") == mine, a.rank
        for a in run.agents.values():
            a.stdin.close()
        assert all(a.wait(timeout=30) == 0 and a.stdout.read() == "" for a in run.agents.values())
        run.wait(timeout=10)
        assert run.proc.returncode == 0
    finally:
        run.kill()


@pytest.mark.netns
def test_a_namespace_gone_mid_list_fails_located_and_leaves_no_agent(namespaces):
    from labctl.errors import LabError
    gone = namespaces[0].rsplit("-", 1)[0] + "-gone"
    with pytest.raises(LabError, match=f"before starting rank 1 \\(in {gone}\\)"):
        spawn.Launched({0: namespaces[0], 1: gone, 2: namespaces[2]})
    # rank 0 had been forked into its namespace: the launcher killed and reaped it before it ended
    assert nsutil.pids_in({nsutil.inode(namespaces[0])}) == []


@pytest.mark.netns
def test_agents_of_a_launcher_killed_under_them_are_killed_by_their_pool(namespaces):
    run = spawn.Launched({r: ns for r, ns in enumerate(namespaces)})
    pids = [a.pid for a in run.agents.values()]
    os.kill(run.proc.pid, 9)                 # the launcher alone, as the OOM killer would
    assert all(a.wait(timeout=10) == -9 for a in run.agents.values())
    deadline = time.monotonic() + 5
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]


def test_the_launcher_refuses_names_labctl_does_not_make():
    with pytest.raises(ValueError):
        launcher.parse(json.dumps([{"rank": 0, "namespace": "../../etc", "stdin": 3, "stdout": 4}]))
    with pytest.raises(ValueError):
        launcher.parse(json.dumps([{"rank": "0", "namespace": "lt-a", "stdin": 3, "stdout": 4}]))
    with pytest.raises(ValueError):
        launcher.parse("[]")
    with pytest.raises(ValueError, match="another rank's"):
        launcher.parse(json.dumps([{"rank": 0, "namespace": "lt-a", "stdin": 3, "stdout": 4},
                                   {"rank": 1, "namespace": "lt-b", "stdin": 4, "stdout": 5}]))
    with pytest.raises(ValueError, match="standard"):
        launcher.parse(json.dumps([{"rank": 0, "namespace": "lt-a", "stdin": 0, "stdout": 4}]))
