"""Start a run's traffic agents by forking them from one process that has imported them once.

Each agent used to be its own interpreter (`ip netns exec NS python -m labctl.traffic.agent`):
Python's start and the agent's imports, about 60-90 ms of CPU, eight times for an 8-rank run on
two cores, before the first packet. The launcher pays that once: it imports the agent, then forks
one child per rank from inside that rank's GPU namespace. The child takes its two pipes as stdin
and stdout and runs `agent.main()`, as the interpreter started by `ip netns exec` did.

    echo '[{"rank": 0, "namespace": "lab-gpu0", "stdin": 5, "stdout": 6}, ...]' | python -P -m labctl.traffic.launcher

The pool passes each agent's read end of its command pipe and write end of its answer pipe
(`pass_fds`), and the list on stdin (a 1,024-rank list is too long for one argument). The launcher
reports on its stdout, one JSON line each:
`{"event": "started", "rank": R, "pid": P}` as each child is forked, and
`{"event": "exited", "rank": R, "code": C}` as each one ends (C < 0: killed by signal -C); it
returns when all have ended. A child whose pool went away sees its stdin end and exits, as before.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import traceback

from labctl import procs
from labctl.kernel import nsutil
from labctl.traffic import agent


def _child(spec: dict) -> None:
    """In the forked child, already in its GPU's namespace: become rank `spec`'s agent. Never returns."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)   # the launcher ignores it; an agent does not
        os.dup2(spec["stdin"], 0)
        os.dup2(spec["stdout"], 1)
        # nothing else of the launcher's: the other ranks' pipes, and the namespace descriptors that
        # entering this one held open (one of them the host's own namespace)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        # fresh files on the new 0 and 1: the launcher's own stdin was read to its end
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        agent.main()
        sys.stdout.flush()
    except BaseException:       # noqa: BLE001 - a child must never return into the launcher's loop
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def _reap(pids: dict[int, int], say) -> None:
    while pids:
        pid, status = os.wait()
        rank = pids.pop(pid, None)
        if rank is not None:
            say({"event": "exited", "rank": rank, "code": os.waitstatus_to_exitcode(status)})


def launch(specs: list[dict], say) -> None:
    """Fork every agent, each from inside its namespace (a child keeps the namespace its parent's
    thread was in), so that a reported agent is already where it will run. If one cannot be
    started (its namespace is gone), those already forked are killed and reaped before it fails."""
    fds = [s[k] for s in specs for k in ("stdin", "stdout")]
    pids: dict[int, int] = {}
    try:
        for s in specs:
            sys.stdout.flush()        # nothing of ours may be written again by a child's copy of the buffer
            sys.stderr.flush()
            with nsutil.entered(s["namespace"]):
                pid = os.fork()
                if pid == 0:
                    _child(s)
            pids[pid] = s["rank"]
            # its identity read here, by its parent: until this process reaps it, its pid is its own
            say({"event": "started", "rank": s["rank"], "pid": pid, "identity": procs.identity(pid)})
    except BaseException:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        _reap(pids, say)
        raise
    finally:
        for fd in fds:            # the pipes are the agents' alone: their ends must reach EOF with them
            os.close(fd)
    _reap(pids, say)


def parse(text: str) -> list[dict]:
    specs = json.loads(text)
    if not isinstance(specs, list) or not specs:
        raise ValueError("expected a JSON list of agents")
    seen: set[int] = set()
    for s in specs:
        if not (isinstance(s, dict) and isinstance(s.get("rank"), int) and isinstance(s.get("stdin"), int)
                and isinstance(s.get("stdout"), int) and isinstance(s.get("namespace"), str)):
            raise ValueError(f"not an agent: {s!r}")
        nsutil.path(s["namespace"])       # refuses a name labctl does not make
        for fd in (s["stdin"], s["stdout"]):
            if fd < 3 or fd in seen:
                raise ValueError(f"descriptor {fd} of rank {s['rank']} is a standard one or another rank's")
            seen.add(fd)
    return specs


def main() -> None:
    # Ctrl-C reaches the whole process group: the agents end on their own (their pool closes their
    # pipes); the launcher stays to reap them, or they would be left to init
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    specs = parse(sys.stdin.read())

    def say(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    launch(specs, say)


if __name__ == "__main__":
    main()
