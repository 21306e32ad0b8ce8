"""The controller's read planning (pure): how soon a switch is read again, and that a queue found
empty still releases its XOFF state and its marking. The kernel side (the qdisc GETs, the nftables
rules, the PFC frames) is replaced by recorders; the decisions are the controller's own code."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from labctl.dataplane import controller as ctl
from labctl.dataplane import ecn, pfc
from labctl.dataplane.controller import FAST, IDLE, Controller, Switch
from labctl.telemetry import reaction

RATE = 100_000_000                       # 12.5 MB/s per port
KMIN, KMAX, XOFF, XON = 400_000, 1_600_000, 3_400_000, 3_380_000
ECN_KEY, PFC_KEY, FEEDER_KEY = (3, 35), (7, 35), (9, 35)


class Recorder:
    def __init__(self):
        self.commands: list[str] = []

    def run(self, commands: str) -> str:
        self.commands.append(commands)
        return ""


class FakePort:
    def __init__(self, name: str):
        self.settings = SimpleNamespace(pfc=True, xoff=XOFF, xon=XON)
        self.over_xoff = False
        self.iface = SimpleNamespace(name=name, shaping=SimpleNamespace(rate_bps=RATE))
        self.cls = SimpleNamespace(pfc_quanta=pfc.MAX_QUANTA)
        self.state = pfc.PortPfc(3)
        self.sent: list[int] = []

    def send_pfc(self, quanta: int, now: float) -> None:
        self.sent.append(quanta)
        self.state.last_sent = now


@pytest.fixture
def setup(monkeypatch):
    backlogs = {ECN_KEY: 0, PFC_KEY: 0, FEEDER_KEY: 0}
    monkeypatch.setattr(ctl.qdepth, "backlogs_get", lambda sock, request: dict(backlogs))
    c = Controller.__new__(Controller)
    c.idle = IDLE
    c.pfc_activity = 0
    c.active = {}
    c.slow = reaction.SlowSteps()
    node = SimpleNamespace(switching=True, name="leaf1")
    port, feeder = FakePort("spine1"), FakePort("gpu0")   # gpu0's traffic can queue toward spine1
    sw = Switch(node, sock=None, nft=Recorder(), family="ip", share=SimpleNamespace(shared_buffer=None))
    sw.ecn_ports[ECN_KEY] = (3, SimpleNamespace(ecn=True, kmin=KMIN, kmax=KMAX, pmax=0.2))
    sw.marking[(ECN_KEY[0], 3)] = 0
    sw.pfc[PFC_KEY], sw.pfc[FEEDER_KEY] = port, feeder
    sw.feeders = {"spine1": {"gpu0"}, "gpu0": set()}
    sw.wanted = {ECN_KEY, PFC_KEY, FEEDER_KEY}
    sw.inflow = {key: 3 * RATE / 8 for key in sw.wanted}
    return c, sw, port, feeder, backlogs


def test_idle_queues_are_read_at_the_idle_rate(setup):
    c, sw, _, _, _ = setup
    assert c.poll(sw) == (False, IDLE)


def test_a_shallow_queue_is_read_after_half_its_time_to_kmin_at_full_inflow(setup):
    c, sw, _, _, backlogs = setup
    backlogs[ECN_KEY] = 100_000
    busy, due = c.poll(sw)
    assert busy and due == pytest.approx((KMIN - 100_000) / (3 * RATE / 8))   # 8 ms at 37.5 MB/s
    assert FAST < due / 2 < IDLE


def test_a_queue_on_the_ramp_or_past_xoff_is_read_at_once(setup):
    c, sw, port, feeder, backlogs = setup
    backlogs[ECN_KEY] = KMIN + 10_000
    assert c.poll(sw)[1] == 0
    backlogs[ECN_KEY], backlogs[PFC_KEY] = 0, XOFF + 1
    assert c.poll(sw)[1] == 0 and port.over_xoff and feeder.sent == [pfc.MAX_QUANTA]
    assert port.sent == []                             # only the port whose traffic queues there


def test_a_queue_found_empty_releases_xoff_and_stops_marking(setup):
    c, sw, port, feeder, backlogs = setup
    backlogs[ECN_KEY], backlogs[PFC_KEY] = KMAX + 1, XOFF + 1
    c.poll(sw)
    assert port.over_xoff and sw.marking[(ECN_KEY[0], 3)] == ecn.SCALE
    backlogs[ECN_KEY], backlogs[PFC_KEY] = 0, 0       # both drained between two reads
    c.poll(sw)
    assert not port.over_xoff and feeder.sent[-1] == 0  # XON sent
    assert sw.marking[(ECN_KEY[0], 3)] == 0 and sw.nft.commands[-1].count("add rule") == 0


def test_idle_reads_stay_within_their_budget_and_the_headroom_follows():
    from labctl.plan import qos
    # the bundled lab (19 switches, 120 queues) keeps 100 Hz and the 30 ms the headroom was sized for
    bundled = [6] * 19
    assert qos.controller_idle_s(bundled) == IDLE
    assert qos.pfc_response_s(bundled) == qos.PFC_RESPONSE_S
    # 1,024 GPUs: 48 switches of 43 queues, 128 NVLink switches of 8; idle reads keep to their share
    big = [43] * 48 + [8] * 128
    idle = qos.controller_idle_s(big)
    cost = sum(qos.READ_BASE_S + qos.READ_PER_QUEUE_S * q for q in big)
    assert idle > IDLE and cost / idle == pytest.approx(qos.IDLE_CPU_SHARE)
    assert qos.pfc_response_s(big) == pytest.approx(qos.PFC_RESPONSE_S + idle - IDLE)
    small = qos.headroom(100_000_000, 4, 0, 1538)
    assert qos.headroom(100_000_000, 4, 0, 1538, qos.pfc_response_s(big)) > 2 * small


def test_a_slow_part_of_the_loop_is_kept_with_its_name_and_logged(setup, capsys):
    import time as _time
    c, sw, port, feeder, backlogs = setup
    slow_run = sw.nft.run
    sw.nft.run = lambda commands: (_time.sleep(reaction.SLOW_STEP_S + 0.02), slow_run(commands))[1]
    backlogs[ECN_KEY] = KMAX + 1                       # marking starts: one nftables change, slow
    c.poll(sw)
    assert c.slow.count == 1 and [(what, node) for _, what, node, _ in c.slow.steps] == [("ecn rule", "leaf1")]
    assert c.slow.steps[0][3] >= reaction.SLOW_STEP_S + 0.02
    assert "slow ecn rule at leaf1" in capsys.readouterr().err
    c.poll(sw)                                         # same level: no change, nothing slow
    assert c.slow.count == 1
