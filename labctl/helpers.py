"""The lab's helper processes (the data-plane controller, the WAN line): one way to start them, one
way to serve, and the files they share with the rest of labctl.

A helper stands in for switch hardware, so it runs real-time (procs.py). It starts in its own
session, with `python -P` from `/` (it imports labctl from its install, never from the user's
directory), journaled as PID and start time before it can do anything; it says "ready" on stdout
once it holds its sockets and rules, and `start` waits for that, then makes every thread of it
real-time. Its start (imports, sockets, programs) runs at normal priority: sixteen switch agents
starting at real-time priority held FRR's bfdd off the CPU past BFD's 300 ms, and every BGP
session of the lab went down just as `up` returned.

Its files are written by a thread of its own (Publisher): a file system call can block for tens
of milliseconds (writing and renaming pfc.json on ext4 took up to 23 ms while captures and run
directories were being written), and a control loop waiting for one leaves its lossless queues
unwatched that long. The loop only hands the latest counters over (the newest wins, none queue
up); the thread writes them and watches control.json's mtime, raising `control_changed`.
"""
from __future__ import annotations

import errno
import gc
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

from labctl import procs
from labctl.errors import LabError

WATCH_EVERY = 0.01   # seconds between looks at control.json


class Publisher:
    def __init__(self, counters_file: Path | None, control_file: Path | None):
        self.counters_file, self.control_file = counters_file, control_file
        self.control_changed = threading.Event()
        self._doc: dict | None = None
        self._cond = threading.Condition()
        self._control_mtime = 0.0
        self.written = 0
        threading.Thread(target=self._run, name="publisher", daemon=True).start()

    def publish(self, doc: dict | str) -> None:
        """Hand over the latest counters (or their JSON text, made by the caller); returns at once."""
        with self._cond:
            self._doc = doc
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._doc is not None, timeout=WATCH_EVERY)
                doc, self._doc = self._doc, None
            if doc is not None and self.counters_file is not None:
                tmp = self.counters_file.with_suffix(".tmp")
                try:
                    tmp.write_text(doc if isinstance(doc, str) else json.dumps(doc))
                    tmp.replace(self.counters_file)
                    self.written += 1
                except OSError:
                    pass          # the lab directory is going away with the lab
            self._watch_control()

    def _watch_control(self) -> None:
        if self.control_file is None:
            return
        try:
            mtime = os.stat(self.control_file).st_mtime
        except OSError:
            return
        if mtime != self._control_mtime:
            self._control_mtime = mtime
            self.control_changed.set()


def start(lab, module: str, log_name: str, what: str, args: tuple[str, ...] = ()) -> int:
    """Start helper `module` for a lab (a state.LabDir) and wait for its "ready"; returns its PID."""
    p = launch(lab, module, log_name, args)
    await_ready(p, what, lab.path / f"{log_name}.log")
    p.stdout.close()
    procs.prioritise_all(p.pid)
    return p.pid


def launch(lab, module: str, log_name: str, args: tuple[str, ...] = ()) -> subprocess.Popen:
    """Start helper `module` (`python -P -m module LAB_DIR ARGS...`), journaled, without waiting:
    several start together, then each is awaited (await_ready) and made real-time (prioritise_all)."""
    return launch_argv(lab, [sys.executable, "-P", "-m", module, str(lab.path), *args], log_name)


def launch_argv(lab, argv: list[str], log_name: str) -> subprocess.Popen:
    """Start a helper from its whole command line (one that runs it inside a container, say).
    Its log is never opened through a link, nor waited on: a node agent's directory is bound into
    its container, which can put a link or a FIFO there (a FIFO's open blocks until a reader comes)."""
    path = lab.path / f"{log_name}.log"
    planted = LabError(f"{path} is not a plain file: something in the node made it", "take the lab down; its "
                       "node's image or command writes into the agent's directory (/run/labctl-agent)")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:      # ELOOP: a link; ENXIO: a FIFO no one reads
        raise (planted if exc.errno in (errno.ELOOP, errno.ENXIO) else exc) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise planted
    os.set_blocking(fd, True)
    log = os.fdopen(fd, "w")
    p = subprocess.Popen(argv, cwd="/", stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True,
                         start_new_session=True)
    log.close()
    lab.journal("pid", procs.identity(p.pid))
    return p


READY = "ready"


def say_ready() -> None:
    """A helper's side of the handshake: it holds what it needs and serves from now on."""
    print(READY, flush=True)


def await_ready(p: subprocess.Popen, what: str, log: Path | None = None, tail: int = 500) -> None:
    """The starter's side: read `p`'s stdout (text) until it says "ready". If it ends first, `p` is
    killed and LabError names `what` with the end of its `log`."""
    for line in p.stdout:
        if line.strip() == READY:
            return
    p.kill()
    p.wait()
    p.stdout.close()
    said = _tail(log, tail) if log is not None else None
    raise LabError(f"{what} did not start: {said if said is not None else f'exit status {p.returncode}'}")


def _tail(log: Path, tail: int) -> str | None:
    """The last `tail` bytes of a helper's log, read as an agent's files are (a node's agent logs
    into a directory its container may write: a link or a FIFO there is not followed or waited on)."""
    try:
        fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        os.lseek(fd, max(0, st.st_size - tail), os.SEEK_SET)
        # the node's text, for a terminal: line breaks kept, escape sequences not
        return "".join(c if c.isprintable() or c == "\n" else "?" for c in os.read(fd, tail).decode(errors="replace"))
    except OSError:
        return None
    finally:
        os.close(fd)


def serve(make, with_plan: bool = True, lab_dir: Path | None = None) -> None:
    """A helper's main: `make(plan, lab_dir)` builds it from the lab's record (`make(None, lab_dir)`
    without the plan: a switch agent reads only its node's share); then "ready", then run().
    `lab_dir`: the directory it serves, if not its first argument."""
    from labctl.plan.model import LabPlan
    lab_dir = lab_dir or Path(sys.argv[1])
    helper = make(LabPlan.from_lab_dir(lab_dir) if with_plan else None, lab_dir)
    # a full collection would walk everything the setup allocated, in the middle of an incast
    gc.collect()
    gc.freeze()
    # `down` stops a helper with SIGTERM: unwind, so that it can release its sockets in bulk
    signal.signal(signal.SIGTERM, _exit_on_term)
    say_ready()
    try:
        helper.run()
    finally:
        close = getattr(helper, "close", None)
        if close is not None:
            close()


def _exit_on_term(signum, frame) -> None:
    raise SystemExit(0)
