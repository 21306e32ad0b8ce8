"""When an operation gives up (pure logic, no root): slow but moving runs go on, stopped ones end,
and the silence allowed is the lab's own longest healthy one."""
from pathlib import Path

import pytest

from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology
from labctl.traffic.pool import STALL_MARGIN_S, quiet_floor, retransmission_timeout
from labctl.traffic.run import time_outs

ROOT = Path(__file__).resolve().parents[1]


def plan_of(name: str, *sets: str):
    return compile_plan(load_topology(ROOT / "topologies" / name, sets=sets))


def test_without_a_timeout_a_run_may_be_slow_but_not_silent():
    deadline, quiet = time_outs(None, 2.0, 3.8)
    assert deadline == 100 * 2.0 + 60 and quiet == 4.0      # 2 x the bound, above the lab's floor
    assert time_outs(None, 1.3, 3.8) == (190.0, 3.8)        # a short operation waits the floor
    assert time_outs(None, 30.0, 3.8) == (3060.0, 60.0)


def test_a_given_timeout_is_both_the_deadline_and_the_silence_allowed():
    assert time_outs(15_000_000_000, 2.0, 3.8) == (15.0, 15.0)
    assert time_outs(2_000_000_000, 2.0, 12.0) == (2.0, 2.0)   # the user's word, even under the floor


def test_the_floor_is_two_timers_the_deepest_drain_and_the_machine_margin():
    plan = plan_of("leaf-spine.yml")
    rto = retransmission_timeout(plan)
    assert rto == pytest.approx(250e-6 * 4000)               # no WAN: the fabric's timer, dilated
    # the slowest queue to drain on the bundled leaf-spine: a 4 MiB default class at its guaranteed
    # 20% of a 400 Gbit/s port (20 Mbit/s here), crowded by the RoCE class
    drain = max(c.buffer_bytes * 8 / c.rate_bps for n in plan.nodes for i in n.interfaces
                if i.shaping for c in i.shaping.classes)
    assert drain == pytest.approx(4 * 2**20 * 8 / 20e6)
    assert quiet_floor(plan) == pytest.approx(STALL_MARGIN_S + 2 * rto + drain)
    assert quiet_floor(plan) < 10.0                          # an incast that lost its tail ends in seconds


@pytest.mark.parametrize("dilation", [2000, 4000, 8000])
def test_the_floor_grows_with_dilation(dilation):
    plan = plan_of("leaf-spine.yml", f"dilation={dilation}")
    assert quiet_floor(plan) == pytest.approx(STALL_MARGIN_S + (0.5 + 4 * 2**20 * 8 / 80e6) * dilation / 1000)


def test_across_a_wan_the_floor_outlasts_a_resend_of_the_round_trip():
    near, far = plan_of("scale-across.yml", "distance=1"), plan_of("scale-across.yml", "distance=100")
    rtt_far = 2 * max(lk.lab_delay_ns for lk in far.links if lk.wire is not None) / 1e9
    assert 3.8 < rtt_far < 4.0                                # 100 km at dilation 4000
    assert quiet_floor(far) > 2 * rtt_far + STALL_MARGIN_S    # a lost message's NAK, resend and its loss
    assert quiet_floor(far) > quiet_floor(near) + 2 * (rtt_far - 0.04)


def test_a_jittered_wan_s_timer_outlasts_its_longest_round_trip():
    """Each direction adds up to the jitter (wan/line.py): an ACK can come back 2 x jitter late."""
    plan = plan_of("scale-across.yml", "distance=100")
    steady = retransmission_timeout(plan)
    for lk in plan.links:
        if lk.wire is not None:
            lk.lab_jitter_ns = 500_000_000                    # 0.5 s of lab time each way
    assert retransmission_timeout(plan) == pytest.approx(steady + 1.0)
