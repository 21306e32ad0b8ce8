"""ECN marking on a real standing queue: the marked fraction follows the RED-like profile."""
from __future__ import annotations

import socket
import struct
import statistics
import threading
import time
from pathlib import Path

import pytest

from conftest import require_root
from labctl.kernel import nsutil, rtnl
from labctl.plan import qos
from labctl.telemetry import qdepth
from labctl.kernel.netconf import set_rate as set_port_rate

BOTTLENECK = Path(__file__).parent / "topologies" / "bottleneck.yml"
pytestmark = pytest.mark.netns
IP_RECVTOS = 13
TOS_ROCE_ECT0 = 26 << 2 | 0b10


class Receiver(threading.Thread):
    def __init__(self, namespace: str, addr: str):
        super().__init__(daemon=True)
        with nsutil.entered(namespace):
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE
        self.sock.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
        self.sock.bind((addr, 7000))
        self.sock.settimeout(0.05)
        self.stop, self.counting = threading.Event(), threading.Event()
        self.packets = self.ce = 0

    def run(self):
        space = socket.CMSG_SPACE(4)
        while not self.stop.is_set():
            try:
                _, anc, _, _ = self.sock.recvmsg(9000, space)
            except socket.timeout:
                continue
            if self.counting.is_set():
                self.packets += 1
                self.ce += anc and anc[0][2][0] & 3 == 3


@pytest.mark.parametrize("marking", ["datapath", "controller"])
def test_marking_fraction_follows_the_profile_at_standing_queue_depths(built_lab, monkeypatch, marking):
    """Both marking mechanisms (kernel/ecnpath.py, and the controller's rules of dataplane/ecn.py)."""
    require_root()
    from labctl import doctor
    from labctl.kernel import ecnpath
    monkeypatch.setenv(ecnpath.ENV, marking)
    plan = built_lab(BOTTLENECK)
    (entry,) = [e for e in doctor.lab_paths() if e["lab"] == plan.lab]
    assert entry["ecn_in_data_path"] == (["r1"] if marking == "datapath" else []), entry
    h1, r1, h2 = plan.node("h1"), plan.node("r1"), plan.node("h2")
    egress = r1.iface("h2")
    roce = next(c for c in egress.shaping.classes if c.ecn)
    e = plan.ecn
    with nsutil.entered(r1.namespace):
        qsock = rtnl.open_socket()

    def depth() -> int:
        return next(q.backlog for q in qdepth.dump(qsock)
                    if q.ifindex == egress.index and q.handle >> 16 == qos.leaf_handle(roce.tc) >> 16)

    dst = h2.iface("r1").address.split("/")[0]
    rx = Receiver(h2.namespace, dst)
    rx.start()
    stop = threading.Event()
    with nsutil.entered(h1.namespace):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, TOS_ROCE_ECT0)

    def blast():
        payload = bytes(8000)
        while not stop.is_set():
            tx.sendto(payload, (dst, 7000))

    sender = threading.Thread(target=blast, daemon=True)
    h1_port = h1.iface("r1")
    results = []
    try:
        set_port_rate(h1, h1_port, 100_000_000)
        sender.start()
        for target in (200_000, 700_000, 1_000_000, 1_300_000, 2_000_000):
            set_port_rate(h1, h1_port, 200_000_000)      # fill at 100 Mbit/s net: 12.5 kB/ms, no overshoot
            deadline = time.monotonic() + 5
            while depth() < target and time.monotonic() < deadline:
                time.sleep(0.0005)
            set_port_rate(h1, h1_port, 100_000_000)      # in = out: the queue stands where it is
            time.sleep(0.3)
            rx.packets = rx.ce = 0
            rx.counting.set()
            samples = []
            t_end = time.monotonic() + 1.5
            while time.monotonic() < t_end:
                samples.append(depth())
                time.sleep(0.005)
            rx.counting.clear()
            mean = statistics.mean(samples)
            want = statistics.mean(qos.marking_probability(d, e.kmin, e.kmax, e.pmax) for d in samples)
            results.append((target, mean, rx.packets, rx.ce / max(1, rx.packets), want))
    finally:
        stop.set()
        rx.stop.set()
        sender.join(timeout=5)
        qsock.close()
    report = [f"depth {m / 1e3:.0f} kB: marked {f:.3f} vs profile {w:.3f} ({n} packets)" for _, m, n, f, w in results]
    print(marking, *report, sep="\n")
    bands = [(0, e.kmin)] + [(e.kmin, e.kmax)] * 3 + [(e.kmax, 4 << 20)]
    for (target, mean, n, frac, want), (low, high) in zip(results, bands):
        assert n > 1000, report
        assert low < mean < high, report   # the queue stood below, inside and above the marking band
        # within 10% of the profile, or three binomial standard deviations of the sample if that is more
        tolerance = max(0.1 * want, 3 * (want * (1 - want) / n) ** 0.5) if want < 1 else 0.02
        assert frac == pytest.approx(want, abs=tolerance), report
    assert results[0][3] == 0, "no marks below Kmin"


def test_incast_queues_get_marked_and_cnps_reach_the_senders(built_lab, tmp_path):
    """The controller marks the incast's queue; receivers answer with CNPs that the senders count."""
    require_root()
    from labctl import state
    from labctl.traffic.run import run_workload
    from labctl.traffic.workload import load_workload
    plan = built_lab(Path(__file__).resolve().parents[1] / "topologies" / "leaf-spine.yml")
    wf = tmp_path / "w.yml"
    wf.write_text("name: ecn\ncollective: incast\nsizes: [2MB]\nparticipants: all\nroot: srv1-gpu0\n"
                  "options: {cnp: true, timeout: 10s}\n")
    doc = run_workload(plan, state.lab_dir(plan.lab), load_workload(wf), tmp_path / "run")
    rx = [q for c in doc["counters"].values() for q in c["rx"]]
    tx = [q for c in doc["counters"].values() for q in c["tx"]]
    ce, cnps = sum(q["ce"] for q in rx), sum(q["cnp_sent"] for q in rx)
    assert ce > 100 and cnps > 0
    assert sum(q["cnp_received"] for q in tx) == cnps


def test_marking_expressions_are_loaded_before_the_controller_is_ready_and_leave_no_rule(built_lab, lab_name):
    """On a stock kernel nft_numgen and nft_objref are modules, loaded when a rule first needs them;
    the controller makes that happen before it says ready (in a QEMU guest the load, left to the first
    marking, held the controller 2.4 s in an incast). This kernel has them built in: the test checks
    that the warm-up ran and that every marking chain is left empty by it."""
    require_root()
    from labctl import state
    from labctl.kernel.nft import Nft
    from labctl.dataplane import ecn
    plan = built_lab(BOTTLENECK)
    log = (state.lab_dir(lab_name).path / "controller.log").read_text()
    assert "nftables marking expressions ready in" in log, log
    r1 = plan.node("r1")
    nft = Nft(r1.namespace)
    try:
        chains = [ecn.chain_name(i.index, c.tc) for i in r1.interfaces for c in i.shaping.classes if c.ecn]
        assert chains
        for chain in chains:
            listing = nft.run(f"list chain ip labctl {chain}")
            assert chain in listing and "numgen" not in listing and "ecn set" not in listing, listing
    finally:
        nft.close()


def test_tc_set_changes_the_profile_the_ports_mark_with_and_marks_follow(built_lab):
    """`labctl tc set` goes through the controller into the marking program's slots: the profile
    bytes change, and a queue that stood below Kmin before is marked on every ECT packet once
    Kmin and Kmax sit below it (then not at all with ECN off)."""
    require_root()
    from labctl import state
    from labctl import lifecycle as labmod
    from labctl.kernel import ecnpath
    plan = built_lab(BOTTLENECK)
    lab = state.lab_dir(plan.lab)
    h1, r1, h2 = plan.node("h1"), plan.node("r1"), plan.node("h2")
    egress = r1.iface("h2")
    roce = next(c for c in egress.shaping.classes if c.ecn)
    with nsutil.netlink_socket(r1.namespace) as sock:
        queues = ecnpath.open_queues(sock, r1)
    assert queues is not None
    dst = h2.iface("r1").address.split("/")[0]
    rx = Receiver(h2.namespace, dst)
    rx.start()
    with nsutil.entered(h1.namespace):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, TOS_ROCE_ECT0)

    def marked_share(count: int = 400) -> float:
        """A burst at twice the port's rate: the queue builds to about half the burst."""
        rx.packets = rx.ce = 0
        rx.counting.set()
        for _ in range(count):
            tx.sendto(bytes(1000), (dst, 7000))
        deadline = time.monotonic() + 5
        while rx.packets < count and time.monotonic() < deadline:
            time.sleep(0.01)
        rx.counting.clear()
        return rx.ce / max(1, rx.packets)

    def profile() -> tuple:
        at = queues.row(egress.index, roce.tc) * ecnpath.VALUE
        return struct.unpack_from("=IIII", queues.mem, at + ecnpath.KMIN)

    h1_port = h1.iface("r1")
    try:
        set_port_rate(h1, h1_port, 2 * egress.shaping.rate_bps)     # in at twice what leaves: it builds
        assert profile() == struct.unpack("=IIII", ecnpath.profile(roce.kmin_bytes or plan.ecn.kmin,
                                                                   roce.kmax_bytes or plan.ecn.kmax,
                                                                   plan.ecn.pmax, True))
        assert marked_share() == 0                       # 400 kB at most: below the default Kmin
        labmod.tc_set(lab, plan, r1, "h2", kmin="1KB", kmax="2KB")
        assert profile()[:2] == (1000, 1000)
        assert marked_share() > 0.5                      # everything past the first two frames
        labmod.tc_set(lab, plan, r1, "h2", ecn="off")
        assert profile()[3] == 0
        assert marked_share() == 0
    finally:
        set_port_rate(h1, h1_port, h1_port.shaping.rate_bps)
        rx.stop.set()
        queues.close()
