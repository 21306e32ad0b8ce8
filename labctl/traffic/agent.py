"""A traffic agent: one process per GPU rank, inside its namespace, speaking RoCEv2 over UDP 4791.

Started by the agent pool (pool.py): forked inside `<lab>-<gpu>` by the run's launcher
(launcher.py), or run as `ip netns exec <lab>-<gpu> python -m labctl.traffic.agent`; it reads JSON
lines on stdin (init, run, exit) and answers on stdout. A receiver thread (receiver.py) accounts
every packet; the main thread runs the rank's transfers in order (sender.py), each one waiting
until the transfers it depends on have arrived here.
"""
from __future__ import annotations

import json
import os
import random
import socket
import struct
import sys
import threading
import time

from labctl.traffic import mmsg, roce
from labctl.traffic.receiver import Receiver
from labctl.traffic.rxbatch import BatchReader
from labctl.traffic.dcqcn import Params
from labctl.traffic.sender import Sender

IP_RECVTOS = 13
SO_RCVBUFFORCE = 33          # root may exceed net.core.rmem_max: a burst must not overflow the socket
RCVBUF = 32 << 20
LATE_GRACE_S = 0.2            # how long a message short of a packet waits for it to come late
RECEIVER_GRACE_S = 0.2        # one more wait before silence is declared, for packets a stall left unread
STALL_SLACK_S = 0.05          # a wait returning this much late is the scheduler's noise, not a stall


def _overslept(cond, timeout: float) -> float:
    """Wait on `cond` for up to `timeout` s; how much later than that it returned, past the
    scheduling noise of a busy machine (STALL_SLACK_S): the time this process did not run."""
    t0 = time.monotonic()
    cond.wait(timeout)
    return max(0.0, time.monotonic() - t0 - timeout - STALL_SLACK_S)


class Agent:
    def __init__(self, rank: int, mtu: int, peers: dict, cnp_interval: float | None = None,
                 sport_policy: str = "per-qp", seed: int = 1, reliable: bool = False, gso: bool = True,
                 priorities: dict[int, int] | None = None, dcqcn: dict | None = None, ooo: str = "drop"):
        self.rank = rank
        params = Params(**dcqcn) if dcqcn is not None else None
        self.sender = Sender(rank, mtu, sport_policy, random.Random(seed * 7919 + rank), reliable, gso,
                             priorities, params)
        self.receiver = Receiver(rank, peers, self.sender, cnp_interval, reliable, ooo)
        self.stop = False
        self.last_arrival = 0.0        # time.monotonic() of the latest batch received: progress
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
        self.sock.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
        # blocking with a receive timeout: recvmmsg returns every 0.2 s to look at `stop`
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 200_000))
        self.sock.bind(("0.0.0.0", roce.ROCE_PORT))
        self.thread = threading.Thread(target=self._receive, daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        rx = mmsg.Receiver(self.sock)
        batch = BatchReader(self.receiver, rx)       # in-order runs of a full batch counted at once
        while not self.stop:
            try:
                n = rx.recv()
            except OSError:
                return
            if n:
                self.last_arrival = time.monotonic()
                batch.take(n)

    def _wait(self, pred, deadline: float, quiet: float, since: float, rto: float = 0.05) -> bool:
        """Wait (holding the receiver's lock) until `pred()`; give up at `deadline`, or once nothing
        has arrived for `quiet` seconds since `since` or the latest arrival: a collective that still
        moves is never cut off for being slow (an emulated CPU runs the agents 5-10x slower),
        one that stopped is not waited for to its deadline."""
        cond = self.receiver.cond
        graced = False
        # the time this process did not run since it last heard anything (its waits returned that
        # much later than asked): a machine that stalls whole (a VM whose host is busy, a frozen
        # cgroup) stops the senders with it, and after such a stall nothing has arrived because
        # nothing ran, not because something was lost. Each stall is kept as (when it ended, how
        # long); one counts for as long as it lies after the latest arrival (an arrival the receiver
        # thread counted just before the stall is noticed only after it, and must not cancel it)
        stalls: list[tuple[float, float]] = []

        def stalled_since(t: float) -> float:
            return sum(max(0.0, min(length, ended - t)) for ended, length in stalls)

        def wait(timeout: float) -> None:
            over = _overslept(cond, timeout)
            if over:
                stalls.append((time.monotonic(), over))
        while not pred():
            now = time.monotonic()
            heard = max(since, self.last_arrival)
            stalls[:] = [x for x in stalls if x[0] > heard]      # ended before the latest arrival: spent
            end = min(deadline, heard + quiet + stalled_since(heard))
            if now >= end:
                if end < deadline and not graced:
                    # after a stall of this process, the receiver thread may hold packets it has
                    # not read yet: one more wait lets it count them before silence is declared
                    graced = True
                    wait(RECEIVER_GRACE_S)
                    continue
                return False
            if self.sender.reliable:
                # go-back-N goes on while we wait: both ends of a lost message may be waiting on
                # each other's. The resend runs without the receiver's lock, which its thread needs.
                cond.release()
                try:
                    pending = self.sender.service(rto)
                finally:
                    cond.acquire()
                if pred():
                    break
                wait(min(end - now, 0.005 if pending else 0.5))
                continue
            wait(min(end - now, 0.5))
        return True

    def run(self, op: dict) -> dict:
        received = time.monotonic()     # after `start` if the `go` came late: the pool reports it
        start = op["start"]
        deadline = self.sender.deadline = start + op["timeout"]
        quiet = op.get("quiet", op["timeout"])
        delay = start - received
        if delay > 0:
            time.sleep(delay)
        arrived, cond = self.receiver.arrived, self.receiver.cond
        sends = []
        timed_out = False
        progress = max(start, received)     # silence counts from when this agent could begin
        for t in op["sends"]:
            with cond:
                ok = self._wait(lambda: all(d in arrived for d in t["after"]), deadline, quiet, progress,
                                op.get("rto", 0.05))
            if not ok:
                timed_out = True
                break
            if t.get("delay"):
                time.sleep(t["delay"])    # the rank computes (a training step's layer) before it sends
                progress = time.monotonic()
            t0 = time.monotonic()
            self.sender.send_message(t)
            progress = time.monotonic()
            sends.append([t["id"], t0 - start, progress - start])
        if not self.sender.settle(deadline, op.get("rto", 0.05)):
            timed_out = True
        expect = op["recvs"]
        with cond:
            ok = self._wait(lambda: all(i in arrived for i in expect), deadline, quiet, progress, op.get("rto", 0.05))
            timed_out = timed_out or not ok
            # a message whose last packet overtook another is complete once the late one lands
            cond.wait_for(lambda: self.receiver.settled(expect),
                          timeout=max(0.0, min(LATE_GRACE_S, deadline - time.monotonic())))
            recvs = [[i, arrived[i][0] - start, arrived[i][1], arrived[i][2]] for i in expect if i in arrived]
            missing = [i for i in expect if i not in arrived]
        end = max([s[2] for s in sends] + [r[1] for r in recvs] + [0.0])
        # an operation that did not finish ran until its agents gave up, not until the last byte
        # that did arrive: the run reports that time, which no bound beats
        gave_up = time.monotonic() - start if timed_out else None
        return {"event": "done", "op": op["op"], "rank": self.rank, "end": end, "sends": sends, "recvs": recvs,
                "missing": missing, "timed_out": timed_out, "gave_up": gave_up, "received": received}

    def counters(self) -> dict:
        rx = [{"peer": ip, "qpn": dq, **q.public()} for (ip, dq), q in self.receiver.qps.items()]
        tx = [{"qpn": lq, **q.public()} for lq, q in self.sender.qps.items()]
        return {"event": "counters", "rank": self.rank, "rx": rx, "tx": tx}


def main() -> None:
    agent = pending = None

    def say(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg["cmd"]
        if cmd == "init":
            if msg.get("cpu") is not None:
                # a flow's packets are forwarded on its sender's CPU (veth has no NAPI): a sender that
                # migrates between CPUs reorders its own flow, which a NIC never does
                os.sched_setaffinity(0, {msg["cpu"]})
            roce.install(msg.get("templates", {}))   # crafted by the controller: no scapy import here
            agent = Agent(msg["rank"], msg["mtu"], {ip: tuple(v) for ip, v in msg["peers"].items()},
                          msg.get("cnp_interval"), msg.get("sport_policy", "per-qp"), msg.get("seed", 1),
                          msg.get("reliable", False), msg.get("gso", True),
                          {int(k): v for k, v in msg.get("priorities", {}).items()}, msg.get("dcqcn"),
                          msg.get("ooo", "drop"))
            say({"event": "ready", "rank": agent.rank, "pid": os.getpid()})
        elif cmd == "run":          # parsed now; it starts with the `go` that names its start
            pending = msg
            say({"event": "armed", "rank": agent.rank})
        elif cmd == "go":
            say(agent.run({**pending, "start": msg["start"]}))
        elif cmd == "exit":
            time.sleep(msg.get("linger", 0.05))  # late ACKs and CNPs
            say(agent.counters())
            agent.stop = True
            return


if __name__ == "__main__":
    main()
