"""How far ahead an operation starts (pure logic, no root): far enough for every agent to hold its
command, and no further once dispatch has been seen."""
import pytest

from labctl.traffic.pool import MIN_START_MARGIN_S, START_MARGIN_S, AgentPool


def pool() -> AgentPool:
    p = AgentPool.__new__(AgentPool)
    p.dispatch_s = None
    return p


def test_the_first_operation_waits_the_full_margin():
    assert pool().start_margin(8) == pytest.approx(START_MARGIN_S + 0.016)


def test_later_operations_wait_four_times_the_slowest_dispatch_seen_at_least_5_ms():
    p = pool()
    p.observe_dispatch(0.002)
    assert p.start_margin(8) == pytest.approx(0.008)
    p = pool()
    p.observe_dispatch(0.0002)
    assert p.start_margin(8) == MIN_START_MARGIN_S
    p.observe_dispatch(-0.001)              # a clock read before the send: never a negative margin
    assert p.start_margin(8) == MIN_START_MARGIN_S


def test_a_slow_dispatch_widens_the_margin_at_once_and_it_narrows_by_a_fifth_an_operation():
    p = pool()
    p.observe_dispatch(0.010)
    assert p.start_margin(8) == pytest.approx(0.040)
    p.observe_dispatch(0.001)
    assert p.start_margin(8) == pytest.approx(4 * 0.008)
    for _ in range(30):
        p.observe_dispatch(0.001)
    assert p.start_margin(8) == pytest.approx(0.005, abs=1e-6)


def test_the_margin_never_exceeds_the_full_one():
    p = pool()
    p.observe_dispatch(1.0)                  # a stall of a second
    assert p.start_margin(8) == pytest.approx(START_MARGIN_S + 0.016)
