"""Packet captures on lab ports with dumpcap (pcapng), started inside the port's namespace.

The default snaplen, 128 bytes, keeps Ethernet, IPv4, UDP, BTH, RETH and AETH of every RoCE frame
(and whole PFC frames) without the payload; use 0 for whole frames, e.g. to decrypt ESP.
Open a file with `wireshark FILE` or `tshark -r FILE --disable-protocol rpcordma`; the RoCE
dissector is "RRoCE" (UDP 4791) and PFC frames are "MAC Control, Class Based Flow Control".
A port's own PFC frames leave without queueing (PACKET_QDISC_BYPASS, as MAC control frames skip a
NIC's queues), which also skips its capture tap: capture pauses at the neighbour that receives them.
"""
from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from labctl import procs
from labctl.errors import LabError
from labctl.lifecycle import targets
from labctl.plan.model import LabPlan

DEFAULT_SNAPLEN = 128
FULL = 262144


def command(namespace: str, port: str, out: str, snaplen: int = DEFAULT_SNAPLEN, bpf: str = "") -> list[str]:
    args = ["ip", "netns", "exec", namespace, "dumpcap", "-q", "-i", port, "-s", str(snaplen or FULL), "-w", out]
    return args + (["-f", bpf] if bpf else [])


class Capture:
    """A background capture into a pcapng file; stop() flushes and closes it."""

    def __init__(self, plan: LabPlan, target: str, path: Path, snaplen: int = DEFAULT_SNAPLEN, bpf: str = "",
                 journal=None):
        ns, port = targets.capture_point(plan, target)
        self.path = path
        self.proc = subprocess.Popen(command(ns, port, str(path), snaplen, bpf), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.journal, self.identity = journal, procs.identity(self.proc.pid)
        if journal is not None:
            journal("pid", self.identity)
        deadline = time.monotonic() + 5
        while not path.exists() and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)          # dumpcap creates the file once it captures
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
