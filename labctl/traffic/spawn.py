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


class Agent:
    def __init__(self, rank: int, stdin, stdout):
        self.rank, self.stdin, self.stdout = rank, stdin, stdout
        self.pid: int | None = None
        self.returncode: int | None = None
        self._ended = threading.Event()
        self.identity: str | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"agent of rank {self.rank}", timeout)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL, only while the process is still the one the launcher forked (checked by its start
        time: its pid is free for reuse as soon as the launcher has reaped it)."""
        if self.returncode is None and self.identity and procs.verified(self.identity):
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _ended_with(self, code: int) -> None:
        self.returncode = code
        self._ended.set()


class Launched:
    """A launcher and the agents it forked."""

    def __init__(self, namespaces: dict[int, str], started: float = 60.0):
        self.agents: dict[int, Agent] = {}
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
            self.proc.stdin.write(json.dumps(specs))
            self.proc.stdin.close()
        finally:
            for fd in theirs:
                os.close(fd)
        self.identity = procs.identity(self.proc.pid)
        self._started = threading.Event()
        self._lines = threading.Thread(target=self._read, daemon=True)
        self._lines.start()
        if not self._started.wait(started):
            self.kill()
            raise TimeoutError(f"the agent launcher started no agent within {started:.0f} s")
        missing = [r for r, a in self.agents.items() if a.pid is None]
        if missing:
            self.kill()
            raise RuntimeError(f"the agent launcher ended (code {self.proc.wait()}) before starting rank {missing[0]}")

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
                a = self.agents[msg["rank"]]
            except (ValueError, KeyError, TypeError):
                continue
            if msg.get("event") == "started":
                a.pid = int(msg["pid"])
                a.identity = procs.identity(a.pid)
                if all(x.pid is not None for x in self.agents.values()):
                    self._started.set()
            elif msg.get("event") == "exited":
                a._ended_with(int(msg["code"]))
        self.proc.wait()
        for a in self.agents.values():      # the launcher is gone: nothing more can be known of them
            if a.returncode is None:
                a._ended_with(-signal.SIGKILL)
        self._started.set()

    def kill(self) -> None:
        """Kill the agents, and let the launcher reap them and end (killed first, it would leave
        them to init as zombies); kill it too if it does not."""
        for a in self.agents.values():
            a.kill()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def wait(self, timeout: float | None = None) -> None:
        self.proc.wait(timeout)
