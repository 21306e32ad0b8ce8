"""The pool's side of the launcher (launcher.py): one process forks every agent of a run.

`Launched({rank: namespace})` holds one `Agent` per rank (`.agents`) with what the pool used from
`subprocess.Popen`: `stdin` and `stdout` as text, `pid`, `poll()`, `wait(timeout)` and `kill()`.
The launcher is this process's child; the agents are its children, so their exit codes come from
its reports.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

from labctl import procs
from labctl.errors import LabError


class Agent:
    def __init__(self, rank: int, stdin, stdout):
        self.rank, self.stdin, self.stdout = rank, stdin, stdout
        self.pid: int | None = None
        self.identity: str | None = None   # "PID:START", read by the launcher before it could reap it
        self.returncode: int | None = None
        self._ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"agent of rank {self.rank}", timeout)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL, only while the process is still the one the launcher forked (its start time
        checked: once reaped, its pid may belong to another process)."""
        if self.identity and procs.verified(self.identity):
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        for f in (self.stdin, self.stdout):
            try:
                f.close()
            except OSError:
                pass

    def _ended_with(self, code: int) -> None:
        self.returncode = code
        self._ended.set()


class Launched:
    """A launcher and the agents it forked."""

    def __init__(self, namespaces: dict[int, str], started: float = 60.0):
        self.agents: dict[int, Agent] = {}
        self.proc: subprocess.Popen | None = None
        try:
            self._start(namespaces, started)
        except BaseException as exc:
            self.kill()
            for a in self.agents.values():
                a.close()
            if isinstance(exc, (OSError, TimeoutError, RuntimeError)):
                raise LabError(f"the traffic agents could not be started: {exc}",
                               "`labctl status` shows whether the lab is still up") from exc
            raise

    def _start(self, namespaces: dict[int, str], started: float) -> None:
        specs, theirs = [], []
        procs.raise_fd_limit(4 * len(namespaces) + 64)     # both ends of two pipes a rank, until the launcher has its own
        try:
            for rank, ns in namespaces.items():
                cmd_r, cmd_w = os.pipe()
                ans_r, ans_w = os.pipe()
                theirs += [cmd_r, ans_w]
                self.agents[rank] = Agent(rank, os.fdopen(cmd_w, "w", buffering=1),
                                          os.fdopen(ans_r, "r", buffering=1))
                specs.append({"rank": rank, "namespace": ns, "stdin": cmd_r, "stdout": ans_w})
            # -P and cwd=/: the launcher imports labctl from its install, not from the caller's directory
            self.proc = subprocess.Popen([sys.executable, "-P", "-m", "labctl.traffic.launcher"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                         cwd="/", pass_fds=theirs)
            self.identity = procs.identity(self.proc.pid)
            self.proc.stdin.write(json.dumps(specs))
            self.proc.stdin.close()
        finally:
            for fd in theirs:
                os.close(fd)
        self._started = threading.Event()
        self._lines = threading.Thread(target=self._read, daemon=True)
        self._lines.start()
        if not self._started.wait(started):
            raise TimeoutError(f"the agent launcher started no agent within {started:.0f} s")
        missing = [r for r, a in self.agents.items() if a.pid is None]
        if missing:
            raise RuntimeError(f"the agent launcher ended (code {self.proc.wait()}) before starting rank "
                               f"{missing[0]} (in {namespaces[missing[0]]})")

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
                a = self.agents[msg["rank"]]
            except (ValueError, KeyError, TypeError):
                continue
            if msg.get("event") == "started":
                a.pid, a.identity = int(msg["pid"]), str(msg["identity"])
                if all(x.pid is not None for x in self.agents.values()):
                    self._started.set()
            elif msg.get("event") == "exited":
                a._ended_with(int(msg["code"]))
        self.proc.wait()
        for a in self.agents.values():
            if a.returncode is None:
                # the launcher is gone without reaping it (killed): an agent still running is killed,
                # and nothing more can be known of it
                a.kill()
                a._ended_with(-signal.SIGKILL)
        self._started.set()

    def kill(self) -> None:
        """Kill the agents, and let the launcher reap them and end (killed first, it would leave
        them to init as zombies); kill it too if it does not."""
        for a in self.agents.values():
            a.kill()
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def wait(self, timeout: float | None = None) -> None:
        self.proc.wait(timeout)
