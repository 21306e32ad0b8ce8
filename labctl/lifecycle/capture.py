"""Packet captures on lab ports with dumpcap (pcapng), started inside the port's namespace.

The default snaplen, 128 bytes, keeps Ethernet, IPv4, UDP, BTH, RETH and AETH of every RoCE frame
(and whole PFC frames) without the payload; use 0 for whole frames, e.g. to decrypt ESP.
Open a file with `wireshark FILE` or `tshark -r FILE --disable-protocol rpcordma`; the RoCE
dissector is "RRoCE" (UDP 4791) and PFC frames are "MAC Control, Class Based Flow Control".
A port's own PFC frames leave without queueing (PACKET_QDISC_BYPASS, as MAC control frames skip a
NIC's queues), which also skips its capture tap: capture pauses at the neighbour that receives them.
"""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from pathlib import Path

from labctl import paths, procs
from labctl.errors import LabError
from labctl.lifecycle import targets
from labctl.plan.model import LabPlan

DEFAULT_SNAPLEN = 128
FULL = 262144


def command(namespace: str, port: str, snaplen: int = DEFAULT_SNAPLEN, bpf: str = "") -> list[str]:
    """dumpcap on the port, writing pcapng to its stdout: labctl opens the file (open_output)."""
    args = ["ip", "netns", "exec", namespace, "dumpcap", "-q", "-i", port, "-s", str(snaplen or FULL), "-w", "-"]
    return args + (["-f", bpf] if bpf else [])


def open_output(path: str | Path) -> int:
    """The capture file, opened for writing by labctl itself, never through a symlink: root's
    dumpcap, given a name, followed a link planted in the user's directory and wrote over the
    file it pointed to. A file that exists is written over only if it is a plain file of this
    user's, and only in a directory that no one else can change: O_NOFOLLOW guards the file's own
    name, not a directory above it that someone else could link elsewhere (paths.new_run_dir)."""
    link = paths.foreign_link(Path(path))
    why = f"{link} is a symlink of uid {os.lstat(link).st_uid}'s" if link is not None else \
        paths.changeable_above(Path(path).parent)
    if why:
        raise LabError(f"cannot write the capture to {path}: {why}, which could send root's file anywhere",
                       "give a file in a directory that only root (or you) can write, e.g. /var/tmp or your home")
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()):
        raise LabError(f"{path} exists and is not a plain file of uid {os.geteuid()}'s "
                       f"({'a symlink' if stat.S_ISLNK(st.st_mode) else f'owner uid {st.st_uid}'})",
                       "give the capture a new file name (-w FILE), or remove that one")
    try:
        fd = os.open(path, flags | (os.O_TRUNC if st is not None else os.O_EXCL), 0o644)
    except OSError as exc:
        raise LabError(f"cannot write the capture to {path}: {exc.strerror}", "give another file (-w FILE)") from None
    if st is not None and os.fstat(fd).st_ino != st.st_ino:     # swapped between the look and the open
        os.close(fd)
        raise LabError(f"{path} changed while labctl opened it", "capture again, into a directory of your own")
    return fd


class Capture:
    """A background capture into a pcapng file; stop() flushes and closes it."""

    def __init__(self, plan: LabPlan, target: str, path: Path, snaplen: int = DEFAULT_SNAPLEN, bpf: str = "",
                 journal=None):
        ns, port = targets.capture_point(plan, target)
        self.path = path
        out = open_output(path)
        try:
            self.proc = subprocess.Popen(command(ns, port, snaplen, bpf), stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.PIPE, text=True)
        finally:
            os.close(out)
        self.journal, self.identity = journal, procs.identity(self.proc.pid)
        if journal is not None:
            journal("pid", self.identity)
        deadline = time.monotonic() + 5
        while not path.stat().st_size and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)          # dumpcap writes the file's header once it captures
        if self.proc.poll() is not None:
            raise LabError(f"capture on {target} failed: {self.proc.stderr.read().strip()[-300:]}",
                           "is dumpcap installed (./install.sh installs tshark, which brings it)?")

    def stop(self) -> Path:
        if self.proc.poll() is None:
            time.sleep(0.2)           # frames in flight reach the file
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.journal is not None:
            self.journal("released-pid", self.identity)
        return self.path


def file_name(target: str) -> str:
    return target.replace(":", "_").replace("/", "_") + ".pcapng"
